// SurgeryWidget front end: lays out the panels, shows what the kernel sends (SVG text and
// HTML already escaped by graphsurgeon), and sends the user's clicks back. It decides nothing:
// every click is an event for the Python session, whose answer comes back as traits. Its
// buttons are the kernel's `actions` trait (SurgeryWidget's one ACTIONS table): name, label,
// tooltip, panel, the traits that enable it, and its keyboard shortcut.
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

function render({ model, el }) {
  const send = (message) => model.send(message);
  const actions = model.get("actions") || [];
  const root = h("div", { class: "gs-widget" });
  el.append(root);

  // -- layout --
  const search = h("input", { type: "search", class: "gs-search", placeholder: "find a module or node", list: "" });
  const views = h("select", { class: "gs-views", title: "what the picture shows" }, [
    h("option", { value: "program", text: "program" }),
    h("option", { value: "merged", text: "before/after (merged)" }),
    h("option", { value: "split", text: "before/after (split)" }),
  ]);
  const zoom = [
    h("button", { "data-gs-zoom": "out", title: "zoom out", text: "−" }),
    h("button", { "data-gs-zoom": "in", title: "zoom in", text: "+" }),
    h("button", { "data-gs-zoom": "fit", title: "fit to the width", text: "fit" }),
    h("button", { "data-gs-zoom": "selection", title: "zoom to the selection", text: "zoom to selection" }),
  ];
  const layoutButtons = buttons(actions, "toolbar");
  const save = [
    h("button", { "data-gs-save": "svg", title: "download the picture as SVG", text: "SVG" }),
    h("button", { "data-gs-save": "dot", title: "download the picture as DOT", text: "DOT" }),
  ];
  const busy = h("span", { class: "gs-busy" });
  const caption = h("span", { class: "gs-caption" });
  const toolbar = h("div", { class: "gs-toolbar" }, [
    h("b", { text: "graphsurgeon" }), search, views, ...zoom, ...layoutButtons, ...save, busy,
  ]);
  const error = h("div", { class: "gs-error", hidden: "" });
  const filter = h("input", { type: "search", class: "gs-filter", placeholder: "filter modules" });
  const tree = h("div", { class: "gs-tree-panel gs-out" });
  const side = h("div", { class: "gs-side" }, [filter, tree]);
  const viewport = h("div", { class: "gs-viewport" });
  const graph = h("div", { class: "gs-graph" }, [caption, viewport]);
  const main = h("div", { class: "gs-main" }, [side, graph]);

  const details = h("div", { class: "gs-details gs-out" });
  const picker = h("select", { class: "gs-picker", title: "the replacement" });
  const expression = h("input", { type: "text", class: "gs-expression", placeholder: "or an expression: MyAttn(dim=64)" });
  const preview = h("div", { class: "gs-preview gs-out" });
  const replaceButtons = h("div", { class: "gs-actions" }, buttons(actions, "replace"));
  const history = h("div", { class: "gs-history gs-out" });
  const swapPanel = h("div", { class: "gs-panel" }, [
    h("div", { class: "gs-heading", text: "Replace" }), picker, expression, preview, replaceButtons, history,
  ]);
  const copyName = h("button", { class: "gs-copy", title: "copy the selected name", text: "copy name" });
  copyName.addEventListener("click", () => {
    const name = model.get("selected_node") || model.get("selected");
    if (name && navigator.clipboard) navigator.clipboard.writeText(name).catch(() => {});
  });
  const detailPanel = h("div", { class: "gs-panel" }, [
    h("div", { class: "gs-heading" }, ["Selection ", copyName]), details,
  ]);
  const verify = h("div", { class: "gs-verify gs-out" });
  const compareOut = h("div", { class: "gs-compare gs-out" });
  const checkPanel = h("div", { class: "gs-panel" }, [
    h("div", { class: "gs-heading", text: "Check" }), h("div", { class: "gs-actions" }, buttons(actions, "check")), verify, compareOut,
  ]);
  const nan = h("input", { type: "checkbox", class: "gs-nan" });
  const stepper = h("div", { class: "gs-stepper gs-out" });
  const stepPanel = h("div", { class: "gs-panel" }, [
    h("div", { class: "gs-heading", text: "Step" }),
    h("div", { class: "gs-actions" }, [...buttons(actions, "stepper"), h("label", {}, [nan, " stop on NaN/Inf"])]),
    stepper,
  ]);
  const lower = h("div", { class: "gs-lower" }, [detailPanel, swapPanel, checkPanel, stepPanel]);
  root.append(toolbar, error, main, lower);

  // -- the picture: zoom and pan without a library --
  let scale = null; // null: fitted to the width
  let natural = 0;
  const svgOf = () => viewport.querySelector("svg");
  function applyScale() {
    const svg = svgOf();
    if (!svg) return;
    if (scale === null) {
      svg.style.width = ""; svg.style.maxWidth = "100%"; root.classList.remove("gs-zoomed");
    } else {
      svg.style.maxWidth = "none"; svg.style.width = natural * scale + "px"; root.classList.add("gs-zoomed");
    }
  }
  function current() {
    return scale === null ? Math.min(1, viewport.clientWidth / natural) : scale;
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
  function reveal(element, zoomIn) {
    if (!element) return;
    if (zoomIn) {
      const box = element.getBoundingClientRect();
      const factor = Math.min(viewport.clientWidth / (box.width + 40), viewport.clientHeight / (box.height + 40), 4);
      if (factor > 1.1 || factor < 0.9) zoomBy(factor);
    }
    const box = element.getBoundingClientRect();
    const view = viewport.getBoundingClientRect();
    const inside = box.top >= view.top && box.bottom <= view.bottom && box.left >= view.left && box.right <= view.right;
    if (!inside) {
      // centre it; one taller or wider than the view shows from its top left corner (its label)
      viewport.scrollLeft += box.width > view.width ? box.left - view.left - 8 : box.left + box.width / 2 - (view.left + view.width / 2);
      viewport.scrollTop += box.height > view.height ? box.top - view.top - 8 : box.top + box.height / 2 - (view.top + view.height / 2);
      if (!zoomIn) element.scrollIntoView({ block: "nearest", inline: "nearest" });
    }
  }
  const find = (id) => (id ? viewport.querySelector(`[id="${CSS.escape(id)}"]`) : null);

  viewport.addEventListener("wheel", (event) => {
    if (!(event.ctrlKey || event.metaKey)) return;
    event.preventDefault();
    const box = viewport.getBoundingClientRect();
    zoomBy(Math.exp(-event.deltaY * 0.002), event.clientX - box.left, event.clientY - box.top);
  }, { passive: false });
  let drag = null;
  let moved = false;
  viewport.addEventListener("pointerdown", (event) => {
    if (event.button !== 0) return;
    drag = { x: event.clientX, y: event.clientY, left: viewport.scrollLeft, top: viewport.scrollTop };
    moved = false;
  });
  const onMove = (event) => {
    if (!drag) return;
    const dx = event.clientX - drag.x, dy = event.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 4) moved = true;
    if (moved && scale !== null) {
      viewport.scrollLeft = drag.left - dx; viewport.scrollTop = drag.top - dy;
    }
  };
  const onUp = () => { drag = null; };
  window.addEventListener("pointermove", onMove);
  window.addEventListener("pointerup", onUp);

  // a click counts only if the pointer did not move (a drag pans)
  const target = (event) => event.target.closest("g.node, g.cluster");
  viewport.addEventListener("click", (event) => {
    if (moved) return;
    const hit = target(event);
    if (hit && hit.id) send({ event: "click", id: hit.id });
  });
  viewport.addEventListener("dblclick", (event) => {
    const hit = target(event);
    if (hit && hit.id) { event.preventDefault(); send({ event: "toggle", id: hit.id }); }
  });

  // -- marking: a class change, no new layout --
  let marked = [];
  function mark() {
    for (const [node, cls] of marked) node.classList.remove(cls);
    marked = [];
    const marks = model.get("marks") || {};
    const add = (ids, cls) => {
      for (const id of ids || []) {
        const node = find(id);
        if (node) { node.classList.add(cls); marked.push([node, cls]); }
      }
    };
    add(marks.selected, "gs-selected");
    add(marks.producers, "gs-producer");
    add(marks.consumers, "gs-consumer");
    add(marks.edges, "gs-flow");
    add([model.get("current")], "gs-current");
    for (const row of tree.querySelectorAll(".gs-row-selected")) row.classList.remove("gs-row-selected");
    // the kernel names the row as its data-gs-module carries the module (escaped as ids are)
    const module = marks.module;
    if (module) {
      const name = tree.querySelector(`[data-gs-module="${CSS.escape(module)}"]`);
      if (name) {
        const row = name.parentElement;
        row.classList.add("gs-row-selected");
        // unfold the rows around it, so the selection is visible in the tree too
        for (let p = row.parentElement; p && p !== tree; p = p.parentElement) if (p.tagName === "DETAILS" && p.firstElementChild !== row) p.open = true;
        const box = row.getBoundingClientRect(), view = tree.getBoundingClientRect();
        if (box.top < view.top || box.bottom > view.bottom) tree.scrollTop += box.top - view.top - view.height / 3;
      }
    }
  }

  // -- traits -> page --
  function showSvg() {
    viewport.innerHTML = model.get("svg");
    const svg = svgOf();
    natural = svg ? parseFloat(svg.getAttribute("width")) || svg.getBoundingClientRect().width : 0;
    applyScale();
    mark();
  }
  function showTree() {
    tree.innerHTML = model.get("tree");
    applyFilter();
    mark();
  }
  function applyFilter() {
    const text = filter.value.trim().toLowerCase();
    for (const name of tree.querySelectorAll("[data-gs-module]")) {
      const row = name.parentElement.tagName === "SUMMARY" ? name.parentElement.parentElement : name.parentElement;
      const hit = !text || name.dataset.gsModule.toLowerCase().includes(text);
      row.classList.toggle("gs-filtered", !hit);
      if (text && hit) for (let p = row.parentElement; p && p !== tree; p = p.parentElement) if (p.tagName === "DETAILS") { p.open = true; p.classList.remove("gs-filtered"); }
    }
  }
  // the picker shows the kernel's choice for the selection, and nothing once it is cleared
  // (another module selected): picker, preview and Swap button read the same state
  function showCandidates() {
    const options = model.get("candidates") || [];
    const key = model.get("choice_key") || "";
    const items = options.map((c) => h("option", { value: c.key, text: c.label }));
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
  // an action is enabled when one of its traits holds (none listed: always)
  const enabled = (a) => a.enabled_by.length === 0 || a.enabled_by.some((trait) => !!model.get(trait));
  function showState() {
    views.value = model.get("view");
    views.disabled = !model.get("can_diff");
    caption.textContent = model.get("caption");
    busy.textContent = model.get("busy");
    root.classList.toggle("gs-is-busy", !!model.get("busy"));
    nan.checked = !!model.get("break_on_nan");
    for (const a of actions) {
      const on = enabled(a);
      for (const b of root.querySelectorAll(`[data-gs-button="${a.name}"]`)) b.disabled = !on;
    }
    picker.disabled = expression.disabled = !model.get("selected");
    copyName.disabled = !model.get("selected") && !model.get("selected_node");
  }
  const html = (node, trait) => () => { node.innerHTML = model.get(trait); };
  const bindings = [
    ["svg", showSvg], ["tree", showTree], ["marks", mark], ["current", mark], ["selected", mark],
    ["details", html(details, "details")], ["preview", html(preview, "preview")],
    ["history", html(history, "history")], ["verify_html", html(verify, "verify_html")],
    ["compare_html", html(compareOut, "compare_html")], ["stepper_html", html(stepper, "stepper_html")],
    ["candidates", showCandidates], ["choice_key", showChoice], ["choice", showChoice],
    ["error", showError],
  ];
  for (const [trait, show] of bindings) { model.on(`change:${trait}`, show); show(); }
  const stateTraits = new Set(["view", "can_diff", "caption", "busy", "break_on_nan", "selected", "selected_node"]);
  for (const a of actions) for (const trait of a.enabled_by) stateTraits.add(trait);
  for (const trait of stateTraits) model.on(`change:${trait}`, showState);
  showState();
  model.on("change:scroll", () => reveal(find((model.get("marks").selected || [])[0]), false));
  model.on("change:scroll_current", () => reveal(find(model.get("current")), false));

  // -- page -> kernel --
  root.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    if (button && button.dataset.gsButton) send({ event: "button", name: button.dataset.gsButton });
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
  // a click anywhere on a compare row selects the call its name cell carries
  compareOut.addEventListener("click", (event) => {
    const row = event.target.closest("tr");
    const call = row && row.querySelector("[data-gs-call]");
    if (call) send({ event: "select", value: call.dataset.gsCall });
  });
  // the actions' shortcuts, while the focus is in the widget (not in a text box or a menu)
  const shortcuts = new Map(actions.filter((a) => a.key).map((a) => [a.key, a]));
  root.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.altKey || event.metaKey) return;
    if (event.target.closest("input, select, textarea")) return;
    const action = shortcuts.get((event.shiftKey ? "Shift+" : "") + event.key);
    if (!action) return;
    event.preventDefault();
    event.stopPropagation();
    if (enabled(action)) send({ event: "button", name: action.name });
  });
  filter.addEventListener("input", applyFilter);
  search.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && search.value.trim()) send({ event: "search", value: search.value });
  });
  views.addEventListener("change", () => send({ event: "view", value: views.value }));
  picker.addEventListener("change", () => {
    const option = picker.selectedOptions[0];
    // the first option clears the choice; the chosen expression is not chosen again
    if (!(option && option.hasAttribute("data-gs-chosen"))) send({ event: "choose", value: picker.value });
    // until the kernel answers, the picker shows what it has chosen (a refused choice, such
    // as a class that needs arguments, leaves it as it was)
    picker.value = model.get("choice_key") || "";
  });
  expression.addEventListener("keydown", (event) => {
    if (event.key === "Enter") send({ event: "expression", value: expression.value });
  });
  nan.addEventListener("change", () => send({ event: "nan", value: nan.checked }));
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
  };
}

export default { render };
