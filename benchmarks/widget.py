"""SurgeryWidget, timed in a real browser: JupyterLab and headless Chromium, as a user clicks.

Programs: the 96-layer GPT-like decoder of graphsurgeon.examples (every layer and attention
preserved, real weights) and the 80-layer Llama-3-70B-shaped decoder built on the meta device.
For each, a notebook shows ``gs.SurgeryWidget`` and the page times, from the click to the
change in the page (measured in the page with ``performance.now()``, checked on every change to
the widget's DOM and every animation frame; each click 0.4 s after the last answer, as a
person clicks):

* select: a click on a box or node until it carries ``gs-selected`` (median of ten; the page
  marks it from what the kernel shipped with the picture, before the kernel's answer; the
  element is found before the clock starts, as the browser's own hit test finds it);
* step: the Step button until ``gs-current`` moves (median and max over 12 steps; a step into a
  collapsed module opens it, which is a new layout); and, under the table, 8 more clicked at
  once after the last answer, as a script clicks (a small answer that follows another within
  ~0.1 s waits ~40 ms for TCP: see the README);
* open, folded: a search for the target module until its layer is open in the picture (the
  stack stays folded around it: the boxes drawn, in brackets);
* expand / collapse: a double-click on a box until the new picture is in the page: the run of
  layers into a box per layer (once), and one layer opened and closed (medians of five, so going
  back to a picture the page has shown is in the figures, as it is in use);
* run to: Run to selection on a layer's attention until ``gs-current`` is there (the stepper
  opens that layer, one layout);
* search: a search for every ``linear`` op until the matches are marked;
* swap: the Swap button (replacement chosen in the picker) until the before/after picture shows,
  clicked 0.4 s after the choice, as a person clicks (the widget builds the swap chosen in its
  picker meanwhile: ``Surgery.prepare_swap``); and, listed under the table, the same swap built
  on the click (that build switched off), as it was before;
* state: the widget's state as the kernel sends it for the default view (its JSON, and the
  binary buffers beside it: the picture, deflated).

Side by side, in the same run: the kernel's own time for the same swap (``Surgery.swap`` on a
fresh Surgery) and for the DOT text of its before/after picture (medians of three): what the
widget adds on top of the engine and the renderer is layout, transfer and the page.
Python's cyclic collector runs a full pass (about 0.5 s at 384 layers) when an action's
allocations cross its threshold, so it lands inside one action or another, decided by the exact
sequence of allocations: the kernel logs its full passes (``gc.callbacks``, wall clock), and
the time one of them overlapped each action measured once (open, folded; expand of the run; run
to; search; swap) is listed under the table.
Targets (the widget's promise): select and step <= 100 ms, expand/collapse and swap <= 1 s,
state < 1 MB. Run: ``python benchmarks/widget.py`` (``--quick``: 32 layers and 16 Llama layers;
``--large``: the 384-layer decoder too, 16,526 fx nodes: a few minutes more).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers.jupyter import browser, jupyterlab, kernel_run, run_notebook, write_notebook  # noqa: E402

REPEATS = 5  # expand and collapse of one layer, each a median of this many
# Seconds between an answer and the next click. A person takes longer; a script clicking at
# once meets a ~40 ms TCP wait on small answers that no person meets (README), so the table is
# clicked at this pace and the steps are also timed at once, apart.
PACE = 0.4
# the Step button, until the current node moves: (action, done) for `timed`
STEP = (
    "window.__gsCurrent = (root.querySelector('.gs-current') || {}).id;"
    "root.querySelector('[data-gs-button=\"step\"]').click();",
    "const c = root.querySelector('.gs-current'); return c && c.id !== window.__gsCurrent;",
)
LARGE_LAYERS = 384  # the decoder of --large: 16,526 fx nodes

TARGETS = {
    "select": 0.1,
    "step": 0.1,
    "expand": 1.0,
    "collapse": 1.0,
    "run_to": 1.0,
    "search": 1.0,
    "swap": 1.0,
}

# Run first in each program's kernel: a log of the collector's full passes, which
# ``timed_once`` reads (every program's kernel keeps its own).
COLLECTOR_LOG = """\
import gc, time
FULL_PASSES = []  # the collector's full passes: (wall clock at their end, seconds)
def _full_pass(phase, info, started=[0.0]):
    if info["generation"] == 2:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            FULL_PASSES.append((time.time(), time.perf_counter() - started[0]))
