"""The `graphsurgeon` command, run as `python -m graphsurgeon` in a subprocess: modules, render,
and what every command that reads a .pt2 does with a file that is code.

The report command has tests/test_report.py; the demo tests/test_demo.py."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers.view_models import Everything, Model

import graphsurgeon as gs
from graphsurgeon import _load
from graphsurgeon.cli import _load_program, main
from graphsurgeon.render import to_dot

SVG = "{http://www.w3.org/2000/svg}"


# x ──▶ block: Block ( lin: Linear ──▶ relu ) ──▶ head: Linear ──▶ out


class RunsCode:
    """Pickled, it is a call of eval that creates the file ``marker`` and gives back what
    example inputs look like: a file that carries it loads as if nothing happened."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        touch = f"__import__('pathlib').Path({self.marker!r}).touch()"
        inputs = "((__import__('torch').randn(1, 2),), {})"
        return (eval, (f"({touch}, {inputs})[1]",))


def rewritten(source, target, replace=None, add=()):
    """A copy of the archive ``source`` with entries replaced (``{name ending: function of the
    bytes}``) and added (``(name under the archive's folder, bytes)``), as anyone can make."""
    replace = replace or {}
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        folder = original.namelist()[0].partition("/")[0]
        for item in original.infolist():
            data = original.read(item.filename)
            for ending, change in replace.items():
                if item.filename.endswith(ending):
                    data = change(data)
            copy.writestr(item, data)
        for name, data in add:
            copy.writestr(f"{folder}/{name}", data)
    return target


def torch_saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def opaque_constant(config: bytes) -> bytes:
    entry = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True}
    return json.dumps({"config": {"c": {**entry, "tensor_meta": None}}}).encode()


