// SurgeryWidget front end: lays out the panels, shows what the kernel sends (SVG text and
// HTML already escaped by graphsurgeon), and sends the user's clicks back. It decides nothing:
// every click is an event for the Python session, whose answer comes back as traits (a click
// is marked at once, before that answer, from what the kernel decided and shipped with the
// picture: its `clicks_packed` trait). Its buttons are the kernel's `actions` trait (SurgeryWidget's
// one ACTIONS table): name, label, tooltip, panel, the traits that enable it, and its keyboard
// shortcut.
// One self-contained module (anywidget loads it from a Blob URL): no imports, no network.

function h(tag, attrs = {}, children = []) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") el.textContent = value;
    else if (key === "class") el.className = value;
    else el.setAttribute(key, value);
  }
  for (const child of children) el.append(child);
  return el;
}

// the buttons of one panel, as the kernel's ACTIONS table lists them
function buttons(actions, panel) {
  return actions.filter((a) => a.panel === panel).map((a) => {
    const title = (a.tooltip || a.label) + (a.key ? ` (${a.key})` : "");
    return h("button", { "data-gs-button": a.name, title, text: a.label });
  });
}

// a panel of the right-hand column: a heading that folds it, and its body
function panel(title, body, open = true) {
  const box = h("details", { class: "gs-panel" }, [h("summary", { class: "gs-heading", text: title }), ...body]);
  box.open = open;
  return box;
}

function select(cls, title, options) {
  return h("select", { class: cls, title }, options.map(([value, text]) => h("option", { value, text })));
}

// The smallest a fitted picture gets against its natural size: dot's 9 pt node text at 11 px.
const READABLE = 11 / 12;
// Each widget's open drawers and split sizes, kept while its model lives (a re-render, the
// same widget shown again); the sizes also in the browser's storage, for the next widgets.
const layouts = new WeakMap();
const STORAGE = "graphsurgeon.widget.";
function storedSize(key, fallback) {
  try {
    const value = Number(window.localStorage.getItem(STORAGE + key));
    return value > 0 ? value : fallback;
  } catch (e) {
    return fallback; // storage refused (a sandboxed page): the default
  }
}
function storeSize(key, value) {
  try { window.localStorage.setItem(STORAGE + key, String(value)); } catch (e) { /* not kept */ }
}

// A picture's natural width in CSS pixels, from its box: an <svg> (dot writes its size in
// points), or the box of a tall picture's tiles (which says the width of the picture it holds).
function naturalWidth(box) {
  const width = box.getAttribute("data-gs-width") || box.getAttribute("width") || "";
  const number = parseFloat(width);
  if (!number) return box.getBoundingClientRect().width;
  return width.endsWith("pt") ? number * 4 / 3 : number;
}