gc.callbacks.append(_full_pass)
"""

SETUP = {
    "decoder": """\
import copy, json, time, torch
import graphsurgeon as gs
from graphsurgeon.examples import FusedAttention, TinyGPT
torch.manual_seed(0)
LAYERS = {layers}
model = TinyGPT(LAYERS).eval()
tokens = model.example_input()
preserve = [f"layers.{{i}}" for i in range(LAYERS)] + [f"layers.{{i}}.attn" for i in range(LAYERS)]
ep = gs.export(model, (tokens,), preserve=preserve)
replacement = FusedAttention(model.layers[3].attn)
TARGET = "layers.3.attn"
w = gs.SurgeryWidget(ep, args=(tokens,))
w""",
    "llama": """\
import copy, json, time, torch
import graphsurgeon as gs
from graphsurgeon.examples import LlamaLike
LAYERS = {layers}
with torch.device("meta"):
    model = LlamaLike(n_layers=LAYERS).eval()
    tokens = torch.zeros(1, 16, dtype=torch.long)
preserve = [f"layers.{{i}}" for i in range(LAYERS)] + [f"layers.{{i}}.self_attn" for i in range(LAYERS)]
ep = gs.export(model, (tokens,), preserve=preserve)
replacement = copy.deepcopy(model.layers[3].self_attn)
TARGET = "layers.3.self_attn"
w = gs.SurgeryWidget(ep, args=(tokens,))
w""",
}

# Runs in the page: performs `action`, then takes the time when `done()` first holds; seconds.
# `done()` is checked on every change to the widget's DOM (a MutationObserver, so the time is
# when the change is in the page, not the next animation frame: polling per frame alone rounds
# to 16.7 ms) and on every frame as well. `prepare` (optional) runs before the clock starts and
# what it returns is `ctx` in both: the element a click hits, found and measured ahead, so a
# page-wide lookup by the benchmark (0.5-1 ms at 384 layers, per lookup) is not counted as the
# widget's time.
TIMED = """async ([action, done, prepare]) => {
    const root = document.querySelector('.gs-widget');
    const act = new Function('root', 'ctx', action), check = new Function('root', 'ctx', done);
    const ctx = prepare ? new Function('root', prepare)(root) : null;
    return await new Promise((resolve, reject) => {
        let finished = false;
        const start = performance.now();
        const finish = () => {
            if (finished || !check(root, ctx)) return finished;
            finished = true;
            observer.disconnect();
            resolve((performance.now() - start) / 1000);
            return true;
        };
        const observer = new MutationObserver(finish);
        observer.observe(root, {subtree: true, childList: true, attributes: true});
        act(root, ctx);
        const poll = () => {
            if (finish()) return;
            if (performance.now() - start > 60000) {
                observer.disconnect();
                reject(new Error('timed out: ' + done));
                return;
            }
            requestAnimationFrame(poll);
        };
        poll();
    });
}"""


def click(selector: str, kind: str = "click") -> str:
    return (
        f"const el = root.querySelector({json.dumps(selector)});"
        f"const box = el.getBoundingClientRect();"
        f"el.dispatchEvent(new MouseEvent({json.dumps(kind)}, {{bubbles: true, "
        f"clientX: box.left + 4, clientY: box.top + 4, detail: {2 if kind == 'dblclick' else 1}}}));"
    )


def timed(
    page, action: str, done: str, pace: float | None = None, prepare: str | None = None
) -> float:
    """``action`` performed in the page ``pace`` seconds (default PACE) after the last answer,
    as a person clicks; the seconds until ``done()`` holds (``prepare``: see TIMED)."""
    time.sleep(PACE if pace is None else pace)
    return page.evaluate(TIMED, [action, done, prepare])


def found(selector: str) -> str:
    """A ``prepare`` for TIMED: the element ``selector`` finds and its box, as ``ctx``."""
    return (
        f"const el = root.querySelector({json.dumps(selector)});"
        "return {el, box: el.getBoundingClientRect()};"
    )


# a click on ctx.el (from `found`), as `click` makes one
CLICK_FOUND = (
    "ctx.el.dispatchEvent(new MouseEvent('click', {bubbles: true, "
    "clientX: ctx.box.left + 4, clientY: ctx.box.top + 4, detail: 1}));"
)


def timed_once(page, result: dict, key: str, action: str, done: str) -> float:
    """``timed``, for an action measured once: also the seconds of the kernel's full
    collections that overlapped it (``result["collector"][key]``)."""
    start = time.time()
    seconds = timed(page, action, done)
    end = time.time()
    passes = json.loads(kernel_run(page, "print(json.dumps(FULL_PASSES))"))
    overlap = sum(max(0.0, min(end, stop) - max(start, stop - took)) for stop, took in passes)
    result.setdefault("collector", {})[key] = overlap
    return seconds


SWAP_BUTTON = "document.querySelector('.gs-widget [data-gs-button=\"swap\"]')"


def timed_swap(page, result: dict, key: str, remember: str) -> float:
    """The replacement chosen in the picker for the module selected, then (once Swap is ready)
    Swap pressed, timed once until the before/after picture shows; the widget must report no
    error."""
    page.select_option(".gs-widget select.gs-picker", "ns:replacement")
    page.wait_for_function(f"() => !{SWAP_BUTTON}.disabled")  # chosen: Swap is ready
    seconds = timed_once(
        page,
        result,
        key,
        remember + "root.querySelector('[data-gs-button=\"swap\"]').click();",
        "return root.querySelector('.gs-views').value === 'merged' && "
        "root.querySelector('.gs-viewport svg') !== window.__gsSvg;",
    )
    errors = kernel_run(page, "print(json.dumps(w.error))")
    assert json.loads(errors) == {}, errors
    return seconds


def measure(page, name: str) -> dict:
    result: dict = {"program": name}
    state = kernel_run(
        page,
        "from ipywidgets.widgets.widget import _remove_buffers\n"
        "_state, _, _buffers = _remove_buffers(w.get_state())\n"
        "print(len(json.dumps(_state)) + sum(len(b) for b in _buffers))",
    )
    result["state"] = int(state)
    result["nodes"] = int(kernel_run(page, "print(len(ep.graph.nodes))"))
    target = json.loads(kernel_run(page, "print(json.dumps(TARGET))"))
    layer = target.rsplit(".", 1)[0]

    # open from the folded view: a search for the target (what a user who knows the name does)
    # until its layer is open in the picture: the stack stays folded around it
    result["open_folded"] = timed_once(
        page,
        result,
        "open_folded",
        f"const box = root.querySelector('.gs-search'); box.value = {json.dumps(target)};"
        "box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));",
        f"return !!root.querySelector('[id=\"cluster:{layer}\"]');",
    )
    result["folded_boxes"] = page.evaluate(
        "() => document.querySelectorAll('.gs-widget .gs-viewport g.node[id^=\"module\"]').length"
    )
    kernel_run(page, "w.close_search(); w.auto()")
    page.wait_for_function(f"() => !document.querySelector('.gs-widget [id=\"cluster:{layer}\"]')")

    # expand: the run of layers into one box per layer; then one layer opened and closed
    # REPEATS times (a double-click each way), the figures the medians
    runs = page.evaluate(
        "() => [...document.querySelectorAll('.gs-widget g.node')].map(g => g.id)"
        ".filter(i => i.startsWith('modules:'))"
    )
    svg_changed = "return root.querySelector('.gs-viewport svg') !== window.__gsSvg;"
    remember = "window.__gsSvg = root.querySelector('.gs-viewport svg');"
    expand_run = (
        timed_once(
            page,
            result,
            "unfold_run",
            remember + click(f'[id="{runs[0]}"]', "dblclick"),
            svg_changed,
        )
        if runs
        else 0.0
    )
    expands, collapses, selects = [], [], []
    for repeat in range(REPEATS):
        expands.append(
            timed(
                page,
                remember + click(f'[id="module:{layer}"]', "dblclick"),
                f"return !!root.querySelector('[id=\"cluster:{layer}\"]');",
            )
        )
        if repeat == 0:  # select: ten different boxes or nodes from the open layer down
            # (by where they are drawn: a tall picture's elements are in several svgs)
            ids = page.evaluate(
                f"""() => {{
                    const view = document.querySelector('.gs-widget .gs-viewport');
                    const top = view.querySelector('[id="cluster:{layer}"]')
                        .getBoundingClientRect().top;
                    return [...view.querySelectorAll('g.node')]
                        .filter(g => /^(node|module):/.test(g.id))
                        .map(g => [g.id, g.getBoundingClientRect().top])
                        .filter(([, y]) => y >= top).sort((a, b) => a[1] - b[1])
                        .slice(0, 10).map(([id]) => id);
                }}"""
            )
            for element in ids:
                selects.append(
                    timed(
                        page,
                        CLICK_FOUND,
                        "return ctx.el.classList.contains('gs-selected');",
                        prepare=found(f'[id="{element}"]'),
                    )
                )
                kernel_run(page, "w.selected")  # the kernel's answer in, before the next click
        collapses.append(
            timed(
                page,
                remember
                + click(f'[id="cluster:{layer}"] polygon, [id="cluster:{layer}"] path', "dblclick"),
                f"return !!root.querySelector('[id=\"module:{layer}\"]');",
            )
        )
    result["expand"] = max(expand_run, statistics.median(expands))
    result["unfold_run"], result["open_layer"] = expand_run, statistics.median(expands)
    result["collapse"] = statistics.median(collapses)
    result["select"] = statistics.median(selects)

    # steps: the Step button until the current node moves
    steps = [timed(page, *STEP) for _ in range(12)]
    result["step"] = statistics.median(steps[1:])  # the first builds the stepper
    result["step_max"] = max(steps[1:])
    result["first_step"] = steps[0]
    # the same, each click at once after the last answer, as a script clicks: a small answer
    # that follows another within ~0.1 s waits ~40 ms for a TCP acknowledgement (README)
    result["step_at_once"] = statistics.median(timed(page, *STEP, pace=0) for _ in range(8))

    # run to selection: the attention of a layer the picture shows as a box
    kernel_run(page, f"w.select({target!r})")
    result["run_to"] = timed_once(
        page,
        result,
        "run_to",
        "window.__gsCurrent = (root.querySelector('.gs-current') || {}).id;"
        "root.querySelector('[data-gs-button=\"run_to_selection\"]').click();",
        "const c = root.querySelector('.gs-current'); return c && c.id !== window.__gsCurrent;",
    )

    # search: every linear op, marked in the picture and listed
    result["search"] = timed_once(
        page,
        result,
        "search",
        "const box = root.querySelector('.gs-search'); box.value = 'linear';"
        "box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));",
        "return root.querySelector('.gs-viewport .gs-match') !== null;",
    )
    kernel_run(page, "w.close_search()")

    # swap: select the attention, choose the replacement in the picker, press Swap
    kernel_run(page, f"w.select({target!r})")
    result["swap"] = timed_swap(page, result, "swap", remember)

    # side by side: the same swap built on the click, as it was before the widget built the
    # swap chosen in its picker ahead (the same click, that build switched off)
    kernel_run(
        page,
        "from graphsurgeon.widget import _widget\n"
        "_AHEAD, _widget.PREPARE_DELAY = _widget.PREPARE_DELAY, None\n"
        f"w.undo(); w.select(None); w.select({target!r})",
    )
    page.wait_for_function(f"() => {SWAP_BUTTON}.disabled")  # the page has it: nothing chosen
    result["swap_on_click"] = timed_swap(page, result, "swap_on_click", remember)
    kernel_run(page, "_widget.PREPARE_DELAY = _AHEAD")

    # side by side: the kernel alone, the same swap on a fresh Surgery, and the DOT text of its
    # before/after picture (medians of three)
    anchor = kernel_run(
        page,
        """\
