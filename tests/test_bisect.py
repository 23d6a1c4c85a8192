"""s.bisect(): the swaps that explain a Surgery's mismatch, found in O(k log n) program runs.

Every case is built with its wrong swaps known: the culprits bisect names are checked against
them, each culprit alone against the original program, and the program without the culprits
against the eager reference (the model with the remaining replacements set).
"""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch
from helpers.check_models import (
    WIDTH,
    Broken,
    LinearBatchNormLinear,
    ResidualStack,
    Shift,
    Shifts,
    TwoDropouts,
    WrongEveryOtherCall,
)
from helpers.grad_models import ArgmaxOf, FailsBackward, NormStack, fused_norms
from helpers.models import NoCausalMask, hf_decoder
from helpers.references import eager_reference
from torch import nn

import graphsurgeon as gs
from graphsurgeon.checks import _grad
from graphsurgeon.checks.bisect import Bisection, BisectRun, bisect
from graphsurgeon.errors import SurgeryError


@functools.cache
def stack(n: int) -> tuple[ResidualStack, torch.Tensor, torch.export.ExportedProgram]:
    """A stack of ``n`` layers, its input and its program, made once per size (not changed)."""
    torch.manual_seed(n)
    model = ResidualStack(n).eval()
    x = torch.randn(3, WIDTH)
    return model, x, gs.export(model, (x,))


def faithful(layer: nn.Linear) -> nn.Linear:
    """A copy of ``layer``: computes exactly what it does."""
    copied = nn.Linear(WIDTH, WIDTH)
    copied.load_state_dict(layer.state_dict())
    return copied


def wrong(layer: nn.Linear) -> nn.Linear:
    """``layer`` with its weights off by a little: a mismatch at any tolerance used here."""
    broken = faithful(layer)
    with torch.no_grad():
        broken.weight.add_(0.05)
    return broken


def surgery_with(n: int, wrong_at: tuple[int, ...]) -> tuple[gs.Surgery, dict, torch.Tensor]:
    """A Surgery on a stack of ``n`` layers with every layer swapped, wrongly at ``wrong_at``."""
    model, x, ep = stack(n)
    s = gs.Surgery(ep, model=model, args=(x,))
    swaps = {}
    for i, layer in enumerate(model.layers):
        swaps[f"layers.{i}"] = wrong(layer) if i in wrong_at else faithful(layer)
        s.swap(f"layers.{i}", swaps[f"layers.{i}"])
    return s, swaps, x


def matches(ep, swaps: dict, x: torch.Tensor) -> bool:
    return bool(gs.verify(ep, gs.swap(ep, swaps), (x,)))


def bound(k: int, n: int) -> int:
    # the search, then each culprit and the rest run once more (a check that answers hold)
    return 2 * k * math.ceil(math.log2(n)) + 2 + (k + 1 if k else 0)


@pytest.mark.parametrize(
    ("n", "wrong_at"),
    [(10, (3, 7)), (10, (0,)), (10, (9,)), (16, (2, 9, 13)), (5, ()), (10, (4, 5))],
    ids=["2 of 10", "first of 10", "last of 10", "3 of 16", "0 of 5", "2 neighbours of 10"],
)
def test_bisect_names_exactly_the_wrong_swaps_within_the_bound(n, wrong_at):
    s, swaps, x = surgery_with(n, wrong_at)
    model, _, ep = stack(n)
    expected = tuple(f"layers.{i}" for i in wrong_at)
    # the precondition: the Surgery mismatches the original exactly when something is wrong
    assert bool(gs.verify(ep, s.module, (x,))) is (not wrong_at)

    found = s.bisect()

    assert isinstance(found, Bisection)
    assert found.culprits == expected
    assert found.matches is (not wrong_at)
    assert found.runs <= bound(len(wrong_at), n), (found.runs, bound(len(wrong_at), n))
    assert found.runs == len(found.log) and found.log[0].reference
    # checked against what is wrong by construction: each culprit alone mismatches the
    # original, and without them the program matches the original and the eager reference
    for culprit in found.culprits:
        assert not matches(ep, {culprit: swaps[culprit]}, x)
    rest = {name: module for name, module in swaps.items() if name not in found.culprits}
    assert matches(ep, rest, x)
    assert gs.verify(eager_reference(model, rest), gs.swap(ep, rest), (x,))


