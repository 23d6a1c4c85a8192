"""compare(): per swapped call, the original partition vs the replacement on the same inputs."""

from __future__ import annotations

import copy
import html
import importlib
import inspect
import math
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers.check_models import (
    ClampReLU,
    Counting,
    DrawsFirst,
    Dropping,
    LayerNormed,
    Loose,
    RaisesValueError,
    StaticKVCache,
    SwappedOutputs,
    TimesFactor,
    TwoOutputs,
    Untraceable,
    UsesCacheDoubled,
    UsesFirst,
)
from helpers.models import Chain, Scale, Shared
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import graphsurgeon as gs
from graphsurgeon.checks._exec import runnable_original
from graphsurgeon.checks.compare import Comparison, compare
from graphsurgeon.checks.verify import eager_reference
from graphsurgeon.errors import CompareError, NotAProgramError, UnknownModuleError
from graphsurgeon.examples import MLP, Attention, FusedAttention, TinyGPT
from graphsurgeon.fuse import fused_call
from graphsurgeon.swap import swap_info

# -- tiny models --------------------------------------------------------------------------


def nudged(linear: nn.Linear, by: float) -> nn.Linear:
    """A copy of ``linear`` whose bias is off by up to ``by``: not a constant shift, which a
    following LayerNorm would cancel."""
    copy = nn.Linear(linear.in_features, linear.out_features)
    noise = torch.rand(linear.out_features, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        copy.weight.copy_(linear.weight)
        copy.bias.copy_(linear.bias + by * noise)
    return copy


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    model = TinyGPT(3).eval()
    tokens = model.example_input()
    return model, tokens, gs.export(model, (tokens,))


def fused(model: TinyGPT) -> dict[str, nn.Module]:
    return {f"layers.{i}.attn": FusedAttention(model.layers[i].attn) for i in range(3)}


# -- finding the culprit ----------------------------------------------------------------------


def test_compare_pinpoints_the_broken_replacement_among_correct_ones(gpt):
    model, tokens, ep = gpt
    replacements = fused(model)
    broken = replacements["layers.1.attn"]
    broken.o = nudged(broken.o, 1e-3)
    swapped = gs.swap(ep, replacements)
    # precondition: the swapped program really computes something else
    assert not gs.verify(ep, swapped, (tokens,))
    comparison = compare(ep, swapped, (tokens,))
    assert [c.call_name for c in comparison.calls] == list(replacements)
    assert comparison.first_divergence == "layers.1.attn"
    assert comparison.divergent == ("layers.1.attn",)
    assert 1e-4 < comparison["layers.1.attn"].max_abs <= 1e-3 * 1.01
    # downstream, the inputs already differ, yet the call itself is still right
    after = comparison["layers.2.attn"]
    assert after.ok and after.input_drift > 1e-4
    assert comparison["layers.0.attn"].input_drift == 0.0
    assert not comparison and not comparison.outputs.ok
    text = str(comparison)
    assert "first divergence: 'layers.1.attn'" in text and "DIVERGES" in text


def test_compare_reports_no_divergence_when_every_replacement_is_equivalent(gpt):
    model, tokens, ep = gpt
    replacements = fused(model)
    same_mlp = MLP(64)
    same_mlp.load_state_dict(model.layers[2].mlp.state_dict())
    replacements["layers.2.mlp"] = same_mlp
    swapped = gs.swap(ep, replacements)
    assert len(swap_info(swapped).calls) == 4  # precondition: four calls really swapped
    comparison = compare(ep, swapped, (tokens,))
    assert comparison.first_divergence is None and comparison.divergent == ()
    assert len(comparison) == 4 and all(c.ok for c in comparison.calls)
    assert comparison.ok and comparison.outputs.ok
    assert all(0 < c.max_abs < 1e-5 for c in comparison.calls if c.replacement != "MLP")
    assert "none diverges" in str(comparison)


@pytest.fixture(scope="module")
def chain():
    torch.manual_seed(0)
    model = Chain().eval()
    return model, gs.export(model, (torch.zeros(1, 4),))


@settings(max_examples=20, deadline=None, derandomize=True)
@given(values=st.lists(st.floats(-5, 5), min_size=4, max_size=4))
def test_a_replacement_diverges_exactly_when_its_inputs_reach_where_it_differs(chain, values):
    model, ep = chain
    x = torch.tensor([values], dtype=torch.float32)
    with torch.no_grad():
        hidden = model.first(x)
    # LeakyReLU(0.1) differs from ReLU by 0.1 * |v| for v < 0; keep clear of the tolerance edge
    assume(not bool(((hidden > -3e-4) & (hidden < -3e-5)).any()))
    equal = compare(ep, gs.swap(ep, {"act": ClampReLU()}), (x,))
    assert equal.first_divergence is None and equal["act"].max_abs == 0.0
    leaky = compare(ep, gs.swap(ep, {"act": nn.LeakyReLU(0.1)}), (x,))
    assert (leaky.first_divergence == "act") == bool((hidden < 0).any())


# -- structure: several outputs, constants, repeated calls --------------------------------------


def test_every_output_leaf_is_compared_by_its_path_and_constants_are_passed():
    model = TwoOutputs()
    x = torch.randn(2, 3)
    ep = gs.export(model, (x,))
    signature = gs.partition(ep)["scaled"].signature
    assert any(type(a).__name__ == "ConstantArgument" for a in signature.inputs)  # factor=2.5
    swapped = gs.swap(ep, {"scaled": TimesFactor(), "split": Loose()})
    comparison = compare(ep, swapped, (x,))
    assert comparison["scaled"].ok and comparison["scaled"].max_abs == 0.0
    split = comparison["split"]
    assert [leaf.path for leaf in split.leaves] == ["[0]", "[1]['b']"]
    assert split.leaves[0].ok and not split.leaves[1].ok
    assert math.isclose(split.leaves[1].max_abs, 0.5, rel_tol=1e-6)
    assert comparison.first_divergence == "split" and "[1]['b']" in split.problem


def test_one_call_of_a_module_called_twice():
    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(2, 4)
    ep = gs.export(model, (x,))
    second = compare(ep, gs.swap(ep, {"shared@1": nudged(model.shared, 0.1)}), (x,))
    assert [c.call_name for c in second.calls] == ["shared@1"]
    assert second.first_divergence == "shared@1" and second["shared@1"].input_drift == 0.0
    both = compare(ep, gs.swap(ep, {"shared": nudged(model.shared, 0.1)}), (x,))
    assert both.divergent == ("shared", "shared@1")
    assert both.first_divergence == "shared" and both["shared@1"].input_drift > 0


def test_an_output_nothing_uses_is_reported_as_unused():
    #   x ──▶ split ──▶ (a, {"b": b}) ──▶ a ──▶ out        (b is never used)
    x = torch.randn(3)
    ep = gs.export(UsesFirst(), (x,))
    outputs = gs.partition(ep)["split"].signature.outputs
    users = {n.name: len(n.users) for n in ep.graph.nodes}
    # precondition: the program computes the dict output but nothing reads it
    assert [users[a.name] > 0 for a in outputs] == [True, False]
    comparison = compare(ep, gs.swap(ep, {"split": Loose()}), (x,))
    assert comparison.first_divergence is None
    unused = comparison["split"].leaves[1]
    assert unused.ok and "unused by the program" in unused.problem and unused.max_abs == 0.5


# -- the cut partitions -------------------------------------------------------------------


def test_the_cut_call_computes_what_the_module_computes_and_is_cached(gpt):
    model, _, ep = gpt
    part = fused_call(ep, "layers.1.attn")
    assert fused_call(ep, "layers.1.attn") is part
    assert [n.op for n in part.graph.nodes].count("placeholder") == 1
    hidden = torch.randn(1, 16, 64)
    with torch.no_grad():
        out = part(hidden)
        assert torch.allclose(out, model.layers[1].attn(hidden), atol=1e-6)
    with pytest.raises(UnknownModuleError, match=r"Did you mean 'layers.1.attn'"):
        fused_call(ep, "layers.1.atn")


def test_unlifted_names_match_the_programs_even_for_an_argument_named_input():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())  # forward(input): "input" is a builtin
    x = torch.randn(1, 2)
    ep = gs.export(model, (x,))
    assert gs.partition(ep)["0"].input_names == ("input",)
    comparison = compare(ep, gs.swap(ep, {"0": nudged(model[0], 0.0)}), (x,))
    assert comparison.first_divergence is None and comparison["0"].input_drift == 0.0
    assert runnable_original(ep) is runnable_original(ep)


