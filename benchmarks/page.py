"""A picture in the page: drawn whole against in tiles, side by side in one headless Chromium.

The widget sends a tall picture in tiles that the browser styles, lays out and paints only near
the view (``graphsurgeon/widget/_tiles.py``). This measures what that saves the page, without
JupyterLab: one page with the widget's stylesheet and a picture area of the widget's size at
1280x900 (730x632 px). For each program, the picture of every layer a box and one layer open
(what opening a layer shows), as the widget sends it whole (``display.inline_svg``) and in
tiles (``_tiles.tiled``); each form put into the picture area 12 times, alternately with a copy
of itself (a picture the page has parsed, put back: what open and collapse do), the two forms
interleaved. Reported, medians:

* insert: ``replaceChildren`` of the picture area with the parsed picture;
* style + layout: the browser's pass forced right after (``getBoundingClientRect``);
* frame: from the insert to the next frame's timer (paint included), ~16 ms of it waiting;
* parse: ``innerHTML`` of the text, once per form (a picture the page had not seen).

The programs: the decoder of graphsurgeon.examples at 96 and 384 layers (``--quick``: 32 and 96).
Run: ``python benchmarks/page.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

import graphsurgeon as gs
from graphsurgeon.display import inline_svg
from graphsurgeon.examples import TinyGPT
from graphsurgeon.widget._tiles import tiled

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers.jupyter import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

STYLE = ROOT / "graphsurgeon" / "widget" / "static" / "widget.css"

# Runs in the page: the picture `text` put into the picture area `rounds` times; milliseconds.
MEASURE = """async ([text, rounds]) => {
    const view = document.querySelector('.gs-viewport');
    const frame = () => new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
    const parsed = () => { const box = document.createElement('div'); box.innerHTML = text;
        return [...box.childNodes]; };
    const started = performance.now(); parsed(); const parse = performance.now() - started;
    const copies = [parsed(), parsed()], rows = [];
    for (let i = 0; i < rounds + 2; i++) {
        await frame();
        const t0 = performance.now();
        view.replaceChildren(...copies[i % 2]);
        const t1 = performance.now();
        view.getBoundingClientRect();
        document.body.offsetHeight;
        const t2 = performance.now();
        await frame();
        if (i >= 2) rows.push([t1 - t0, t2 - t1, performance.now() - t0]);  // two warm-ups
    }
    return {parse, rows, elements: view.querySelectorAll('*').length};
}"""


def picture(layers: int) -> str:
    """The picture opening a layer shows: every layer a box, ``layers.3`` open."""
    torch.manual_seed(0)
    model = TinyGPT(n_layers=layers).eval()
    ep = gs.export(model, (model.example_input(),), preserve=[f"layers.{i}" for i in range(layers)])
    boxes = {f"layers.{i}" for i in range(layers) if i != 3}
    return inline_svg(gs.to_svg(ep, collapse=boxes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 and 96 layers")
    parser.add_argument("--rounds", type=int, default=12, help="insertions of each form")
    options = parser.parse_args()
    from playwright.sync_api import sync_playwright

    sizes = [32, 96] if options.quick else [96, 384]
    pictures = {}
    for layers in sizes:
        whole = picture(layers)
        pictures[layers] = {"whole": whole, "tiles": tiled(whole)}
        if pictures[layers]["tiles"] == whole:
            print(f"{layers} layers: the picture is not tall enough for tiles", file=sys.stderr)
    shell = (
        f"<style>body{{margin:0}}{STYLE.read_text()}</style><div class='gs-widget'>"
        "<div class='gs-picture' style='width:730px;height:632px'><div class='gs-viewport'"
        " style='height:100%;overflow:auto'></div></div></div>"
    )
    results = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_content(shell)
        for layers in sizes:
            rows = {"whole": [], "tiles": []}
            parse, elements = {}, {}
            for _ in range(2):  # the two forms interleaved, twice over
                for form in ("whole", "tiles"):
                    out = page.evaluate(
                        MEASURE, [pictures[layers][form], max(1, options.rounds // 2)]
                    )
                    rows[form] += out["rows"]
                    parse.setdefault(form, []).append(out["parse"])
                    elements[form] = out["elements"]
            results[layers] = {
                form: {
                    "insert": statistics.median(r[0] for r in rows[form]),
                    "style_layout": statistics.median(r[1] for r in rows[form]),
                    "frame": statistics.median(r[2] for r in rows[form]),
                    "parse": min(parse[form]),
                    "elements": elements[form],
                }
                for form in rows
            }
        browser.close()
    print(
        "| layers | form | elements | parse | insert | style + layout | frame |\n"
        "|---:|---|---:|---:|---:|---:|---:|"
    )
    for layers, forms in results.items():
        for form, r in forms.items():
            print(
                f"| {layers} | {form} | {r['elements']:,} | {r['parse']:.1f} ms "
                f"| {r['insert']:.1f} ms | {r['style_layout']:.1f} ms | {r['frame']:.1f} ms |"
            )
    print("\nTiles against whole (under 1 is faster), and each size against the smallest:")
    first = sizes[0]
    for layers, forms in results.items():
        ratio = {
            k: forms["tiles"][k] / forms["whole"][k] for k in ("insert", "style_layout", "frame")
        }
        growth = {
            form: forms[form]["frame"] / results[first][form]["frame"]
            for form in ("whole", "tiles")
        }
        print(
            f"  {layers} layers: insert {ratio['insert']:.2f}x, style + layout "
            f"{ratio['style_layout']:.2f}x, frame {ratio['frame']:.2f}x; frame against "
            f"{first} layers: whole {growth['whole']:.2f}x, tiles {growth['tiles']:.2f}x"
        )


if __name__ == "__main__":
    main()