def test_every_run_of_the_log_says_what_its_program_does():
    s, swaps, x = surgery_with(10, (3, 7))
    ep = stack(10)[2]
    found = s.bisect()
    assert found.log[0] == BisectRun((), False)
    for run in found.log[1:]:
        assert run.swaps == tuple(sorted(run.swaps, key=lambda name: int(name.split(".")[1])))
        assert run.mismatch is not matches(ep, {name: swaps[name] for name in run.swaps}, x)
    # each subset is run once, and the final answer's once more: each culprit, then the rest
    first = [run for run in found.log if not run.repeated]
    assert len({run.swaps for run in first}) == len(first)
    again = [run.swaps for run in found.log if run.repeated]
    rest = tuple(name for name in swaps if name not in found.culprits)
    assert again == [("layers.3",), ("layers.7",), rest] and found.reliable


def test_a_tiny_gpt_with_two_wrong_attentions_among_ten_swaps():
    from graphsurgeon.examples import FusedAttention, TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(n_layers=10).eval()
    tokens = model.example_input()
    s = gs.Surgery.from_model(model, (tokens,))
    for i, layer in enumerate(model.layers):
        replacement = NoCausalMask(layer.attn) if i in (2, 6) else FusedAttention(layer.attn)
        s.swap(f"layers.{i}.attn", replacement)
    assert not gs.verify(s.program, s.module, (tokens,), rtol=1e-4, atol=1e-4)

    found = s.bisect(rtol=1e-4, atol=1e-4)

    assert found.culprits == ("layers.2.attn", "layers.6.attn")
    assert found.runs <= bound(2, 10)
    rest = {n: m for n, m in s.replacements.items() if n not in found.culprits}
    assert gs.verify(model, gs.swap(s.program, rest), (tokens,), rtol=1e-4, atol=1e-4)


def shifted(shifts: dict[int, float], n: int = 8) -> gs.Surgery:
    torch.manual_seed(0)
    model = Shifts(n)
    s = gs.Surgery.from_model(model, (torch.zeros(2),))
    for i in range(n):
        s.swap(f"steps.{i}", Shift(shifts.get(i, 0.0)))
    return s


def test_swaps_wrong_only_together_are_found_as_one_group():
    # each shift alone is within atol=1, the two together are not
    s = shifted({2: 0.6, 5: 0.6})
    for name in ("steps.2", "steps.5"):
        alone = gs.swap(s.program, {name: s.replacements[name]})
        assert gs.verify(s.program, alone, s.args, rtol=0.0, atol=1.0)
    assert not gs.verify(s.program, s.module, s.args, rtol=0.0, atol=1.0)

    found = s.bisect(rtol=0.0, atol=1.0)

    assert found.culprits == ("steps.2", "steps.5")
    assert found.groups == (("steps.2", "steps.5"),)
    assert "only together" in str(found)


def test_a_culprit_and_an_interacting_pair_are_told_apart():
    s = shifted({1: 0.6, 4: 0.6, 7: 5.0})
    found = s.bisect(rtol=0.0, atol=1.0)
    assert found.culprits == ("steps.1", "steps.4", "steps.7")
    assert sorted(found.groups) == [("steps.1", "steps.4"), ("steps.7",)]
    # what is guaranteed, seen directly: each group mismatches alone, the rest matches
    for group in found.groups:
        swaps = {n: s.replacements[n] for n in group}
        assert not gs.verify(s.program, gs.swap(s.program, swaps), s.args, rtol=0.0, atol=1.0)
    rest = {n: m for n, m in s.replacements.items() if n not in found.culprits}
    assert gs.verify(s.program, gs.swap(s.program, rest), s.args, rtol=0.0, atol=1.0)


def test_swaps_that_cancel_out_are_no_culprits():
    s = shifted({2: 3.0, 5: -3.0})
    one = gs.swap(s.program, {"steps.2": s.replacements["steps.2"]})
    assert not gs.verify(s.program, one, s.args, rtol=0.0, atol=1.0)  # wrong alone
    found = s.bisect(rtol=0.0, atol=1.0)
    assert found.matches and found.culprits == () and found.runs == 2
    assert "matches the original: no culprits" in str(found)


