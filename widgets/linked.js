// tkx linked views (anywidget ES module, no build step).
//
// Model traits (see tkx/explorer/linked.py):
//   data      {ir_rows:[{text,op,region}], cuda_lines:[str], line_ops:{line:op}, stages:[{stage,groups:[...]}],
//              slots:[{buffer,offset,nbytes,first,last,kind}], arena_bytes, num_stages, title}
//   selected  the selection: an op id, "line:<n>" or "slot:<buffer>"; a click sets it and Python
//             answers with `highlight`
//   highlight {op, ops:[str], cuda_lines:[int], arena:{...}|null, slots:[str], group, stage, groups:[str], text}

function h(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// Scroll `row` into view inside its scrolling pane only (scrollIntoView would move the notebook too).
function reveal(row) {
  const pane = row.closest(".tkx-linked-pane");
  if (!pane) return;
  const top = row.offsetTop;  // the pane is position: relative, so this is inside the pane
  if (top < pane.scrollTop + 24 || top > pane.scrollTop + pane.clientHeight - 24) {
    pane.scrollTop = Math.max(0, top - pane.clientHeight / 3);
  }
}

function render({ model, el }) {
  const root = h("div", "tkx-linked");
  el.appendChild(root);

  const select = (op) => {
    if (!op) return;
    model.set("selected", op);
    model.save_changes();
  };

  let irRows = new Map();   // op -> row element
  let cudaRows = [];        // index line-1 -> row element
  let slotEls = new Map();  // buffer -> element
  let groupEls = new Map(); // group id -> element
  let stageEls = [];        // stage index -> element

  function build() {
    const d = model.get("data") || {};
    root.replaceChildren();
    irRows = new Map(); cudaRows = []; slotEls = new Map(); groupEls = new Map(); stageEls = [];

    root.appendChild(h("div", "tkx-linked-title", d.title || ""));
    const info = h("div", "tkx-linked-info", "Click an op in the IR, a CUDA line, an arena block or a group.");
    root.appendChild(info);

    const panes = h("div", "tkx-linked-panes");
    const ir = h("div", "tkx-linked-pane tkx-linked-ir");
    ir.appendChild(h("div", "tkx-linked-head", "IR (after passes)"));
    for (const r of d.ir_rows || []) {
      const row = h("div", "tkx-linked-row" + (r.op ? " tkx-linked-op" : ""), r.text);
      if (r.region) row.classList.add("tkx-linked-" + r.region);
      if (r.op) {
        row.dataset.op = r.op;
        row.title = "op " + r.op;
        row.addEventListener("click", () => select(r.op));
        irRows.set(r.op, row);
      }
      ir.appendChild(row);
    }
    const cuda = h("div", "tkx-linked-pane tkx-linked-cuda");
    cuda.appendChild(h("div", "tkx-linked-head", "CUDA source"));
    const lineOps = d.line_ops || {};
    (d.cuda_lines || []).forEach((text, i) => {
      const n = i + 1;
      const row = h("div", "tkx-linked-row");
      row.appendChild(h("span", "tkx-linked-ln", String(n)));
      row.appendChild(h("span", "tkx-linked-code", text));
      const op = lineOps[String(n)];
      if (op) {
        row.classList.add("tkx-linked-op");
        row.title = "op " + op;
      }
      // every line links: its ops, its group and the arena slots it touches
      row.addEventListener("click", () => select("line:" + n));
      cuda.appendChild(row);
      cudaRows.push(row);
    });
    panes.appendChild(ir);
    panes.appendChild(cuda);
    root.appendChild(panes);

    const bottom = h("div", "tkx-linked-bottom");
    const arena = h("div", "tkx-linked-arena");
    arena.appendChild(h("div", "tkx-linked-head", `arena (${d.arena_bytes || 0} B; x: bytes, y: stages)`));
    const map = h("div", "tkx-linked-arena-map");
    const total = Math.max(1, d.arena_bytes || 1);
    const nst = Math.max(1, d.num_stages || 1);
    for (const s of d.slots || []) {
      const b = h("div", "tkx-linked-slot" + (s.kind === "scratch" ? " tkx-linked-scratch" : ""));
      b.style.left = (100 * s.offset / total) + "%";
      b.style.width = Math.max(0.5, 100 * s.nbytes / total) + "%";
      b.style.top = (100 * s.first / nst) + "%";
      b.style.height = (100 * (s.last - s.first + 1) / nst) + "%";
      b.title = `${s.buffer}: bytes ${s.offset}..${s.offset + s.nbytes}, stages ${s.first}..${s.last}`;
      b.addEventListener("click", () => select("slot:" + s.buffer));
      map.appendChild(b);
      slotEls.set(s.buffer, b);
    }
    arena.appendChild(map);
    const sched = h("div", "tkx-linked-schedule");
    sched.appendChild(h("div", "tkx-linked-head", "schedule (stages, barrier between rows)"));
    for (const st of d.stages || []) {
      const row = h("div", "tkx-linked-stage");
      row.appendChild(h("span", "tkx-linked-stage-n", "stage " + st.stage));
      for (const g of st.groups) {
        const chip = h("span", "tkx-linked-group", `${g.id} ${g.kind}`);
        chip.title = "ops: " + g.ops.join(", ");
        chip.addEventListener("click", () => select(g.anchor));
        row.appendChild(chip);
        groupEls.set(g.id, chip);
      }
      sched.appendChild(row);
      stageEls.push(row);
    }
    bottom.appendChild(arena);
    bottom.appendChild(sched);
    root.appendChild(bottom);
    root.__info = info;
    paint();
  }

  function paint() {
    const hl = model.get("highlight") || {};
    root.querySelectorAll(".tkx-linked-hl").forEach((e) => e.classList.remove("tkx-linked-hl"));
    if (!hl.op && !(hl.cuda_lines || []).length && !(hl.slots || []).length) return;
    if (root.__info) root.__info.textContent = hl.text || hl.op;
    let firstIr = null;
    for (const op of (hl.ops && hl.ops.length ? hl.ops : [hl.op])) {
      const row = irRows.get(op);
      if (row) { row.classList.add("tkx-linked-hl"); firstIr = firstIr || row; }
    }
    if (firstIr) reveal(firstIr);
    let first = null;
    for (const n of hl.cuda_lines || []) {
      const r = cudaRows[n - 1];
      if (r) { r.classList.add("tkx-linked-hl"); first = first || r; }
    }
    if (first) reveal(first);
    for (const b of (hl.slots && hl.slots.length ? hl.slots : (hl.arena ? [hl.arena.buffer] : []))) {
      if (slotEls.get(b)) slotEls.get(b).classList.add("tkx-linked-hl");
    }
    for (const g of hl.groups || []) if (groupEls.get(g)) groupEls.get(g).classList.add("tkx-linked-hl");
    if (hl.stage >= 0 && stageEls[hl.stage]) stageEls[hl.stage].classList.add("tkx-linked-hl");
  }

  model.on("change:data", build);
  model.on("change:highlight", paint);
  build();
  return () => {
    model.off("change:data", build);
    model.off("change:highlight", paint);
  };
}

export default { render };
