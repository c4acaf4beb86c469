// Hierarchical graph view: region -> module -> fusion group -> op, laid out by dagre (vendor/dagre.min.js).
// Works as a classic script (the exported report: defines the global tkxHGraph) and inside an ES module
// (the JupyterLab widget concatenates dagre, this file and its glue). Data: tkx/render/hgraph.py.
var tkxHGraph = (function () {
  "use strict";
  // The SVG namespace, read off an element the HTML parser makes (the file names no URL at all).
  var NS = (function () { var d = document.createElement("div"); d.innerHTML = "<svg></svg>";
                          return d.firstChild.namespaceURI; })();
  var FONT = 12, LINE = 15, CHAR = 7.3, PAD = 8, HEAD = 18;

  function svg(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function html(tag, cls, parent, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function lines(n) {
    var ls = n.l.split("\n");
    if (n.t === "c" && !n.open) ls[0] = "+ " + ls[0];
    return ls;
  }
  function boxSize(ls) {
    var w = 0;
    ls.forEach(function (s) { w = Math.max(w, s.length); });
    return { width: Math.ceil(w * CHAR + 2 * PAD), height: ls.length * LINE + 2 * PAD - 4 };
  }

  return function tkxHGraph(root, data, opts) {
    opts = opts || {};
    var colors = opts.colors || {};
    var byId = {}, kids = {};
    data.nodes.forEach(function (n) {
      byId[n.id] = n;
      (kids[n.p] = kids[n.p] || []).push(n);
    });
    var open = {};
    (data.open || []).forEach(function (id) { open[id] = true; });
    var view = { k: 1, x: 0, y: 0 }, size = { w: 0, h: 0 }, boxes = [], found = [], foundAt = -1, marked = [];

    root.textContent = "";
    root.classList.add("tkx-hg-on");
    var bar = html("div", "tkx-hg-bar", root);
    var search = html("input", "tkx-hg-search", bar);
    search.type = "search";
    search.placeholder = "search op id, aten op or module";
    search.setAttribute("aria-label", "search the graph");
    var hits = html("span", "tkx-hg-hits", bar);
    function button(label, title, fn) {
      var b = html("button", "", bar, label);
      b.type = "button";
      b.title = title;
      b.addEventListener("click", function (ev) { ev.stopPropagation(); fn(); });
      return b;
    }
    button("+", "zoom in", function () { zoomAt(view.k * 1.25); });
    button("\u2212", "zoom out", function () { zoomAt(view.k / 1.25); });
    button("fit", "fit the whole graph", function () { fit(true); });
    button("100%", "labels at their own size", function () { zoomAt(1); });
    button("collapse", "back to the first view", function () {
      open = {};
      (data.open || []).forEach(function (id) { open[id] = true; });
      draw(null);
      fit(false);
    });
    var info = html("span", "tkx-hg-info", bar);
    var stage = html("div", "tkx-hg-stage", root);
    var main = svg("svg", { "class": "tkx-hg-svg", width: "100%", height: "100%" }, stage);
    var port = svg("g", { "class": "tkx-hg-port" }, main);
    var mini = svg("svg", { "class": "tkx-hg-mini", width: 180, height: 120 }, stage);
    var miniG = svg("g", {}, mini);
    var miniView = svg("rect", { "class": "tkx-hg-miniview" }, mini);
    html("div", "tkx-hg-help", root, "Click a box with + to expand it, the title of an open box to collapse it, " +
      "an op to select it (its group, arena slot and CUDA lines light up). Drag to pan, Ctrl+wheel to zoom; " +
      "the minimap (bottom right) moves the view.");

    function visible(id) {            // the drawn box standing for node id
      var chain = [], n = byId[id];
      while (n) { chain.push(n.id); n = byId[n.p]; }
      for (var i = chain.length - 1; i > 0; i--) if (!open[chain[i]]) return chain[i];
      return id;
    }
    function color(n) { return colors[n.r] || "#57606a"; }

    function layout() {
      var g = new dagre.graphlib.Graph({ compound: true });
      g.setGraph({ rankdir: "TB", nodesep: 16, ranksep: 30, marginx: 14, marginy: 14 });
      g.setDefaultEdgeLabel(function () { return {}; });
      (function add(pid) {
        (kids[pid] || []).forEach(function (n) {
          n.open = n.t === "c" && !!open[n.id];
          if (n.open) g.setNode(n.id, { paddingTop: HEAD });
          else { var s = boxSize(lines(n)); g.setNode(n.id, { width: s.width, height: s.height }); }
          if (pid) g.setParent(n.id, pid);
          if (n.open) add(n.id);
        });
      })("");
      var merged = {};
      data.edges.forEach(function (e) {
        var a = visible(e[0]), b = visible(e[1]);
        if (a === b || !byId[a] || !byId[b]) return;
        if (byId[a].lv === "ends" || byId[b].lv === "ends") return;   // collapsed inputs/outputs: no fan
        var key = a + "\u0000" + b;
        merged[key] = (merged[key] || 0) + 1;
      });
      Object.keys(merged).forEach(function (key) {
        var ab = key.split("\u0000");
        g.setEdge(ab[0], ab[1], { count: merged[key], label: merged[key] > 1 ? String(merged[key]) : "",
                                  width: merged[key] > 1 ? 8 * String(merged[key]).length : 0,
                                  height: merged[key] > 1 ? 12 : 0, labelpos: "c" });
      });
      dagre.layout(g);
      return g;
    }

    function draw(anchor) {
      var before = anchor ? screenOf(anchor) : null;
      var g = layout();
      port.textContent = "";
      miniG.textContent = "";
      boxes = [];
      var clusters = svg("g", {}, port), edges = svg("g", {}, port), nodes = svg("g", {}, port);
      var shown = 0;
      g.nodes().forEach(function (id) {
        var n = byId[id], p = g.node(id);
        if (!n || !p) return;
        var x = p.x - p.width / 2, y = p.y - p.height / 2;
        boxes.push({ id: id, x: x, y: y, w: p.width, h: p.height, open: n.open });
        if (n.open) {
          var c = svg("g", { "class": "tkx-hg-cluster tkx-gc", "data-id": id }, clusters);
          svg("rect", { x: x, y: y - HEAD, width: p.width, height: p.height + HEAD, rx: 6,
                        stroke: color(n), fill: n.lv === "region" ? "#fbfcfd" : "none" }, c);
          var t = svg("text", { x: x + 6, y: y - HEAD + 13, "class": "tkx-hg-head", fill: color(n),
                                "font-size": FONT }, c);
          t.textContent = "\u2212 " + n.l.split("\n")[0] + "  (" + n.n + (n.n === 1 ? " op)" : " ops)");
          t.setAttribute("data-hg-toggle", id);
          if (n.k) { t.setAttribute("data-tkx-key", n.k); }
          svg("rect", { x: x, y: y - HEAD, width: p.width, height: p.height + HEAD, "class": "tkx-hg-minibox",
                        fill: "none", stroke: color(n) }, miniG);
          return;
        }
        shown += 1;
        var cls = "tkx-hg-node tkx-gn tkx-hg-" + n.t + (n.t === "c" ? " tkx-hg-lv-" + n.lv : "");
        var ng = svg("g", { "class": cls, "data-id": id, transform: "translate(" + x + "," + y + ")" }, nodes);
        if (n.k) ng.setAttribute("data-tkx-key", n.k);
        if (n.i) ng.setAttribute("data-tkx-ids", n.i);
        if (n.m) ng.setAttribute("data-tkx-module", n.m);
        if (n.g) ng.setAttribute("data-tkx-group", n.g);
        var title = svg("title", {}, ng);
        title.textContent = n.t === "c" ? n.l.replace(/\n/g, " ") + " - click to expand" : n.l.replace(/\n/g, " ");
        var fill = n.t === "c" ? "#ffffff" : (n.t === "op" ? "#f6f8fa" : "#fff8e1");
        svg("rect", { width: p.width, height: p.height, rx: n.t === "c" ? 6 : 4, fill: fill,
                      stroke: n.t === "op" || n.t === "c" ? color(n) : "#9a6700",
                      "stroke-width": n.t === "c" ? 2 : 1, "stroke-dasharray": n.lv === "chunk" ? "4 3" : "" }, ng);
        lines(n).forEach(function (s, i) {
          var t = svg("text", { x: PAD, y: PAD + 10 + i * LINE, "font-size": FONT,
                                "class": i ? "tkx-hg-sub" : "tkx-hg-label" }, ng);
          t.textContent = s;
        });
        svg("rect", { x: x, y: y, width: p.width, height: p.height, fill: color(n), opacity: 0.5 }, miniG);
      });
      g.edges().forEach(function (e) {
        var d = g.edge(e), pts = d.points || [];
        if (!pts.length) return;
        var path = "M" + pts.map(function (q) { return q.x.toFixed(1) + "," + q.y.toFixed(1); }).join("L");
        svg("path", { d: path, "class": "tkx-hg-edge", "stroke-width": Math.min(1 + d.count / 6, 4).toFixed(2) },
            edges);
        if (pts.length > 1) {     // the arrow head: a triangle along the last segment
          var q = pts[pts.length - 1], r = pts[pts.length - 2];
          var dx = q.x - r.x, dy = q.y - r.y, len = Math.sqrt(dx * dx + dy * dy) || 1;
          var ux = dx / len, uy = dy / len;
          var head = [[q.x, q.y], [q.x - 8 * ux - 4 * uy, q.y - 8 * uy + 4 * ux], [q.x - 8 * ux + 4 * uy, q.y - 8 * uy - 4 * ux]];
          svg("path", { d: "M" + head.map(function (h) { return h[0].toFixed(1) + "," + h[1].toFixed(1); }).join("L") + "Z",
                        "class": "tkx-hg-arrow" }, edges);
        }
        if (d.count > 1) {
          var m = d.x !== undefined ? { x: d.x, y: d.y } : pts[Math.floor(pts.length / 2)];
          var t = svg("text", { x: m.x, y: m.y + 4, "class": "tkx-hg-count", "font-size": 11,
                                "text-anchor": "middle" }, edges);
          t.textContent = String(d.count);
        }
      });
      var gg = g.graph();
      size = { w: gg.width || 1, h: gg.height || 1 };
      var top = 0;
      boxes.forEach(function (b) { if (b.open) top = Math.min(top, b.y - HEAD); });
      mini.setAttribute("viewBox", "0 " + top + " " + size.w + " " + (size.h - top));
      info.textContent = shown + " boxes drawn \u00b7 " + data.ops + " ops";
      root.setAttribute("data-tkx-hg-shown", String(shown));
      if (before) {               // keep the clicked box where it was on screen, then bring it into view
        var after = screenOf(anchor);
        if (after) { view.x += before.x - after.x; view.y += before.y - after.y; }
        var b = boxOf(anchor), W = stage.clientWidth || 800, H = stage.clientHeight || 500;
        if (b) {
          var left = view.k * b.x + view.x, top = view.k * (b.y - HEAD) + view.y;
          var right = left + view.k * b.w, bottom = top + view.k * (b.h + HEAD);
          if (right > W - 8) view.x -= Math.min(right - W + 8, left - 8);
          if (bottom > H - 8) view.y -= Math.min(bottom - H + 8, top - 8);
          if (left < 8) view.x += 8 - left;
          if (top < 8) view.y += 8 - top;
        }
      }
      apply();
      mark();
    }


    function boxOf(id) {
      for (var i = 0; i < boxes.length; i++) if (boxes[i].id === id) return boxes[i];
      return null;
    }
    function screenOf(id) {
      var b = boxOf(id);
      return b ? { x: view.k * b.x + view.x, y: view.k * b.y + view.y } : null;
    }
    function apply() {
      port.setAttribute("transform", "translate(" + view.x.toFixed(2) + "," + view.y.toFixed(2) + ") scale(" +
                        view.k.toFixed(4) + ")");
      root.setAttribute("data-tkx-hg-zoom", view.k.toFixed(3));
      var W = stage.clientWidth || 800, H = stage.clientHeight || 500;
      miniView.setAttribute("x", (-view.x / view.k).toFixed(1));
      miniView.setAttribute("y", (-view.y / view.k).toFixed(1));
      miniView.setAttribute("width", (W / view.k).toFixed(1));
      miniView.setAttribute("height", (H / view.k).toFixed(1));
    }
    function zoomAt(k, cx, cy) {
      var W = stage.clientWidth || 800, H = stage.clientHeight || 500;
      if (cx === undefined) { cx = W / 2; cy = H / 2; }
      k = Math.max(0.05, Math.min(4, k));
      view.x = cx - (cx - view.x) * k / view.k;
      view.y = cy - (cy - view.y) * k / view.k;
      view.k = k;
      apply();
    }
    // The first view: labels stay readable (zoom >= 0.95, so 12 px labels draw at >= 11.4 px); a graph
    // wider than the box starts at its top left and pans.
    function fit(whole) {
      var W = stage.clientWidth || 800, H = stage.clientHeight || 500;
      var k = Math.min(W / (size.w + 10), H / (size.h + HEAD + 10), 1);
      if (!whole) k = Math.max(k, 0.95);
      view.k = k;
      view.x = size.w * k < W ? (W - size.w * k) / 2 : 4;
      view.y = 4 + HEAD * k;
      if (!whole && size.w * k >= W) {   // too wide: start at the first open box (or the first box) drawn
        var first = null;
        boxes.forEach(function (b) { if (!first || (b.open && !first.open) || (b.open === first.open && b.y < first.y)) first = b; });
        if (first) { view.x = 8 - k * first.x; view.y = 8 - k * (first.y - (first.open ? HEAD : 0)); }
      }
      apply();
    }
    function centerOn(id) {
      var b = boxOf(id);
      if (!b) return;
      var W = stage.clientWidth || 800, H = stage.clientHeight || 500;
      if (view.k < 0.95) view.k = 1;
      view.x = W / 2 - view.k * (b.x + b.w / 2);
      view.y = H / 2 - view.k * (b.y + b.h / 2);
      apply();
    }
    function reveal(id) {             // open every ancestor of id so it is drawn
      var n = byId[byId[id] ? byId[id].p : ""];
      while (n) { open[n.id] = true; n = byId[n.p]; }
    }
    function mark() {
      port.querySelectorAll(".tkx-hg-found").forEach(function (e) { e.classList.remove("tkx-hg-found"); });
      var cur = found[foundAt];
      if (cur) {
        var e = port.querySelector('[data-id="' + cssEsc(visible(cur)) + '"]');
        if (e) e.classList.add("tkx-hg-found");
      }
      port.querySelectorAll(".tkx-hl-ext").forEach(function (e) { e.classList.remove("tkx-hl-ext"); });
      if (marked.length) {
        port.querySelectorAll(".tkx-hg-node").forEach(function (e) {
          var k = e.getAttribute("data-tkx-key"), ids = (e.getAttribute("data-tkx-ids") || "").split(" ");
          if (e.getAttribute("data-tkx-group")) ids.push("grp:" + e.getAttribute("data-tkx-group"));
          for (var i = 0; i < marked.length; i++) {
            if (k === marked[i] || ids.indexOf(marked[i]) >= 0) { e.classList.add("tkx-hl-ext"); break; }
          }
        });
      }
    }
    function cssEsc(s) { return s.replace(/["\\]/g, "\\$&"); }

    function runSearch(step) {
      var q = search.value.trim().toLowerCase();
      if (!q) { found = []; foundAt = -1; hits.textContent = ""; mark(); return; }
      var exact = [], part = [];
      data.nodes.forEach(function (n) {
        if (!n.s) return;
        var words = n.s.split(/\s+/);
        if (words.indexOf(q) >= 0) exact.push(n.id);
        else if (n.s.indexOf(q) >= 0) part.push(n.id);
      });
      var all = exact.concat(part);
      if (String(all) !== String(found)) { found = all; foundAt = -1; }
      hits.textContent = found.length ? found.length + (found.length === 1 ? " match" : " matches") : "no match";
      if (!found.length) { mark(); return; }
      if (step) {
        foundAt = (foundAt + 1) % found.length;
        var id = found[foundAt];
        reveal(id);
        draw(null);
        centerOn(visible(id));
        hits.textContent = (foundAt + 1) + " of " + found.length;
      }
      mark();
    }
    search.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter") { ev.preventDefault(); runSearch(true); }
    });
    search.addEventListener("input", function () { runSearch(false); });

    var dragged = false;
    main.addEventListener("click", function (ev) {
      var t = ev.target;
      if (dragged) { dragged = false; ev.stopPropagation(); return; }
      var tog = t.closest ? t.closest("[data-hg-toggle]") : null;
      if (tog) { var id = tog.getAttribute("data-hg-toggle"); delete open[id]; draw(id); return; }
      var node = t.closest ? t.closest(".tkx-hg-node") : null;
      if (!node) return;
      var nid = node.getAttribute("data-id"), n = byId[nid];
      if (n.t === "c") { open[nid] = true; draw(nid); return; }
      if (opts.onSelect && n.k) opts.onSelect(n.k);
    });
    var drag = null;
    main.addEventListener("mousedown", function (ev) {
      dragged = false;
      if (ev.button !== 0) return;
      drag = { x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y, moved: false };
    });
    window.addEventListener("mousemove", function (ev) {
      if (!drag) return;
      var dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
      view.x = drag.vx + dx;
      view.y = drag.vy + dy;
      apply();
    });
    window.addEventListener("mouseup", function () { dragged = !!(drag && drag.moved); drag = null; });
    main.addEventListener("wheel", function (ev) {
      if (!(ev.ctrlKey || ev.metaKey)) return;
      ev.preventDefault();
      var r = main.getBoundingClientRect();
      zoomAt(view.k * (ev.deltaY < 0 ? 1.15 : 1 / 1.15), ev.clientX - r.left, ev.clientY - r.top);
    }, { passive: false });
    function miniMove(ev) {
      var r = mini.getBoundingClientRect(), vb = mini.viewBox.baseVal;
      var s = Math.max(vb.width / r.width, vb.height / r.height);
      var ox = (r.width - vb.width / s) / 2, oy = (r.height - vb.height / s) / 2;
      var gx = vb.x + (ev.clientX - r.left - ox) * s, gy = vb.y + (ev.clientY - r.top - oy) * s;
      var W = stage.clientWidth || 800, H = stage.clientHeight || 500;
      view.x = W / 2 - view.k * gx;
      view.y = H / 2 - view.k * gy;
      apply();
    }
    var miniDrag = false;
    mini.addEventListener("mousedown", function (ev) { ev.stopPropagation(); miniDrag = true; miniMove(ev); });
    mini.addEventListener("mousemove", function (ev) { if (miniDrag) miniMove(ev); });
    window.addEventListener("mouseup", function () { miniDrag = false; });

    draw(null);
    fit(false);
    return {
      // Light the nodes keyed (or carrying in data-tkx-ids) one of ``keys`` (the widget's highlight).
      highlight: function (keys) { marked = keys || []; mark(); },
      expand: function (id) { if (byId[id]) { reveal(id); open[id] = true; draw(id); } },
      search: function (q) { search.value = q; runSearch(true); return found.length; },
      shown: function () { return boxes.filter(function (b) { return !b.open; }).length; },
    };
  };
})();
