"""`graphsurgeon report` and graphsurgeon.report: one self-contained HTML page of a program.

The command runs in this process, through ``main``, from a folder that holds the replacements'
Python module (as a user runs it next to their code); one browser test opens a report in
Chromium from its file.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from html.parser import HTMLParser

import pytest
import torch
from helpers.jupyter import MISSING, browser, screenshot
from helpers.view_models import MARKUP, MarkupNamedBlocks
from torch import nn

import graphsurgeon as gs
from graphsurgeon.cli import main
from graphsurgeon.display import picture_script as _script
from graphsurgeon.errors import NotAProgramError
from graphsurgeon.report import build_report, write_report

# The replacements, as a user's module next to the program. Named for this test file, since a
# module stays imported for the session.
KERNELS = "report_kernels"
KERNELS_SOURCE = '''
import torch
from torch import nn

from graphsurgeon.examples import MLP


class Doubler(nn.Module):
    def forward(self, x):
        return x * 2


gelu = nn.GELU()  # an instance: used as it is


def tanh_mlp(original):
    """The program's MLP with the tanh approximation of GELU, built from its weights."""
    new = MLP(original.up.weight.shape[1])
    new.load_state_dict(original.state_dict())
    new.act = nn.GELU(approximate="tanh")
    return new


def two_arguments(original, scale):
    return Doubler()


def raises():
    raise ValueError("no kernel for this machine")


def not_a_module():
    return 42


class Broken(nn.Module):
    def forward(self, x):
        raise RuntimeError("kernel not built for this shape")


number = 3
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_gpt):
    folder = tmp_path_factory.mktemp("report")
    _, _, ep = tiny_gpt
    torch.export.save(ep, str(folder / "gpt.pt2"))
    loaded = torch.export.load(str(folder / "gpt.pt2"))
    loaded.example_inputs = None  # as a program saved without them
    torch.export.save(loaded, str(folder / "no-inputs.pt2"))
    torch.export.save(
        gs.export(MarkupNamedBlocks(), (torch.randn(1, 2),)), str(folder / "named.pt2")
    )
    (folder / f"{KERNELS}.py").write_text(KERNELS_SOURCE)
    yield folder
    sys.modules.pop(KERNELS, None)


@pytest.fixture
def here(files, monkeypatch):
    """Run from the folder of the program and the kernels, as a user would."""
    monkeypatch.chdir(files)
    return files


class Links(HTMLParser):
    """Every element, and every attribute that makes a browser fetch or navigate."""

    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.links: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in_script = tag == "script"
        if tag == "script":
            self.scripts.append("")
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data"):
                self.links.append(value or "")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def parse(html: str) -> Links:
    links = Links()
    links.feed(html)
    return links


def assert_self_contained(html: str) -> None:
    page = parse(html)
    assert page.links, "precondition: the page has links (its table of contents)"
    assert all(link.startswith("#") for link in page.links), page.links
    assert "link" not in page.tags and "iframe" not in page.tags and "img" not in page.tags
    assert "@import" not in html and "url(" not in html
    # the only script is the vendored zoom script, once per picture
    assert page.scripts and all(script == _script() for script in page.scripts)
    assert "default-src 'none'" in html, "the page's policy lets no request out"


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith("graphsurgeon: error: ")
    return line


# -- the command ------------------------------------------------------------------------------