# -- reports, errors, and the user's objects ---------------------------------------------------


def test_the_report_reads_as_text_and_as_rows(gpt):
    model, tokens, ep = gpt
    replacements = fused(model)
    replacements["layers.0.attn"].o = nudged(replacements["layers.0.attn"].o, 1e-2)
    comparison = compare(ep, gs.swap(ep, replacements), (tokens,))
    rows = comparison.rows
    assert [r["call"] for r in rows] == [*replacements, "(outputs)"]
    assert rows[0]["ok"] is False and rows[0]["replacement"] == "FusedAttention"
    table = comparison.table().splitlines()
    assert table[0].split()[:2] == ["call", "replacement"] and len(table) == 5
    assert table[1].startswith("layers.0.attn") and table[1].endswith("DIVERGES")
    assert table[-1].startswith("(outputs)") and table[-1].endswith("DRIFT")
    assert isinstance(comparison, Comparison) and "layers.0.attn" in repr(comparison)
    with pytest.raises(UnknownModuleError, match=r"Did you mean 'layers.1.attn'"):
        comparison["layers.1.atn"]


def test_misuse_raises_compare_errors_that_say_what_to_pass():
    torch.manual_seed(0)
    model = Chain()
    x = torch.randn(2, 4)
    ep = gs.export(model, (x,))
    other = gs.export(model, (x,))
    swapped = gs.swap(ep, {"act": ClampReLU()})
    # what is no program is refused as by every entry point (graphsurgeon._program)
    with pytest.raises(NotAProgramError, match=r"gs.swap or gs.fuse did not make"):
        compare(ep, torch.fx.symbolic_trace(model), (x,))
    with pytest.raises(CompareError, match=r"another ExportedProgram"):
        compare(other, swapped, (x,))
    with pytest.raises(NotAProgramError, match=r"a model: export it first"):
        compare(model, swapped, (x,))

    failing = gs.swap(ep, {"act": RaisesValueError()})
    with pytest.raises(CompareError, match=r"swapped program failed at node 'swapped_act'"):
        compare(ep, failing, (x,))


def test_compare_leaves_the_program_inputs_and_replacements_as_they_were(gpt):
    model, tokens, ep = gpt
    replacements = fused(model)
    swapped = gs.swap(ep, replacements)
    graph_before = str(ep.graph)
    tokens_before = tokens.clone()
    weights_before = {k: v.clone() for k, v in replacements["layers.0.attn"].state_dict().items()}
    compare(ep, swapped, (tokens,))
    assert str(ep.graph) == graph_before and torch.equal(tokens, tokens_before)
    for replacement in replacements.values():
        assert not replacement._forward_hooks and not replacement._forward_pre_hooks
    for key, value in replacements["layers.0.attn"].state_dict().items():
        assert torch.equal(value, weights_before[key])


def test_compare_leaves_buffers_of_the_original_and_of_replacements_as_they_were():
    #   x ──▶ lin ──▶ norm (BatchNorm1d, training) ──▶ act ──▶ out;  norm swapped for a copy
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.ReLU()).train()
    x = torch.randn(4, 3)
    ep = gs.export(model, (x,))
    replacement = nn.BatchNorm1d(3).train()
    swapped = gs.swap(ep, {"1": replacement})
    original_mean = runnable_original(ep).get_buffer("1.running_mean")
    before = original_mean.clone(), replacement.running_mean.clone()
    comparison = compare(ep, swapped, (x,))
    assert comparison.ok and comparison["1"].leaves[0].max_abs < 1e-6
    assert torch.equal(original_mean, before[0]) and torch.equal(
        replacement.running_mean, before[1]
    )
    with torch.no_grad():
        replacement(x)
    assert not torch.equal(replacement.running_mean, before[1])  # precondition: it does update


def test_on_the_meta_device_compare_says_no_values_were_compared():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
        x = torch.zeros(2, 4)
    ep = gs.export(model, (x,))
    comparison = gs.compare(ep, gs.swap(ep, {"1": torch.nn.GELU()}), (x,))
    assert not comparison.values_compared
    assert "no values compared" in str(comparison) and "no values compared" in repr(comparison)
    assert "no values compared" in comparison._repr_html_()
    real = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    ep = gs.export(real, (x,))
    assert gs.compare(ep, gs.swap(ep, {"1": torch.nn.GELU()}), (x,)).values_compared


# -- random ops -----------------------------------------------------------------------------


@pytest.fixture
def dropping():
    torch.manual_seed(0)
    model = Dropping().train()
    x = torch.randn(4, 8)
    with torch.no_grad():  # precondition: two runs draw different masks
        assert not torch.equal(model(x), model(x))
    return model, x, gs.export(model, (x,))


@pytest.mark.parametrize("name", ["o", "d"])
def test_a_faithful_swap_in_a_train_mode_model_with_dropout_compares_exactly(dropping, name):
    model, x, ep = dropping
    replacement = nn.Dropout(0.5) if name == "d" else copy.deepcopy(model.o)
    state = torch.random.get_rng_state()
    comparison = compare(ep, gs.swap(ep, {name: replacement}), (x,))
    assert comparison.ok and comparison[name].max_abs == 0.0 and comparison.outputs.max_abs == 0
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's stream is untouched


def test_with_random_ops_compare_names_them_and_does_not_blame_small_differences(dropping):
    model, x, ep = dropping
    comparison = compare(ep, gs.swap(ep, {"l": DrawsFirst(copy.deepcopy(model.l))}), (x,))
    assert comparison.first_divergence is None and not comparison.outputs.ok
    assert comparison.random_ops == ("node 'dropout' in module 'd'",)
    for said in (str(comparison), html.unescape(comparison._repr_html_())):
        assert "small differences add up" not in said
        assert "the model uses random ops (node 'dropout' in module 'd')" in said
        assert "different random stream" in said
    # a model without random ops (dropout in eval mode) keeps the old explanation
    eval_model = copy.deepcopy(model).eval()
    eval_ep = gs.export(eval_model, (x,))
    drifting = compare(eval_ep, gs.swap(eval_ep, {"l": nudged(eval_model.l, 1e-6)}), (x,))
    assert drifting.random_ops == ()


# -- state the calls write ----------------------------------------------------------------------


def test_a_call_returning_the_buffer_it_writes_is_compared_as_it_returned_it():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    ep = gs.export(UsesCacheDoubled().eval(), (x,))
    with torch.no_grad():  # precondition: the cache's output is not its initial zeros
        assert StaticKVCache()(x).abs().sum() > 0
    faithful = compare(ep, gs.swap(ep, {"cache": StaticKVCache()}), (x,))
    assert faithful.ok and faithful["cache"].max_abs == 0.0
    wrong = compare(ep, gs.swap(ep, {"cache": StaticKVCache(row=1)}), (x,))
    assert wrong.first_divergence == "cache" and not wrong.outputs.ok


def test_on_the_meta_device_the_table_prints_no_nan():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
        x = torch.zeros(2, 4)
    ep = gs.export(model, (x,))
    comparison = gs.compare(ep, gs.swap(ep, {"1": torch.nn.GELU()}), (x,))
    assert not comparison.values_compared and not comparison["1"].values_compared
    assert "nan" not in comparison.table() and "no values compared" in comparison.table()
    html = comparison._repr_html_()
    assert ">nan<" not in html and "no values compared" in html