def test_nothing_swapped_or_only_fused_calls_have_no_culprits():
    _, x, ep = stack(5)
    s = gs.Surgery(ep, args=(x,))
    assert s.bisect().culprits == () and s.bisect().runs == 0
    s.fuse("layers.1")  # fused calls are exact: not candidates
    found = s.bisect()
    assert found.swaps == () and found.culprits == () and found.matches


def test_a_replacement_that_fails_to_run_is_a_culprit():
    s, _, _ = surgery_with(6, ())
    s.swap("layers.4", Broken())
    found = s.bisect()
    assert found.culprits == ("layers.4",)
    failed = [run for run in found.log if run.error]
    assert failed and all("not implemented yet" in run.error for run in failed)
    assert "the run failed" in str(found)


def test_random_ops_every_program_runs_from_the_same_random_state():
    torch.manual_seed(0)
    model = TwoDropouts().train()
    x = torch.randn(4, WIDTH)
    s = gs.Surgery.from_model(model, (x,))
    # the precondition: two runs from different random states differ
    assert not torch.equal(s.module(x), s.module(x))
    s.swap("a", faithful(model.a)).swap("drop1", nn.Dropout(0.5)).swap("b", faithful(model.b))
    s.swap("c", wrong(model.c))
    state = torch.random.get_rng_state()

    found = s.bisect()

    assert found.culprits == ("c",)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's stream is untouched


def test_bisect_changes_nothing_and_rebuilds_only_what_it_must():
    torch.manual_seed(0)
    model = LinearBatchNormLinear().train()  # batch norm writes its statistics when it runs
    x = torch.randn(4, WIDTH)
    s = gs.Surgery.from_model(model, (x,))
    s.swap("a", faithful(model.a)).swap("b", wrong(model.b))
    module, history, replacements = s.module, s.history, s.replacements
    program_state = {k: v.clone() for k, v in s.program.state_dict.items()}
    buffers = {k: v.clone() for k, v in module.named_buffers()}

    found = s.bisect()

    assert found.culprits == ("b",)
    assert found.builds == found.runs - 2  # the original and the Surgery's module: not built
    assert s.module is module and s.history == history and s.replacements == replacements
    assert all(torch.equal(v, s.program.state_dict[k]) for k, v in program_state.items())
    assert all(torch.equal(v, dict(module.named_buffers())[k]) for k, v in buffers.items())

    # once the Surgery's module has run in training mode, its statistics are not the
    # program's: the full set is built afresh, and the answer is the same
    module(x)
    changed = dict(module.named_buffers())
    assert not all(torch.equal(v, changed[k]) for k, v in buffers.items())
    again = s.bisect()
    assert again.culprits == ("b",) and again.builds == again.runs - 1


def test_mistakes_are_clear_errors():
    _, x, ep = stack(5)
    s = gs.Surgery(ep)
    s.swap("layers.0", nn.Linear(WIDTH, WIDTH))
    with pytest.raises(SurgeryError, match=r"bisect: no inputs.*s\.bisect\(\(x,\)\)"):
        s.bisect()
    with pytest.raises(SurgeryError, match="rtol=-1"):
        s.bisect((x,), rtol=-1)
    with pytest.raises(SurgeryError, match="atol='a'"):
        s.bisect((x,), atol="a")
    with pytest.raises(SurgeryError, match="running the original program failed: GuardError"):
        s.bisect((torch.randn(3, WIDTH + 1),))
    with pytest.raises(SurgeryError, match=r"expected a gs\.Surgery"):
        bisect(ep)


def test_it_shows_itself():
    s, _, _ = surgery_with(10, (3, 7))
    found = s.bisect()
    text = str(found)
    assert text.startswith("bisect: 2 culprits among 10 swaps")
    assert "layers.3, layers.7" in text and "without them the program matches" in text
    assert repr(found).startswith("<Bisection: 2 culprits of 10 swaps (layers.3, layers.7)")
    bundle = found._repr_mimebundle_()
    assert bundle["text/plain"] == repr(found)
    assert "mismatch" in bundle["text/html"] and "reference" in bundle["text/html"]
    with pytest.raises(AttributeError):
        found.culprits = ()  # frozen
    clean = surgery_with(5, ())[0].bisect()
    assert "no culprits" in clean._repr_mimebundle_()["text/html"]


def test_a_surgery_copy_of_the_swaps_is_not_needed():
    # bisect builds programs with the Surgery's own replacement objects: they stay unchanged
    s, swaps, _ = surgery_with(6, (2,))
    weights = {n: copy.deepcopy(m.state_dict()) for n, m in swaps.items()}
    s.bisect()
    for name, module in swaps.items():
        assert all(torch.equal(v, module.state_dict()[k]) for k, v in weights[name].items())