owns, dots = [], []
for _ in range(3):
    s2 = gs.Surgery(ep)
    start = time.perf_counter(); s2.swap(TARGET, replacement); owns.append(time.perf_counter() - start)
    start = time.perf_counter(); gs.to_dot(s2, diff="merged"); dots.append(time.perf_counter() - start)
print(json.dumps([sorted(owns)[1], sorted(dots)[1]]))""",
    )
    try:
        result["kernel_swap"], result["kernel_dot"] = json.loads(anchor.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise RuntimeError(f"the side-by-side swap failed in the kernel: {anchor}") from None
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 decoder and 16 Llama layers")
    parser.add_argument("--large", action="store_true", help="also the 384-layer decoder")
    options = parser.parse_args()
    programs = [("decoder", 32 if options.quick else 96), ("llama", 16 if options.quick else 80)]
    if options.large:
        programs.append(("decoder", LARGE_LAYERS))
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        root, scratch = Path(temporary) / "notebooks", Path(temporary) / "jupyter"
        root.mkdir()
        scratch.mkdir()
        for kind, layers in programs:
            write_notebook(
                root / f"{kind}{layers}.ipynb", [COLLECTOR_LOG + SETUP[kind].format(layers=layers)]
            )
        with jupyterlab(root, scratch) as lab, browser(scratch) as page:
            for kind, layers in programs:
                started = time.perf_counter()
                run_notebook(page, lab, f"{kind}{layers}.ipynb")
                page.wait_for_selector(".gs-widget .gs-viewport svg")
                print(
                    f"{kind} {layers} layers: exported and shown in {time.perf_counter() - started:.1f} s"
                )
                rows.append(measure(page, f"{kind} {layers} layers"))
                # the next program gets a kernel (and memory) of its own
                page.evaluate(
                    "() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()"
                )
    print()
    print(
        "| program | fx nodes | state | select | step (max) | open, folded (boxes) "
        "| expand: run / layer | collapse | run to | search | swap | kernel: swap + DOT |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['program']} | {r['nodes']:,} | {r['state'] / 1e6:.2f} MB "
            f"| {r['select'] * 1e3:.0f} ms | {r['step'] * 1e3:.0f} ms ({r['step_max'] * 1e3:.0f}) "
            f"| {r['open_folded'] * 1e3:.0f} ms ({r['folded_boxes']}) "
            f"| {r['unfold_run'] * 1e3:.0f} / {r['open_layer'] * 1e3:.0f} ms "
            f"| {r['collapse'] * 1e3:.0f} ms | {r['run_to'] * 1e3:.0f} ms "
            f"| {r['search'] * 1e3:.0f} ms | {r['swap'] * 1e3:.0f} ms "
            f"| {r['kernel_swap'] * 1e3:.0f} + {r['kernel_dot'] * 1e3:.0f} ms |"
        )
    print()
    print(
        "Step clicked at once after the last answer (median of 8), as a script clicks; the "
        f"table's clicks come {PACE} s after the last answer, as a person clicks:"
    )
    for r in rows:
        print(f"  {r['program']}: {r['step_at_once'] * 1e3:.0f} ms")
    print()
    print(
        "Swap: the table's is clicked as a person clicks, after the widget has built the swap "
        "chosen in its picker; the same swap built on the click (that build switched off):"
    )
    for r in rows:
        print(
            f"  {r['program']}: {r['swap'] * 1e3:.0f} ms built ahead, "
            f"{r['swap_on_click'] * 1e3:.0f} ms built on the click"
        )
    print()
    print("The collector's full passes inside an action measured once (seconds of it):")
    for r in rows:
        inside = [f"{k} {v:.2f} s of {r[k]:.2f} s" for k, v in r["collector"].items() if v > 0]
        print(f"  {r['program']}: {', '.join(inside) or 'none'}")
    print()
    print("Against the targets (measured / target; under 1 is within):")
    for r in rows:
        ratios = ", ".join(f"{k} {r[k] / t:.2f}" for k, t in TARGETS.items())
        print(f"  {r['program']}: {ratios}, state {r['state'] / 1e6:.2f}")
    (ROOT / "out").mkdir(exist_ok=True)
    (ROOT / "out" / "widget-benchmark.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