# -- locate: inside the diverging call, the line of the replacement --------------------------------
#
# Replacements with one bug planted on demand (``bug=""``: none). Each planted line carries the
# comment ``# planted: <bug>``; the tests read the expected line number from the class's own
# source, so ``locate().source`` must name exactly that line.


def planted_line(cls: type, bug: str) -> str:
    """``"test_compare.py:LINE"`` of the line of ``cls`` marked ``# planted: <bug>``."""
    lines, first = inspect.getsourcelines(cls)
    (offset,) = [i for i, line in enumerate(lines) if line.rstrip().endswith(f"# planted: {bug}")]
    return f"{Path(__file__).name}:{first + offset}"


class SdpaAttention(nn.Module):
    """The decoder's Attention through scaled_dot_product_attention, with q/k/v/o of its own."""

    def __init__(self, original: Attention, bug: str = "", o_weight: torch.Tensor | None = None):
        super().__init__()
        self.heads, self.bug = original.heads, bug
        self.q, self.k, self.v, self.o = (copy.deepcopy(original.get_submodule(n)) for n in "qkvo")
        if o_weight is not None:
            with torch.no_grad():
                self.o.weight.copy_(o_weight)

    def forward(self, x):
        batch, tokens, hidden = x.shape

        def heads(t):
            return t.view(batch, tokens, self.heads, hidden // self.heads).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        attend = F.scaled_dot_product_attention
        if self.bug == "no causal mask":
            out = attend(q, k, v)  # planted: no causal mask
        elif self.bug == "wrong scale":
            out = attend(q, k, v, is_causal=True, scale=1.0)  # planted: wrong scale
        else:
            out = attend(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(batch, tokens, hidden))  # planted: wrong weight


class WrittenOutAttention(nn.Module):
    """The decoder's Attention written out step by step, from one fused qkv projection."""

    def __init__(self, original: Attention, bug: str = ""):
        super().__init__()
        self.heads, self.bug = original.heads, bug
        fused = FusedAttention(original)
        self.qkv, self.o = fused.qkv, fused.o

    def forward(self, x):
        batch, tokens, hidden = x.shape
        size = hidden // self.heads
        qkv = self.qkv(x).view(batch, tokens, 3, self.heads, size).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        scores = q @ k.transpose(-2, -1)
        if self.bug == "wrong scale":
            scores = scores / size  # planted: wrong scale
        else:
            scores = scores / math.sqrt(size)
        if self.bug == "wrong mask":
            mask = torch.ones(tokens, tokens, dtype=torch.bool).triu(0)  # planted: wrong mask
        else:
            mask = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
        weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return self.o((weights @ v).transpose(1, 2).reshape(batch, tokens, hidden))


class StepMLP(nn.Module):
    """The decoder's MLP, one step a line."""

    def __init__(self, original: MLP, bug: str = ""):
        super().__init__()
        self.up, self.down, self.bug = copy.deepcopy(original.up), copy.deepcopy(original.down), bug

    def forward(self, x):
        hidden = self.up(x)
        if self.bug == "wrong activation":
            hidden = torch.relu(hidden)  # planted: wrong activation
        else:
            hidden = F.gelu(hidden)
        return self.down(hidden)


class StepLayerNorm(nn.Module):
    """LayerNorm written out, as a replacement for ``nn.LayerNorm`` (one fused op)."""

    def __init__(self, original: nn.LayerNorm, bug: str = ""):
        super().__init__()
        self.weight = nn.Parameter(original.weight.detach().clone())
        self.bias = nn.Parameter(original.bias.detach().clone())
        self.eps, self.bug = original.eps, bug

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        centered = x - mean
        variance = centered.pow(2).mean(-1, keepdim=True)
        if self.bug == "misplaced epsilon":
            scale = 1 / (variance.sqrt() + self.eps)  # planted: misplaced epsilon
        else:
            scale = torch.rsqrt(variance + self.eps)
        return centered * scale * self.weight + self.bias


@pytest.fixture(scope="module")
def normed():
    torch.manual_seed(0)
    model = LayerNormed().eval()
    x = torch.randn(4, 8)
    return model, x, gs.export(model, (x,))


def locate_planted(model, args, ep, name, make, bug, kwargs=None):
    """compare and locate a replacement with ``bug`` planted, after checking that the same
    replacement without it matches (so the bug is what makes it differ)."""
    faithful = gs.swap(ep, {name: make("")})
    assert compare(ep, faithful, args, kwargs).first_divergence is None, "precondition"
    replacement = make(bug)
    swapped = gs.swap(ep, {name: replacement})
    # the surgery is right (the eager model carrying the same module agrees): the divergence
    # is the replacement's own
    reference = eager_reference(model, {name: replacement})
    assert gs.verify(reference, swapped, args, kwargs, rtol=1e-4, atol=1e-5)
    comparison = compare(ep, swapped, args, kwargs, locate=False)
    assert comparison.first_divergence == name
    return comparison, comparison.locate()


GPT_BUGS = [
    ("layers.1.attn", SdpaAttention, "no causal mask"),
    ("layers.1.attn", SdpaAttention, "wrong scale"),
    ("layers.1.attn", WrittenOutAttention, "wrong scale"),
    ("layers.1.attn", WrittenOutAttention, "wrong mask"),
    ("layers.1.mlp", StepMLP, "wrong activation"),
]


@pytest.mark.parametrize(("name", "cls", "bug"), GPT_BUGS, ids=lambda v: getattr(v, "__name__", v))
def test_locate_names_the_line_of_a_planted_bug(gpt, name, cls, bug):
    model, tokens, ep = gpt
    original = model.get_submodule(name)
    _, found = locate_planted(model, (tokens,), ep, name, lambda b: cls(original, b), bug)
    assert found and found.call == name and found.replacement == cls.__name__
    assert found.source == planted_line(cls, bug)
    assert found.line.endswith(f"# planted: {bug}") and found.line in str(found)
    assert found.file == __file__ and "first differs here, inputs agree" in str(found)
    assert found.op.startswith("aten.") and found.node


def test_locate_shows_the_arguments_that_make_the_difference(gpt):
    model, tokens, ep = gpt
    attention = model.layers[1].attn
    _, no_mask = locate_planted(
        model,
        (tokens,),
        ep,
        "layers.1.attn",
        lambda b: SdpaAttention(attention, b),
        "no causal mask",
    )
    assert no_mask.op.startswith("aten.scaled_dot_product_attention.default(f32[1, 4, 16, 16]")
    assert "attn_mask=None" in no_mask.op and "is_causal=False" in no_mask.op
    # its inputs agree: each is the original's value, named with the line computing it
    assert len(no_mask.inputs) == 3
    assert all("= the original's 'transpose_" in i and "examples.py:" in i for i in no_mask.inputs)
    _, scale = locate_planted(
        model, (tokens,), ep, "layers.1.attn", lambda b: SdpaAttention(attention, b), "wrong scale"
    )
    assert "scale=1.0" in scale.op and "is_causal=True" in scale.op


@pytest.mark.parametrize("which", ["transposed", "another layer's"])
def test_a_wrong_weight_is_located_where_it_is_used(gpt, which):
    model, tokens, ep = gpt
    attention = model.layers[1].attn
    weight = attention.o.weight.T if which == "transposed" else model.layers[0].attn.o.weight

    def make(bug):
        return SdpaAttention(attention, o_weight=weight if bug else None)

    _, found = locate_planted(model, (tokens,), ep, "layers.1.attn", make, "wrong weight")
    assert found.source == planted_line(SdpaAttention, "wrong weight")
    assert found.op.startswith("aten.linear.default")
    (weight_input,) = [i for i in found.inputs if i.startswith("o.weight:")]
    if which == "transposed":  # the original transposes its weight inside linear: that step
        assert re.search(
            r"a step of the original's 'linear_\d+' \(aten\.(t|transpose|permute)", weight_input
        )
    else:
        assert weight_input.endswith("matches no value")


def test_a_misplaced_epsilon_is_found_in_a_norm_written_out_against_a_fused_one(normed):
    model, x, ep = normed
    # the original is one op: its steps (mean, variance, rsqrt...) come from its decomposition
    assert [n.target for n in fused_call(ep, "norm").graph.nodes if n.op == "call_function"] == [
        torch.ops.aten.layer_norm.default
    ]
    make = lambda bug: StepLayerNorm(model.norm, bug)  # noqa: E731
    _, found = locate_planted(model, (x,), ep, "norm", make, "misplaced epsilon")
    assert found.source == planted_line(StepLayerNorm, "misplaced epsilon")
    assert found.op.startswith("aten.sqrt.default")
    assert "a step of the original's 'layer_norm'" in found.inputs[0]


# -- locate on a Hugging Face Llama attention ----------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # the second sequence is padded
    kwargs = {"attention_mask": mask, "use_cache": False}
    return model, (ids,), kwargs, gs.export(model, (ids,), kwargs)


def rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class LlamaSdpa(nn.Module):
    """Llama's attention as a user writes it: the same projections and rotary embedding,
    ``scaled_dot_product_attention`` with grouped key/value heads."""

    def __init__(self, attention, bug: str = "", o_proj: nn.Linear | None = None):
        super().__init__()
        config = attention.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.bug = attention.head_dim, bug
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, copy.deepcopy(attention.get_submodule(name)))
        if o_proj is not None:
            self.o_proj = copy.deepcopy(o_proj)

    def forward(
        self, hidden_states, attention_mask, position_ids, cache, use_cache, position_embeddings
    ):
        batch, tokens, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(batch, tokens, self.heads, -1).transpose(1, 2)
        k = self.k_proj(hidden_states).view(batch, tokens, self.kv_heads, -1).transpose(1, 2)
        v = self.v_proj(hidden_states).view(batch, tokens, self.kv_heads, -1).transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        attend, mask = F.scaled_dot_product_attention, attention_mask
        if self.bug == "no mask":
            out = attend(q, k, v, enable_gqa=True)  # planted: no mask
        elif self.bug == "wrong scale":
            out = attend(q, k, v, mask, scale=1.0, enable_gqa=True)  # planted: wrong scale
        else:
            out = attend(q, k, v, mask, enable_gqa=True)
        out = out.transpose(1, 2).reshape(batch, tokens, -1)
        return self.o_proj(out), None  # planted: wrong weight