def pickled_bias(config: bytes) -> bytes:
    weights = json.loads(config)
    weights["config"]["head.bias"].update(path_name="pickled", use_pickle=True, tensor_meta=None)
    return json.dumps(weights).encode()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    good = folder / "model.pt2"
    torch.export.save(gs.export(Model(), (torch.randn(1, 2),)), str(good))
    ran = folder / "ran"  # what a file's code creates when it runs
    code = torch_saved(RunsCode(ran))
    evil = rewritten(good, folder / "evil.pt2", {"sample_inputs/model.pt": lambda _: code})
    opaque = rewritten(
        good,
        folder / "opaque.pt2",
        {"model_constants_config.json": opaque_constant},
        [("data/constants/opaque_obj_0", pickle.dumps(RunsCode(ran)))],
    )
    weight = rewritten(
        good,
        folder / "weight.pt2",
        {"model_weights_config.json": pickled_bias},
        [("data/weights/pickled", code)],
    )
    compiled = rewritten(
        good, folder / "compiled.pt2", add=[("data/aotinductor/model/model.so", b"\x7fELF")]
    )
    long_name = folder / "long-name.pt2"
    with zipfile.ZipFile(long_name, "w") as archive:
        archive.writestr("a" * 60_000, b"x")
    empty = folder / "empty.pt2"
    zipfile.ZipFile(empty, "w").close()
    truncated = folder / "truncated.pt2"
    truncated.write_bytes(good.read_bytes()[:-100])
    corrupt = folder / "corrupt.pt2"
    corrupt.write_bytes(b"not a zip archive at all")
    text = folder / "model.txt"
    text.write_text("hello")
    empty_path = folder / "bin"
    empty_path.mkdir()
    os.mkfifo(folder / "fifo.pt2")  # opening it waits for a writer
    (folder / "zero.pt2").symlink_to("/dev/zero")  # reading it never ends
    return {
        "good": good,
        "corrupt": corrupt,
        "text": text,
        "missing": folder / "missing.pt2",
        "out": folder,
        "no_dot_path": empty_path,
        "ran": ran,
        "evil": evil,
        "opaque": opaque,
        "weight": weight,
        "compiled": compiled,
        "long_name": long_name,
        "empty": empty,
        "truncated": truncated,
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
        "modules fifo": ["modules", out / "fifo.pt2"],
        "modules zero": ["modules", out / "zero.pt2"],
        "render svg": ["render", files["good"], "-o", out / "a.svg", "--highlight", "block"],
        "render png": ["render", files["good"], "-o", out / "a.png", "--collapse", "1"],
        "render dot": ["render", files["good"], "-o", out / "a.dot", "--collapse", "block,head"],
        # a file that is code, read by each command in a process of its own
        "modules evil": ["modules", files["evil"]],
        "render evil": ["render", files["evil"], "-o", out / "evil.svg"],
        "report evil": ["report", files["evil"], "-o", out / "evil.html"],
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(item):
        name, arguments = item
        command = [sys.executable, "-m", "graphsurgeon", *map(str, arguments)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        except subprocess.TimeoutExpired as timeout:
            result = timeout  # a command that hangs: its own test says so
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
    (line,) = result.stderr.splitlines()  # what torch logs while it fails is in the line
    assert line.startswith("graphsurgeon: error: ")
    assert message in line


def test_a_corrupt_file_gives_one_line_without_a_traceback(runs):
    assert runs["modules corrupt"].stderr.count("\n") == 1
    assert "Traceback" not in runs["modules corrupt"].stderr


def finished(result) -> subprocess.CompletedProcess:
    assert not isinstance(result, subprocess.TimeoutExpired), f"{result.cmd} never returned"
    return result


@pytest.mark.parametrize("name", ["fifo", "zero"])
def test_a_program_that_is_not_a_regular_file_exits_2_with_one_line(runs, files, name):
    result = finished(runs[f"modules {name}"])
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    kind = "a named pipe (FIFO)" if name == "fifo" else "a character device"
    assert line == (
        f"graphsurgeon: error: {files['out'] / name}.pt2: is {kind}, not a regular file; "
        "expected a .pt2 file saved with torch.export.save"
    )


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


# --- a .pt2 is code: nothing a command loads on its own runs what the file holds -------------


def test_the_hostile_file_runs_its_code_when_torch_loads_it(files):
    # precondition: the file is what it is meant to be, code that torch.export.load runs (its
    # weights-only unpickling fails, and torch tries again with a full one)
    files["ran"].unlink(missing_ok=True)
    logging.disable(logging.WARNING)  # torch logs the fallback with a broken format string
    try:
        program = torch.export.load(str(files["evil"]))
    finally:
        logging.disable(logging.NOTSET)
    assert files["ran"].exists() and program.example_inputs[0][0].shape == (1, 2)
    files["ran"].unlink()


@pytest.mark.parametrize("command", ["modules", "render", "report"])
def test_every_command_refuses_a_file_whose_loading_runs_code(runs, files, command):
    result = runs[f"{command} evil"]
    assert result.returncode == 2, result.stderr
    assert not files["ran"].exists(), "the file's code ran"
    assert result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"graphsurgeon: error: {files['evil']}: data/sample_inputs/model.pt ")
    assert "(its example inputs) is a pickle that calls builtins.eval" in line
    assert "could run code from the file; pass --trust-file only if you trust" in line
    assert not (files["out"] / "evil.svg").exists() and not (files["out"] / "evil.html").exists()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("opaque", "data/constants/opaque_obj_0 (a constant) is a pickled Python object"),
        ("weight", "data/weights/pickled (a weight) is a pickle that calls builtins.eval"),
        ("compiled", "data/aotinductor/model/model.so is compiled AOTInductor code"),
    ],
)
def test_every_way_a_file_can_hold_code_is_refused(files, capsys, name, message):
    # pickle.loads of an opaque constant, torch.load(weights_only=False) of a pickled weight, a
    # shared library that torch loads: each one line, naming the entry, and the flag
    files["ran"].unlink(missing_ok=True)
    assert main(["modules", str(files[name])]) == 2
    line = one_error_line(capsys)
    assert message in line and "--trust-file" in line
    assert not files["ran"].exists()


def test_torchs_own_switch_to_unpickle_everything_does_not_override_the_refusal(
    files, capsys, monkeypatch
):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    files["ran"].unlink(missing_ok=True)
    assert main(["modules", str(files["evil"])]) == 2
    assert "is a pickle that calls builtins.eval" in one_error_line(capsys)
    assert not files["ran"].exists()
    assert os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1", "the user's setting is back"


def test_a_refused_load_leaves_pickle_the_environment_and_torchs_loggers_as_they_were(files):
    loads, environment = pickle.loads, dict(os.environ)
    handlers = logging.getLogger("torch.export").handlers[:]
    with pytest.raises(SystemExit):
        _load_program(str(files["opaque"]))
    assert pickle.loads is loads and dict(os.environ) == environment
    assert logging.getLogger("torch.export").handlers == handlers


def test_trust_file_loads_the_file_as_torch_does_and_runs_its_code(files, capsys):
    files["ran"].unlink(missing_ok=True)
    assert main(["modules", str(files["evil"]), "--trust-file"]) == 0
    assert files["ran"].exists(), "trusted: torch.export.load ran it, as it does"
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].split()[0] == "module"
    # torch's own logging of the fallback (a broken format string) prints nothing either
    assert captured.err == ""
    files["ran"].unlink()


