"""After surgery: a Surgery's program compiled (torch.compile) and packaged (AOTInductor) is
checked against the eager model with the same replacements; what cannot compile is one line
naming the replacement; a report says which kind of candidate it checked.

The tests marked ``slow`` run Inductor's C++ compiler (tens of seconds each on 2 cores): make
test runs them; ``-m "not slow"`` leaves them out of a quick local run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from helpers.deploy_models import CustomOpRMSNorm, ItemGuardedRMSNorm, TorchRMSNorm
from helpers.grad_models import NormStack

import graphsurgeon as gs
from graphsurgeon.checks.verify import candidate_kind, eager_reference
from graphsurgeon.deploy import compiled, package
from graphsurgeon.errors import DeployError, VerifyError

# Inductor's own modules still use torch.jit.script_method, which torch deprecates: its warning,
# not the project's
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)


def norm_surgery(replacement):
    """A Surgery of a 2-block NormStack (``s.model``, ``s.args``) with ``replacement`` swapped
    into its final norm and one block's."""
    torch.manual_seed(0)
    model = NormStack(dim=8, layers=2).eval()
    x = torch.randn(2, 5, 8)
    s = gs.Surgery.from_model(model, (x,))
    for name in ("layers.1.norm", "norm"):
        s.swap(name, replacement(model.get_submodule(name)))
    return s


def expected_outputs(s):
    """The eager model with the same replacements on the example input, run by torch itself."""
    with torch.no_grad():
        return eager_reference(s.model, s.replacements)(*s.args)


# -- the kind of candidate, named ---------------------------------------------------------------


def test_the_report_names_a_compiled_candidate_and_stays_as_it_was_for_python_ones():
    s = norm_surgery(TorchRMSNorm)
    model, x = s.model, s.args[0]
    fast = compiled(s, backend="eager")  # dynamo without inductor: no C++ compile
    report = gs.verify(eager_reference(model, s.replacements), fast, (x,))
    assert report, "precondition: the compiled program matches"
    assert report.candidate_kind == "a torch.compile'd module"
    assert "  candidate: a torch.compile'd module" in str(report).splitlines()
    assert "a torch.compile&#x27;d module" in report._repr_html_()
    plain = gs.verify(model, s.module, (x,), rtol=1e-4)
    assert plain.candidate_kind == "a GraphModule" and "candidate:" not in str(plain)
    assert [candidate_kind(v) for v in (model, s.program, torch.relu)] == [
        "an eager model",
        "an ExportedProgram",
        "a function",
    ]
    assert candidate_kind(torch.compile(torch.relu)) == "a torch.compile'd function"


def test_a_surgery_verifies_what_ships_with_both_verdicts_and_keeps_its_own():
    s = norm_surgery(TorchRMSNorm)
    mine = s.verify(rtol=1e-4, atol=1e-5)
    fast = compiled(s, backend="eager")
    report = s.verify(rtol=1e-4, atol=1e-5, candidate=fast)
    assert report and report.original, "faithful, and equal to the original within rtol"
    assert report.against == "the eager model with the same replacements"
    assert report.candidate_kind == report.original.candidate_kind == "a torch.compile'd module"
    assert s.last_verify is mine, "the artifact's verdict is not the state's"


def test_the_swapped_program_itself_traces_whole_under_torch_compile():
    """Its generated code names its builtins as exec would: dynamo reads them from there."""
    s = norm_surgery(TorchRMSNorm)
    fast = torch.compile(s.module, fullgraph=True, backend="eager")
    report = s.verify(rtol=1e-4, atol=1e-5, candidate=fast)
    assert report and report.original
    assert report.candidate_kind == "a torch.compile'd module"


# -- what cannot compile: one line ----------------------------------------------------------------


def test_a_kernel_torch_compile_cannot_train_through_is_one_line_naming_its_replacement():
    s = norm_surgery(CustomOpRMSNorm)
    assert s.verify(), "precondition: the kernel runs eagerly and swaps in faithfully"
    assert s.export(), "precondition: it exports again (its fake kernel gives the shapes)"
    with pytest.raises(DeployError) as caught:
        compiled(s)  # inductor, autograd on: its training graph needs the missing formula
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith("torch.compile failed in the replacement for ")
    assert "(CustomOpRMSNorm)" in message
    assert "no autograd formula was registered" in message
    assert caught.value.__cause__ is not None, "torch's error is chained"


def test_data_dependent_python_control_flow_is_refused_by_the_export_naming_the_replacement():
    s = norm_surgery(ItemGuardedRMSNorm)
    assert s.verify(), "precondition: it runs eagerly"
    with pytest.raises(gs.ExportError) as caught:
        compiled(s, backend="eager")
    message = str(caught.value)
    assert "in the replacement for 'layers.1.norm' (ItemGuardedRMSNorm, at deploy_models.py:" in (
        message
    )
    assert "data-dependent" in message