def test_a_report_without_swaps_shows_the_tree_the_picture_and_the_notes(here, capsys):
    assert main(["report", "gpt.pt2", "-o", "plain.html"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plain.html: ") and "the module tree, the picture, export notes" in out
    html = (here / "plain.html").read_text()
    for section in ("program", "picture", "tree", "notes"):
        assert f'<section id="{section}">' in html
    assert 'id="checks"' not in html and 'id="swaps"' not in html, "nothing to check"
    assert "<svg" in html and "<title>" in html, "the picture inline, with its tooltips"
    assert 'class="gs-tree"' in html and "Attention" in html, "the module tree"
    assert "TinyGPT (gpt.pt2)" in html and "nothing swapped" in html
    # a program gs.export made carries its notes, also through torch.export.save and load
    assert "No notes from gs.export" not in html
    assert "torch.export attempt" in html, "the notes themselves (how the export went)"
    assert_self_contained(html)


def test_swaps_give_before_after_verify_and_compare_and_a_factory_gets_the_weights(here, capsys):
    # loose tolerances: the tanh GELU is close, so this matches only if tanh_mlp really got
    # the program's weights (a fresh MLP would be far off)
    arguments = ["report", "gpt.pt2", "--swap", f"layers.1.mlp={KERNELS}:tanh_mlp"]
    arguments += ["--swap", f"layers.0.mlp.act={KERNELS}:gelu", "-o", "swapped.html"]
    assert main([*arguments, "--rtol", "1e-2", "--atol", "1e-3"]) == 0
    out = capsys.readouterr().out
    assert "the before/after picture, verify and compare" in out
    assert "verify: match (1 output leaf, rtol=0.01, atol=0.001)" in out
    assert "compare: 2 swapped calls, none diverges" in out
    html = (here / "swapped.html").read_text()
    for section in ("program", "swaps", "checks", "picture", "tree", "notes"):
        assert f'<section id="{section}">' in html
    assert f"MLP ({KERNELS}:tanh_mlp)" in html and f"GELU ({KERNELS}:gelu)" in html
    assert "the example inputs stored in the program" in html and "int64 [1, 16]" in html
    assert 'id="before/' in html and 'id="after/' in html, "the before/after picture"
    assert html.count('data-gs="in"') == 1 and "<script>" in html, "zoomable"
    assert "verify: match" in html and "no call diverges" in html
    assert_self_contained(html)

    # at the default tolerances the approximation is a mismatch: exit 1, the report written
    assert main([*arguments[:-1], "strict.html"]) == 1
    out = capsys.readouterr().out
    assert "verify: MISMATCH" in out and "first divergence: 'layers.1.mlp'" in out
    html = (here / "strict.html").read_text()
    assert "verify: MISMATCH" in html and "first divergence: layers.1.mlp" in html


def test_an_overlay_paints_the_swapped_picture_with_its_legend(here, capsys):
    arguments = ["report", "gpt.pt2", "--swap", f"layers.1.mlp={KERNELS}:tanh_mlp"]
    assert main([*arguments, "-o", "plain.html"]) == 1  # precondition: a mismatch
    assert 'id="overlay"' not in (here / "plain.html").read_text()
    assert main([*arguments, "--overlay", "own-error", "-o", "painted.html"]) == 1
    html = (here / "painted.html").read_text()
    overlay = html[html.index('<section id="overlay">') :]
    assert "own error overlay" in overlay and 'class="gs-legend"' in overlay
    assert overlay.count("<svg") == 1 and "beyond" in overlay
    assert_self_contained(html)
    with pytest.raises(SystemExit):
        main([*arguments, "--overlay", "colour", "-o", "x.html"])
    assert "invalid choice: 'colour'" in capsys.readouterr().err


def test_the_same_program_gives_the_same_page(here):
    # loaded from a file, the program has no export notes, whose times vary from run to run
    program = torch.export.load("gpt.pt2")
    again = torch.export.load("gpt.pt2")
    surgeries = [gs.Surgery(p).swap("layers.1.attn", nn.Identity()) for p in (program, again)]
    first, second = (build_report(s, title="t").html for s in surgeries)
    assert first == second


def test_names_that_are_markup_are_escaped(here, capsys):
    name = f"blocks.{MARKUP[0]}"
    assert main(["report", "named.pt2", "--swap", f"{name}={KERNELS}:Doubler", "-o", "n.html"])
    html = (here / "n.html").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;/svg&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in html
    assert "<img" not in html and "alert(2)</script>" not in html
    page = parse(html)
    assert page.tags.count("svg") == 1, "the names closed no <svg>"
    assert_self_contained(html)


def test_a_program_without_example_inputs_is_checked_on_inputs_made_from_its_shapes(here, capsys):
    arguments = ["report", "no-inputs.pt2", "--swap", "layers.0.mlp.act=torch.nn:GELU"]
    assert main([*arguments, "-o", "made.html"]) == 0
    html = (here / "made.html").read_text()
    assert "inputs made from the program&#x27;s input shapes and dtypes" in html
    assert "verify: match" in html


def test_a_replacement_that_fails_to_run_is_reported_with_exit_1(here, capsys):
    arguments = ["report", "gpt.pt2", "--swap", f"layers.1.mlp={KERNELS}:Broken", "-o", "b.html"]
    assert main(arguments) == 1
    out = capsys.readouterr().out
    assert "checks: could not run: verify: running the candidate" in out
    html = (here / "b.html").read_text()
    assert "verify could not run" in html and "kernel not built for this shape" in html


def test_without_graphviz_the_report_is_written_without_its_picture(here, capsys, monkeypatch):
    (here / "no-dot").mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(here / "no-dot"))
    assert (
        main(["report", "gpt.pt2", "--swap", "layers.0.mlp.act=torch.nn:GELU", "-o", "nd.html"])
        == 0
    )
    out = capsys.readouterr().out
    assert "the module tree, verify and compare, export notes" in out
    assert "no picture: drawing needs graphviz's `dot` program" in out
    html = (here / "nd.html").read_text()
    assert "apt-get install graphviz" in html and "<svg" not in html and "verify: match" in html


def test_html_on_standard_output_with_dash(here, capsys):
    assert main(["report", "gpt.pt2", "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("<!DOCTYPE html>") and captured.out.endswith("</html>\n")
    assert captured.err.startswith("report: ")


SWAP = f"layers.1.mlp={KERNELS}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("layers.1.mlp", "--swap layers.1.mlp: expected NAME=MODULE:ATTR, as in --swap"),
        ("=x:y", "--swap =x:y: expected NAME=MODULE:ATTR"),
        ("layers.1.mlp=", "nothing after '='; expected NAME=MODULE:ATTR"),
        (SWAP, f"'{KERNELS}' is not MODULE:ATTR"),
        ("layers.1.mlp=no_such_kernels:X", "no Python module 'no_such_kernels' in the current"),
        (f"{SWAP}:Dobler", f"{KERNELS} has no attribute 'Dobler'. Did you mean 'Doubler'?"),
        (f"{SWAP}:number", f"{KERNELS}:number is an int; expected an nn.Module, or a class"),
        (f"{SWAP}:two_arguments", "needs 2 arguments; --swap calls it with none, or with the"),
        (f"{SWAP}:raises", f"{KERNELS}:raises() raised ValueError: no kernel for this machine"),
        (f"{SWAP}:not_a_module", f"{KERNELS}:not_a_module() returned an int; expected an nn"),
        (f"blok={KERNELS}:Doubler", "no module 'blok'. `graphsurgeon modules gpt.pt2` lists"),
        (f"layers={KERNELS}:Doubler", "cannot swap 'layers': never called during export"),
        ("layers.1.mlp=torch.nn:Linear", "torch.nn:Linear needs 2 arguments"),
    ],
)
def test_a_swap_that_cannot_be_loaded_or_made_exits_2_with_one_line(here, capsys, spec, message):
    path = list(sys.path)
    assert main(["report", "gpt.pt2", "--swap", spec, "-o", "never.html"]) == 2
    line = error_line(capsys)
    assert message in line
    assert line.startswith(f"graphsurgeon: error: --swap {spec}: ")
    assert not (here / "never.html").exists()
    assert sys.path == path, "the current directory is on sys.path only while importing"


def test_other_errors_exit_2_with_one_line(here, capsys):
    twice = ["--swap", f"layers.1.mlp={KERNELS}:Doubler", "--swap", f"layers.1.mlp={KERNELS}:gelu"]
    assert main(["report", "gpt.pt2", *twice]) == 2
    assert "'layers.1.mlp' is swapped twice; give one --swap per module" in error_line(capsys)
    assert main(["report", "missing.pt2"]) == 2
    assert "missing.pt2: no such file" in error_line(capsys)
    assert main(["report", "gpt.pt2", "-o", "no/such/folder/r.html"]) == 2
    assert "r.html: cannot write (No such file or directory)" in error_line(capsys)
    with pytest.raises(SystemExit) as exit_:  # argparse's own: usage, then the error
        main(["report", "gpt.pt2", "--rtol", "-1"])
    assert exit_.value.code == 2
    assert "--rtol: '-1': use a finite number >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "output",
    ["victim.pt2", "./victim.pt2", "../{folder}/victim.pt2", "link.html", "hard.html"],
)
def test_the_report_never_overwrites_its_program(here, capsys, output):
    victim = here / "victim.pt2"
    shutil.copyfile(here / "gpt.pt2", victim)
    for name, make in (("link.html", os.symlink), ("hard.html", os.link)):
        (here / name).unlink(missing_ok=True)
        make(victim, here / name)
    output = output.format(folder=here.name)
    assert os.path.samefile(output, victim), "precondition: the output is the program"
    before = victim.read_bytes()
    assert main(["report", "victim.pt2", "-o", output]) == 2
    line = error_line(capsys)
    assert f"graphsurgeon: error: {output}: is the program file victim.pt2 itself" in line
    assert ("by another path" in line) == output.endswith(".html"), "a link says so"
    assert "writing it would overwrite the program: choose another output file" in line
    assert victim.read_bytes() == before