@pytest.mark.parametrize("bug", ["no mask", "wrong scale", "wrong weight"])
def test_locate_in_a_hugging_face_llama_attention(llama, bug):
    model, args, kwargs, ep = llama
    name = "model.layers.1.self_attn"
    attention = model.get_submodule(name)
    other = model.get_submodule("model.layers.0.self_attn").o_proj

    def make(planted):
        if planted == "wrong weight":
            return LlamaSdpa(attention, o_proj=other)
        return LlamaSdpa(attention, planted)

    _, found = locate_planted(model, args, ep, name, make, bug, kwargs)
    assert found.source == planted_line(LlamaSdpa, bug)
    assert any("modeling_llama.py:" in i for i in found.inputs), "the original's values, by line"


class StackedRope(nn.Module):
    """Hugging Face's apply_rotary_pos_emb with q and k rotated in one pass: stacked along the
    heads, one multiply-add, split again (no value of the original until the split)."""

    def __init__(self, bug: str = ""):
        super().__init__()
        self.bug = bug

    def forward(self, q, k, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        both = torch.cat((q, k), dim=1)
        if self.bug == "flipped rotation":
            rotated = both * cos - rotate_half(both) * sin  # planted: flipped rotation
        else:
            rotated = both * cos + rotate_half(both) * sin
        q_embed, k_embed = rotated.split((q.shape[1], k.shape[1]), dim=1)
        return q_embed, k_embed


def test_locate_judges_values_the_replacement_stacks_piece_by_piece(llama):
    model, args, kwargs, _ = llama
    module = importlib.import_module(type(model).__module__)
    example = (
        torch.randn(1, 4, 5, 16),
        torch.randn(1, 2, 5, 16),
        torch.randn(1, 5, 16),
        torch.randn(1, 5, 16),
    )
    s = gs.Surgery.from_model(model, args, kwargs)
    s.replace(module.apply_rotary_pos_emb, StackedRope(), example)
    assert s.compare().first_divergence is None, "precondition: stacked, it is right"
    s.undo().replace(module.apply_rotary_pos_emb, StackedRope("flipped rotation"), example)
    comparison = s.compare()
    assert comparison.first_divergence == "apply_rotary_pos_emb:model.layers.0.self_attn"
    found = comparison.locate()
    # was the cat: the stacked q and k match no single value of the original
    assert found.source == planted_line(StackedRope, "flipped rotation")
    assert found.op.startswith("aten.sub.Tensor")


def interleaved(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Each head's rows from (first half | second half) to pairs (0, D/2), (1, D/2 + 1), ..."""
    rows, columns = weight.shape
    return (
        weight.reshape(heads, 2, rows // heads // 2, columns).transpose(1, 2).reshape(rows, columns)
    )


class InterleavedLlama(nn.Module):
    """Llama's attention with one fused qkv weight whose query and key rows are in the
    interleaved order of rotary embeddings that rotate adjacent pairs: every query and key
    value is laid out otherwise than in the original, until the attention scores."""

    def __init__(self, attention, forget_keys: bool = False):
        super().__init__()
        config = attention.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = attention.head_dim
        keys = (
            attention.k_proj.weight
            if forget_keys
            else interleaved(attention.k_proj.weight, self.kv_heads)
        )
        weight = torch.cat(
            [interleaved(attention.q_proj.weight, self.heads), keys, attention.v_proj.weight]
        )
        self.sizes = [self.heads * self.head_dim, *[self.kv_heads * self.head_dim] * 2]
        self.qkv = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        self.o_proj = copy.deepcopy(attention.o_proj)
        with torch.no_grad():
            self.qkv.weight.copy_(weight)

    def rope(self, x, cos, sin):
        cos = cos[..., : self.head_dim // 2].unsqueeze(1)
        sin = sin[..., : self.head_dim // 2].unsqueeze(1)
        even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)  # planted: keys not interleaved
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def forward(
        self, hidden_states, attention_mask, position_ids, cache, use_cache, position_embeddings
    ):
        batch, tokens, _ = hidden_states.shape
        q, k, v = self.qkv(hidden_states).split(self.sizes, dim=-1)
        q = q.view(batch, tokens, self.heads, -1).transpose(1, 2)
        k = k.view(batch, tokens, self.kv_heads, -1).transpose(1, 2)
        v = v.view(batch, tokens, self.kv_heads, -1).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, attention_mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, -1)), None


def test_values_laid_out_otherwise_are_matched_and_the_step_that_goes_wrong_is_found(llama):
    model, args, kwargs, ep = llama
    name = "model.layers.1.self_attn"
    attention = model.get_submodule(name)
    # keys whose rows were left in the original order, rotated as if interleaved: the rotary
    # step of the keys is the first whose inputs agree and whose output matches nothing
    make = lambda bug: InterleavedLlama(attention, forget_keys=bool(bug))  # noqa: E731
    _, found = locate_planted(model, args, ep, name, make, "keys not interleaved", kwargs)
    assert found.source == planted_line(InterleavedLlama, "keys not interleaved")
    assert found.stack[-2:] == (
        f"{found.stack[-2].split(' ')[0]} in forward",
        f"{found.source} in rope",
    ), "the helper's line, called from forward"
    (keys,) = found.inputs
    assert "= the original's" in keys and "key_states" in keys, (
        "the keys agree, as Llama lays them out"
    )


# -- when locate cannot answer, it says why --------------------------------------------------------


def test_locate_says_why_when_nothing_diverges_or_on_meta(gpt):
    model, tokens, ep = gpt
    same = compare(ep, gs.swap(ep, fused(model)), (tokens,))
    assert same.first_divergence is None, "precondition"
    nothing = same.locate()
    assert not nothing and nothing.reason == "no call diverges: there is nothing to locate"
    assert str(nothing) == nothing.reason and nothing.call == ""
    with torch.device("meta"):
        meta_model = LayerNormed()
        x = torch.zeros(4, 8)
    meta_ep = gs.export(meta_model, (x,))
    on_meta = compare(
        meta_ep,
        gs.swap(meta_ep, {"norm": StepLayerNorm(meta_model.norm, "misplaced epsilon")}),
        (x,),
    )
    assert not on_meta.values_compared, "precondition"
    assert "meta device" in on_meta.locate().reason


def test_locate_says_why_when_the_replacement_cannot_be_traced_or_every_value_matches(normed):
    model, x, ep = normed
    untraceable = compare(ep, gs.swap(ep, {"norm": Untraceable(model.norm)}), (x,))
    assert untraceable.first_divergence == "norm", "precondition"
    found = untraceable.locate()
    assert not found and "cannot be traced on the call's inputs" in found.reason
    assert "data-dependent" in found.reason.lower() and "Untraceable" in found.reason
    assert f"not located: {found.reason}" in str(untraceable)
    # every op computes one of the original's values; they are returned in each other's place
    two = TwoOutputs()
    y = torch.randn(2, 3)
    two_ep = gs.export(two, (y,))
    swapped = compare(two_ep, gs.swap(two_ep, {"split": SwappedOutputs()}), (y,))
    assert swapped.first_divergence == "split", "precondition"
    arranged = swapped.locate()
    assert not arranged and "which values it returns, or how they are arranged" in arranged.reason


def test_locate_refuses_to_blame_a_trace_that_does_not_reproduce_the_run():
    model = nn.Sequential(nn.Linear(3, 3), Scale(3.0))
    x = torch.randn(2, 3)
    ep = gs.export(model, (x,))
    comparison = compare(ep, gs.swap(ep, {"1": Counting()}), (x,), locate=False)
    assert comparison.first_divergence == "1", "precondition"
    assert "does not compute what it returned in the run" in comparison.locate().reason


# -- locate in compare's report, cached, and leaving everything as it was -----------------------


def test_compare_shows_the_located_line_for_a_small_call_and_a_hint_otherwise(gpt, monkeypatch):
    model, tokens, ep = gpt
    swapped = gs.swap(ep, {"layers.1.attn": SdpaAttention(model.layers[1].attn, "no causal mask")})
    shown = compare(ep, swapped, (tokens,))
    assert shown.location is not None and shown.location.found, "located on its own: small"
    expected = planted_line(SdpaAttention, "no causal mask")
    assert f"located: {expected} out = attend(q, k, v)  # planted" in str(shown)
    assert expected in html.unescape(shown._repr_html_())
    assert shown.locate() is shown.location, "computed once"
    hinted = compare(ep, swapped, (tokens,), locate=False)
    assert hinted.location is None
    assert "cmp.locate() names the line of the replacement of 'layers.1.attn'" in str(hinted)
    assert "cmp.locate()" in hinted._repr_html_()
    assert hinted.locate() == shown.location and hinted.location is not None
    bundle = shown.location._repr_mimebundle_()
    assert bundle["text/plain"] == str(shown.location) and expected in bundle["text/html"]
    # a call larger than compare locates on its own: the hint, until asked
    monkeypatch.setattr(sys.modules["graphsurgeon.checks.compare"], "_SMALL_NODES", 10)
    large = compare(ep, swapped, (tokens,))
    assert large.location is None and "cmp.locate()" in str(large)
    assert compare(ep, swapped, (tokens,), locate=True).location == shown.location


def test_locate_leaves_the_program_the_replacement_and_the_random_stream_as_they_were(gpt):
    model, tokens, ep = gpt
    replacement = SdpaAttention(model.layers[1].attn, "wrong scale")
    swapped = gs.swap(ep, {"layers.1.attn": replacement})
    comparison = compare(ep, swapped, (tokens,), locate=False)
    graph_before, weights = str(ep.graph), copy.deepcopy(replacement.state_dict())
    state = torch.random.get_rng_state()
    assert comparison.locate()
    assert str(ep.graph) == graph_before and torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(v, weights[k]) for k, v in replacement.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in replacement.modules())
    assert torch.equal(swapped(tokens), swapped(tokens))


# -- the shape of a mismatch and the error relative to the tolerance, in compare -----------------


def test_a_forgotten_causal_mask_shows_as_only_the_last_token_matching(gpt):
    model, tokens, ep = gpt
    swapped = gs.swap(ep, {"layers.1.attn": SdpaAttention(model.layers[1].attn, "no causal mask")})
    comparison = compare(ep, swapped, (tokens,), locate=False)
    call = comparison["layers.1.attn"]
    (leaf,) = call.leaves
    # the last token sees every token with or without the mask: only it matches
    assert leaf.differing[1] == (range(0, 15),) and leaf.by_axis == "dim 1: 0–14 differ, 15 matches"
    assert "dim 1: 0–14 differ, 15 matches" in call.problem and call.problem in str(comparison)
    assert (
        call.tolerance_ratio > 1 and comparison.rows[0]["tolerance_ratio"] == call.tolerance_ratio
    )
    header = comparison.table().splitlines()[0]
    assert "of tolerance" in header
    assert "of tolerance" in comparison._repr_html_()


def test_an_ok_row_with_a_large_relative_error_explains_itself_by_the_tolerance(gpt):
    model, tokens, ep = gpt
    comparison = compare(ep, gs.swap(ep, fused(model)), (tokens,))
    call = comparison["layers.0.attn"]
    # precondition: the relative error is above rtol (at a value near 0, where atol covers it)
    assert call.ok and call.max_rel > comparison.rtol
    assert 0 < call.tolerance_ratio < 1
    row = comparison.table().splitlines()[1]
    assert f"{call.tolerance_ratio:.2g}x" in row


# -- locate on a Hugging Face GPT-2 attention: a mask of the replacement's own making ---------------


@pytest.fixture(scope="module")
def gpt2():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 8))
    kwargs = {"use_cache": False}
    return model, (ids,), kwargs, gs.export(model, (ids,), kwargs)


