"""Notebook display: every result object's mime bundle (HTML structure, plain text), draw().

The HTML is parsed, not matched as text: what is checked is its structure (tables, folds,
badges, an inline <svg> with <title> tooltips) and that names from the program are text.
"""

from __future__ import annotations

import html.parser
import shutil

import pytest
import torch
from helpers.view_models import MarkupNamed, StrangelyNamedBlocks, Wide
from torch import nn

import graphsurgeon as gs
from graphsurgeon.examples import FusedAttention, GeluTanhMLP, TinyGPT
from graphsurgeon.export import export_notes
from graphsurgeon.swap import swap_info
from graphsurgeon.types import Drawing

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` not installed")


class Elements(html.parser.HTMLParser):
    """Every start tag with its attributes, the text, and whether the markup nests properly."""

    VOID = frozenset(
        {"br", "hr", "img", "input", "meta", "link", "path", "polygon", "ellipse", "polyline"}
    )

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.open: list[str] = []
        self.balanced = True
        self.feed(text)
        self.close()
        self.balanced = self.balanced and not self.open

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.open or self.open[-1] != tag:
            self.balanced = False
            return
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)

    def count(self, tag: str, **attrs) -> int:
        return sum(
            1
            for t, a in self.tags
            if t == tag and all(v in (a.get(k) or "").split() for k, v in attrs.items())
        )

    @property
    def all_text(self) -> str:
        return " ".join(self.text)


def bundle_of(obj) -> tuple[Elements, str]:
    data = obj._repr_mimebundle_()
    assert set(data) == {"text/html", "text/plain"}
    page = Elements(data["text/html"])
    assert page.balanced, "the HTML nests properly"
    assert page.count("div", **{"class": "gs-out"}) >= 1, "in its scoped container"
    assert page.count("script") == 0 or isinstance(obj, Drawing | gs.types.GraphView | gs.Surgery)
    return page, data["text/plain"]


@pytest.fixture(scope="module")
def gpt(tiny_gpt):
    model, tokens, ep = tiny_gpt
    replacements = {
        "layers.1.attn": FusedAttention(model.layers[1].attn),
        "layers.0.mlp": GeluTanhMLP(model.layers[0].mlp),
    }
    swapped = gs.swap(ep, replacements)
    return model, tokens, ep, swapped


def test_a_verify_report_is_a_table_with_its_verdict(gpt):
    model, tokens, _, swapped = gpt
    report = gs.verify(model, swapped, (tokens,))
    assert not report, "precondition: the approximate MLP makes the outputs differ"
    page, plain = bundle_of(report)
    assert plain == str(report) and plain.startswith("verify: MISMATCH")
    assert page.count("span", **{"class": "gs-bad"}) >= 2  # the verdict and the leaf
    assert page.count("table") == 1 and "values differ beyond tolerance" in page.all_text
    same, _ = bundle_of(gs.verify(model, model, (tokens,)))
    assert (
        same.count("span", **{"class": "gs-ok"}) >= 2
        and same.count("span", **{"class": "gs-bad"}) == 0
    )


def test_a_comparison_lists_the_diverging_call_first(gpt):
    _, tokens, ep, swapped = gpt
    comparison = gs.compare(ep, swapped, (tokens,))
    assert comparison.first_divergence == "layers.0.mlp", "precondition"
    page, plain = bundle_of(comparison)
    assert plain == repr(comparison) and len(plain.splitlines()) == 1
    cells = [d.strip() for d in page.text if d.strip()]
    assert cells.index("layers.0.mlp") < cells.index("layers.1.attn")
    assert "DIVERGES" in cells and "first divergence: layers.0.mlp" in cells
    assert page.count("details") == 1, "the program's outputs, folded"


def test_a_checks_table_names_each_cell_by_its_column_for_a_narrow_panel(gpt):
    # the widget's panel column shows such a table as a card per row, each value after its
    # column's name (no header row there): every named column's cell carries its name
    _, tokens, ep, swapped = gpt
    comparison = gs.compare(ep, swapped, (tokens,), backward=True)
    page, _ = bundle_of(comparison)
    tables = [a for t, a in page.tags if t == "table" and "gs-cards" in a.get("class", "")]
    assert len(tables) >= 2, "the calls' table and, folded, the outputs' leaves and gradients"
    labels = [a["data-label"] for t, a in page.tags if t == "td" and "data-label" in a]
    for column in ("call", "replacement", "max abs", "backward", "what differs", "leaf"):
        assert column in labels, column
    headers = Elements(gs.display.table(["", "name"], [["x", "y"]]))
    assert not any("data-label" in a for _, a in headers.tags), "a plain table is unchanged"
    assert all("gs-cards" not in a.get("class", "") for _, a in headers.tags)


def test_a_diff_shows_counts_and_folds_the_node_lists(gpt):
    _, _, _, swapped = gpt
    diff = swap_info(swapped).diff
    page, plain = bundle_of(diff)
    assert plain == f"<Diff: {diff}>" and len(plain) < 80
    assert f"{len(diff.removed)} removed" in page.all_text
    assert page.count("details") >= 3, "removed per call, added, kept"
    assert "linear_6" in page.all_text, "the node names are there, folded"


def test_swap_info_tables_each_call(gpt):
    _, _, _, swapped = gpt
    page, plain = bundle_of(swap_info(swapped))
    assert "2 swapped" in plain and "\n" not in plain
    assert page.count("tr") == 3 and "FusedAttention" in page.all_text


def test_a_stepper_shows_where_it_is_its_stack_and_the_values_at_hand(gpt):
    _, tokens, _, swapped = gpt
    stepper = gs.Stepper(swapped, tokens)
    stepper.run_to("layers.0.attn.q")
    page, plain = bundle_of(stepper)
    assert plain == repr(stepper)
    assert [d for d in page.text if d in ("layers.0", "layers.0.attn", "layers.0.attn.q")] == [
        "layers.0",
        "layers.0.attn",
        "layers.0.attn.q",
    ], "the module stack, outermost first"
    assert page.count("table") == 1 and "layer_norm" in page.all_text, "what the next node reads"
    result = stepper.step(5)
    page, plain = bundle_of(result)
    assert plain == str(result) and page.count("details") == 1
    summary_page, summary_plain = bundle_of(stepper.summary(result.last))
    assert summary_plain == str(stepper.summary(result.last))
    assert summary_page.count("td") == 7


def test_a_summary_with_nan_is_marked():
    summary = gs.types.Summary.of(torch.tensor([1.0, float("nan")]), name="x")
    page, _ = bundle_of(summary)
    assert page.count("span", **{"class": "gs-bad"}) == 1 and "1 / 0" in page.all_text


@needs_dot
def test_draw_shows_inline_svg_with_tooltips_ids_and_a_short_text(gpt):
    _, _, ep, swapped = gpt
    drawing = gs.draw(ep)
    page, plain = bundle_of(drawing)
    assert plain == repr(drawing) and plain.startswith("<Drawing of TinyGPT:")
    assert page.count("svg") == 1 and page.count("img") == 0, "inline SVG, not an image"
    assert page.count("title") > 10, "tooltips kept"
    assert page.count("g", id="node:tokens") == 1, "the renderer's ids kept"
    assert page.count("script") == 1 and page.count("button") == 3
    assert "<?xml" not in drawing._repr_html_() and "<!--" not in drawing._repr_html_()
    assert drawing.picture is drawing.view.picture and drawing.dot == drawing.view.dot
    split = gs.draw(swapped, diff="split")
    split_page, _ = bundle_of(split)
    assert (
        split_page.count("g", id="diff:before") == 1 and split_page.count("g", id="diff:after") == 1
    )


@needs_dot
def test_inline_svg_keeps_every_element_and_drops_the_line_breaks_between_them(gpt):
    import xml.etree.ElementTree as ET

    from graphsurgeon.display import inline_svg

    _, _, ep, _ = gpt
    raw = gs.draw(ep).view.laid_out("svg").decode()
    assert raw.count(">\n<") > 100, "precondition: dot writes one element a line"
    inline = inline_svg(raw)
    assert ">\n<" not in inline

    def elements(text):
        root = ET.fromstring(text[text.find("<svg") :])
        return [
            (e.tag, {k: v for k, v in e.attrib.items() if k not in ("width", "height")}, e.text)
            for e in root.iter()
            if e.tag != "{http://www.w3.org/2000/svg}svg"
        ]

    def stripped(text):  # the text of an element with its white space as the page draws it
        return [(tag, attrib, (t or "").strip()) for tag, attrib, t in elements(text)]

    assert stripped(inline) == stripped(raw), "every element, attribute and label kept"
    assert all((t or "").strip() or not t for _, _, t in elements(inline)), "no blank text left"


@needs_dot
def test_draw_collapses_further_until_the_picture_fits_a_notebook():
    from graphsurgeon.display import svg_size
    from graphsurgeon.drawing import FIT_WIDTH, MAX_HEIGHT

    torch.manual_seed(0)
    model = TinyGPT(4).eval()
    ep = gs.export(model, (model.example_input(),))
    tall = gs.to_svg(ep)  # the budget of to_svg: 300 nodes
    width, height = svg_size(tall)
    assert height * min(1, FIT_WIDTH / width) > MAX_HEIGHT, "precondition: too tall to fit"
    drawing = gs.draw(ep)
    assert drawing.height * min(1, FIT_WIDTH / drawing.width) <= MAX_HEIGHT
    assert drawing.max_nodes < 300 and drawing.view.collapsed
    told = gs.draw(ep, max_nodes=300)
    assert told.max_nodes is None and told.height == height, "a budget given is kept"


@needs_dot
def test_draw_saves_svg_dot_and_png(gpt, tmp_path):
    _, _, ep, _ = gpt
    drawing = gs.draw(ep)
    assert drawing.save(tmp_path / "p.svg").read_text() == drawing.svg
    assert drawing.save(tmp_path / "p.dot").read_text() == drawing.dot
    assert drawing.save(tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(gs.errors.RenderError, match=r"\.svg, \.dot, \.png or \.pdf"):
        drawing.save(tmp_path / "p.txt")


@needs_dot
def test_module_names_that_are_markup_show_as_text_and_run_nothing():
    torch.manual_seed(0)
    model, x = MarkupNamed(), torch.randn(1, 2)
    ep = gs.export(model, (x,))
    swapped = gs.swap(ep, {f"blocks.{MarkupNamed.NAMES[0]}": nn.Tanh()})
    objects = [
        gs.draw(ep, collapse=None),
        gs.draw(swapped, diff="split"),
        swap_info(swapped),
        swap_info(swapped).diff,
        gs.compare(ep, swapped, (x,)),
    ]
    for obj in objects:
        page, _ = bundle_of(obj)
        assert page.count("img") == 0, type(obj).__name__
        scripts = page.count("script")
        assert scripts == (1 if isinstance(obj, Drawing) else 0), "only the vendored one"
        markup = obj._repr_mimebundle_()["text/html"]
        assert "<img src=x" not in markup and "<script>alert(2)" not in markup
        if isinstance(obj, Drawing):
            assert any(MarkupNamed.NAMES[0] in text for text in page.text), "shown as text"


def test_the_module_tree_folds_with_counts_and_reasons(gpt):
    model, _, ep, _ = gpt
    tree = gs.module_tree(ep)
    page, plain = bundle_of(tree)
    assert plain == repr(tree) and plain == "<ModuleTree: 30 modules, 28 swappable>"
    assert page.count("details") == sum(1 for i in tree.values() if i.children), "one fold each"
    # top-level modules and the container's blocks show; deeper ones start folded
    opened = [a for t, a in page.tags if t == "details" and "open" in a]
    assert len(opened) == 2, "the root and the nn.ModuleList"
    assert "container" in page.all_text and "never called during export" in page.all_text
    total = sum(p.numel() for p in model.parameters())
    assert tree[""].num_parameters == total and "137.2K" in page.all_text
    assert tree["layers.0"].num_parameters == sum(p.numel() for p in model.layers[0].parameters())


def test_a_tree_row_names_its_module_under_its_parent_and_carries_its_depth():
    from graphsurgeon.display import module_tree_html

    deep = nn.Linear(2, 2)
    for _ in range(8):  # the Linear eight levels down
        deep = nn.Sequential(deep, nn.ReLU())
    tree = gs.module_tree(gs.export(deep.eval(), (torch.randn(1, 2),)))
    name = ".".join(["0"] * 7)
    for selectable in (False, True):
        page = Elements(module_tree_html(tree, selectable=selectable))
        assert page.balanced
        rows = [a for t, a in page.tags if t == "span" and "gs-name" in a.get("class", "")]
        # the page indents by the depth, never past the name's own room (its style sheet)
        assert [r["style"] for r in rows][:3] == ["--gs-depth:0", "--gs-depth:1", "--gs-depth:2"]
        assert sum(r["style"] == "--gs-depth:8" for r in rows) == 2  # the Linear and a ReLU
        if selectable:
            assert any(r.get("data-gs-module") == name for r in rows)
        else:
            assert any(r.get("title") == name for r in rows)
    assert "min(calc(var(--gs-depth,0)*14px),calc(100% - 5em))" in module_tree_html(tree)


def test_names_with_control_characters_or_thousands_of_characters_show_as_text():
    from graphsurgeon.display import id_text, module_tree_html

    ep = gs.export(StrangelyNamedBlocks(), (torch.randn(1, 2),))
    tree = gs.module_tree(ep)
    assert set(StrangelyNamedBlocks.NAMES) <= {fqn.removeprefix("blocks.") for fqn in tree}, (
        "precondition"
    )
    page, _ = bundle_of(tree)
    assert "a␀b" in page.all_text and "line␊break" in page.all_text
    assert not any(c in page.all_text for c in "\x00\r"), "no control character in the text"
    assert "x" * 30 + "…" + "x" * 29 in page.all_text, "a long name is shortened in the middle"
    assert "x" * 100 not in page.all_text
    titles = [a["title"] for t, a in page.tags if t == "span" and "title" in a]
    assert any("…" in title and len(title) < 500 for title in titles)
    selectable = Elements(module_tree_html(tree, selectable=True))
    modules = {a["data-gs-module"] for t, a in selectable.tags if "data-gs-module" in a}
    assert {id_text(f"blocks.{name}") for name in StrangelyNamedBlocks.NAMES} <= modules, (
        "as ids carry it"
    )
    if shutil.which("dot"):
        drawing, _ = bundle_of(gs.draw(ep, collapse=None))
        assert any("a␀b: Linear" in text for text in drawing.text)


def test_a_module_a_partition_and_export_notes_show_themselves(gpt):
    _, _, ep, _ = gpt
    page, plain = bundle_of(gs.module_tree(ep)["layers.0"])
    assert "swappable" in page.all_text and "49,984" in page.all_text
    assert plain == "<ModuleInfo 'layers.0': Block, 1 call, 27 nodes, swappable>"
    part = gs.partition(ep)["layers.0.attn"]
    page, plain = bundle_of(part)
    assert plain == "<Partition 'layers.0.attn': 20 nodes, swappable>"
    assert page.count("details") == 1 and "linear" in page.all_text
    notes = export_notes(ep)
    page, plain = bundle_of(notes)
    assert plain == "<ExportNotes: 29 of 29 module signatures preserved; 1 export attempt>"
    assert "29 preserved" in page.all_text


@needs_dot
def test_a_surgery_shows_its_picture_history_and_last_verify(gpt):
    model, tokens, _, _ = gpt
    surgery = gs.Surgery.from_model(model, (tokens,))
    fresh, _ = bundle_of(surgery)
    assert fresh.count("svg") == 1 and fresh.count("table") == 0, "no history yet"
    surgery.swap("layers.1.attn", FusedAttention(model.layers[1].attn))
    surgery.swap("layers.0.mlp", GeluTanhMLP(model.layers[0].mlp))
    surgery.undo()
    page, plain = bundle_of(surgery)
    assert plain == repr(surgery) and plain.startswith("<Surgery: 1 swap")
    assert "undone" in page.all_text and "step 1" in page.all_text
    assert page.count("g", id="node:swapped_layers_1_attn") == 1, "the current picture"
    assert page.count("g", **{"class": "removed"}) > 0, "drawn against the original"
    assert "verify" not in page.all_text, "not verified yet"
    surgery.verify()
    verified, _ = bundle_of(surgery)
    assert "verify" in verified.all_text and verified.count("span", **{"class": "gs-ok"}) >= 2
    surgery.redo()
    redone, _ = bundle_of(surgery)
    assert "verify" not in redone.all_text, "that report was of another state"


@needs_dot
def test_a_graph_view_shows_as_its_drawing(gpt):
    _, _, ep, _ = gpt
    view = gs.render.graph_view(ep, collapse=1)
    page, plain = bundle_of(view)
    assert page.count("svg") == 1 and page.count("g", id="module:layers.0") == 1
    assert plain.startswith("<Drawing of TinyGPT:")


def test_a_long_verify_report_keeps_a_short_plain_form():
    outputs = {f"out{i}": torch.zeros(2) for i in range(30)}

    class Many(nn.Module):
        def forward(self, x):
            return {k: v + x for k, v in outputs.items()}

    report = gs.verify(Many(), Many(), (torch.zeros(2),))
    page, plain = bundle_of(report)
    assert len(plain.splitlines()) == 12 and plain.endswith("and 20 more leaves")
    # every leaf is in the HTML: 12 shown, 18 folded, and the two tables' header rows
    assert page.count("tr") == 32 and page.count("details") == 1


def test_the_module_tree_shows_an_overlay_aggregated_per_module(gpt):
    import re

    from graphsurgeon.checks.overlay import overlay_values
    from graphsurgeon.display import module_tree_html

    _, tokens, ep, swapped = gpt
    tree = gs.module_tree(ep)
    assert "data-gs-value" not in module_tree_html(tree), "precondition: no overlay, no column"
    error = overlay_values(swapped, (tokens,), kind="error")
    html = module_tree_html(tree, overlay=error)
    page = Elements(html)
    assert page.balanced and page.count("div", **{"class": "gs-valued"}) == 1
    shown = dict(re.findall(r'title="([^"]*)"><code>.*?data-gs-value="([^"]*)"', html))
    number = error.number
    assert shown["layers.0.mlp"] == number(error.calls["layers.0.mlp"])  # beyond: marked
    assert shown["layers.0.attn"] == "0", "before the first swap: nothing"
    every = max(error.calls[c] for c in error.calls if c.startswith("layers."))
    assert shown["layers"] == number(every), "a container: the worst of its modules"
    assert shown["(root)"] == number(max(error.nodes.values()))
    row = html[html.index('title="layers.0.mlp"') :]
    assert 'class="gs-badge gs-bad"' in row[: row.index("</div>")]
    latency = overlay_values(ep, (tokens,), kind="latency", repeat=1)
    times = dict(
        re.findall(
            r'title="([^"]*)"><code>.*?data-gs-value="([^"]*)"',
            module_tree_html(tree, overlay=latency),
        )
    )
    assert times["layers.0"] == latency.number(latency.calls["layers.0"]), "a sum of shares"


@needs_dot
def test_a_wide_picture_scrolls_rather_than_shrink_its_text_below_60_percent():
    from graphsurgeon.drawing import FIT_WIDTH, MIN_SCALE

    torch.manual_seed(0)
    drawing = gs.draw(gs.export(Wide(), (torch.randn(1, 2),)), collapse=None)
    assert FIT_WIDTH / drawing.width < MIN_SCALE, "precondition: fitted, its text would shrink"
    assert drawing.scale == MIN_SCALE
    html = drawing._repr_html_()
    svg = next(a for t, a in Elements(html).tags if t == "svg")
    assert svg["style"] == f"min-width:{round(drawing.width * MIN_SCALE)}px"
    assert f'data-gs-min-scale="{MIN_SCALE:g}"' in html
    assert "Math.max(smallest," in html, "the script keeps it when it fits the width again"