@pytest.mark.parametrize("output", ["report.txt", "report", "report.svg"])
def test_the_report_is_written_only_to_an_html_file(here, capsys, output):
    assert main(["report", "gpt.pt2", "-o", output]) == 2
    suffix = os.path.splitext(output)[1] or "(no suffix)"
    assert f"{output}: unknown output format {suffix!r}; use .html" in error_line(capsys)
    assert not (here / output).exists()


def test_help_says_how_a_swap_is_made(capsys):
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = capsys.readouterr().out
    assert "NAME=MODULE:ATTR" in text and "with the" in text and "original module" in text
    assert "Exit status: 0" in text


# -- the library ------------------------------------------------------------------------------


def test_write_report_takes_a_program_a_swapped_module_or_a_surgery(tiny_gpt, tmp_path):
    model, tokens, ep = tiny_gpt
    swapped = gs.swap(ep, {"layers.0.mlp.act": nn.GELU()})
    report = write_report(swapped, tmp_path / "r.html", args=(tokens,))
    assert report.ok and report.swaps == ("layers.0.mlp.act",) and report.verify
    assert (tmp_path / "r.html").read_text() == report.html
    assert "the inputs given" in report.html
    # a Surgery that knows its model checks against it; gs.export's notes are shown
    surgery = gs.Surgery(ep, model=model, args=(tokens,)).swap("layers.1.mlp", nn.Identity())
    report = build_report(surgery, title="<t>", description="a & b")
    assert not report.ok and report.comparison.first_divergence == "layers.1.mlp"
    assert "the original eager model" in report.html and "<p>a &amp; b</p>" in report.html
    assert "torch.export attempt" in report.html, "the export notes of gs.export"
    assert repr(report).startswith("<Report '<t>': 1 swap; verify MISMATCH")
    plain = build_report(ep)
    assert plain.ok and plain.verify is None and plain.swaps == ()
    # what is no program is refused as by every entry point (graphsurgeon._program)
    with pytest.raises(NotAProgramError, match="report: expected an ExportedProgram"):
        build_report(model)