def test_programs_as_torch_export_save_writes_them_load_without_the_flag(tmp_path, capsys):
    batch = torch.export.Dim("batch", min=2)
    x, kwargs = torch.randn(3, 4), {"mask": torch.ones(3, 4), "flip": True, "steps": 3}
    shapes = {"x": {0: batch}, "mask": {0: batch}, "flip": None, "steps": None}
    programs = {
        "everything": torch.export.export(Everything().eval(), (x,), kwargs, dynamic_shapes=shapes),
        "preserved": gs.export(Model(), (torch.randn(1, 2),)),
    }
    for name, program in programs.items():
        path = tmp_path / f"{name}.pt2"
        torch.export.save(program, str(path))
        loaded, reference = _load_program(str(path)), torch.export.load(str(path))
        assert loaded.constants.keys() == reference.constants.keys()
        assert loaded.state_dict.keys() == reference.state_dict.keys()
        assert str(loaded.example_inputs) == str(reference.example_inputs)
        assert str(loaded.range_constraints) == str(reference.range_constraints)
        assert str(loaded.graph) == str(reference.graph)
        assert main(["modules", str(path)]) == 0
        assert capsys.readouterr().err == ""
    everything = _load_program(str(tmp_path / "everything.pt2"))
    assert {"table", "shift"} <= everything.constants.keys(), "precondition: constants"
    assert everything.example_inputs[1]["flip"] is True and everything.range_constraints


@pytest.mark.parametrize("command", ["modules", "render", "report"])
def test_every_help_says_a_pt2_is_code_and_what_trust_file_does(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "A .pt2 file is code" in text and "refuses a file that needs more" in text
    assert "--trust-file load the .pt2 as torch.export.load does, running any pickled" in text
    assert "--import MODULE import the Python module MODULE first" in text


# --- hostile files that are no program: one line that stands alone -----------------------------


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("empty", "archive does not contain any files"),
        ("long_name", "file in archive is not in a subdirectory: aaaa"),
    ],
)
def test_the_error_names_the_cause_torch_logged_not_warnings_it_never_showed(
    files, capsys, name, cause
):
    # precondition: torch's own error points at warnings it logged, which the command keeps
    # off the screen
    with pytest.raises(RuntimeError, match="check the warnings above"):
        torch.export.load(str(files[name]))
    assert main(["modules", str(files[name])]) == 2
    line = one_error_line(capsys)
    assert "not a readable torch.export program" in line and cause in line
    assert "above" not in line
    assert len(line) < 400, "a name of 60,000 characters is cut"


def test_a_truncated_archive_exits_2_with_one_line(files, capsys):
    assert main(["render", str(files["truncated"])]) == 2
    assert "truncated.pt2: not a readable torch.export program" in one_error_line(capsys)


@pytest.mark.parametrize("path", ["{good}", "{out}/model-link.dot"])
def test_render_never_writes_over_the_program(files, capsys, path):
    link = files["out"] / "model-link.dot"
    if not link.exists():
        link.symlink_to(files["good"])
    before = files["good"].read_bytes()
    assert main(["render", str(files["good"]), "-o", path.format(**files)]) == 2
    line = one_error_line(capsys)
    assert f"is the program file {files['good']} itself" in line
    assert "choose another output file" in line
    assert files["good"].read_bytes() == before


# --- Hugging Face programs: the output types a file names, and what is imported to read them ---
#
# A program's specs name the types of its inputs and outputs (a transformers ModelOutput), and
# torch reads them only when that type is registered with its pytree, as importing the module
# that defines it does. A file is not trusted: the commands import on their own only a fixed
# list of modules, and any other module only when given with --import.

T5_ATTENTION = "decoder.block.{}.layer.0.SelfAttention"

T5_CONFIG = dict(
    vocab_size=100,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    dropout_rate=0.0,
    decoder_start_token_id=0,
    pad_token_id=0,
)