class Gpt2Attention(nn.Module):
    """GPT-2's attention with a boolean causal mask of its own (GPT-2 adds a float mask it is
    given): a value the original never has, which must not be blamed."""

    def __init__(self, original, bug: str = ""):
        super().__init__()
        self.c_attn, self.c_proj = copy.deepcopy(original.c_attn), copy.deepcopy(original.c_proj)
        self.heads, self.bug = original.num_heads, bug

    def forward(self, hidden_states, *args, **kwargs):
        batch, tokens, hidden = hidden_states.shape
        # made first, from nothing the call passes: the first value that matches nothing
        future = torch.ones(tokens, tokens, dtype=torch.bool).tril().logical_not()
        q, k, v = self.c_attn(hidden_states).split(hidden, dim=2)
        q, k, v = (t.view(batch, tokens, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2)
        if self.bug == "wrong scale":
            scores = scores / v.size(-1)  # planted: wrong scale
        else:
            scores = scores / math.sqrt(v.size(-1))
        weights = scores.masked_fill(future, torch.finfo(scores.dtype).min).softmax(-1)
        return self.c_proj((weights @ v).transpose(1, 2).reshape(batch, tokens, hidden)), weights


def test_locate_in_a_gpt2_attention_passes_over_a_mask_the_original_never_makes(gpt2):
    model, args, kwargs, ep = gpt2
    name = "transformer.h.1.attn"
    make = lambda bug: Gpt2Attention(model.get_submodule(name), bug)  # noqa: E731
    _, found = locate_planted(model, args, ep, name, make, "wrong scale", kwargs)
    assert found.source == planted_line(Gpt2Attention, "wrong scale")
    assert found.op.startswith("aten.div.Tensor") and "other=16" in found.op


def test_a_line_typed_in_a_notebook_cell_is_named_by_its_cell(monkeypatch):
    from types import SimpleNamespace

    from graphsurgeon._meta import file_line_text

    path = "/tmp/ipykernel_4242/3141592653.py"
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert file_line_text(path, 4) == "3141592653.py:4"  # no IPython running: the file
    shell = SimpleNamespace(compile=SimpleNamespace(_filename_map={path: 7}))
    monkeypatch.setitem(sys.modules, "IPython", SimpleNamespace(get_ipython=lambda: shell))
    assert file_line_text(path, 4) == "In [7]:4"
    assert file_line_text("/home/me/kernels.py", 42) == "kernels.py:42"


# -- the backward: compare(..., backward=True) and locate in a backward ---------------------------


class PlantedRMSNormFunction(torch.autograd.Function):
    """``weight * x * rstd`` with a backward by hand, one bug planted on a line of its own."""

    @staticmethod
    def forward(ctx, x, weight, eps, bug):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        normed = x * rstd
        ctx.save_for_backward(normed, weight, rstd)
        ctx.bug = bug
        return normed * weight

    @staticmethod
    def backward(ctx, grad):
        normed, weight, rstd = ctx.saved_tensors
        grad_weight = (grad * normed).reshape(-1, normed.shape[-1]).sum(0)
        if ctx.bug == "weight factor":
            grad_weight = grad_weight * 2  # planted: weight factor
        grad_normed = grad * weight
        if ctx.bug == "missing mean":
            grad_x = grad_normed * rstd  # planted: missing mean
        else:
            mean = (grad_normed * normed).mean(-1, keepdim=True)
            grad_x = (grad_normed - normed * mean) * rstd
        return grad_x, grad_weight, None, None


class PlantedRMSNorm(nn.Module):
    """Any RMSNorm (its weight copied) through :class:`PlantedRMSNormFunction`."""

    def __init__(self, norm: nn.Module, bug: str = ""):
        super().__init__()
        self.weight = nn.Parameter(norm.weight.detach().clone())
        self.eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
        self.bug = bug

    def forward(self, x):
        return PlantedRMSNormFunction.apply(x, self.weight, self.eps, self.bug)


class DetachedRMSNorm(nn.Module):
    """An RMSNorm autograd differentiates, with a ``detach`` where it must not be."""

    def __init__(self, norm: nn.Module, bug: str = ""):
        super().__init__()
        self.weight = nn.Parameter(norm.weight.detach().clone())
        self.eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
        self.bug = bug

    def forward(self, x):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.bug == "detached":
            rstd = rstd.detach()  # planted: detached
        return self.weight * (x * rstd)


class StraightThroughReLU(nn.Module):
    """ReLU's values with the identity's gradient: the straight-through trick."""

    def forward(self, x):
        return x + (torch.relu(x) - x).detach()  # planted: straight through


def norms(model: nn.Module, cls: type, bugs: dict[str, str] | None = None) -> dict[str, nn.Module]:
    """``{name: cls(norm, bug)}`` for every RMSNorm of ``model``."""
    bugs = bugs or {}
    return {
        name: cls(module, bugs.get(name, ""))
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RMSNorm")
    }


@pytest.fixture(scope="module")
def norm_stack():
    from helpers.grad_models import NormStack

    torch.manual_seed(0)
    model = NormStack(dim=8, layers=6)
    x = torch.randn(2, 5, 8)
    return model, x, gs.export(model, (x,))


def eager_call_gradients(model, replacements, name, x):
    """What torch's own autograd says of call ``name``: run the eager model carrying
    ``replacements`` forward and backward from the seeded upstream gradient, keep the input the
    call received and the gradient that reaches its output, then differentiate the ORIGINAL
    module on that input from that gradient: ``(input, upstream, {label: gradient})``."""
    from graphsurgeon.checks._grad import seeded_upstream

    reference = eager_reference(model, replacements)
    seen = {}

    def keep(module, inputs, output):
        seen["input"] = inputs[0].detach().clone()
        output.register_hook(lambda grad: seen.setdefault("upstream", grad.detach().clone()))

    handle = reference.get_submodule(name).register_forward_hook(keep)
    start = x.detach().clone().requires_grad_(True)
    out = reference(start)
    torch.autograd.grad(out, [start], seeded_upstream(out))
    handle.remove()
    original = model.get_submodule(name)
    call_input = seen["input"].clone().requires_grad_(True)
    grad_x, grad_w = torch.autograd.grad(
        original(call_input), [call_input, original.weight], seen["upstream"]
    )
    return (
        seen["input"],
        seen["upstream"],
        {
            "grad of input x": grad_x,
            f"grad of {name}.weight": grad_w,
        },
    )


def test_right_custom_backward_norms_match_in_both_passes_on_every_call(norm_stack):
    model, x, ep = norm_stack
    replacements = norms(model, PlantedRMSNorm)
    swapped = gs.swap(ep, replacements)
    assert compare(ep, swapped, (x,)).ok, "precondition: the forwards match"
    cmp = compare(ep, swapped, (x,), backward=True)
    assert cmp.ok and cmp.first_divergence is None and cmp.first_divergence_pass is None
    assert len(cmp.calls) == 7
    for call in cmp.calls:
        assert call.forward_ok and call.backward_ok is True and call.ok
        assert [g.path for g in call.gradient_leaves] == [
            "grad of input x",
            f"grad of {call.call_name}.weight",
        ]
        assert all(g.ok and g.values_compared for g in call.gradient_leaves)
    # the program's gradients too, as verify checks them
    assert cmp.outputs.backward and cmp.outputs.gradients_ok
    assert {g.path for g in cmp.outputs.gradients} == {
        g.path for g in gs.verify(ep, swapped, (x,), backward=True).gradients
    }
    assert "forward and backward" in str(cmp) and "backward" in cmp.table().splitlines()[0]


@pytest.mark.parametrize(
    ("name", "bug", "differs"),
    [
        ("layers.3.norm", "weight factor", "grad of layers.3.norm.weight"),
        ("layers.1.norm", "missing mean", "grad of input x"),
    ],
)
def test_a_planted_backward_bug_diverges_in_the_backward_of_that_call_only(
    norm_stack, name, bug, differs
):
    model, x, ep = norm_stack
    replacements = norms(model, PlantedRMSNorm, {name: bug})
    swapped = gs.swap(ep, replacements)
    assert compare(ep, swapped, (x,)).ok, "precondition: the forward matches everywhere"
    cmp = compare(ep, swapped, (x,), backward=True, locate=False)
    assert not cmp.ok and cmp.divergent == (name,)
    assert cmp.first_divergence == name and cmp.first_divergence_pass == "backward"
    call = cmp[name]
    assert call.forward_ok and call.backward_ok is False and not call.ok
    assert [g.path for g in call.gradient_leaves if not g.ok] == [differs]
    assert call.diverges_in == "backward" and call.problem.startswith(f"backward: {differs}")
    # the error compare measures is the one torch's autograd gives on the original module
    call_input, upstream, expected = eager_call_gradients(model, replacements, name, x)
    planted = call_input.clone().requires_grad_(True)
    got = dict(
        zip(
            ["grad of input x", f"grad of {name}.weight"],
            torch.autograd.grad(
                replacements[name](planted), [planted, replacements[name].weight], upstream
            ),
        )
    )
    error = float((got[differs] - expected[differs]).abs().max())
    assert error > 1e-2
    (leaf,) = [g for g in call.gradient_leaves if g.path == differs]
    assert leaf.max_abs == pytest.approx(error, rel=1e-4)
    # the program's gradients, as verify has them and as torch's autograd gives them eagerly
    verified = {g.path: g for g in gs.verify(ep, swapped, (x,), backward=True).gradients}
    program = {g.path: g for g in cmp.outputs.gradients}
    assert program.keys() == verified.keys() and not cmp.outputs.gradients_ok
    assert all(program[k].max_abs == verified[k].max_abs for k in program)
    from graphsurgeon.checks._grad import seeded_upstream

    eager = {}
    for which, module in (("want", model), ("got", eager_reference(model, replacements))):
        start = x.detach().clone().requires_grad_(True)
        out = module(start)
        eager[which] = torch.autograd.grad(
            out, [start, module.get_submodule(name).weight], seeded_upstream(out)
        )
    for position, path in enumerate(["grad of input x", f"grad of {name}.weight"]):
        error = float((eager["got"][position] - eager["want"][position]).abs().max())
        assert program[path].max_abs == pytest.approx(error, rel=1e-4, abs=1e-6)
    text = str(cmp)
    assert f"first divergence: {name!r} (in its backward)" in text
    assert "diverges in its backward" in text and "DIVERGES in backward" in text
    assert repr(cmp).endswith(
        f"first divergence {name!r} in its backward, outputs match, gradients differ>"
    )
    page = cmp._repr_html_()
    assert "in its backward" in page and "<th>backward</th>" in page
    rows = cmp.rows
    assert [r["backward_ok"] for r in rows[:-1]].count(False) == 1
    # locate names the planted line of the backward
    found = cmp.locate()
    assert found and found.call == name and found.replacement == "PlantedRMSNorm"
    assert found.source == planted_line(PlantedRMSNormFunction, bug)
    assert found.line.endswith(f"# planted: {bug}") and found.file == __file__
    assert found.op.startswith("aten.mul.Tensor") and found.node == "PlantedRMSNormFunctionBackward"
    assert found.backward and "the backward first differs here, inputs agree" in str(found)
    assert "the backward first differs here" in found._repr_html_()


def test_compare_locates_a_backward_divergence_of_a_small_call_on_its_own(norm_stack):
    model, x, ep = norm_stack
    swapped = gs.swap(ep, norms(model, PlantedRMSNorm, {"layers.4.norm": "weight factor"}))
    cmp = compare(ep, swapped, (x,), backward=True)
    assert cmp.location is not None and cmp.location.source == planted_line(
        PlantedRMSNormFunction, "weight factor"
    )
    assert "located: " in str(cmp) and "located" in cmp._repr_html_()


def test_backward_false_keeps_the_forward_report_as_it_was(norm_stack):
    model, x, ep = norm_stack
    swapped = gs.swap(ep, norms(model, PlantedRMSNorm, {"layers.3.norm": "weight factor"}))
    cmp = compare(ep, swapped, (x,))
    assert cmp.ok and not cmp.backward and "backward" not in str(cmp)
    assert all(c.backward_ok is None and c.gradient_leaves == () for c in cmp.calls)
    assert "backward_ok" not in cmp.rows[0] and "<th>backward</th>" not in cmp._repr_html_()


def test_a_wrong_derivative_autograd_takes_is_found_at_its_forward_line(norm_stack):
    model, x, ep = norm_stack
    name = "layers.2.norm"
    right = gs.swap(ep, norms(model, DetachedRMSNorm))
    assert compare(ep, right, (x,), backward=True).ok, "precondition: without the bug it matches"
    swapped = gs.swap(ep, norms(model, DetachedRMSNorm, {name: "detached"}))
    cmp = compare(ep, swapped, (x,), backward=True, locate=False)
    assert cmp.first_divergence == name and cmp.first_divergence_pass == "backward"
    assert [g.path for g in cmp[name].gradient_leaves if not g.ok] == ["grad of input x"]
    found = cmp.locate()
    # the derivative of `x * rstd` is where the gradients part; the detach made it so
    assert found and found.call == name and found.file == __file__
    assert found.source == planted_line(DetachedRMSNorm, "detached")
    assert "the derivative autograd takes" in found.stack[0] and "detached" in found.stack[-1]


def test_a_custom_backward_norm_in_a_hugging_face_llama(llama):
    model, args, kwargs, ep = llama
    bugs = {
        "model.layers.0.post_attention_layernorm": "missing mean",
        "model.layers.1.input_layernorm": "weight factor",
    }
    right = gs.swap(ep, norms(model, PlantedRMSNorm))
    fine = compare(ep, right, args, kwargs, backward=True, rtol=1e-4, atol=1e-5)
    assert fine.ok and all(c.backward_ok for c in fine.calls) and len(fine.calls) == 5
    swapped = gs.swap(ep, norms(model, PlantedRMSNorm, bugs))
    cmp = compare(ep, swapped, args, kwargs, backward=True, rtol=1e-4, atol=1e-5, locate=False)
    assert cmp.divergent == tuple(bugs)
    assert all(cmp[n].forward_ok and cmp[n].backward_ok is False for n in bugs)
    assert cmp.first_divergence == "model.layers.0.post_attention_layernorm"
    assert cmp.first_divergence_pass == "backward"
    found = cmp.locate()
    assert found.source == planted_line(PlantedRMSNormFunction, "missing mean")


def test_a_call_no_gradient_reaches_says_so_and_does_not_diverge():
    from helpers.grad_models import ArgmaxReader

    torch.manual_seed(0)
    model = ArgmaxReader()
    x = torch.randn(3, 8)
    ep = gs.export(model, (x,))
    cmp = compare(
        ep, gs.swap(ep, {"norm": PlantedRMSNorm(model.norm, "weight factor")}), (x,), backward=True
    )
    call = cmp["norm"]
    assert call.forward_ok and call.backward_ok is None and call.ok
    assert "no gradient reaches its outputs" in call.backward_note
    assert cmp.first_divergence is None and cmp.ok and call.backward_text == "no gradient"


def test_backward_of_calls_with_several_outputs_constants_and_a_second_call():
    from helpers.check_models import Split

    torch.manual_seed(0)
    x = torch.randn(2, 3)
    model = TwoOutputs()
    ep = gs.export(model, (x,))
    cmp = compare(ep, gs.swap(ep, {"scaled": TimesFactor(), "split": Split()}), (x,), backward=True)
    assert cmp.ok and [c.backward_ok for c in cmp.calls] == [True, True]
    assert [g.path for g in cmp["split"].gradient_leaves] == ["grad of input x"]
    loose = compare(ep, gs.swap(ep, {"split": Loose()}), (x,), backward=True)
    assert loose.first_divergence == "split" and loose.first_divergence_pass == "forward"

    shared = Shared()
    x = torch.randn(2, 4)
    ep = gs.export(shared, (x,))
    same = compare(ep, gs.swap(ep, {"shared": nudged(shared.shared, 0.0)}), (x,), backward=True)
    assert same.ok and [c.call_name for c in same.calls] == ["shared", "shared@1"]
    assert "grad of shared@1.weight" in [g.path for g in same["shared@1"].gradient_leaves]
    assert all(c.backward_ok for c in same.calls)
    program = {g.path for g in same.outputs.gradients}
    assert program == {"grad of input x", "grad of shared.weight", "grad of shared.bias"}


def test_backward_of_the_fused_attentions_of_a_gpt(gpt):
    model, tokens, ep = gpt
    cmp = compare(ep, gs.swap(ep, fused(model)), (tokens,), backward=True, rtol=1e-4)
    assert cmp.ok and all(c.backward_ok for c in cmp.calls)
    assert all(g.path != "grad of input tokens" for g in cmp.outputs.gradients)  # integers
    assert any("not differentiated" in note for note in cmp.outputs.backward_notes)


@pytest.mark.parametrize(
    "family", ["llama", "gemma", "gemma3", "qwen2", "qwen3", "mistral", "t5", "olmo2", "phi3"]
)
def test_custom_backward_norms_of_the_llama_family_in_compare(family):
    pytest.importorskip("transformers")
    from helpers.grad_models import FusedRMSNorm, hf_norm

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), hf_norm(family, 16), nn.Linear(16, 16))
    x = torch.randn(2, 7, 16) * 3
    ep = gs.export(model, (x,))
    right = compare(ep, gs.swap(ep, {"1": FusedRMSNorm(model[1])}), (x,), backward=True)
    assert right.ok and right["1"].backward_ok is True, right  # no false alarm
    wrong = compare(
        ep, gs.swap(ep, {"1": FusedRMSNorm(model[1], "weight factor")}), (x,), backward=True
    )
    assert wrong.first_divergence == "1" and wrong.first_divergence_pass == "backward"
    assert [g.path for g in wrong["1"].gradient_leaves if not g.ok] == ["grad of 1.weight"]
    assert wrong.location.line == "grad_weight = grad_weight * 2"


