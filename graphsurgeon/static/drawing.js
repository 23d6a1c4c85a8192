// Zoom and pan for a graphsurgeon drawing shown in a notebook. Vendored with the package and
// inlined into each output: nothing is loaded from the network. Plain wheel scrolls the page as
// usual; Ctrl (or Cmd) + wheel and the +/- buttons zoom around the pointer; dragging pans once
// zoomed; "fit" goes back to the width of the output. Without scripts the picture still fits.
(function (root) {
  if (!root || root.dataset.gsReady) return;
  root.dataset.gsReady = "1";
  var view = root.querySelector(".gs-viewport");
  var svg = view && view.querySelector("svg");
  if (!svg) return;
  var natural = parseFloat(svg.getAttribute("width")) || svg.getBoundingClientRect().width;
  // fitted, a picture is never shown smaller than this: a wider one scrolls in its frame
  var smallest = parseFloat(root.dataset.gsMinScale) || 0;
  var scale = null; // null: fitted to the output's width
  function current() {
    return scale === null ? Math.max(smallest, Math.min(1, view.clientWidth / natural)) : scale;
  }
  function zoom(factor, x, y) {
    var before = current();
    var after = Math.max(0.05, Math.min(8, before * factor));
    if (x === undefined) { x = view.clientWidth / 2; y = view.clientHeight / 2; }
    scale = after;
    root.classList.add("gs-zoomed");
    svg.style.maxWidth = "none";
    svg.style.minWidth = "0";
    svg.style.width = natural * after + "px";
    var k = after / before;
    view.scrollLeft = (view.scrollLeft + x) * k - x;
    view.scrollTop = (view.scrollTop + y) * k - y;
  }
  function fit() {
    scale = null;
    root.classList.remove("gs-zoomed");
    svg.style.maxWidth = "";
    svg.style.minWidth = smallest ? natural * smallest + "px" : "";
    svg.style.width = "";
    view.scrollLeft = 0;
    view.scrollTop = 0;
  }
  function on(name, handler) {
    var button = root.querySelector('[data-gs="' + name + '"]');
    if (button) button.addEventListener("click", handler);
  }
  on("in", function () { zoom(1.25); });
  on("out", function () { zoom(0.8); });
  on("fit", fit);
  view.addEventListener("wheel", function (event) {
    if (!(event.ctrlKey || event.metaKey)) return;
    event.preventDefault();
    var box = view.getBoundingClientRect();
    zoom(Math.exp(-event.deltaY * 0.002), event.clientX - box.left, event.clientY - box.top);
  }, { passive: false });
  var drag = null;
  view.addEventListener("pointerdown", function (event) {
    if (event.button !== 0 || scale === null) return;
    drag = { x: event.clientX, y: event.clientY, left: view.scrollLeft, top: view.scrollTop };
    root.classList.add("gs-dragging");
  });
  window.addEventListener("pointermove", function (event) {
    if (!drag) return;
    view.scrollLeft = drag.left - (event.clientX - drag.x);
    view.scrollTop = drag.top - (event.clientY - drag.y);
  });
  window.addEventListener("pointerup", function () {
    drag = null;
    root.classList.remove("gs-dragging");
  });
})(document.currentScript && document.currentScript.parentElement);