def test_a_package_that_cannot_be_written_is_said_before_the_compile(tmp_path):
    s = norm_surgery(TorchRMSNorm)
    with pytest.raises(DeployError, match=r"the folder of .* does not exist; create it first"):
        package(s, tmp_path / "missing" / "norms.pt2")
    with pytest.raises(DeployError, match=r"an AOTInductor package is a \.pt2 file"):
        package(s, tmp_path / "norms.zip")
    with pytest.raises(DeployError) as caught:  # torch refuses the option before compiling
        package(s, tmp_path / "norms.pt2", no_such_option=1)
    assert str(caught.value) == (
        "AOTInductor (aoti_compile_and_package) failed: KeyError: 'no_such_option'"
    )
    assert not list(tmp_path.iterdir()), "nothing written"


def test_what_is_no_surgery_or_program_is_refused_with_what_to_pass():
    s = norm_surgery(TorchRMSNorm)
    with pytest.raises(gs.errors.NotAProgramError, match=r"compiled: .* made by gs\.swap"):
        compiled(s.module)  # its replacements run as Python: s.export() is what ships
    with pytest.raises(gs.errors.NotAProgramError, match=r"package: .* a model: export it"):
        package(s.model, "norms.pt2")


# -- compiled and packaged: equal to the eager model with the same replacements -------------------


@pytest.mark.slow
def test_a_swapped_program_compiled_by_inductor_equals_the_eager_model_with_its_replacements():
    s = norm_surgery(TorchRMSNorm)
    fast = compiled(s)
    want = expected_outputs(s)
    with torch.no_grad():
        got = fast(*s.args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    report = s.verify(candidate=fast)
    assert report and report.candidate_kind == "a torch.compile'd module"


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    s = norm_surgery(TorchRMSNorm)
    return s, package(s, tmp_path_factory.mktemp("deploy") / "norms.pt2")


@pytest.mark.slow
def test_a_swapped_program_packaged_by_aoti_equals_the_eager_model_in_a_fresh_process(packaged):
    s, path = packaged
    x, want = s.args[0], expected_outputs(s)
    loaded = torch._inductor.aoti_load_package(path)
    torch.testing.assert_close(loaded(x), want, rtol=1e-5, atol=1e-6)
    report = s.verify(candidate=loaded)
    assert report and report.original
    assert report.candidate_kind == "an AOTInductor package"
    assert str(report).splitlines()[1] == "  candidate: an AOTInductor package"
    # a fresh process: nothing of this one but the file and the inputs
    inputs = path.replace(".pt2", ".inputs.pt")
    torch.save(x, inputs)
    script = textwrap.dedent(f"""
        import sys, torch, torch._inductor
        loaded = torch._inductor.aoti_load_package({path!r})
        torch.save(loaded(torch.load({inputs!r})), {inputs!r} + ".out")
        print("graphsurgeon" in sys.modules)
    """)
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False", "the fresh process ran the package alone"
    torch.testing.assert_close(torch.load(inputs + ".out"), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_the_gradients_of_a_package_are_refused_in_one_message(packaged):
    s, path = packaged
    x = s.args[0]
    loaded = torch._inductor.aoti_load_package(path)
    assert gs.verify(s.module, loaded, (x,)), "precondition: the forward matches"
    with pytest.raises(VerifyError, match=r"the candidate is an AOTInductor package, which runs"):
        gs.verify(s.module, loaded, (x,), backward=True)
    with pytest.raises(VerifyError, match=r"runs inference only"):
        s.verify(candidate=loaded, backward=True)


def test_a_program_refuses_pickling_and_says_how_to_save_it(tmp_path):
    # fx would pickle the code and trace it again on load, which cannot give a swapped program
    # back: the refusal names the program and the way that works, which is then tried
    import copy
    import io
    import pickle

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    ep = gs.export(model, (x,))
    s = gs.Surgery(ep).swap("1", torch.nn.Tanh())
    programs = {"swap": gs.swap(ep, {"1": torch.nn.Tanh()}), "fuse": gs.fuse(ep, "1")}
    programs["surgery"] = s.module
    for made, program in programs.items():
        expected = program(x)  # precondition: a program that runs
        for save in (pickle.dumps, lambda p: torch.save(p, io.BytesIO())):
            with pytest.raises(DeployError) as refused:
                save(program)
            message = str(refused.value)
            assert f"a {type(program).__name__} cannot be pickled" in message, made
            assert "torch.export.save(gs.export(program, args), 'program.pt2')" in message
        torch.testing.assert_close(copy.deepcopy(program)(x), expected)
    path = tmp_path / "program.pt2"  # what the message says to do, done
    torch.export.save(gs.export(programs["swap"], (x,)), path)
    torch.testing.assert_close(torch.export.load(path).module()(x), programs["swap"](x))
    torch.export.save(s.export((x,)), tmp_path / "surgery.pt2")
    loaded = torch.export.load(tmp_path / "surgery.pt2").module()
    torch.testing.assert_close(
        loaded(x), torch.tanh(model[0](x)) @ model[2].weight.T + model[2].bias
    )