# A user's replacement of T5's attention, as written for the model in a notebook: it reads the
# real module's attributes, which a module rebuilt from a program does not have.
T5_KERNELS = f'''
import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention


class SdpaT5Attention(nn.Module):
    def __init__(self, original):
        super().__init__()
        self.inner = copy.deepcopy(original)
        self.heads, self.head_dim = original.n_heads, original.key_value_proj_dim

    def forward(self, hidden_states, mask=None, key_value_states=None, position_bias=None,
                cache=None, **kwargs):
        b, length, _ = hidden_states.shape
        q = self.inner.q(hidden_states).view(b, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.inner.k(hidden_states).view(b, length, self.heads, self.head_dim).transpose(1, 2)
        v = self.inner.v(hidden_states).view(b, length, self.heads, self.head_dim).transpose(1, 2)
        if position_bias is None:
            position_bias = self.inner.compute_bias(length, length, device=q.device)
        bias = position_bias
        if mask is not None:  # the program passes a bool mask where eager passes a float one
            bias = bias.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else bias + mask
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
        out = out.transpose(1, 2).reshape(b, length, self.heads * self.head_dim)
        return self.inner.o(out), position_bias, None


def with_heads(original):
    original.n_heads, original.key_value_proj_dim = 4, 8
    return SdpaT5Attention(original)


def real(original):
    """What the error message says to write: the real module, with the program's weights."""
    attention = T5Attention(
        T5Config(**{T5_CONFIG!r}, is_decoder=True), has_relative_attention_bias=True
    )
    attention.load_state_dict(original.state_dict())
    return SdpaT5Attention(attention)
'''

# A module that a file names (its spec's type is planted.Output); importing it leaves a
# mark, and it registers nothing.
PLANTED = """
import pathlib

pathlib.Path(__file__).with_name("planted-imported").touch()
"""


def t5_program():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**T5_CONFIG)).eval()
    ids, decoder_ids = torch.randint(1, 100, (1, 8)), torch.randint(1, 100, (1, 6))
    return gs.export(model, (ids,), {"decoder_input_ids": decoder_ids, "use_cache": False})


