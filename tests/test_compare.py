"""compare(): per swapped call, the original partition vs the replacement on the same inputs."""

from __future__ import annotations

import copy
import html
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from models import Chain, Shared
from torch import nn

import graphsurgeon as gs
from graphsurgeon._exec import runnable_original
from graphsurgeon.compare import Comparison, compare
from graphsurgeon.errors import CompareError, UnknownModuleError
from graphsurgeon.examples import MLP, FusedAttention, TinyGPT
from graphsurgeon.fuse import fused_call

# -- tiny models --------------------------------------------------------------------------


class ClampReLU(nn.Module):
    """ReLU written another way: equal everywhere."""

    def forward(self, x):
        return x.clamp(min=0)


class Scaled(nn.Module):
    def forward(self, x, factor):
        return x * factor


class Split(nn.Module):
    def forward(self, x):
        return x * 2, {"b": x + 1}


#   x ──▶ scaled(x, factor=2.5) ──▶ split ──▶ (a, {"b": b}) ──▶ a - b ──▶ out
#         (factor is a constant argument)   (two outputs, one inside a dict)
class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.scaled = Scaled()
        self.split = Split()

    def forward(self, x):
        a, rest = self.split(self.scaled(x, factor=2.5))
        return a - rest["b"]


class Loose(nn.Module):
    """Split, but its dict output is off by 0.5."""

    def forward(self, x):
        return x * 2, {"b": x + 1.5}


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
    assert len(gs.swap_info(swapped).calls) == 4  # precondition: four calls really swapped
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
    swapped = gs.swap(ep, {"scaled": Scaled(), "split": Loose()})
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
    class UsesFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.split = Split()

        def forward(self, x):
            return self.split(x)[0]

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
    with pytest.raises(CompareError, match=r"not made by gs.swap"):
        compare(ep, torch.fx.symbolic_trace(model), (x,))
    with pytest.raises(CompareError, match=r"another ExportedProgram"):
        compare(other, swapped, (x,))
    with pytest.raises(CompareError, match=r"pass the ExportedProgram"):
        compare(model, swapped, (x,))

    class Raises(nn.Module):
        def forward(self, x):
            raise ValueError("no")

    failing = gs.swap(ep, {"act": Raises()})
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


class Dropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)
        self.d = nn.Dropout(0.5)
        self.o = nn.Linear(8, 8)

    def forward(self, x):
        return self.o(self.d(self.l(x)))


class DrawsFirst(nn.Module):
    """A faithful Linear that draws a random number it does not use: everything after it
    sees another random stream."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        torch.rand(3)
        return self.linear(x)


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


class Cache(nn.Module):
    def __init__(self, row: int = 0):
        super().__init__()
        self.row = row
        self.register_buffer("k", torch.zeros(4, 8))

    def forward(self, x):
        self.k[self.row].copy_(x[0])
        return self.k  # a static KV cache: the output is the buffer the call wrote


class UsesCache(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.cache = Cache()

    def forward(self, x):
        return self.cache(self.proj(x)) * 2


def test_a_call_returning_the_buffer_it_writes_is_compared_as_it_returned_it():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    ep = gs.export(UsesCache().eval(), (x,))
    with torch.no_grad():  # precondition: the cache's output is not its initial zeros
        assert Cache()(x).abs().sum() > 0
    faithful = compare(ep, gs.swap(ep, {"cache": Cache()}), (x,))
    assert faithful.ok and faithful["cache"].max_abs == 0.0
    wrong = compare(ep, gs.swap(ep, {"cache": Cache(row=1)}), (x,))
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
