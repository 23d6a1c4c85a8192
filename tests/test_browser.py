"""In a real JupyterLab, in a real browser: every object displays itself, pictures fit the
output area and keep their tooltips, and module names that are markup run nothing.

One JupyterLab and one headless Chromium for the module (tests/helpers/jupyter.py); screenshots go
to out/screenshots/ (one of them is in the README).
"""

from __future__ import annotations

import pytest
from helpers.jupyter import MISSING, browser, jupyterlab, run_notebook, screenshot, write_notebook

pytestmark = pytest.mark.skipif(bool(MISSING), reason=MISSING)

DISPLAY_CELLS = [
    """\
import torch
from torch import nn
import graphsurgeon as gs
from graphsurgeon.checks.verify import eager_reference
from graphsurgeon.swap import swap_info
from graphsurgeon.examples import FusedAttention, GeluTanhMLP, TinyGPT

torch.manual_seed(0)
model = TinyGPT(n_layers=4).eval()
tokens = model.example_input()
ep = gs.export(model, (tokens,))
replacements = {"layers.1.attn": FusedAttention(model.layers[1].attn),
                "layers.2.mlp": GeluTanhMLP(model.layers[2].mlp)}
swapped = gs.swap(ep, replacements)""",
    "gs.draw(ep)",
    "gs.draw(swapped, diff='split')",
    "gs.module_tree(ep)",
    "gs.verify(eager_reference(model, replacements), swapped, (tokens,))",
    "gs.compare(ep, swapped, (tokens,))",
    "swap_info(swapped).diff",
    """\
stepper = gs.Stepper(swapped, tokens)
stepper.run_to("layers.2.mlp")
stepper""",
    """\
class Named(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({"<img src=x onerror=alert(1)>": nn.Linear(2, 2),
                                     "</svg><script>alert(2)</script>": nn.Linear(2, 2)})
    def forward(self, x):
        for block in self.blocks.values():
            x = torch.relu(block(x))
        return x

named = gs.export(Named(), (torch.randn(1, 2),))
gs.draw(named, collapse=None)""",
    "gs.module_tree(named)",
    """\
surgery = gs.Surgery.from_model(model, (tokens,))
surgery.swap("layers.1.attn", FusedAttention(model.layers[1].attn))
surgery.verify()
surgery""",
]


@pytest.fixture(scope="module")
def lab_page(tmp_path_factory):
    root = tmp_path_factory.mktemp("notebooks")
    scratch = tmp_path_factory.mktemp("jupyter")
    write_notebook(root / "display.ipynb", DISPLAY_CELLS)
    with jupyterlab(root, scratch) as lab, browser(scratch) as page:
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        run_notebook(page, lab, "display.ipynb")
        yield page, dialogs


def outputs(page) -> list[dict]:
    """What each cell's output area holds in the page."""
    return page.evaluate(
        """() => {
            const panel = window.jupyterapp.shell.currentWidget;
            return panel.content.widgets.filter(c => c.model.type === 'code').map(cell => {
                const area = cell.node.querySelector('.jp-OutputArea');
                const svg = area && area.querySelector('svg');
                const errors = area ? area.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').length : 0;
                return {
                    text: area ? area.textContent : '',
                    areaWidth: area ? area.getBoundingClientRect().width : 0,
                    svgWidth: svg ? svg.getBoundingClientRect().width : 0,
                    titles: svg ? svg.querySelectorAll('title').length : 0,
                    imgs: area ? area.querySelectorAll('img').length : 0,
                    tables: area ? area.querySelectorAll('table.gs-table').length : 0,
                    details: area ? area.querySelectorAll('details').length : 0,
                    trees: area ? area.querySelectorAll('.gs-tree').length : 0,
                    errors,
                    html: area ? area.innerHTML.length : 0,
                };
            });
        }"""
    )


def test_every_object_displays_itself_and_nothing_raised(lab_page):
    page, _ = lab_page
    cells = outputs(page)
    assert len(cells) == len(DISPLAY_CELLS)
    assert all(cell["errors"] == 0 for cell in cells), [c["text"][:300] for c in cells]
    assert all("Traceback" not in cell["text"] for cell in cells)
    tree, verify, compare, diff, stepper = cells[3], cells[4], cells[5], cells[6], cells[7]
    assert tree["trees"] == 1 and tree["details"] >= 5 and "Attention" in tree["text"]
    assert verify["tables"] == 1 and "verify match" in verify["text"]
    assert compare["tables"] >= 1 and "first divergence: layers.2.mlp" in compare["text"]
    assert diff["details"] >= 3 and "removed" in diff["text"]
    assert stepper["tables"] == 1 and "layers.2.mlp" in stepper["text"]
    surgery = cells[10]
    assert surgery["svgWidth"] > 0 and surgery["tables"] >= 2, "picture, history, verify"
    screenshot(page, "display-objects.png", full_page=True)


def test_pictures_are_inline_svg_that_fit_the_output_and_keep_their_tooltips(lab_page):
    page, _ = lab_page
    for cell in outputs(page)[1:3]:
        assert cell["svgWidth"] > 0 and cell["imgs"] == 0, "inline SVG, not an <img>"
        assert cell["titles"] > 10, "the tooltips are there"
        assert cell["svgWidth"] <= cell["areaWidth"] + 1, "the picture fits the output area"
    page.locator(".gs-drawing").first.scroll_into_view_if_needed()
    screenshot(page, "draw-default-view.png")


def test_zoom_buttons_zoom_and_fit_goes_back(lab_page):
    page, _ = lab_page
    drawing = page.locator(".gs-drawing").first
    svg = drawing.locator("svg").first
    before = svg.bounding_box()["width"]
    drawing.locator('button[data-gs="in"]').click()
    drawing.locator('button[data-gs="in"]').click()
    assert svg.bounding_box()["width"] > before * 1.4
    drawing.locator('button[data-gs="fit"]').click()
    assert abs(svg.bounding_box()["width"] - before) < 1


def test_names_that_are_markup_are_shown_as_text_and_run_nothing(lab_page):
    page, dialogs = lab_page
    drawing, tree = outputs(page)[8], outputs(page)[9]
    assert dialogs == [], "no alert ran"
    assert drawing["imgs"] == 0 and tree["imgs"] == 0, "no <img> element was made"
    assert "<img src=x onerror=alert(1)>" in drawing["text"] + tree["text"]
    assert "</svg><script>alert(2)</script>" in drawing["text"] + tree["text"]
    injected = page.evaluate(
        "() => [...document.querySelectorAll('script')].filter(s => s.textContent.includes('alert(')).length"
    )
    assert injected == 0
    page.locator(".gs-drawing").nth(2).scroll_into_view_if_needed()
    screenshot(page, "markup-names-as-text.png")
