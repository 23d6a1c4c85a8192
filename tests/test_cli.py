"""The `graphsurgeon` command, run as `python -m graphsurgeon` in a subprocess: modules, render.

The report command has tests/test_report.py; the demo tests/test_demo.py."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn

import graphsurgeon as gs
from graphsurgeon.cli import main
from graphsurgeon.render import to_dot

SVG = "{http://www.w3.org/2000/svg}"


# x ──▶ block: Block ( lin: Linear ──▶ relu ) ──▶ head: Linear ──▶ out


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(self.block(x))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    good = folder / "model.pt2"
    torch.export.save(gs.export(Model(), (torch.randn(1, 2),)), str(good))
    corrupt = folder / "corrupt.pt2"
    corrupt.write_bytes(b"not a zip archive at all")
    text = folder / "model.txt"
    text.write_text("hello")
    empty_path = folder / "bin"
    empty_path.mkdir()
    return {
        "good": good,
        "corrupt": corrupt,
        "text": text,
        "missing": folder / "missing.pt2",
        "out": folder,
        "no_dot_path": empty_path,
    }


@pytest.fixture(scope="module")
def runs(files):
    """The commands run in a subprocess, each once, three at a time (each pays torch's import).

    The other error paths of ``render`` run in this process, through ``main``, below.
    """
    out = files["out"]
    commands = {
        "help": ["--help"],
        "modules": ["modules", files["good"]],
        "modules missing": ["modules", files["missing"]],
        "modules corrupt": ["modules", files["corrupt"]],
        "modules not pt2": ["modules", files["text"]],
        "render svg": ["render", files["good"], "-o", out / "a.svg", "--highlight", "block"],
        "render png": ["render", files["good"], "-o", out / "a.png", "--collapse", "1"],
        "render dot": ["render", files["good"], "-o", out / "a.dot", "--collapse", "block,head"],
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(item):
        name, arguments = item
        command = [sys.executable, "-m", "graphsurgeon", *map(str, arguments)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        return name, result

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(run, commands.items()))


def test_help_lists_the_commands(runs):
    assert runs["help"].returncode == 0
    for command in ("demo", "modules", "render", "report"):
        assert command in runs["help"].stdout


def test_modules_prints_the_module_tree(runs):
    result = runs["modules"]
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["module", "type", "calls", "nodes", "swappable"]
    assert lines[1].startswith("(root)")
    assert lines[2].split() == ["block", "Block", "1", "2", "yes"]
    assert lines[3].split()[:2] == ["lin", "Linear"]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("modules missing", "missing.pt2: no such file"),
        ("modules corrupt", "corrupt.pt2: not a readable torch.export program"),
        ("modules not pt2", "model.txt: expected a .pt2 file saved with torch.export.save"),
    ],
)
def test_unreadable_programs_exit_2_with_a_clear_message(runs, name, message):
    result = runs[name]
    assert result.returncode == 2
    assert result.stdout == ""
    # the last line: torch logs a warning of its own first on a corrupt file (see below)
    assert result.stderr.splitlines()[-1].startswith("graphsurgeon: error: ")
    assert message in result.stderr.splitlines()[-1]


def test_a_corrupt_file_gives_one_line_without_a_traceback(runs):
    assert runs["modules corrupt"].stderr.count("\n") == 1
    assert "Traceback" not in runs["modules corrupt"].stderr


def test_render_writes_an_svg_with_ids(runs, files):
    result = runs["render svg"]
    assert result.returncode == 0, result.stderr
    assert "a.svg: 5 nodes drawn of 9 in the program" in result.stderr
    root = ET.parse(files["out"] / "a.svg").getroot()
    classes = {g.get("id"): g.get("class") for g in root.iter(f"{SVG}g")}
    assert classes["cluster:block"] == "cluster module highlighted"
    assert classes["node:linear_1"] == "node op module"
    assert "edge:relu->linear_1" in classes


def test_render_writes_png(runs, files):
    assert runs["render png"].returncode == 0, runs["render png"].stderr
    assert (files["out"] / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_render_writes_dot_text_identical_to_this_process(runs, files):
    # another process has another hash seed: any set or dict-order dependence would show
    assert runs["render dot"].returncode == 0, runs["render dot"].stderr
    dot = (files["out"] / "a.dot").read_text()
    assert dot.startswith('digraph "Model" {') and '"module:block"' in dot
    program = torch.export.load(str(files["good"]))
    assert dot == to_dot(program, collapse={"block", "head"})


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["{good}", "--highlight", "blok"], "no module 'blok'. Did you mean 'block'"),
        (["{good}", "--collapse", "0"], "a depth is 1 or more"),
        (
            ["{good}", "-o", "{out}/a.jpg"],
            "a.jpg: unknown output format '.jpg'; use .dot, .gv, .pdf",
        ),
        (["{corrupt}", "-o", "{out}/b.svg"], "corrupt.pt2: not a readable torch.export program"),
        (["{missing}"], "missing.pt2: no such file"),
        (["{good}", "-o", "{out}/no/such/folder/a.dot"], "cannot write"),
    ],
)
def test_render_errors_exit_2_with_a_clear_message(files, capsys, arguments, message):
    arguments = [a.format(**files) for a in arguments]
    assert main(["render", *arguments]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("graphsurgeon: error: ")
    assert message in error


def test_render_without_dot_names_the_install_command(files, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(files["no_dot_path"]))
    assert main(["render", str(files["good"]), "-o", str(files["out"] / "c.svg")]) == 2
    assert "apt-get install graphviz" in capsys.readouterr().err
    assert not (files["out"] / "c.svg").exists()
    # DOT needs no binary
    assert main(["render", str(files["good"]), "-o", str(files["out"] / "c.dot")]) == 0


# --- arguments and outputs a user can get wrong: one line, exit 2, no traceback ---------------


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith("graphsurgeon: error: ")
    return line


@pytest.mark.parametrize("layers", ["0", "-1", "1", "65"])
def test_demo_with_too_few_or_too_many_layers_exits_2_with_one_line(capsys, layers):
    # precondition: the bound is what refuses, not argparse (it takes any int)
    assert int(layers) < 2 or int(layers) > 64
    assert main(["demo", "--layers", layers]) == 2
    assert f"--layers {layers}: the demo swaps the attention of layers.1" in one_error_line(capsys)


def test_demo_with_no_timed_rounds_exits_2_with_one_line(capsys):
    assert main(["demo", "--rounds", "0"]) == 2
    assert "--rounds 0: the forward is timed over at least 1 round" in one_error_line(capsys)


def test_demo_with_a_report_it_cannot_write_exits_2_with_one_line(files, capsys):
    blocked = files["text"] / "report.html"  # under a file, not a folder
    assert main(["demo", "--layers", "2", "--rounds", "1", "--report", str(blocked)]) == 2
    assert "report.html: cannot write the report (Not a directory)" in one_error_line(capsys)


class FullDisk:
    """A standard output that refuses every write, as /dev/full does."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass


@pytest.mark.parametrize(
    "arguments", [["render", "{good}"], ["modules", "{good}"], ["demo", "--layers", "2"]]
)
def test_a_standard_output_that_cannot_be_written_exits_2_with_one_line(
    files, capsys, monkeypatch, arguments
):
    arguments = [a.format(**files) for a in arguments]
    if arguments[0] != "demo":  # precondition: the command works with somewhere to write
        assert main(arguments) == 0 and capsys.readouterr().out
    monkeypatch.setattr(sys, "stdout", FullDisk())
    assert main(arguments) == 2
    assert "cannot write to standard output (No space left on device)" in one_error_line(capsys)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs the /dev/full device")
def test_render_and_modules_to_dev_full_exit_2_without_a_traceback(files):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(command):
        with open("/dev/full", "w") as full:
            return subprocess.run(
                [sys.executable, "-m", "graphsurgeon", command, str(files["good"])],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                timeout=300,
            )

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, ["render", "modules"]))
    for result in results:
        assert result.returncode == 2, result.stderr
        # one line: nothing more at interpreter exit either ("Exception ignored ...")
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("graphsurgeon: error: cannot write to standard output")


def test_a_collapse_of_other_digits_is_a_module_name_not_a_traceback(files, capsys):
    assert "²".isdigit()  # precondition: what let it reach int() before
    assert main(["render", str(files["good"]), "--collapse", "²"]) == 2
    assert "no module '²'" in one_error_line(capsys)


def test_a_program_path_that_cannot_be_looked_at_exits_2_with_one_line(files, capsys):
    too_long = str(files["out"] / ("a" * 300 + ".pt2"))
    assert main(["modules", too_long]) == 2
    assert "cannot read (File name too long)" in one_error_line(capsys)