def test_runs_that_disagree_are_said_and_the_answer_is_unreliable():
    """Was: a replacement wrong on every other call made bisect blame an innocent exact copy
    (``layers.7``) without a word."""
    torch.manual_seed(0)
    model, x, _ = stack(10)
    s = gs.Surgery.from_model(model, (x,))
    for i, layer in enumerate(model.layers):
        s.swap(f"layers.{i}", WrongEveryOtherCall(layer) if i == 5 else copy.deepcopy(layer))
    found = s.bisect()
    assert not found.reliable and found.disagreements
    assert "UNRELIABLE" in repr(found) or "UNRELIABLE" in found._summary()
    assert "two runs of the same swaps disagreed" in str(found)
    assert any(run.repeated for run in found.log)
    # deterministic swaps: the same check finds nothing to say
    s2, _, _ = surgery_with(10, (3,))
    assert s2.bisect().reliable


# -- backward=True: replacements whose forward is right and whose backward is not -------------


def _torch_gradients(module: nn.Module, args: tuple, kwargs: dict, upstream: tuple) -> dict:
    """torch's own autograd on ``module``: ``{name: gradient}`` of every floating input and
    parameter, from ``upstream`` (one tensor or None per output leaf)."""
    inputs = [a.detach().requires_grad_(True) if a.is_floating_point() else a for a in args]
    named = {f"input {i}": a for i, a in enumerate(inputs) if a.requires_grad}
    named.update(module.named_parameters())
    outputs = torch.utils._pytree.tree_leaves(module(*inputs, **kwargs))
    pairs = [(out, grad) for out, grad in zip(outputs, upstream) if grad is not None]
    grads = torch.autograd.grad(
        [out for out, _ in pairs], list(named.values()), [g for _, g in pairs], allow_unused=True
    )
    return dict(zip(named, grads))


def _same_gradients(expected: dict, actual: dict) -> bool:
    assert expected.keys() == actual.keys()
    return all(
        torch.allclose(expected[name], actual[name], rtol=1e-5, atol=1e-5) for name in expected
    )


def _check_backward_bisection(model, args, kwargs, bugs, culprit_gradient):
    s = gs.Surgery.from_model(model, args, kwargs)
    swaps = fused_norms(model, bugs)
    for name, replacement in swaps.items():
        s.swap(name, replacement)
    # precondition: the forward is right everywhere, so a forward bisection finds nothing
    forward = s.bisect()
    assert forward.matches and forward.culprits == () and not forward.backward
    with torch.no_grad():
        reference = model(*args, **kwargs)
    upstream = _grad.seeded_upstream(
        torch.utils._pytree.tree_map(lambda t: t.requires_grad_(True), reference)
    )
    expected = _torch_gradients(model, args, kwargs, upstream)
    program = lambda subset: gs.swap(s.program, {n: swaps[n] for n in subset})  # noqa: E731
    # ... and the backward is wrong, by torch's own autograd on the eager model
    assert not _same_gradients(expected, _torch_gradients(s.module, args, kwargs, upstream))

    found = s.bisect(backward=True)

    assert found.backward and not found.matches and found.reliable
    assert set(found.culprits) == set(bugs) and len(found.groups) == len(bugs)
    # checked against torch: each culprit alone has wrong gradients, the rest has right ones
    for culprit in found.culprits:
        alone = _torch_gradients(program([culprit]), args, kwargs, upstream)
        assert not _same_gradients(expected, alone)
    rest = [name for name in swaps if name not in found.culprits]
    assert _same_gradients(expected, _torch_gradients(program(rest), args, kwargs, upstream))
    # every run says what differed: here the gradients, never the outputs
    for run in found.log[1:]:
        assert run.differs == ("gradients" if run.mismatch else "")
        assert bool(run.gradients) is run.mismatch
    for culprit, name in culprit_gradient.items():
        (run,) = [r for r in found.log if r.swaps == (culprit,) and not r.repeated]
        assert name in run.gradients
    text = str(found)
    assert "outputs and gradients" in text.splitlines()[0]
    assert "the outputs match" in text and "MISMATCH of" in text
    html = found._repr_mimebundle_()["text/html"]
    assert "outputs and gradients" in html and "grad max abs" in html
    return found