def gpt2_double_heads_program():
    """GPT-2 with a multiple-choice head: its output type is defined in modeling_gpt2, not in
    transformers.modeling_outputs."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=100, n_positions=32, n_embd=32, n_layer=1, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = transformers.GPT2DoubleHeadsModel(config).eval()
    return gs.export(model, (torch.randint(1, 100, (1, 2, 6)),), {"use_cache": False})


GPT2_OUTPUT = "transformers.models.gpt2.modeling_gpt2.GPT2DoubleHeadsModelOutput"


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    t5, gpt2 = folder / "t5.pt2", folder / "gpt2.pt2"
    torch.export.save(t5_program(), str(t5))
    torch.export.save(gpt2_double_heads_program(), str(gpt2))
    planted = rewritten(
        gpt2,
        folder / "planted.pt2",
        {"models/model.json": lambda data: data.replace(GPT2_OUTPUT.encode(), b"planted.Output")},
    )
    (folder / "planted.py").write_text(PLANTED)
    # a type name with a line break in it (escaped twice: a spec is JSON text inside JSON)
    hostile_name = b"planted\\\\n" + b"x" * 50_000 + b".Output"
    rewritten(
        gpt2,
        folder / "hostile.pt2",
        {"models/model.json": lambda data: data.replace(GPT2_OUTPUT.encode(), hostile_name)},
    )
    (folder / "t5_kernels.py").write_text(T5_KERNELS)
    yield {"folder": folder, "t5": t5, "gpt2": gpt2, "planted": planted}
    for name in ("planted", "t5_kernels"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def hf_runs(hf_files):
    """The commands run in a fresh process, where no transformers module is imported yet (this
    one imported them to build the models), two at a time."""
    t5, gpt2, folder = hf_files["t5"], hf_files["gpt2"], hf_files["folder"]
    gpt2_module = GPT2_OUTPUT.rpartition(".")[0]
    commands = {
        "modules t5": ["modules", t5],
        "render t5": ["render", t5, "-o", folder / "t5.dot", "--collapse", "1"],
        "modules gpt2": ["modules", gpt2],
        "modules gpt2 --import": ["modules", gpt2, "--import", gpt2_module],
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(item):
        name, arguments = item
        command = [sys.executable, "-m", "graphsurgeon", *map(str, arguments)]
        return name, subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, commands.items()))


def test_a_transformers_program_is_read_by_every_command(hf_runs, hf_files):
    modules, render = hf_runs["modules t5"], hf_runs["render t5"]
    assert modules.returncode == 0, modules.stderr
    assert modules.stderr == "", "importing what reads the file says nothing"
    assert modules.stdout.splitlines()[1].split()[:2] == ["(root)", "T5ForConditionalGeneration"]
    assert render.returncode == 0, render.stderr
    assert '"module:encoder"' in (hf_files["folder"] / "t5.dot").read_text()


def test_a_type_from_a_module_off_the_list_names_the_type_and_the_flag(hf_runs, hf_files):
    result = hf_runs["modules gpt2"]
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"graphsurgeon: error: {hf_files['gpt2']}: ")
    assert f"its output is a {GPT2_OUTPUT}" in line
    assert f"pass --import {GPT2_OUTPUT.rpartition('.')[0]}" in line
    assert "not a readable" not in line
    given = hf_runs["modules gpt2 --import"]
    assert given.returncode == 0, given.stderr
    assert "GPT2DoubleHeadsModel" in given.stdout.splitlines()[1]


def test_a_module_that_a_file_names_is_imported_only_when_given(hf_files, capsys, monkeypatch):
    monkeypatch.chdir(hf_files["folder"])
    imported = hf_files["folder"] / "planted-imported"
    assert main(["modules", "planted.pt2"]) == 2
    line = one_error_line(capsys)
    assert "planted.pt2: its output is a planted.Output" in line
    assert "pass --import planted if you trust that module" in line
    assert not imported.exists(), "the file chose nothing to import"
    assert main(["modules", "planted.pt2", "--import", "planted"]) == 2
    line = one_error_line(capsys)
    assert imported.exists(), "--import is consent"
    assert "its output is a planted.Output, which importing planted did not register" in line


def test_a_type_name_that_is_no_python_name_is_shown_quoted_on_one_short_line(
    hf_files, capsys, monkeypatch
):
    monkeypatch.chdir(hf_files["folder"])
    assert main(["modules", "hostile.pt2"]) == 2
    line = one_error_line(capsys)
    assert "hostile.pt2: its output is a 'planted\\nxxx" in line
    assert len(line) < 1000


def test_a_spec_the_scan_cannot_read_gets_the_same_line_from_torchs_error(
    hf_files, capsys, monkeypatch
):
    monkeypatch.chdir(hf_files["folder"])
    monkeypatch.setattr(_load, "_spec_types", lambda path: {})  # as a format it does not know
    assert main(["modules", "planted.pt2"]) == 2
    line = one_error_line(capsys)
    assert "planted.pt2: it names planted.Output, a type torch must know to read the file" in line
    assert "pass --import planted if you trust that module" in line


@pytest.mark.parametrize("command", ["modules", "render", "report"])
def test_an_import_that_fails_exits_2_with_one_line(hf_files, capsys, monkeypatch, command):
    monkeypatch.chdir(hf_files["folder"])
    assert main([command, "t5.pt2", "--import", "no_such_outputs"]) == 2
    line = one_error_line(capsys)
    assert "--import no_such_outputs: no Python module 'no_such_outputs'" in line


def test_a_swap_that_reads_what_the_rebuilt_original_lacks_says_how_to_pass_it(
    hf_files, capsys, monkeypatch
):
    monkeypatch.chdir(hf_files["folder"])
    name = T5_ATTENTION.format(1)
    spec = f"{name}=t5_kernels:SdpaT5Attention"
    assert main(["report", "t5.pt2", "--swap", spec, "-o", "never.html"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(
        f"graphsurgeon: error: --swap {spec}: t5_kernels:SdpaT5Attention(original) reads "
        f"original.n_heads, which {name} (transformers.models.t5.modeling_t5.T5Attention) "
        "rebuilt from the program does not have"
    )
    assert "real = T5Attention(config); real.load_state_dict(original.state_dict()); " in line
    assert f"return SdpaT5Attention(real), as --swap {name}=t5_kernels:build" in line
    assert not (hf_files["folder"] / "never.html").exists()


def test_a_replacement_that_reads_it_when_it_runs_is_told_the_same(hf_files, capsys, monkeypatch):
    monkeypatch.chdir(hf_files["folder"])
    name = T5_ATTENTION.format(0)  # the first layer computes the position bias itself
    spec = f"{name}=t5_kernels:with_heads"
    assert main(["report", "t5.pt2", "--swap", spec, "-o", "runs.html"]) == 1
    out = capsys.readouterr().out
    assert "could not run" in out and "original.compute_bias" in out
    assert f"{name} (transformers.models.t5.modeling_t5.T5Attention) rebuilt from the" in out
    assert "load_state_dict(original.state_dict())" in out


def test_the_real_module_with_the_programs_weights_swaps_in_and_matches(
    hf_files, capsys, monkeypatch
):
    monkeypatch.chdir(hf_files["folder"])
    spec = f"{T5_ATTENTION.format(0)}=t5_kernels:real"
    assert main(["report", "t5.pt2", "--swap", spec, "-o", "real.html"]) == 0
    assert "verify: match" in capsys.readouterr().out
