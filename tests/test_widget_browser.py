"""SurgeryWidget in a real JupyterLab and a real Notebook 7, in a real headless Chromium.

For each front end: a notebook shows the widget; a click on a module in the graph selects it
in the kernel (``w.selected``), the picker swaps it and the before/after picture appears, three
steps move ``gs-current`` through the picture, and module names that are markup run nothing.
Screenshots go to out/screenshots/ (one is in the README).
"""

from __future__ import annotations

import json

import pytest
from jupyter import (
    MISSING,
    browser,
    jupyterlab,
    kernel_run,
    run_notebook,
    screenshot,
    write_notebook,
)

pytestmark = pytest.mark.skipif(bool(MISSING), reason=MISSING)

CELLS = [
    """\
import torch
from torch import nn
import graphsurgeon as gs
from graphsurgeon.examples import FusedAttention, TinyGPT

torch.manual_seed(0)
model = TinyGPT(n_layers=2).eval()
tokens = model.example_input()
fast = FusedAttention(model.layers[1].attn)
w = gs.Surgery.from_model(model, (tokens,)).widget()
w""",
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

# as if from a .pt2 file of unknown origin
x = torch.randn(1, 2)
torch.export.save(gs.export(Named(), (x,)), "named.pt2")
named = gs.SurgeryWidget(torch.export.load("named.pt2"), args=(x,))
named.expand_all()
named""",
]


@pytest.fixture(scope="module", params=["lab", "notebook"])
def page(request, tmp_path_factory):
    app = request.param
    root = tmp_path_factory.mktemp(f"widget-{app}")
    scratch = tmp_path_factory.mktemp(f"jupyter-{app}")
    write_notebook(root / "widget.ipynb", CELLS)
    with jupyterlab(root, scratch, app=app) as lab, browser(scratch) as page:
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        run_notebook(page, lab, "widget.ipynb")
        page.wait_for_selector(".gs-widget .gs-viewport svg")
        page.dialogs, page.app = dialogs, app
        yield page


def in_kernel(page, expression: str):
    out = kernel_run(page, f"import json as _j; print(_j.dumps({expression}))")
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        raise AssertionError(f"the kernel said: {out}") from None


def test_a_click_in_the_graph_selects_the_module_in_the_kernel(page):
    widget = page.locator(".gs-widget").first
    box = widget.locator('[id="module:layers.1.attn"], [id="cluster:layers.1.attn"]').first
    box.click(position={"x": 6, "y": 6})
    page.wait_for_selector(".gs-widget .gs-selected")
    assert in_kernel(page, "w.selected") == "layers.1.attn"
    selected = page.evaluate(
        "() => [...document.querySelector('.gs-widget').querySelectorAll('.gs-selected')].map(e => e.id)"
    )
    assert selected and selected[0].endswith(":layers.1.attn")
    assert "layers.1.attn" in widget.locator(".gs-details").inner_text()
    screenshot(page, f"widget-{page.app}-selected.png")


def test_the_picker_swaps_it_and_the_after_picture_shows_the_replacement(page):
    widget = page.locator(".gs-widget").first
    widget.locator(".gs-search").fill("layers.1.attn")  # selected by the search box this time
    widget.locator(".gs-search").press("Enter")
    page.wait_for_function(
        "() => document.querySelector('.gs-widget .gs-tree-panel .gs-row-selected')"
    )
    assert in_kernel(page, "w.selected") == "layers.1.attn"
    widget.locator("select.gs-picker").select_option("ns:fast")
    page.wait_for_function(
        "() => document.querySelector('.gs-widget .gs-preview').textContent.includes('fast')"
    )
    assert "removes 20 fx nodes" in widget.locator(".gs-preview").inner_text()
    widget.locator('[data-gs-button="swap"]').click()
    page.wait_for_function(
        "() => document.querySelector('.gs-widget .gs-views').value === 'merged'"
    )
    assert in_kernel(page, "list(w.surgery.replacements)") == ["layers.1.attn"]
    picture = widget.locator(".gs-viewport").inner_text()
    assert "FusedAttention" in picture and "swapped" in picture
    assert in_kernel(page, "w.error") == {}
    widget.locator('[data-gs-button="verify"]').click()
    page.wait_for_function(
        "() => document.querySelector('.gs-widget .gs-verify').textContent.includes('faithful')"
    )
    screenshot(page, f"widget-{page.app}-swapped.png")
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")  # the widget from its top
    screenshot(page, f"widget-{page.app}.png")


def test_three_steps_move_the_current_node_through_the_picture(page):
    widget = page.locator(".gs-widget").first
    if not widget.locator(".gs-views").is_disabled():  # after a swap: back to the program
        widget.locator(".gs-views").select_option("program")
    page.wait_for_function(
        "() => document.querySelector('.gs-widget .gs-views').value === 'program'"
    )
    seen: list[str] = []
    for _ in range(3):
        widget.locator('[data-gs-button="step"]').click()
        page.wait_for_function(
            """(previous) => {
                const current = document.querySelector('.gs-widget .gs-current');
                return current && current.id !== previous;
            }""",
            arg=seen[-1] if seen else "",
        )
        seen.append(page.evaluate("() => document.querySelector('.gs-widget .gs-current').id"))
    assert len(set(seen)) == 3 and all(s.startswith("node:") for s in seen)
    assert in_kernel(page, "w.stepper.current.name") == seen[-1].removeprefix("node:")
    assert in_kernel(page, "w.current") == seen[-1]
    in_view = page.evaluate(
        """() => {
            const widget = document.querySelector('.gs-widget');
            const view = widget.querySelector('.gs-viewport').getBoundingClientRect();
            const node = widget.querySelector('.gs-current').getBoundingClientRect();
            return node.top >= view.top - 1 && node.bottom <= view.bottom + 1;
        }"""
    )
    assert in_view, "the current node is scrolled into the picture's view"
    widget.locator(".gs-viewport").evaluate("el => el.scrollIntoView({block: 'start'})")
    screenshot(page, f"widget-{page.app}-stepping.png")


def test_a_double_click_opens_a_module_and_errors_show_in_the_widget(page):
    widget = page.locator(".gs-widget").first
    assert in_kernel(page, "'module:layers.0' in w.svg or 'module:layers.0.mlp' in w.svg")
    target = widget.locator('[id="module:layers.0"], [id="module:layers.0.mlp"]').first
    opened = target.get_attribute("id").replace("module:", "cluster:")
    target.dblclick(position={"x": 6, "y": 6})
    page.wait_for_selector(f'.gs-widget [id="{opened}"]')
    widget.locator(".gs-search").fill("no-such-module")
    widget.locator(".gs-search").press("Enter")
    page.wait_for_selector(".gs-widget .gs-error:not([hidden])")
    assert "no module or node matches" in widget.locator(".gs-error").inner_text()
    assert in_kernel(page, "w.error['type']") == "WidgetError"


def test_names_that_are_markup_are_shown_as_text_and_run_nothing(page):
    named = page.locator(".gs-widget").nth(1)
    named.locator('[data-gs-module="blocks.<img src=x onerror=alert(1)>"] code').click()
    page.wait_for_function(
        "() => document.querySelectorAll('.gs-widget')[1].querySelector('.gs-details').textContent.includes('onerror')"
    )
    text = named.inner_text()
    assert "<img src=x onerror=alert(1)>" in text and "</svg><script>alert(2)</script>" in text
    assert (
        named.locator(
            '[id="cluster:blocks.<img src=x onerror=alert(1)>"], [id="node:linear"]'
        ).count()
        >= 1
    )
    assert page.dialogs == [], "no alert ran"
    assert named.locator("img").count() == 0
    injected = page.evaluate(
        "() => [...document.querySelectorAll('script')].filter(s => s.textContent.includes('alert(')).length"
    )
    assert injected == 0
