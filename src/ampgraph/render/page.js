// ampgraph's interactive page: the data is in #ampgraph-data (JSON); everything the page shows
// of it goes through textContent or the canvas, never innerHTML, because module names are data.
(function () {
  "use strict";
  const t0 = performance.now();
  const DATA = JSON.parse(document.getElementById("ampgraph-data").textContent);
  const C = DATA.colours;
  const ROW = 26, BOX_W = 420, INDENT = 16, LEFT = 16;

  // -- DOM helpers ---------------------------------------------------------------------------
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    for (const kid of kids) if (kid != null) e.append(kid);
    return e;
  }
  function bytes(n) {
    if (n == null) return "? bytes";
    const units = ["B", "KiB", "MiB", "GiB"];
    let k = 0; while (n >= 1024 && k < 3) { n /= 1024; k++; }
    return (k ? n.toFixed(1) : String(n)) + " " + units[k];
  }
  function short(dtype) {
    return ({float32: "fp32", bfloat16: "bf16", float16: "fp16", float64: "fp64"})[dtype] ||
      (dtype == null ? "-" : dtype);
  }
  function opName(op) { return op.replace(/^aten\./, "").replace(/\.default$/, ""); }
  function edgeColour(dtype) { return C.edges[C.families[dtype] || "other"] || C.edges.other; }

  // -- the page's frame ------------------------------------------------------------------------
  const settingSel = el("select", {id: "setting", "aria-label": "setting shown"});
  const compareSel = el("select", {id: "compare", "aria-label": "compare with setting"});
  compareSel.append(el("option", {value: "-1", text: "nothing"}));
  DATA.settings.forEach((s, k) => {
    settingSel.append(el("option", {value: String(k), text: `${k + 1}. ${s.name}`, title: s.caption}));
    compareSel.append(el("option", {value: String(k), text: `${k + 1}. ${s.name}`}));
  });
  const search = el("input", {id: "search", type: "search", placeholder: "search module, op, node  (/)",
    "aria-label": "search by module path, op or node name", autocomplete: "off"});
  const count = el("span", {id: "count", "aria-live": "polite"});
  const foldBtn = el("button", {id: "fold-all", type: "button", text: "fold all"});
  const unfoldBtn = el("button", {id: "unfold-all", type: "button", text: "unfold all"});
  const fitBtn = el("button", {id: "fit", type: "button", text: "fit"});
  const header = el("header", {},
    el("h1", {text: DATA.title}),
    el("label", {text: "setting "}, settingSel),
    el("label", {text: "changes vs "}, compareSel),
    search, count, foldBtn, unfoldBtn, fitBtn);
  const canvas = el("canvas", {id: "graph", tabindex: "0", role: "application",
    "aria-label": "dtype-flow graph: arrow keys move, Enter folds or unfolds, / searches"});
  const view = el("div", {id: "view"}, canvas);
  const results = el("ul", {id: "results"});
  const panel = el("div", {id: "details", "aria-live": "polite"});
  const legend = el("div", {class: "legend"});
  for (const [name, key] of [["lower precision", "lower_precision_fp"], ["fp32", "fp32"],
    ["promote", "promote"], ["no policy", "none"]]) {
    legend.append(el("span", {}, el("span", {class: "swatch",
      style: `background:${C.fills[key]};border-color:${C.borders[key]}`}), name));
  }
  for (const fam of ["fp32", "bf16", "fp16", "int"]) {
    legend.append(el("span", {}, el("span", {class: "swatch",
      style: `background:${C.edges[fam]};border-color:${C.edges[fam]}`}), fam + " edge"));
  }
  legend.append(el("span", {}, el("span", {class: "swatch",
    style: `background:transparent;border:2px solid ${C.promotion}`}), "promotion"));
  legend.append(el("span", {}, el("span", {class: "swatch",
    style: "background:#d63384;border-color:#d63384;width:5px"}), "differs from compared"));
  const keys = el("p", {class: "keys", text: "Keys: ↑ ↓ move · → unfold · ← fold / parent · " +
    "Enter toggle · / search · n / N next match · ] / [ next change · + / − zoom · 0 fit · " +
    "1–9 setting · drag pans, Ctrl+wheel zooms"});
  const aside = el("aside", {"aria-label": "details"},
    legend, panel, results, keys);
  document.body.append(header, el("main", {}, view, aside));

  // -- the model tree of one setting ------------------------------------------------------------
  let S = null;         // the setting shown: {nodes, byName, groups, root}
  let other = null;     // the compared setting's {name -> sig}, or null
  const open = new Set();   // open group paths, kept across settings
  let rows = [], rowOfNode = null, edges = [], selected = null, matches = [], matchAt = -1;
  let changedSet = new Set();

  function numericTail(path) { return /\.\d+$/.test(path) || /^\d+$/.test(path); }

  function buildTree(k) {
    const s = DATA.settings[k];
    const root = {path: "", name: s.model, kids: [], parent: null, n: 0, casts: 0, changed: 0,
      bytes: 0, sub: 0, depth: -1};
    const groups = new Map([["", root]]);
    function group(path) {
      let g = groups.get(path);
      if (g) return g;
      const cut = path.lastIndexOf(".");
      const parent = group(cut < 0 ? "" : path.slice(0, cut));
      g = {path, name: cut < 0 ? path : path.slice(cut + 1), kids: [], parent, n: 0, casts: 0,
        changed: 0, bytes: 0, sub: 0, depth: parent.depth + 1};
      parent.kids.push({g}); parent.sub++;
      groups.set(path, g);
      return g;
    }
    const byName = new Map(), state = [];
    const SOURCES = new Set(["parameter", "buffer", "constant"]);
    function add(node, i, g) {
      for (let a = g; a; a = a.parent) {
        a.n++; a.casts += node.casts.length;
        for (const c of node.casts) a.bytes += c.bytes || 0;
      }
    }
    // Groups open in the order the forward enters them: the parameters (graph inputs, all
    // first) join their module afterwards, at its top.
    s.nodes.forEach((node, i) => {
      byName.set(node.name, i);
      if (SOURCES.has(node.kind)) { state.push(i); return; }
      const g = group(node.group);
      g.kids.push({i}); add(node, i, g);
    });
    const firsts = new Map();
    for (const i of state) {
      const g = group(s.nodes[i].group);
      if (!firsts.has(g)) firsts.set(g, []);
      firsts.get(g).push({i}); add(s.nodes[i], i, g);
    }
    for (const [g, list] of firsts) g.kids.unshift(...list);
    return {k, s, nodes: s.nodes, byName, groups, root};
  }

  function firstFold() {
    // As the SVG: a layer of a repeated stack (a numbered child) and a leaf module are shut.
    for (const g of S.groups.values()) {
      if (g === S.root) continue;
      const layer = numericTail(g.path) && g.parent.kids.filter(x => x.g).length > 1;
      if (!(layer || g.sub === 0) || DATA.unfold) open.add(g.path);
    }
  }

  function markChanges() {
    changedSet = new Set();
    for (const g of S.groups.values()) g.changed = 0;
    if (!other) return;
    S.nodes.forEach((node, i) => {
      if (other.get(node.name) === node.sig) return;
      changedSet.add(i);
      for (let g = S.groups.get(node.group); g; g = g.parent) g.changed++;
    });
  }

  // -- rows and edges of what is unfolded -------------------------------------------------------
  function layout() {
    rows = []; rowOfNode = new Int32Array(S.nodes.length);
    function shut(g, r) {
      for (const kid of g.kids) if (kid.g) shut(kid.g, r); else rowOfNode[kid.i] = r;
    }
    function walk(g, depth) {
      for (const kid of g.kids) {
        const r = rows.length;
        if (kid.g) {
          const row = {g: kid.g, depth, end: r};
          rows.push(row);
          if (open.has(kid.g.path)) { walk(kid.g, depth + 1); row.end = rows.length - 1; }
          else shut(kid.g, r);
        } else {
          rows.push({i: kid.i, depth, end: r});
          rowOfNode[kid.i] = r;
        }
      }
    }
    walk(S.root, 0);
    const seen = new Map();
    edges = [];
    S.nodes.forEach((node, i) => {
      const b = rowOfNode[i];
      for (const [src, dtype] of node.inputs) {
        const p = S.byName.get(src);
        if (p === undefined) continue;
        const a = rowOfNode[p];
        if (a === b) continue;
        const key = a * 1e6 + b;
        const fam = C.families[dtype] || "other";
        const have = seen.get(key);
        if (have && have.fam === fam) continue;
        const e = {a: Math.min(a, b), b: Math.max(a, b), dtype, fam};
        seen.set(key, e); edges.push(e);
      }
    });
  }

  // -- drawing: only the rows and edges in view ---------------------------------------------------
  const ctx = canvas.getContext("2d");
  const HIT = getComputedStyle(document.body).getPropertyValue("--hit").trim() || "#fff3b0";
  let scale = 1, tx = 0, ty = 0, width = 0, height = 0, pending = false;
  function resize() {
    const r = canvas.getBoundingClientRect(), dpr = window.devicePixelRatio || 1;
    width = r.width; height = r.height;
    canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr);
    draw();
  }
  function draw() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; paint(); });
  }
  function boxX(depth) { return LEFT + depth * INDENT; }
  function label(row) {
    if (row.g) {
      const g = row.g, type = DATA.modules[g.path];
      const sign = open.has(g.path) ? "▾ " : "▸ ";
      let text = sign + g.name + (type ? "  " + type : "") + `  · ${g.n} nodes`;
      if (g.casts) text += `, ${g.casts} casts`;
      if (g.changed) text += `, ${g.changed} differ`;
      return text;
    }
    const n = S.nodes[row.i];
    if (n.kind !== "op") return `${(n.target || n.name).split(".").pop()}  ${n.kind} → ${n.outputs.map(short).join(", ")}`;
    let text = opName(n.op) + "  → " + n.outputs.map(short).join(", ");
    if (n.casts.length) text += `  (casts ${n.casts.map(c => c.node).join(", ")}: ` +
      `${short(n.casts[0].from)}→${short(n.casts[0].to)})`;
    return text;
  }
  function paint() {
    const started = performance.now();
    paintBody();
    if (window.ampgraph) window.ampgraph.paintMs = performance.now() - started;
  }
  function paintBody() {
    const dpr = window.devicePixelRatio || 1;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = C.background; ctx.fillRect(0, 0, width, height);
    ctx.setTransform(dpr * scale, 0, 0, dpr * scale, dpr * tx, dpr * ty);
    const first = Math.max(0, Math.floor(-ty / scale / ROW) - 1);
    const last = Math.min(rows.length - 1, Math.ceil((height - ty) / scale / ROW) + 1);
    // Frames of open groups that reach into view.
    ctx.lineWidth = 1.5; ctx.strokeStyle = C.groupBorder;
    for (let r = 0; r < rows.length && r <= last; r++) {
      const row = rows[r];
      if (!row.g || row.end < first || row.end === r) { if (row.g && row.end < first) r = row.end; continue; }
      const x = boxX(row.depth) - 6;
      ctx.beginPath(); ctx.moveTo(x, r * ROW + ROW / 2); ctx.lineTo(x, (row.end + 1) * ROW - 4);
      ctx.stroke();
    }
    // Edges, on the right of the boxes, bowed by how far they go. An edge with one end out of
    // view is a short stub pointing the way it goes (its other end is a click on the node
    // away); one with both ends out of view is not drawn: unfolded, thousands of saved
    // activations cross from the forward to the backward, and rastering curves thousands of
    // pixels long is what made a frame slow, not the drawing commands.
    const top = -ty / scale, bottom = (height - ty) / scale;
    for (const e of edges) {
      if (e.b < first || e.a > last) continue;
      const ya = e.a * ROW + ROW / 2, yb = e.b * ROW + ROW / 2;
      const inA = ya >= top && ya <= bottom, inB = yb >= top && yb <= bottom;
      if (!inA && !inB) continue;
      ctx.strokeStyle = edgeColour(e.dtype);
      ctx.lineWidth = e.fam === "int" || e.fam === "other" ? 1 : 1.8;
      ctx.setLineDash(e.fam === "int" ? [4, 3] : []);
      ctx.beginPath();
      if (inA && inB) {
        const xa = boxX(rows[e.a].depth) + BOX_W, xb = boxX(rows[e.b].depth) + BOX_W;
        const bow = 14 + Math.min(400, 10 * Math.sqrt(e.b - e.a));
        ctx.moveTo(xa, ya); ctx.bezierCurveTo(xa + bow, ya, Math.max(xa, xb) + bow, yb, xb, yb);
      } else {
        const y = inA ? ya : yb, x = boxX(rows[inA ? e.a : e.b].depth) + BOX_W;
        const lane = 10 + (e.b - e.a) % 5 * 4, dy = inA ? 8 : -8;
        ctx.moveTo(x, y); ctx.lineTo(x + lane, y); ctx.lineTo(x + lane, y + dy);
        ctx.lineTo(x + lane - 3, y + dy - Math.sign(dy) * 3);
      }
      ctx.stroke();
    }
    ctx.setLineDash([]);
    ctx.font = "12px system-ui, sans-serif"; ctx.textBaseline = "middle";
    for (let r = first; r <= last; r++) paintRow(r);
  }
  function paintRow(r) {
    const row = rows[r], x = boxX(row.depth), y = r * ROW + 3, h = ROW - 6;
    let fill, border, lw = 1;
    const node = row.g ? null : S.nodes[row.i];
    if (row.g) { fill = C.group; border = C.groupBorder; }
    else { fill = C.fills[node.style] || C.fills.none; border = C.borders[node.style] || C.borders.none; }
    if (node && node.promotion) { border = C.promotion; lw = 3; }
    if (matchSet.has(r)) fill = HIT;
    ctx.fillStyle = fill; ctx.strokeStyle = border; ctx.lineWidth = lw;
    ctx.beginPath(); ctx.roundRect(x, y, BOX_W, h, 4); ctx.fill(); ctx.stroke();
    const differs = row.g ? row.g.changed > 0 : changedSet.has(row.i);
    if (differs) {  // a bar at the left: differs from the compared setting
      ctx.fillStyle = "#d63384"; ctx.fillRect(x - 5, y - 1, 4, h + 2);
    }
    if (selected === r) {
      ctx.strokeStyle = C.text; ctx.lineWidth = 2.5;
      ctx.strokeRect(x - 2, y - 1, BOX_W + 4, h + 2);
    }
    if (scale * 12 < 5) return;  // text too small to read: boxes only
    ctx.fillStyle = C.text;
    ctx.save(); ctx.beginPath(); ctx.rect(x, y, BOX_W - 4, h); ctx.clip();
    ctx.fillText(label(row), x + 6, y + h / 2);
    ctx.restore();
  }

  // -- moving around -----------------------------------------------------------------------------
  function clampView() {
    const total = rows.length * ROW * scale;
    ty = Math.min(40, Math.max(ty, Math.min(0, height - total - 40)));
  }
  function zoom(factor, cx = width / 2, cy = height / 2) {
    const s = Math.min(3, Math.max(0.05, scale * factor));
    tx = cx - (cx - tx) * s / scale; ty = cy - (cy - ty) * s / scale; scale = s;
    clampView(); draw();
  }
  function fit() {
    scale = Math.min(1.4, Math.max(0.3, (width - 20) / (BOX_W + 260)));
    tx = 10; ty = 10; draw();
  }
  function reveal(r) {
    const y = r * ROW * scale + ty;
    if (y < 20 || y > height - 40) ty = height / 3 - r * ROW * scale;
    const x = boxX(rows[r].depth) * scale + tx;
    if (x < 0 || x + BOX_W * scale > width) tx = 20 - boxX(rows[r].depth) * scale;
    clampView();
  }
  function rowAt(px, py) {
    const r = Math.floor((py - ty) / scale / ROW);
    if (r < 0 || r >= rows.length) return -1;
    const x = (px - tx) / scale, bx = boxX(rows[r].depth);
    return x >= bx && x <= bx + BOX_W ? r : -1;
  }

  // -- what the panel says ------------------------------------------------------------------------
  function dl(pairs) {
    const list = el("dl");
    for (const [k, v] of pairs) if (v != null && v !== "") list.append(el("dt", {text: k}), el("dd", {}, v));
    return list;
  }
  function showNode(i) {
    const n = S.nodes[i];
    panel.replaceChildren();
    panel.append(el("h2", {text: opName(n.op)}));
    panel.append(dl([
      ["node", n.name], ["backward of", n.forward || null], ["module", n.module || n.group || "(model)"],
      ["module type", DATA.modules[n.module] || null], ["kind", n.kind], ["target", n.target],
      ["policy", n.policy || "none"], ["why", n.reason], ["region", n.region],
      ["check", n.agree == null ? null : n.agree ? "the dispatcher agrees" : "DISAGREES with the dispatcher"],
      ["error", n.error],
    ]));
    panel.append(el("h3", {text: "dtypes in"}));
    const ins = el("ul");
    for (const [src, d] of n.inputs) ins.append(el("li", {text: `${src}: ${d}`}));
    if (!n.inputs.length) ins.append(el("li", {text: "none"}));
    panel.append(ins, el("h3", {text: "dtypes out"}));
    const outs = el("ul");
    n.outputs.forEach((d, k) => {
      const shape = n.shapes && n.shapes[k] ? ` [${n.shapes[k].join(", ")}]` : "";
      outs.append(el("li", {text: `${d}${shape}`}));
    });
    panel.append(outs);
    if (n.casts.length) {
      panel.append(el("h3", {text: "casts autocast inserts"}));
      const cs = el("ul");
      for (const c of n.casts) cs.append(el("li", {text: `${c.node}: ${c.from} → ${c.to}, ${bytes(c.bytes)}`}));
      panel.append(cs);
    }
    if (n.promotion) panel.append(el("h3", {text: "promotion"}),
      el("p", {text: `${(n.promotion.inputs || []).join(" + ")} → ${n.promotion.to}`}));
    if (n.headroom != null) panel.append(el("h3", {text: "value-range headroom"}),
      el("p", {text: `${n.headroom >= 0 ? "+" : ""}${n.headroom.toFixed(2)} decades below the dtype's largest value`}));
    if (n.gradient) panel.append(el("h3", {text: "gradient dtype"}), el("p", {text: n.gradient.join(", ")}));
    if (changedSet.has(i)) {
      const o = DATA.settings[+compareSel.value], j = o.nodes.find(x => x.name === n.name);
      panel.append(el("h3", {text: `in ${o.name}`}), el("p", {class: "diff", text: j
        ? `policy ${j.policy || "none"}, out ${j.outputs.join(", ")}, casts ${j.casts.length ? j.casts.map(c => `${c.node} ${short(c.from)}→${short(c.to)}`).join("; ") : "none"}${j.promotion ? ", promotes" : ""}`
        : "no node of this name"}));
    }
  }
  function showGroup(g) {
    panel.replaceChildren(el("h2", {text: g.path || S.s.model}),
      dl([["module type", DATA.modules[g.path] || null], ["nodes", String(g.n)],
        ["casts", `${g.casts} (${bytes(g.bytes)})`], ["differ", other ? String(g.changed) : null],
        ["state", open.has(g.path) ? "unfolded (← or Enter folds)" : "folded (→ or Enter unfolds)"]]));
  }
  function select(r, center) {
    selected = r;
    if (r >= 0 && r < rows.length) {
      const row = rows[r];
      if (row.g) showGroup(row.g); else showNode(row.i);
      if (center) reveal(r);
    }
    draw();
  }

  // -- folding, searching, settings --------------------------------------------------------------
  function keyOf(r) { const row = rows[r]; return row ? (row.g ? "g:" + row.g.path : "n:" + S.nodes[row.i].name) : null; }
  function rowOfKey(key) {
    if (!key) return -1;
    if (key.startsWith("n:")) { const i = S.byName.get(key.slice(2)); return i === undefined ? -1 : rowOfNode[i]; }
    return rows.findIndex(row => row.g && "g:" + row.g.path === key);
  }
  function relayout(keepKey) {
    const key = keepKey === undefined ? keyOf(selected) : keepKey;
    layout(); refreshMatches(false);
    selected = rowOfKey(key);
    if (selected >= 0) select(selected, true); else draw();
  }
  function toggle(g, state) {
    if (state === undefined) state = !open.has(g.path);
    if (state) open.add(g.path); else open.delete(g.path);
    relayout("g:" + g.path);
  }
  function openTo(i) {
    for (let g = S.groups.get(S.nodes[i].group); g && g !== S.root; g = g.parent) open.add(g.path);
  }
  let matchSet = new Set();
  function refreshMatches(reset) {
    const q = search.value.trim().toLowerCase();
    if (reset) { matchAt = -1; results.replaceChildren(); }
    matches = [];
    if (q) {
      const hay = S.hay || (S.hay = S.nodes.map(n => `${n.name}\n${n.op}\n${n.group}`.toLowerCase()));
      for (let i = 0; i < hay.length; i++) if (hay[i].includes(q)) matches.push(i);
    }
    matchSet = new Set(matches.map(i => rowOfNode[i]));
    count.textContent = q ? `${matches.length} match${matches.length === 1 ? "" : "es"}` : "";
    if (reset) {
      for (const i of matches.slice(0, 40)) {
        const n = S.nodes[i];
        const b = el("button", {type: "button", text: `${n.group || "(model)"} · ${opName(n.op)} · ${n.name}`});
        b.addEventListener("click", () => goTo(i));
        results.append(el("li", {}, b));
      }
      if (matches.length > 40) results.append(el("li", {text: `… and ${matches.length - 40} more (n: next)`}));
    }
    draw();
  }
  function goTo(i) { openTo(i); relayout("n:" + S.nodes[i].name); canvas.focus({preventScroll: true}); }
  function nextMatch(step) {
    if (!matches.length) return;
    matchAt = (matchAt + step + matches.length) % matches.length;
    count.textContent = `${matchAt + 1} of ${matches.length}`;
    goTo(matches[matchAt]);
  }
  function nextChange(step) {
    if (!changedSet.size) return;
    const list = [...changedSet].sort((a, b) => a - b);
    const cur = selected >= 0 && rows[selected] && !rows[selected].g ? rows[selected].i : (step > 0 ? -1 : S.nodes.length);
    const i = step > 0 ? (list.find(x => x > cur) ?? list[0]) : ([...list].reverse().find(x => x < cur) ?? list[list.length - 1]);
    goTo(i);
  }
  function setSetting(k) {
    const key = keyOf(selected);
    S = buildTree(k); settingSel.value = String(k);
    const c = +compareSel.value;
    other = c >= 0 && c !== k ? new Map(DATA.settings[c].nodes.map(n => [n.name, n.sig])) : null;
    markChanges(); layout(); refreshMatches(true);
    selected = rowOfKey(key);
    if (selected >= 0) select(selected, false); else { panel.replaceChildren(); draw(); }
  }

  // -- events ------------------------------------------------------------------------------------
  let drag = null;
  canvas.addEventListener("pointerdown", e => {
    drag = {x: e.clientX, y: e.clientY, tx, ty, moved: false};
    canvas.setPointerCapture(e.pointerId);
  });
  canvas.addEventListener("pointermove", e => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 4) { drag.moved = true; canvas.classList.add("dragging"); }
    if (drag.moved) { tx = drag.tx + dx; ty = drag.ty + dy; clampView(); draw(); }
  });
  canvas.addEventListener("pointerup", e => {
    const was = drag; drag = null; canvas.classList.remove("dragging");
    if (!was || was.moved) return;
    const rect = canvas.getBoundingClientRect();
    const r = rowAt(e.clientX - rect.left, e.clientY - rect.top);
    if (r < 0) return;
    canvas.focus({preventScroll: true});
    if (rows[r].g) { selected = r; toggle(rows[r].g); } else select(r, false);
  });
  canvas.addEventListener("wheel", e => {
    e.preventDefault();
    const rect = canvas.getBoundingClientRect();
    if (e.ctrlKey || e.metaKey) zoom(Math.exp(-e.deltaY / 300), e.clientX - rect.left, e.clientY - rect.top);
    else { tx -= e.deltaX; ty -= e.deltaY; clampView(); draw(); }
  }, {passive: false});
  canvas.addEventListener("keydown", e => {
    const row = rows[selected];
    const k = e.key;
    if (k === "ArrowDown" || k === "j") select(Math.min(rows.length - 1, selected + 1), true);
    else if (k === "ArrowUp" || k === "k") select(Math.max(0, selected - 1), true);
    else if (k === "ArrowRight" && row && row.g) toggle(row.g, true);
    else if (k === "ArrowLeft" && row) {
      if (row.g && open.has(row.g.path)) toggle(row.g, false);
      else { const g = row.g ? row.g.parent : S.groups.get(S.nodes[row.i].group);
        if (g && g !== S.root) select(rowOfKey("g:" + g.path), true); }
    } else if ((k === "Enter" || k === " ") && row && row.g) toggle(row.g);
    else if (k === "+" || k === "=") zoom(1.25);
    else if (k === "-" || k === "_") zoom(0.8);
    else if (k === "0") fit();
    else if (k === "n") nextMatch(1);
    else if (k === "N") nextMatch(-1);
    else if (k === "]") nextChange(1);
    else if (k === "[") nextChange(-1);
    else if (/^[1-9]$/.test(k) && +k <= DATA.settings.length) setSetting(+k - 1);
    else if (k === "PageDown") { ty -= height * 0.8; clampView(); draw(); }
    else if (k === "PageUp") { ty += height * 0.8; clampView(); draw(); }
    else return;
    e.preventDefault();
  });
  document.addEventListener("keydown", e => {
    if (e.key === "/" && document.activeElement !== search) { e.preventDefault(); search.focus(); search.select(); }
  });
  search.addEventListener("input", () => refreshMatches(true));
  search.addEventListener("keydown", e => {
    if (e.key === "Enter") { e.preventDefault(); nextMatch(e.shiftKey ? -1 : 1); }
    else if (e.key === "Escape") canvas.focus();
  });
  settingSel.addEventListener("change", () => setSetting(+settingSel.value));
  compareSel.addEventListener("change", () => setSetting(S.k));
  foldBtn.addEventListener("click", () => { open.clear(); relayout(); });
  unfoldBtn.addEventListener("click", () => { for (const g of S.groups.keys()) open.add(g); relayout(); });
  fitBtn.addEventListener("click", fit);
  new ResizeObserver(resize).observe(view);

  // -- start ---------------------------------------------------------------------------------------
  if (DATA.settings.length > 1) compareSel.value = "1";
  S = buildTree(0); firstFold();
  setSetting(0);
  const rect = view.getBoundingClientRect(); width = rect.width; height = rect.height;
  fit(); resize();
  // For tests and the benchmark: how long the first picture took, and a few handles.
  window.ampgraph = {
    built: performance.now() - t0,
    rows: () => rows.length,
    nodes: () => S.nodes.length,
    open: path => { const g = S.groups.get(path); if (g) toggle(g, true); return rows.length; },
    unfoldAll: () => { for (const g of S.groups.keys()) open.add(g); relayout(); return rows.length; },
    boxOf: name => {
      const i = S.byName.get(name); if (i === undefined) return null;
      const r = rowOfNode[i], rc = canvas.getBoundingClientRect();
      return {row: r, x: rc.left + tx + (boxX(rows[r].depth) + 40) * scale, y: rc.top + ty + (r + 0.5) * ROW * scale};
    },
    changed: () => changedSet.size,
    selected: () => {
      const row = rows[selected];
      return !row ? null : row.g ? {group: row.g.path, open: open.has(row.g.path)} : {node: S.nodes[row.i].name};
    },
  };
  // Since the navigation began (performance's time origin): the page's whole cost to a reader.
  requestAnimationFrame(() => { window.ampgraph.firstPaint = performance.now(); });
})();