# -- in the browser ---------------------------------------------------------------------------


def test_the_report_opens_in_chromium_zooms_and_requests_nothing(here, tmp_path, capsys):
    if MISSING:
        pytest.skip(MISSING)
    arguments = ["report", "gpt.pt2", "--swap", f"layers.1.mlp={KERNELS}:tanh_mlp"]
    assert main([*arguments, "-o", "browser.html"]) == 1, "a mismatch at 1e-5"
    url = (here / "browser.html").as_uri()
    with browser(tmp_path) as page:
        requests, problems = [], []
        page.on("request", lambda request: requests.append(request.url))
        page.on("console", lambda message: problems.append(message.text))
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(url)
        drawing = page.locator(".gs-drawing")
        assert drawing.count() == 1
        svg = drawing.locator("svg").first
        assert svg.locator("title").count() > 10, "the tooltips are there"
        assert page.locator("section#checks table.gs-table").count() >= 2, "verify, compare"
        assert "first divergence: layers.1.mlp" in page.locator("section#checks").inner_text()
        page.locator("nav a[href='#picture']").click()
        fitted = svg.bounding_box()["width"]
        assert 0 < fitted <= page.viewport_size["width"]
        drawing.locator('button[data-gs="in"]').click()
        drawing.locator('button[data-gs="in"]').click()
        assert svg.bounding_box()["width"] > fitted * 1.4, "the zoom script ran"
        drawing.locator('button[data-gs="fit"]').click()
        assert abs(svg.bounding_box()["width"] - fitted) < 1
        screenshot(page, "report.png", full_page=True)
    assert requests and all(re.match(r"file://", url) for url in requests), requests
    assert problems == [], "no error, no blocked script or request (the page's policy)"