def test_on_the_meta_device_the_backward_says_no_values_were_compared():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
        x = torch.zeros(2, 4)
    ep = gs.export(model, (x,))
    cmp = gs.compare(ep, gs.swap(ep, {"1": torch.nn.GELU()}), (x,), backward=True)
    assert not cmp.values_compared and cmp.first_divergence is None
    assert [row["backward"] for row in cmp.rows] == ["no values compared"] * 2
    assert "nan" not in cmp.table().lower() and "no values compared" in cmp._repr_html_()


def test_a_straight_through_trick_is_named_at_its_detach():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    x = torch.randn(3, 4)
    ep = gs.export(model, (x,))
    swapped = gs.swap(ep, {"1": StraightThroughReLU()})
    assert compare(ep, swapped, (x,)).ok, "precondition: the forward matches"
    cmp = compare(ep, swapped, (x,), backward=True)
    assert cmp.first_divergence == "1" and cmp.first_divergence_pass == "backward"
    # torch's autograd: ReLU passes no gradient where its input is negative, the trick does
    h = model[0](x).detach().requires_grad_(True)
    upstream = torch.randn(3, 4)
    (want,) = torch.autograd.grad(torch.relu(h), [h], upstream)
    (got,) = torch.autograd.grad(StraightThroughReLU()(h), [h], upstream)
    assert not torch.allclose(want, got), "precondition: the gradients differ"
    assert cmp.location.source == planted_line(StraightThroughReLU, "straight through")
    assert "detached" in cmp.location.stack[-1]


