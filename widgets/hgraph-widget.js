// Glue of the JupyterLab graph widget (tkx/explorer/graphview.py): Python prepends vendor/dagre.min.js
// and hgraph.js to this file to make one anywidget ES module.
//   data       the graph (tkx/render/hgraph.py)
//   selected   the key of the op clicked ("op:<id>" or "fx:<node>"); Python answers with highlight
//   highlight  keys to light (the selected op's group, arena slot and CUDA lines live in LinkedView)
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "tkx-hg";
  el.appendChild(root);
  let api = null;
  function build() {
    api = tkxHGraph(root, model.get("data") || { nodes: [], edges: [], open: [], ops: 0 }, {
      colors: model.get("colors") || {},
      onSelect: (key) => { model.set("selected", key); model.save_changes(); },
    });
    api.highlight(model.get("highlight") || []);
  }
  // The stage has no size until the output area is attached: draw when it first has one.
  function whenSized() {
    if (root.isConnected && root.clientWidth > 0) build();
    else requestAnimationFrame(whenSized);
  }
  whenSized();
  model.on("change:data", build);
  model.on("change:highlight", () => { if (api) api.highlight(model.get("highlight") || []); });
}
export default { render };