def test_bisect_backward_finds_the_two_norms_with_a_wrong_backward_among_six():
    torch.manual_seed(0)
    model, x = NormStack(layers=6).eval(), torch.randn(3, 8)
    bugs = {"layers.1.norm": "weight factor", "layers.4.norm": "missing mean"}
    found = _check_backward_bisection(
        model, (x,), {}, bugs, {"layers.1.norm": "grad of layers.1.norm.weight"}
    )
    assert found.swaps == (*(f"layers.{i}.norm" for i in range(6)), "norm")
    assert found.culprits == ("layers.1.norm", "layers.4.norm")


def test_bisect_backward_finds_the_wrong_fused_norms_of_a_hugging_face_llama():
    model = hf_decoder("Llama", layers=3)
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    bugs = {
        "model.layers.0.post_attention_layernorm": "weight factor",
        "model.layers.2.input_layernorm": "missing mean",
    }
    found = _check_backward_bisection(
        model,
        (ids,),
        {"use_cache": False},
        bugs,
        {
            "model.layers.0.post_attention_layernorm": (
                "grad of model.layers.0.post_attention_layernorm.weight"
            )
        },
    )
    assert len(found.swaps) == 7  # two norms in each of three layers, and the final one
    # integers are not differentiated, and the notes say so
    assert any("input input_ids (torch.int64)" in note for note in found.backward_notes)


def test_bisect_backward_refuses_a_program_whose_outputs_need_no_gradient():
    model, x, _ = stack(4)
    s = gs.Surgery.from_model(ArgmaxOf(model), (x,)).swap(
        "inner.layers.0", copy.deepcopy(model.layers[0])
    )
    with pytest.raises(SurgeryError, match="no output needs a gradient"):
        s.bisect(backward=True)
    with pytest.raises(SurgeryError, match="backward='yes'"):
        s.bisect(backward="yes")


def test_a_backward_that_fails_is_a_mismatch_of_its_run():
    torch.manual_seed(0)
    model, x = NormStack(layers=4).eval(), torch.randn(3, 8)
    s = gs.Surgery.from_model(model, (x,))
    for name, replacement in fused_norms(model).items():
        s.swap(
            name,
            FailsBackward(model.get_submodule(name)) if name == "layers.2.norm" else replacement,
        )
    assert s.bisect().matches, "precondition: the forward is right everywhere"
    found = s.bisect(backward=True)
    assert found.culprits == ("layers.2.norm",)
    (alone,) = [run for run in found.log if run.swaps == ("layers.2.norm",) and not run.repeated]
    assert alone.mismatch and "this backward is not written yet" in alone.error
    assert "the run failed" in str(found)


def test_bisect_backward_runs_every_backward_from_the_given_upstream_gradients():
    torch.manual_seed(0)
    model, x = NormStack(layers=4).eval(), torch.randn(3, 8)
    swaps = fused_norms(model, {"layers.2.norm": "weight factor"})
    s = gs.Surgery.from_model(model, (x,))
    for name, replacement in swaps.items():
        s.swap(name, replacement)
    zeros, ones = torch.zeros(3, 8), torch.ones(3, 8)
    # by torch's own autograd: a zero upstream gradient hides the planted bug, ones show it
    assert _same_gradients(
        _torch_gradients(model, (x,), {}, (zeros,)), _torch_gradients(s.module, (x,), {}, (zeros,))
    )
    assert not _same_gradients(
        _torch_gradients(model, (x,), {}, (ones,)), _torch_gradients(s.module, (x,), {}, (ones,))
    )

    hidden = s.bisect(backward=True, grad_outputs=zeros)
    shown = s.bisect(backward=True, grad_outputs=ones)

    assert hidden.matches and hidden.culprits == ()
    assert not shown.matches and shown.culprits == ("layers.2.norm",)
    assert "upstream gradients: grad_outputs as given" in shown.backward_notes[-1]
    assert "seeded" in s.bisect(backward=True).backward_notes[-1]
    with pytest.raises(SurgeryError, match=r"bisect: grad_outputs leaf 0 has shape \[8\]"):
        s.bisect(backward=True, grad_outputs=torch.ones(8))
    with pytest.raises(SurgeryError, match="pass backward=True"):
        s.bisect(grad_outputs=ones)