def test_compare_backward_leaves_the_program_model_and_replacements_as_they_were(norm_stack):
    model, x, ep = norm_stack
    replacements = norms(model, PlantedRMSNorm, {"layers.2.norm": "missing mean"})
    swapped = gs.swap(ep, replacements)
    graph_before, x_before = str(ep.graph), x.clone()
    weights = {k: v.clone() for k, v in ep.state_dict.items()}
    state = torch.random.get_rng_state()
    cmp = compare(ep, swapped, (x,), backward=True)
    assert cmp.location is not None and cmp.location.found  # located on its own, too
    assert str(ep.graph) == graph_before and torch.equal(x, x_before) and not x.requires_grad
    assert all(torch.equal(v, weights[k]) for k, v in ep.state_dict.items())
    assert torch.equal(torch.random.get_rng_state(), state)
    # nothing accumulated into any .grad, nothing left hooked
    everything = [*ep.state_dict.values(), *model.parameters(), *swapped.parameters()]
    everything += [p for r in replacements.values() for p in r.parameters()]
    assert all(p.grad is None for p in everything)
    assert not any(r._forward_hooks or r._backward_hooks for r in replacements.values())


def test_two_planted_backward_bugs_among_six_norms_and_in_a_llama(norm_stack, llama):
    from helpers.grad_models import fused_norms

    model, x, ep = norm_stack
    bugs = {"layers.1.norm": "missing mean", "layers.4.norm": "weight factor"}
    assert compare(ep, gs.swap(ep, fused_norms(model)), (x,), backward=True).ok, "no false alarm"
    cmp = compare(ep, gs.swap(ep, fused_norms(model, bugs)), (x,), backward=True)
    assert cmp.divergent == tuple(bugs) and all(cmp[n].forward_ok for n in bugs)
    assert cmp.first_divergence == "layers.1.norm" and cmp.first_divergence_pass == "backward"
    assert cmp.location.line == "grad_x = grad_normed * rstd"
    second = compare(
        ep, gs.swap(ep, fused_norms(model, {"layers.4.norm": "weight factor"})), (x,), backward=True
    )
    assert second.location.line == "grad_weight = grad_weight * 2"

    model, args, kwargs, ep = llama
    bugs = {"model.layers.0.input_layernorm": "weight factor", "model.norm": "missing mean"}
    cmp = compare(ep, gs.swap(ep, fused_norms(model, bugs)), args, kwargs, backward=True, rtol=1e-4)
    assert cmp.divergent == tuple(bugs) and cmp.first_divergence_pass == "backward"
    assert cmp.locate().line == "grad_weight = grad_weight * 2"