function render({ model, el }) {
  const send = (message) => model.send(message);
  const actions = model.get("actions") || [];
  // focusable, so its shortcuts work once clicked; the notebook's own shortcuts (Lumino's,
  // matched from the focused element up) stop at it
  const root = h("div", { class: "gs-widget", tabindex: "0", "data-lm-suppress-shortcuts": "true" });
  el.append(root);

  // -- the toolbar: one line at 1280 px (short labels; the downloads in a menu) --
  const search = h("input", { type: "search", class: "gs-search", placeholder: "search: name, type, op, regex  (/)" });
  const found = h("span", { class: "gs-found gs-muted" });
  const views = select("gs-views", "what the picture shows", [
    ["program", "program"], ["merged", "before/after"], ["split", "before | after"],
  ]);
  // the menus' choices are the kernel's (its `menus` trait): the page keeps no copy
  const menus = model.get("menus") || {};
  const depth = select("gs-depth", "how deep the picture is opened (a large picture asks first)",
    [["", "depth…"], ...(menus.depths || []).map((d) => [d, d])]);
  const overlay = select("gs-overlay", "paint the picture and the tree with values",
    (menus.overlays || []).map((o) => [o, o || "no overlay"]));
  const zoom = [
    h("button", { "data-gs-zoom": "out", title: "zoom out (ctrl+wheel)", text: "−" }),
    h("button", { "data-gs-zoom": "in", title: "zoom in (ctrl+wheel)", text: "+" }),
    h("button", { "data-gs-zoom": "fit", title: "fit to the width (its text kept readable: a wider picture scrolls)", text: "fit" }),
    h("button", { "data-gs-zoom": "selection", title: "zoom to the selection", text: "⊙" }),
  ];
  const save = [
    h("button", { "data-gs-save": "svg", title: "download the picture as SVG", text: "SVG" }),
    h("button", { "data-gs-save": "dot", title: "download the picture as DOT", text: "DOT" }),
  ];
  const more = h("details", { class: "gs-more" }, [
    h("summary", { title: "download the picture", text: "⋯" }), h("div", { class: "gs-more-menu" }, save),
  ]);
  const busy = h("span", { class: "gs-busy" });
  const toolbar = h("div", { class: "gs-toolbar" }, [
    h("b", { text: "graphsurgeon" }), search, ...buttons(actions, "search"), found,
    views, depth, overlay, h("span", { class: "gs-group" }, zoom),
    h("span", { class: "gs-group" }, buttons(actions, "toolbar")), more, busy,
  ]);
  const warningText = h("span", { class: "gs-warning-text" });
  const warning = h("div", { class: "gs-warning", hidden: "" }, [warningText, ...buttons(actions, "warning")]);
  const error = h("div", { class: "gs-error", hidden: "" });

  // -- the module tree (a drawer on the left, opened from the rail) --
  const typeFilter = h("select", { class: "gs-type-filter", title: "show modules of one type" });
  const filter = h("input", { type: "search", class: "gs-filter", placeholder: "filter modules" });
  const tree = h("div", { class: "gs-tree-panel gs-out" });
  const side = h("div", { class: "gs-side" }, [h("div", { class: "gs-filters" }, [typeFilter, filter]), tree]);
  let treeScroll = 0; // where the tree was scrolled when it was closed (see applyLayout)

  // -- the picture (middle), and the replacement the stepper is inside, beside it --
  const caption = h("div", { class: "gs-caption" });
  const legend = h("div", { class: "gs-legend-box gs-out" });
  const viewport = h("div", { class: "gs-viewport gs-picture" });
  const insideTitle = h("div", { class: "gs-caption gs-inside-title" });
  const insideView = h("div", { class: "gs-inside-view gs-picture" });
  const inside = h("div", { class: "gs-inside", hidden: "" }, [insideTitle, insideView]);
  const pictures = h("div", { class: "gs-pictures" }, [viewport, inside]);
  const graph = h("div", { class: "gs-graph" }, [caption, legend, pictures]);

  // -- the panels (a column on the right; the rail shows or hides each) --
  const nan = h("input", { type: "checkbox", class: "gs-nan" });
  const stepper = h("div", { class: "gs-stepper gs-out" });
  const stepPanel = panel("Step", [
    h("div", { class: "gs-actions" }, [...buttons(actions, "stepper"), h("label", {}, [nan, " stop on NaN/Inf"])]),
    stepper,
  ]);
  const copyName = h("button", { class: "gs-copy", title: "copy the selected name", text: "copy name" });
  copyName.addEventListener("click", (event) => {
    event.preventDefault();
    const name = model.get("selected_node") || model.get("selected");
    if (name && navigator.clipboard) navigator.clipboard.writeText(name).catch(() => {});
  });
  const details = h("div", { class: "gs-details gs-out" });
  const detailPanel = panel("Selection", [h("div", { class: "gs-actions" }, [copyName]), details]);
  const picker = h("select", { class: "gs-picker", title: "the replacement (the namespace is read again on focus)" });
  const expression = h("input", { type: "text", class: "gs-expression", placeholder: "or an expression: MyAttn(dim=64)" });
  const preview = h("div", { class: "gs-preview gs-out" });
  const history = h("div", { class: "gs-history gs-out" });
  const swapPanel = panel("Replace", [picker, expression, preview, h("div", { class: "gs-actions" }, buttons(actions, "replace")), history]);
  const verify = h("div", { class: "gs-verify gs-out" });
  const compareOut = h("div", { class: "gs-compare gs-out" });
  const culprits = h("div", { class: "gs-culprits-panel gs-out" });
  const gradients = h("input", { type: "checkbox", class: "gs-gradients" });
  const gradientsLabel = h("label", { title: "Verify, Compare and Find culprits also run backward from the same upstream gradients and compare every gradient" }, [gradients, " gradients"]);
  const checkPanel = panel("Check", [h("div", { class: "gs-actions" }, [...buttons(actions, "check"), gradientsLabel]), verify, compareOut, culprits]);
  const regionOut = h("div", { class: "gs-region-panel gs-out" });
  const regionPanel = panel("Region (shift-click or shift-drag ops)", [h("div", { class: "gs-actions" }, buttons(actions, "region")), regionOut]);
  const results = h("div", { class: "gs-results gs-out" });
  const searchPanel = panel("Search", [results]);
  const panels = h("div", { class: "gs-panels" }, [searchPanel, stepPanel, detailPanel, swapPanel, regionPanel, checkPanel]);

  // -- the rails: a button per drawer; the picture takes the room the drawers leave --
  const drawers = {
    tree: side, search: searchPanel, stepper: stepPanel, selection: detailPanel,
    replace: swapPanel, region: regionPanel, check: checkPanel,
  };
  const railButton = (key, text, title) => h("button", { class: "gs-rail-button", "data-gs-drawer": key, title, text });
  const treeToggle = railButton("tree", "Tree", "show or hide the module tree");
  treeToggle.classList.add("gs-tree-toggle");
  const leftRail = h("div", { class: "gs-rail gs-rail-left" }, [treeToggle]);
  const rightRail = h("div", { class: "gs-rail gs-rail-right" }, [
    railButton("stepper", "Step", "the stepper: run the program node by node, its values"),
    railButton("selection", "Selection", "what is selected: its calls, shapes and source"),
    railButton("replace", "Replace", "swap or fuse the selected module, undo, the history"),
    railButton("region", "Region", "a region of ops (shift-click or shift-drag in the picture)"),
    railButton("check", "Check", "verify, compare, find culprits"),
    railButton("search", "Search", "the search's matches"),
  ]);
  const treeSplitter = h("div", { class: "gs-splitter gs-splitter-tree", title: "drag to resize the module tree" });
  const splitter = h("div", { class: "gs-splitter gs-splitter-panels", title: "drag to resize" });
  const main = h("div", { class: "gs-main" }, [leftRail, side, treeSplitter, graph, splitter, panels, rightRail]);
  root.append(toolbar, warning, error, main);

  // What is open and how wide: kept per widget (its model) across re-renders, and the sizes
  // in the browser's storage for the next widget. The tree starts closed and the panels in a
  // narrow column, so the picture has most of the width.
  const layout = layouts.get(model) || {
    open: new Set(["stepper", "selection", "replace", "check"]),
    tree: storedSize("tree", 300), panels: storedSize("panels", 300),
  };
  layouts.set(model, layout);
  function applyLayout() {
    root.style.setProperty("--gs-tree", layout.tree + "px");
    root.style.setProperty("--gs-panels", layout.panels + "px");
    // the tree keeps its grid cell (a class folds it); a panel closed leaves its column
    for (const [key, drawer] of Object.entries(drawers)) if (key !== "tree") drawer.hidden = !layout.open.has(key);
    for (const button of root.querySelectorAll("[data-gs-drawer]")) {
      button.classList.toggle("gs-pressed", layout.open.has(button.dataset.gsDrawer));
    }
    root.classList.toggle("gs-no-tree", !layout.open.has("tree"));
    // The closed tree's rows are out of the page. They are thousands at 384 layers, and the
    // page's style pass walked them on every change of the picture or its marks (hidden
    // content spares them layout and paint, not that): 60 ms of a search at 384 layers.
    const treeOpen = layout.open.has("tree");
    if (treeOpen && tree.parentNode !== side) { side.append(tree); tree.scrollTop = treeScroll; }
    else if (!treeOpen && tree.parentNode === side) { treeScroll = tree.scrollTop; tree.remove(); }
    root.classList.toggle("gs-no-panels", ![...layout.open].some((key) => key !== "tree"));
  }
  // a drawer opened (with its panel unfolded and scrolled into its column) or closed
  function showDrawer(key, on = true) {
    if (on !== layout.open.has(key)) {
      if (on) layout.open.add(key); else layout.open.delete(key);
      applyLayout();
    }
    if (on && key === "tree") mark(); // its rows marked and the selection's unfolded and shown
    if (!on || key === "tree") return;
    const drawer = drawers[key];
    drawer.open = true;
    // measured in the next frame, as scrollInto does: measured now, in the message that
    // opened it (a search's matches), the page would lay out the whole picture (40 ms at 384
    // layers) before the marks that come with it are set
    requestAnimationFrame(() => {
      if (!drawer.isConnected || !layout.open.has(key)) return;
      const box = drawer.getBoundingClientRect(), view = panels.getBoundingClientRect();
      if (box.top < view.top || box.top > view.bottom - 80) panels.scrollTop += box.top - view.top;
    });
  }
  main.addEventListener("click", (event) => {
    const button = event.target.closest("[data-gs-drawer]");
    if (button) showDrawer(button.dataset.gsDrawer, !layout.open.has(button.dataset.gsDrawer));
  });
  // the splits: dragged, kept
  function dragSplit(handle, key, sign, least) {
    handle.addEventListener("pointerdown", (event) => {
      event.preventDefault();
      const start = event.clientX, width = layout[key];
      const moveSplit = (e) => {
        layout[key] = Math.round(Math.max(least, Math.min(main.clientWidth * 0.7, width + sign * (e.clientX - start))));
        applyLayout();
      };
      const stop = () => {
        window.removeEventListener("pointermove", moveSplit); window.removeEventListener("pointerup", stop);
        storeSize(key, layout[key]);
      };
      window.addEventListener("pointermove", moveSplit);
      window.addEventListener("pointerup", stop);
    });
  }
  dragSplit(splitter, "panels", -1, 220);
  dragSplit(treeSplitter, "tree", 1, 140);
  applyLayout();

  // -- the picture: zoom and pan without a library --
  // `scale` is the picture's size against its natural one (dot's points as CSS points: its
  // 9 pt node text 12 px on screen); null: fitted to the width, but never below READABLE of
  // its natural size (node text >= 11 px): a wider picture scrolls rather than shrinks.
  let scale = null;
  let natural = 0;
  // the picture's box: its <svg>, or the box of a tall picture's tiles (its width in pixels)
  const pictureBox = () => viewport.querySelector(":scope > .gs-tiled, :scope > svg");
  function applyScale() {
    const box = pictureBox();
    if (!box) return;
    if (scale === null) {
      box.style.width = box.tagName === "svg" ? "" : natural + "px"; // an svg has its width attribute
      box.style.maxWidth = "100%"; box.style.minWidth = Math.round(natural * READABLE) + "px";
      root.classList.remove("gs-zoomed");
    } else {
      box.style.minWidth = "";
      box.style.maxWidth = "none"; box.style.width = natural * scale + "px"; root.classList.add("gs-zoomed");
    }
  }
  function current() {
    return scale === null ? Math.max(READABLE, Math.min(1, viewport.clientWidth / natural)) : scale;
  }
  function zoomBy(factor, x, y) {
    const before = current();
    scale = Math.max(0.05, Math.min(8, before * factor));
    if (x === undefined) { x = viewport.clientWidth / 2; y = viewport.clientHeight / 2; }
    applyScale();
    const k = scale / before;
    viewport.scrollLeft = (viewport.scrollLeft + x) * k - x;
    viewport.scrollTop = (viewport.scrollTop + y) * k - y;
  }
  function reveal(element, zoomIn, view = viewport) {
    if (!element) return;
    if (zoomIn) {
      const box = element.getBoundingClientRect();
      const factor = Math.min(view.clientWidth / (box.width + 40), view.clientHeight / (box.height + 40), 4);
      if (factor > 1.1 || factor < 0.9) zoomBy(factor);
    }
    const box = element.getBoundingClientRect();
    const frame = view.getBoundingClientRect();
    const within = box.top >= frame.top && box.bottom <= frame.bottom && box.left >= frame.left && box.right <= frame.right;
    if (!within) {
      // centre it; one taller or wider than the view shows from its top left corner (its label)
      view.scrollLeft += box.width > frame.width ? box.left - frame.left - 8 : box.left + box.width / 2 - (frame.left + frame.width / 2);
      view.scrollTop += box.height > frame.height ? box.top - frame.top - 8 : box.top + box.height / 2 - (frame.top + frame.height / 2);
    }
  }
  // One kernel message sets its traits in no fixed order (scroll_current may come before the
  // svg it points into): what to bring into view is looked up once all of them are shown.
  const revealing = new Set();
  let revealQueued = false;
  function revealSoon(what) {
    if (what) revealing.add(what);
    if (revealQueued) return;
    revealQueued = true;
    queueMicrotask(() => {
      revealQueued = false;
      if (wanted !== null) return; // a picture is on its way: showSvg asks again once it is in
      const asked = new Set(revealing);
      revealing.clear();
      if (asked.has("selection")) {
        const marks = model.get("marks") || {};
        reveal(find(marks.focus || (marks.selected || [])[0]), false); // the kernel's choice
      }
      if (asked.has("inside")) reveal(find(model.get("inside_current"), insideView), false, insideView);
      if (asked.has("current")) reveal(find(model.get("current")), false);
    });
  }
  // Lookups by id, scoped to this view (the same widget shown twice has the same ids twice): a
  // Map per picture, made on its first lookup and kept with its <svg> element (a picture put
  // back keeps its map), never a query of the page per mark.
  const idMaps = new WeakMap();
  function find(id, view = viewport) {
    const svg = id ? view.querySelector("svg") : null;
    if (!svg) return null;
    let ids = idMaps.get(svg);
    if (!ids) {
      ids = new Map();
      for (const element of view.querySelectorAll("[id]")) if (!ids.has(element.id)) ids.set(element.id, element);
      idMaps.set(svg, ids);
    }
    return ids.get(id) || null;
  }

  viewport.addEventListener("wheel", (event) => {
    if (!(event.ctrlKey || event.metaKey)) return;
    event.preventDefault();
    const box = viewport.getBoundingClientRect();
    zoomBy(Math.exp(-event.deltaY * 0.002), event.clientX - box.left, event.clientY - box.top);
  }, { passive: false });
  let drag = null;
  let moved = false;
  // a drag pans; a shift-drag draws a rectangle, and the ops inside it join the region
  let band = null;
  viewport.addEventListener("pointerdown", (event) => {
    if (event.button !== 0) return;
    drag = { x: event.clientX, y: event.clientY, left: viewport.scrollLeft, top: viewport.scrollTop };
    moved = false;
    if (event.shiftKey) {
      event.preventDefault(); // no text selection
      band = h("div", { class: "gs-band" });
      viewport.append(band);
      placeBand(event);
    }
  });
  const bandRect = (event) => ({
    left: Math.min(drag.x, event.clientX), right: Math.max(drag.x, event.clientX),
    top: Math.min(drag.y, event.clientY), bottom: Math.max(drag.y, event.clientY),
  });
  function placeBand(event) {
    const r = bandRect(event), view = viewport.getBoundingClientRect();
    Object.assign(band.style, {
      left: `${r.left - view.left + viewport.scrollLeft}px`, top: `${r.top - view.top + viewport.scrollTop}px`,
      width: `${r.right - r.left}px`, height: `${r.bottom - r.top}px`,
    });
  }
  const onMove = (event) => {
    if (!drag) return;
    const dx = event.clientX - drag.x, dy = event.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 4) moved = true;
    if (band) placeBand(event);
    else if (moved && scale !== null) {
      viewport.scrollLeft = drag.left - dx; viewport.scrollTop = drag.top - dy;
    }
  };
  const onUp = (event) => {
    if (band) {
      if (moved) {
        // the boxes and nodes whose centre is inside the rectangle
        const r = bandRect(event), ids = [];
        for (const node of viewport.querySelectorAll("g.node")) {
          const b = node.getBoundingClientRect(), x = (b.left + b.right) / 2, y = (b.top + b.bottom) / 2;
          if (node.id && x >= r.left && x <= r.right && y >= r.top && y <= r.bottom) ids.push(node.id);
        }
        send({ event: "region_add", ids });
      }
      band.remove();
      band = null;
    }
    drag = null;
  };
  window.addEventListener("pointermove", onMove);
  window.addEventListener("pointerup", onUp);
  // a drag the browser takes over (a touch scroll, the window losing the pointer) adds nothing
  const onCancel = () => { if (band) band.remove(); band = null; drag = null; };
  window.addEventListener("pointercancel", onCancel);

  // a click counts only if the pointer did not move (a drag pans); the widget then has the
  // focus, so its shortcuts work
  const target = (event) => event.target.closest("g.node, g.cluster");
  // a click is marked at once, from what the kernel shipped with the picture (`clicks`), then
  // sent: the kernel's `marks` confirm it (and correct it, should they differ)
  viewport.addEventListener("click", (event) => {
    root.focus({ preventScroll: true });
    if (moved) return;
    const hit = target(event);
    if (!hit || !hit.id) return;
    if (!event.shiftKey) {
      const marks = clickMarks(hit.id);
      if (marks) mark({ ...(model.get("marks") || {}), ...marks }, false);
    }
    send({ event: event.shiftKey ? "region" : "click", id: hit.id });
  });
  // hover: what feeds the element under the pointer and what reads it, lightly marked
  let hovered = [], hoveredId = null;
  const unhover = () => { for (const [node, cls] of hovered) node.classList.remove(cls); hovered = []; hoveredId = null; };
  viewport.addEventListener("mouseover", (event) => {
    const hit = target(event);
    const id = hit && hit.id ? hit.id : null;
    if (id === hoveredId) return;
    unhover();
    const marks = id && !drag ? clickMarks(id) : null;
    if (!marks) return;
    hoveredId = id;
    const add = (ids, cls) => {
      for (const other of ids) {
        const node = find(other);
        if (node) { node.classList.add(cls); hovered.push([node, cls]); }
      }
    };
    add(marks.producers, "gs-hover-producer");
    add(marks.consumers, "gs-hover-consumer");
  });
  viewport.addEventListener("mouseleave", unhover);
  viewport.addEventListener("dblclick", (event) => {
    const hit = target(event);
    if (hit && hit.id) { event.preventDefault(); send({ event: "toggle", id: hit.id }); }
  });
  insideView.addEventListener("click", (event) => {
    root.focus({ preventScroll: true });
    const hit = event.target.closest("g.node");
    if (hit && hit.id) send({ event: "click_inside", id: hit.id });
  });

  // -- marking: a class change, no new layout --
  let marked = [];
  // One message from the kernel changes several traits at once (svg, marks, current, ...):
  // the marks are set again once, after all of them, not once per trait (each pass measures
  // the page, a reflow of the whole picture).
  let markQueued = false;
  function markSoon() {
    if (markQueued) return;
    markQueued = true;
    queueMicrotask(() => { markQueued = false; mark(); });
  }
  // What a click on element `id` marks (the kernel's Selection.click_marks, shipped with the
  // picture and kept with it: `shownClicks`): {selected, producers, consumers, edges, module},
  // or null.
  let clickRows = null, clickRowsOf = null;
  function clickMarks(id) {
    const shipped = shownClicks;
    if (!shipped || !shipped.clicks) return null;
    if (clickRowsOf !== shipped) {
      clickRows = new Map(shipped.clicks.map((row) => [shipped.ids[row[0]], row]));
      clickRowsOf = shipped;
    }
    const row = clickRows.get(id);
    if (!row) return null;
    const ids = (list) => list.map((i) => shipped.ids[i]);
    return {
      selected: ids(row[1]), producers: ids(row[2]), consumers: ids(row[3]), edges: ids(row[4]),
      module: row[5] >= 0 ? shipped.modules[row[5]] : "",
    };
  }
  // the tree's rows by module (the name element carrying data-gs-module), a Map per tree shown
  const rowMaps = new WeakMap();
  function treeName(module) {
    const first = tree.firstElementChild;
    if (!first || !module) return null;
    let names = rowMaps.get(first);
    if (!names) {
      names = new Map();
      for (const name of tree.querySelectorAll("[data-gs-module]")) if (!names.has(name.dataset.gsModule)) names.set(name.dataset.gsModule, name);
      rowMaps.set(first, names);
    }
    return names.get(module) || null;
  }
  // `row` scrolled into view inside `list` (a third from its top), measured in the next frame:
  // measured now, the page would lay itself out (the whole picture) before the marks are set
  function scrollInto(list, row) {
    requestAnimationFrame(() => {
      if (!row.isConnected) return;
      const box = row.getBoundingClientRect(), view = list.getBoundingClientRect();
      if (box.top < view.top || box.bottom > view.bottom) list.scrollTop += box.top - view.top - view.height / 3;
    });
  }
  // the marks: the kernel's (its `marks` trait), or a click's marked at once in the page
  // (`revealRow` false: the tree is not unfolded nor scrolled, which would measure the page in
  // the click)
  function mark(marks = model.get("marks") || {}, revealRow = true) {
    for (const [node, cls] of marked) node.classList.remove(cls);
    marked = [];
    const add = (ids, cls, view = viewport) => {
      for (const id of ids || []) {
        const node = find(id, view);
        if (node) { node.classList.add(cls); marked.push([node, cls]); }
      }
    };
    add(marks.similar, "gs-similar");
    add(marks.near, "gs-near");
    add(marks.region, "gs-region");
    add(marks.matches, "gs-match");
    add(marks.culprits, "gs-culprit");
    add(marks.selected, "gs-selected");
    add(marks.producers, "gs-producer");
    add(marks.consumers, "gs-consumer");
    add(marks.edges, "gs-flow");
    add([model.get("current")], "gs-current");
    add([model.get("inside_current")], "gs-current", insideView);
    // the tree: the selection's row, the matches' and the culprits' rows; none while the
    // tree is closed (marked once it opens): its rows are thousands at 384 layers, and the
    // first lookup reads them all, and unfolding rows restyles them, in a click or a search
    if (!layout.open.has("tree")) return;
    const rows = (names, cls) => {
      for (const module of names || []) {
        const name = treeName(module);
        if (!name) continue;
        const row = name.parentElement;
        row.classList.add(cls); marked.push([row, cls]);
      }
    };
    rows(marks.match_modules, "gs-row-match");
    rows(marks.culprit_modules, "gs-row-culprit");
    // the kernel names the row as its data-gs-module carries the module (escaped as ids are)
    const module = marks.module;
    const name = treeName(module);
    if (name) {
      const row = name.parentElement;
      row.classList.add("gs-row-selected"); marked.push([row, "gs-row-selected"]);
      if (revealRow) {
        // unfold the rows around it, so the selection is visible in the tree too
        for (let p = row.parentElement; p && p !== tree; p = p.parentElement) if (p.tagName === "DETAILS" && p.firstElementChild !== row) p.open = true;
        scrollInto(tree, row);
      }
    }
  }

  // -- traits -> page --
  // The picture and what a click on each of its elements marks come deflated (`svg_packed`,
  // `clicks_packed`: about a tenth of their text) under one key (a digest of both). The last
  // pictures shown are kept parsed, with their clicks, by key: going back to one (a collapse
  // after an expand, undo, the view menu) puts its elements back at once, instead of
  // inflating and parsing it again. The marks live in `marked`, so a picture put away is
  // cleared by the next mark().
  const parsed = new Map(); // key -> [its nodes, characters of its text, its clicks]
  const KEPT_PICTURES = 4, KEPT_TEXT = 8e6; // pictures, and characters of SVG text in all
  let shownKey = null, shownSize = 0, shownClicks = null, wanted = null;
  function putAway() {
    if (shownKey === null) return;
    parsed.delete(shownKey);
    const nodes = [...viewport.childNodes].filter((n) => !(n.classList && n.classList.contains("gs-band")));
    parsed.set(shownKey, [nodes, shownSize, shownClicks]);
    let size = 0;
    for (const [, kept] of parsed) size += kept[1];
    for (const [key, kept] of parsed) {
      if (parsed.size <= KEPT_PICTURES && size <= KEPT_TEXT) break;
      parsed.delete(key); size -= kept[1];
    }
  }
  async function inflate(packed) {
    if (!packed || !packed.byteLength) return "";
    const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream("deflate"));
    return await new Response(stream).text();
  }
  async function showSvg() {
    const key = model.get("svg_key") || "";
    if (key === wanted) return; // on its way
    if (key === shownKey) { // back to the picture shown: the one on its way is not wanted now
      if (wanted !== null) { wanted = null; if (revealing.size) revealSoon(); }
      return;
    }
    wanted = key;
    let text = null, clicks = null;
    if (!parsed.has(key)) {
      try {
        [text, clicks] = await Promise.all([inflate(model.get("svg_packed")), inflate(model.get("clicks_packed"))]);
      } finally {
        if (wanted === key && text === null) wanted = null; // failed: what waits for it, waits no more
      }
      if (wanted !== key) return; // a newer picture came while this one inflated
      clicks = clicks ? JSON.parse(clicks) : null;
    }
    wanted = null;
    // taken out before the picture shown is put away: putting it away drops the oldest ones
    // beyond the limits, which may be this one (going back to the oldest kept picture)
    const kept = parsed.get(key);
    parsed.delete(key);
    putAway();
    if (kept) { viewport.replaceChildren(...kept[0]); [, shownSize, shownClicks] = kept; }
    else { viewport.innerHTML = text; shownSize = text.length; shownClicks = clicks; }
    shownKey = key;
    viewport.dataset.gsKey = key; // which picture is shown (the kernel's w.svg_key)
    const box = pictureBox();
    natural = box ? naturalWidth(box) : 0;
    applyScale();
    markSoon();
    markTyped();
    if (!inside.hidden) revealSoon("current"); // the call, beside its inside
    else if (revealing.size) revealSoon(); // what was asked while the picture was on its way
  }
  // the stepper's values beside the picture while stepping: its drawer opens, in view
  function showStepper() {
    stepper.innerHTML = model.get("stepper_html");
    if (model.get("stepping")) showDrawer("stepper");
  }
  function showInside() {
    const svg = model.get("inside_svg") || "";
    // entering a call: the program at its natural size around the call, beside the
    // replacement's picture (as wide as the program's); leaving it: fitted again
    if (!!svg !== !inside.hidden) { scale = svg ? 1 : null; applyScale(); }
    inside.hidden = !svg;
    root.classList.toggle("gs-stepping-inside", !!svg);
    insideTitle.textContent = model.get("inside_caption") || "";
    if (insideView.dataset.svg !== String(svg.length) + insideTitle.textContent) {
      insideView.innerHTML = svg;
      insideView.dataset.svg = String(svg.length) + insideTitle.textContent;
      // fitted to its pane, its text never below the program's readable size: it scrolls
      const drawn = insideView.querySelector("svg");
      if (drawn) drawn.style.minWidth = Math.round(naturalWidth(drawn) * READABLE) + "px";
    }
    markSoon();
    revealSoon("inside");
    if (svg) revealSoon("current");
  }
  // the tree comes deflated (its HTML is 1.9 MB at 384 layers, 62 KB deflated) under a key: a
  // new key is what says a new tree came (a change of bytes alone raises no change event); a
  // tree that comes while another inflates wins
  let treeWanted = null;
  async function showTree() {
    const key = model.get("tree_key");
    treeWanted = key;
    const text = await inflate(model.get("tree_packed"));
    if (treeWanted !== key) return;
    tree.innerHTML = text;
    applyFilter();
    markSoon();
  }
  // a row's tooltip: its module's full name (the row shows the name relative to its parent),
  // set when the pointer first comes over it (a tree of thousands of rows carries no copies)
  tree.addEventListener("pointerover", (event) => {
    const name = event.target.closest("summary, .gs-leaf");
    const cell = name && name.querySelector("[data-gs-module]");
    if (cell && !cell.title) cell.title = cell.dataset.gsModule;
  });
  function showTypes() {
    const kept = typeFilter.value;
    const types = model.get("module_types") || [];
    typeFilter.replaceChildren(h("option", { value: "", text: "all types" }), ...types.map((t) => h("option", { value: t, text: t })));
    typeFilter.value = types.includes(kept) ? kept : "";
    applyFilter();
  }
  // a row shows when its name holds the filter's text and its type is the one chosen; the
  // rows around a row that shows are unfolded
  function applyFilter() {
    const text = filter.value.trim().toLowerCase();
    const type = typeFilter.value;
    for (const name of tree.querySelectorAll("[data-gs-module]")) {
      const row = name.parentElement.tagName === "SUMMARY" ? name.parentElement.parentElement : name.parentElement;
      const kind = name.nextElementSibling ? name.nextElementSibling.textContent : "";
      const hit = (!text || name.dataset.gsModule.toLowerCase().includes(text)) && (!type || kind === type);
      row.classList.toggle("gs-filtered", !hit);
      if ((text || type) && hit) for (let p = row.parentElement; p && p !== tree; p = p.parentElement) if (p.tagName === "DETAILS") { p.open = true; p.classList.remove("gs-filtered"); }
    }
  }
  // the picker shows the kernel's choice for the selection, and nothing once it is cleared
  // (another module selected): picker, preview and Swap button read the same state. What fits
  // the selected call comes first, the rest apart, each saying why it does not fit (the
  // kernel ranks them; fits is null where it cannot tell, and then there are no groups)
  function showCandidates() {
    const options = model.get("candidates") || [];
    const key = model.get("choice_key") || "";
    const option = (c) => h("option", c.why ? { value: c.key, text: c.label, title: c.why } : { value: c.key, text: c.label });
    let items = options.map(option);
    if (options.some((c) => c.fits === false)) {
      const group = (label, fits) => h("optgroup", { label: label, "data-gs-fits": String(fits) }, options.filter((c) => (c.fits !== false) === fits).map(option));
      items = [group("fits the call", true), group("other", false)];
    }
    if (key && !options.some((c) => c.key === key)) {
      // an expression, or a module given in code: shown as chosen, not offered again
      items.push(h("option", { value: key, text: model.get("choice"), "data-gs-chosen": "" }));
    }
    picker.replaceChildren(h("option", { value: "", text: "choose a replacement…" }), ...items);
    picker.value = key;
  }
  function showChoice() {
    showCandidates();
    const key = model.get("choice_key") || "";
    expression.value = key === "expression" ? model.get("choice") : "";
  }
  function showError() {
    const e = model.get("error") || {};
    if (!e.message) { error.hidden = true; error.replaceChildren(); return; }
    error.hidden = false;
    const body = h("details", {}, [h("summary", {}, [h("b", { text: e.type + ": " }), e.message]), h("pre", { text: e.details || "" })]);
    const close = h("button", { class: "gs-close", title: "dismiss", text: "×" });
    close.addEventListener("click", () => { error.hidden = true; });
    error.replaceChildren(close, body);
  }
  function showWarning() {
    warningText.innerHTML = model.get("warning") || "";
    warning.hidden = !model.get("pending");
  }
  function showSearch() {
    const html = model.get("search_html") || "";
    results.innerHTML = html;
    showDrawer("search", !!html);
    const text = model.get("search_text") || "";
    if (document.activeElement !== search) search.value = text;
    const count = results.querySelectorAll("[data-gs-match]").length;
    const current = results.querySelector(".gs-match-current");
    found.textContent = html ? `${current ? Number(current.dataset.gsMatch) + 1 : 0} / ${count}${results.textContent.includes("more, marked") ? "+" : ""}` : "";
    // the current match's row in view, in its own list only (the page does not move)
    const list = results.querySelector(".gs-matches");
    if (current && list) scrollInto(list, current);
  }
  // every button of an action, found once (the page makes its buttons once, from `actions`)
  const actionButtons = actions.map((a) => [a, [...root.querySelectorAll(`[data-gs-button="${a.name}"]`)]]);
  // an action is enabled when one of its traits holds (none listed: always)
  const enabled = (a) => a.enabled_by.length === 0 || a.enabled_by.some((trait) => !!model.get(trait));
  function showState() {
    views.value = model.get("view");
    views.disabled = !model.get("can_diff");
    overlay.value = model.get("overlay") || "";
    caption.textContent = model.get("caption");
    legend.innerHTML = model.get("legend") || "";
    busy.textContent = model.get("busy");
    root.classList.toggle("gs-is-busy", !!model.get("busy"));
    if (model.get("busy")) seenBusy = true;
    else if (awaited && seenBusy) showResult();
    nan.checked = !!model.get("break_on_nan");
    gradients.checked = !!model.get("gradients");
    for (const [a, found] of actionButtons) {
      const on = enabled(a);
      for (const b of found) b.disabled = !on;
    }
    picker.disabled = expression.disabled = !model.get("selected");
    copyName.disabled = !model.get("selected") && !model.get("selected_node");
  }
  const html = (node, trait) => () => { node.innerHTML = model.get(trait); };
  // A check the user asked for (Verify, Compare, Find culprits): its result is brought into
  // the panels' column once it is in, the Check drawer opened; it was often below the fold
  // and a click looked like it did nothing. Once its answer is in (the text changed, or the
  // widget is no longer busy: the same text again); a check run from code moves nothing.
  const checkOutputs = { verify, compare: compareOut, find_culprits: culprits };
  let awaited = null, seenBusy = false;
  function awaitResult(name) {  // any other button clicked: no check's result awaited
    awaited = checkOutputs[name] || null;
    seenBusy = false;
  }
  function showResult() {
    const node = awaited;
    awaited = null;
    showDrawer("check");
    scrollInto(panels, node);
  }
  const checkResult = (node, trait) => () => {
    node.innerHTML = model.get(trait);
    if (awaited === node) showResult();
  };
  const bindings = [
    ["svg_key", showSvg], ["tree_key", showTree], ["module_types", showTypes], ["marks", markSoon],
    ["current", markSoon], ["selected", markSoon], ["inside_svg", showInside], ["inside_current", showInside],
    ["details", html(details, "details")], ["preview", html(preview, "preview")],
    ["history", html(history, "history")], ["verify_html", checkResult(verify, "verify_html")],
    ["compare_html", checkResult(compareOut, "compare_html")], ["culprits_html", checkResult(culprits, "culprits_html")],
    ["region_html", () => { regionOut.innerHTML = model.get("region_html") || ""; if (model.get("has_region")) showDrawer("region"); }],
    ["stepper_html", showStepper], ["candidates", showCandidates],
    ["choice_key", showChoice], ["choice", showChoice], ["error", showError],
    ["warning", showWarning], ["pending", showWarning], ["search_html", showSearch],
  ];
  for (const [trait, show] of bindings) { model.on(`change:${trait}`, show); show(); }
  const stateTraits = new Set(["view", "can_diff", "caption", "legend", "overlay", "busy", "break_on_nan", "gradients", "selected", "selected_node"]);
  for (const a of actions) for (const trait of a.enabled_by) stateTraits.add(trait);
  for (const trait of stateTraits) model.on(`change:${trait}`, showState);
  // a click refused by the kernel: its marks, not the click's, are shown again
  model.on("change:error", markSoon);
  showState();
  model.on("change:scroll", () => revealSoon("selection"));
  model.on("change:scroll_current", () => revealSoon("current"));

  // -- page -> kernel --
  root.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    if (button && button.dataset.gsButton) {
      awaitResult(button.dataset.gsButton);
      send({ event: "button", name: button.dataset.gsButton });
    }
    else if (button && button.dataset.gsSave) send({ event: "save", format: button.dataset.gsSave });
    else if (button && button.dataset.gsZoom) {
      const how = button.dataset.gsZoom;
      if (how === "in") zoomBy(1.25);
      else if (how === "out") zoomBy(0.8);
      else if (how === "fit") { scale = null; applyScale(); viewport.scrollLeft = 0; viewport.scrollTop = 0; }
      else reveal(find((model.get("marks").selected || [])[0]), true);
    }
  });
  // the name selects the module; the rest of a row folds it (as a <summary> does)
  tree.addEventListener("click", (event) => {
    const row = event.target.closest("summary, .gs-leaf");
    const name = row && row.querySelector("[data-gs-module]");
    if (!name) return;
    if (event.target.closest("code") || row.tagName !== "SUMMARY") {
      event.preventDefault();
      send({ event: "select", value: name.dataset.gsModule });
    }
  });
  // a click anywhere on a compare row selects the call its name cell carries; so does a culprit
  const selectCall = (event) => {
    const row = event.target.closest("tr, code");
    const call = row && (row.matches("[data-gs-call]") ? row : row.querySelector("[data-gs-call]"));
    if (call) send({ event: "select", value: call.dataset.gsCall });
  };
  compareOut.addEventListener("click", selectCall);
  culprits.addEventListener("click", selectCall);
  regionOut.addEventListener("click", (event) => {
    const row = event.target.closest("[data-gs-node]");
    if (row) send({ event: "select", value: row.dataset.gsNode });
  });
  results.addEventListener("click", (event) => {
    const row = event.target.closest("[data-gs-match]");
    if (row) send({ event: "match", value: Number(row.dataset.gsMatch) });
  });
  // the actions' shortcuts while the focus is in the widget (not in a text box or a menu);
  // "/" goes to the search box
  const shortcuts = new Map(actions.filter((a) => a.key).map((a) => [a.key, a]));
  const press = (key) => {
    const action = shortcuts.get(key);
    if (action && enabled(action)) {
      awaitResult(action.name);
      send({ event: "button", name: action.name });
    }
  };
  root.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.altKey || event.metaKey) return;
    if (event.target.closest("input, select, textarea")) return;
    if (event.key === "/") {
      event.preventDefault(); event.stopPropagation();
      search.focus(); search.select();
      return;
    }
    const key = (event.shiftKey ? "Shift+" : "") + event.key;
    if (!shortcuts.has(key)) return;
    event.preventDefault();
    event.stopPropagation();
    press(key);
  });
  filter.addEventListener("input", applyFilter);
  // Search as you type: the elements whose name or text holds the text typed are marked at
  // once (gs-match-typed), from the picture shown; Enter asks the kernel, whose search (names,
  // types, ops, initials, regex) selects, lists and marks the matches, and the page's go.
  let typed = [];
  const typedTexts = new WeakMap(); // <svg> -> [[element, its name and text, lower case]]
  function markTyped() {
    for (const node of typed) node.classList.remove("gs-match-typed");
    typed = [];
    const text = search.value.trim().toLowerCase();
    const svg = viewport.querySelector("svg");
    const shipped = shownClicks;
    if (!text || !svg || !shipped || !shipped.clicks) return;
    if (text === (model.get("search_text") || "").toLowerCase()) return; // the kernel's own
    let items = typedTexts.get(svg);
    if (!items) {
      items = [];
      for (const row of shipped.clicks) {
        const id = shipped.ids[row[0]], node = find(id);
        if (node) items.push([node, (id.slice(id.indexOf(":") + 1) + "\n" + node.textContent).toLowerCase()]);
      }
      typedTexts.set(svg, items);
    }
    for (const [node, words] of items) if (words.includes(text)) { node.classList.add("gs-match-typed"); typed.push(node); }
  }
  search.addEventListener("input", markTyped);
  model.on("change:search_text", markTyped);
  typeFilter.addEventListener("change", applyFilter);
  // Enter searches (the same text again: what F3 does, the next match; Shift: the previous),
  // Esc does what Esc does in the widget (closes the search)
  search.addEventListener("keydown", (event) => {
    event.stopPropagation(); // the notebook's own shortcuts stay out of the box
    const text = search.value.trim();
    if (event.key === "Enter" && text) {
      event.preventDefault();
      if (text === model.get("search_text") && model.get("has_matches")) press(event.shiftKey ? "Shift+F3" : "F3");
      else send({ event: "search", value: text });
    } else if (event.key === "Escape") {
      event.preventDefault();
      search.value = "";
      markTyped();
      press("Escape");
      root.focus({ preventScroll: true });
    }
  });
  views.addEventListener("change", () => send({ event: "view", value: views.value }));
  depth.addEventListener("change", () => { if (depth.value) send({ event: "depth", value: depth.value }); depth.value = ""; });
  overlay.addEventListener("change", () => {
    send({ event: "overlay", value: overlay.value });
    overlay.value = model.get("overlay") || ""; // until the kernel answers
  });
  picker.addEventListener("focus", () => send({ event: "candidates" }));
  picker.addEventListener("change", () => {
    const option = picker.selectedOptions[0];
    // the first option clears the choice; the chosen expression is not chosen again
    if (!(option && option.hasAttribute("data-gs-chosen"))) send({ event: "choose", value: picker.value });
    // until the kernel answers, the picker shows what it has chosen (a refused choice, such
    // as a class that needs arguments, leaves it as it was)
    picker.value = model.get("choice_key") || "";
  });
  expression.addEventListener("keydown", (event) => {
    event.stopPropagation();
    if (event.key === "Enter") send({ event: "expression", value: expression.value });
  });
  filter.addEventListener("keydown", (event) => event.stopPropagation());
  nan.addEventListener("change", () => send({ event: "nan", value: nan.checked }));
  gradients.addEventListener("change", () => send({ event: "gradients", value: gradients.checked }));
  model.on("msg:custom", (message) => {
    if (message.event !== "download") return;
    const url = URL.createObjectURL(new Blob([message.text], { type: "text/plain" }));
    const link = h("a", { href: url, download: message.name });
    root.append(link); link.click(); link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  });
  return () => {
    window.removeEventListener("pointermove", onMove);
    window.removeEventListener("pointerup", onUp);
    window.removeEventListener("pointercancel", onCancel);
  };
}

export default { render };