def test_a_program_whose_outputs_need_no_gradient_says_its_backward_was_not_checked():
    from helpers.grad_models import ArgmaxOutput

    torch.manual_seed(0)
    model = ArgmaxOutput()
    x = torch.randn(3, 8)
    ep = gs.export(model, (x,))
    cmp = compare(
        ep, gs.swap(ep, {"norm": PlantedRMSNorm(model.norm, "weight factor")}), (x,), backward=True
    )
    assert cmp.first_divergence is None and not cmp.ok  # a check that did not run does not pass
    assert cmp.outputs.outputs_ok and "no output needs a gradient" in cmp.outputs.backward_problem
    assert cmp["norm"].backward_ok is None and "no gradient reaches" in cmp["norm"].backward_note
    assert "NOT CHECKED" in cmp.table() and "the program's gradients were not checked" in str(cmp)
    assert "gradients not checked" in repr(cmp) and "NOT CHECKED" in cmp._repr_html_()


class PlantedLayerNormFunction(torch.autograd.Function):
    """A layer norm with its backward by hand. torch's own backward is one fused op
    (native_layer_norm_backward): locate must look at its steps to find where this one errs."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, bug):
        centered = x - x.mean(-1, keepdim=True)
        rstd = torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps)
        normed = centered * rstd
        ctx.save_for_backward(normed, weight, rstd)
        ctx.bug = bug
        return normed * weight + bias

    @staticmethod
    def backward(ctx, grad):
        n, w, rstd = ctx.saved_tensors
        grad_weight = (grad * n).reshape(-1, n.shape[-1]).sum(0)
        grad_bias = grad.reshape(-1, n.shape[-1]).sum(0)
        gn = grad * w
        if ctx.bug == "missing mean":
            grad_x = (gn - n * (gn * n).mean(-1, True)) * rstd  # planted: missing mean
        else:
            grad_x = (gn - gn.mean(-1, True) - n * (gn * n).mean(-1, True)) * rstd
        return grad_x, grad_weight, grad_bias, None, None


class PlantedLayerNorm(nn.Module):
    """An nn.LayerNorm (its weight and bias copied) through :class:`PlantedLayerNormFunction`."""

    def __init__(self, norm: nn.LayerNorm, bug: str = ""):
        super().__init__()
        self.weight = nn.Parameter(norm.weight.detach().clone())
        self.bias = nn.Parameter(norm.bias.detach().clone())
        self.eps, self.bug = norm.eps, bug

    def forward(self, x):
        return PlantedLayerNormFunction.apply(x, self.weight, self.bias, self.eps, self.bug)


def test_locate_names_the_line_of_a_layer_norm_backward_whose_original_is_one_fused_op():
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = transformers.BertModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "LayerNorm" in name:
                parameter.copy_(torch.rand_like(parameter) + 0.5)
    ids = torch.randint(0, 100, (2, 8))
    ep = gs.export(model, (ids,))
    wrong = "encoder.layer.1.output.LayerNorm"
    names = [n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    swaps = {
        n: PlantedLayerNorm(model.get_submodule(n), "missing mean" if n == wrong else "")
        for n in names
    }
    swapped = gs.swap(ep, swaps)
    assert compare(ep, swapped, (ids,), rtol=1e-4).ok, "precondition: the forward matches"
    cmp = compare(ep, swapped, (ids,), rtol=1e-4, backward=True, locate=False)
    assert cmp.divergent == (wrong,) and cmp.first_divergence_pass == "backward"
    found = cmp.locate()
    assert found.source == planted_line(PlantedLayerNormFunction, "missing mean"), found
    assert found.backward and found.node == "PlantedLayerNormFunctionBackward"
