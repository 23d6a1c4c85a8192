"""find(): where the ops of a function or module occur in a program, and the near-misses.

Expected counts are derived without the engine: from the model's structure (its layers, its
modules of a type), from the graph's own ops, or by counting calls of the pattern function
while the eager model runs.
"""

from __future__ import annotations

import copy
import importlib
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from helpers.models import hf_decoder
from helpers.pattern_models import (
    Blocks,
    CastThenScale,
    ConvertThenScale,
    DoubledHeads,
    GateReadTwice,
    HeadsThenSwap,
    InlineGelu,
    NotConvex,
    OperandsEitherWayRound,
    QuarterAndHalf,
    Scores,
    SwishThenCast,
    SwishTwoWays,
    TanhChain,
    Views,
    attention_scores,
    gelu_tanh,
    split_heads,
    swish,
)
from torch import nn

import graphsurgeon as gs
from graphsurgeon.errors import ConflictError, GraphSurgeonError, NotAProgramError, PatternError
from graphsurgeon.examples import GroupedQueryAttention, LlamaLike, RMSNorm
from graphsurgeon.partition import call_index
from graphsurgeon.patterns.find import Match, Matches, NearMiss, find

aten = torch.ops.aten


def ops_of(ep, target) -> list[str]:
    return [n.name for n in ep.graph.nodes if n.op == "call_function" and n.target is target]


def graph_text(ep) -> str:
    return str(ep.graph)


# -- a pattern repeated in several modules --------------------------------------------------------


def test_a_repeated_pattern_is_found_in_every_module_that_computes_it():
    model = Blocks(3)
    ep = gs.export(model, (torch.randn(2, 6),))
    sigmoids = ops_of(ep, aten.sigmoid.default)
    assert len(sigmoids) == len(model.blocks) == 3  # precondition: one per block
    found = find(ep, swish, (torch.randn(3, 4, 5),))  # traced at another rank and shape
    assert isinstance(found, Matches) and len(found) == 3
    assert found.calls == ("blocks.0.act", "blocks.1.act", "blocks.2.act")
    assert [m.inputs for m in found] == [("linear",), ("linear_1",), ("linear_2",)]
    assert [m.outputs for m in found] == [("mul",), ("mul_1",), ("mul_2",)]
    assert [m.nodes for m in found] == [(s, m.outputs[0]) for s, m in zip(sigmoids, found)]
    assert all(m.num_ops == 2 and isinstance(m, Match) for m in found)
    assert [m.index for m in found] == [0, 1, 2]
    assert found.near_misses == ()
    # every match sits in the call the call index gives its nodes
    calls = call_index(ep)
    for match in found:
        assert {calls.call_of(n) for n in match.nodes} == {match.call}


def _as_hub_kernel(function):
    """A function wrapped as Hugging Face's hub kernels wrap ``apply_rotary_pos_emb`` (from
    transformers 5 with the ``kernels`` package): an instance of a module class made inside a
    function, named ``Func``, whose forward calls the function it closes over."""

    def make():
        class Func(nn.Module):
            def forward(self, *args):
                return function(*args)

        return Func()

    return make()


def test_a_function_wrapped_as_a_hub_kernel_module_is_named_by_the_function():
    model = Blocks(2)
    ep = gs.export(model, (torch.randn(2, 6),))
    wrapped = _as_hub_kernel(swish)
    assert type(wrapped).__name__ == "Func", "precondition: the module's own name says nothing"
    found = find(ep, wrapped, (torch.randn(3, 4),))
    assert found.pattern == "swish" and len(found) == 2
    s = gs.Surgery(ep).replace(wrapped, nn.SiLU(), (torch.randn(3, 4),))
    assert list(s.replacements) == ["swish:blocks.0.act", "swish:blocks.1.act"]
    assert s.history[-1].name == "swish (2 matches)"


def test_operands_either_way_round_match_and_an_input_used_twice_must_be_one_value():
    ep = gs.export(OperandsEitherWayRound(), (torch.randn(4), torch.randn(4)))
    found = find(ep, swish, (torch.randn(3),))
    assert [m.outputs for m in found] == [("mul",)]
    assert len(found.near_misses) == 1
    miss = found.near_misses[0]
    assert isinstance(miss, NearMiss) and miss.kind == "differs"
    assert miss.matched == 1 and miss.num_ops == 2
    assert "1 of 2 ops match" in miss.reason
    assert "the pattern's input `t` is `y` elsewhere in this match, but `x` here" in miss.reason
    assert set(miss.nodes) == {"sigmoid_1", "mul_1"}


# -- overlapping candidates -------------------------------------------------------------------------


def twice_tanh(t):
    return torch.tanh(torch.tanh(t))


def test_overlapping_candidates_are_taken_greedily_in_graph_order():
    ep = gs.export(TanhChain(3), (torch.randn(4),))
    tanhs = ops_of(ep, aten.tanh.default)
    assert len(tanhs) == 3  # precondition: two candidates, (1st, 2nd) and (2nd, 3rd), overlap
    found = find(ep, twice_tanh, (torch.randn(2),))
    assert [m.nodes for m in found] == [tuple(tanhs[:2])]
    assert len(found.near_misses) == 1
    miss = found.near_misses[0]
    assert miss.kind == "overlaps" and miss.nodes == tuple(tanhs[1:])
    assert f"`{tanhs[1]}` is already in match 0" in miss.reason

    ep = gs.export(TanhChain(4), (torch.randn(4),))
    tanhs = ops_of(ep, aten.tanh.default)
    found = find(ep, twice_tanh, (torch.randn(2),))
    assert [m.nodes for m in found] == [tuple(tanhs[:2]), tuple(tanhs[2:])]
    assert found.near_misses == ()  # the overlap the second match covers is no near-miss


# -- constants and sizes ----------------------------------------------------------------------------


def test_a_constant_that_differs_is_a_near_miss_naming_the_op_and_both_constants():
    ep = gs.export(QuarterAndHalf(), (torch.randn(4),))
    found = find(ep, lambda t: t * 0.25 + 1, (torch.randn(3),))
    assert [m.outputs for m in found] == [("add",)]
    (miss,) = found.near_misses
    assert miss.kind == "differs" and miss.matched == 1
    assert miss.reason == (
        "1 of 2 ops match; differs at `mul_1` (aten.mul, other): constant 0.5, pattern 0.25"
    )
    assert miss.differences == (miss.reason.split("; ", 1)[1],)
    assert miss.inputs == ("x",) and miss.outputs == ("add_1",)


@pytest.mark.parametrize(
    ("program_shape", "pattern_shape"),
    [
        ((1, 8, 32), (2, 5, 24)),  # batch, sequence length and heads all differ
        ((3, 8, 32), (1, 1, 8)),  # traced at size 1: still any size
    ],
)
def test_a_pattern_traced_at_another_shape_matches_at_the_programs(program_shape, pattern_shape):
    ep = gs.export(DoubledHeads(), (torch.randn(*program_shape),))
    (view,) = [n for n in ep.graph.nodes if n.target is aten.view.default]
    assert view.args[1] == [program_shape[0], program_shape[1], -1, 8]  # precondition: ints
    found = find(ep, split_heads, (torch.randn(*pattern_shape),))
    assert [m.nodes for m in found] == [("view", "transpose")]
    assert found.notes == ()  # traced with every size symbolic


def test_a_pattern_traced_only_at_fixed_sizes_takes_ints_where_sizes_go_as_sizes():
    ep = gs.export(HeadsThenSwap(), (torch.randn(1, 8, 32),))
    real_export = torch.export.export

    def symbolic_fails(*args, dynamic_shapes=None, **kwargs):
        if dynamic_shapes is not None:
            raise RuntimeError("no symbolic sizes here")
        return real_export(*args, dynamic_shapes=dynamic_shapes, **kwargs)

    def heads_then_swap(x, dims):
        return split_heads(x).transpose(*dims)

    with mock.patch.object(torch.export, "export", symbolic_fails):
        found = find(ep, heads_then_swap, (torch.randn(2, 5, 24), (2, 3)))
        other_dims = find(ep, heads_then_swap, (torch.randn(2, 5, 24), (1, 3)))
    assert found.pattern_program.graph_signature.input_specs  # traced, at fixed sizes
    (view,) = [n for n in found.pattern_program.graph.nodes if n.target is aten.view.default]
    assert view.args[1] == [2, 5, -1, 8]  # precondition: the sizes are the example's ints
    assert [m.nodes for m in found] == [("view", "transpose", "transpose_1")]
    assert "could not be traced with symbolic sizes" in found.notes[0]
    # an int that is not a size (a dim) is still compared
    assert len(other_dims) == 0
    assert "(aten.transpose, dim0): constant 2, pattern 1" in other_dims.near_misses[0].reason


def test_a_size_the_pattern_turns_into_a_number_is_compared_as_one():
    ep = gs.export(Scores(), (torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8)))
    # batch, heads and sequence length differ; the head size is the program's
    found = find(ep, attention_scores, (torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)))
    assert [m.outputs for m in found] == [("softmax",)]
    # math.sqrt of a size is a Python float at tracing: 1/sqrt(16) is another constant
    found = find(ep, attention_scores, (torch.randn(2, 3, 5, 16), torch.randn(2, 3, 5, 16)))
    assert len(found) == 0
    (miss,) = found.near_misses
    assert miss.reason == (
        "3 of 4 ops match; differs at `div` (aten.div, other): constant 2.8284271247461903, "
        "pattern 4.0"
    )


def test_sizes_bind_consistently_within_one_match():
    ep = gs.export(Views(), (torch.randn(3, 12),))
    found = find(ep, lambda t: t.view(t.shape[0], t.shape[0], -1), (torch.randn(5, 10),))
    assert [m.nodes for m in found] == [("view",)]
    (miss,) = found.near_misses
    assert "differs at `view_1` (aten.view, size): size 2, but the pattern's size" in miss.reason
    assert "the pattern's size (t.shape[0]) is 3 elsewhere in this match" in miss.reason
    assert miss.reason.startswith("0 of 1 op matches; ")


# -- what cannot be replaced as one call --------------------------------------------------------------


def test_an_intermediate_read_outside_the_match_is_a_near_miss():
    ep = gs.export(GateReadTwice(), (torch.randn(4),))
    found = find(ep, swish, (torch.randn(3),))
    assert len(found) == 0
    (miss,) = found.near_misses
    assert miss.kind == "read outside" and miss.matched == 2
    assert miss.reason.startswith(
        "all 2 ops match, but `sigmoid` (the pattern's `sigmoid`) is also read by `add` "
        "outside the match and is not one of the pattern's results"
    )
    assert miss.inputs == ("x",) and miss.outputs == ("mul",)
    # returning the intermediate from the pattern makes it a result: then it matches
    found = find(ep, lambda t: (t * torch.sigmoid(t), torch.sigmoid(t)), (torch.randn(3),))
    assert len(found) == 0  # traced as two sigmoids: another graph
    gate_too = find(ep, lambda t: (lambda g: (t * g, g))(torch.sigmoid(t)), (torch.randn(3),))
    assert [m.outputs for m in gate_too] == [("mul", "sigmoid")]


def test_a_no_op_conversion_read_after_the_match_is_a_read_of_its_input():
    pattern = lambda t: t.to(torch.float32) * 2  # noqa: E731
    ep = gs.export(ConvertThenScale(), (torch.randn(4),))
    (add,) = [n for n in ep.graph.nodes if n.target is aten.add.Tensor]
    assert [a.name for a in add.args] == ["mul", "to"]  # precondition: read outside
    found = find(ep, pattern, (torch.randn(3),))
    assert [m.nodes for m in found] == [("to", "mul")]  # its assert reads x: not the match's
    assert found[0].aliases == (("to", "x"),)
    # on a float64 input the conversion makes a tensor of its own: then it is read outside
    ep = gs.export(ConvertThenScale(), (torch.randn(4, dtype=torch.float64),))
    found = find(ep, pattern, (torch.randn(3),))
    assert len(found) == 0
    (miss,) = found.near_misses
    assert (
        miss.kind == "read outside" and "`to` (the pattern's `to`) is also read by" in miss.reason
    )


def test_a_check_another_call_makes_on_a_result_stays_that_calls():
    ep = gs.export(SwishThenCast(), (torch.randn(4),))
    calls = call_index(ep)
    (check,) = ops_of(ep, aten._assert_tensor_metadata.default)
    swish_out = ops_of(ep, aten.mul.Tensor)[0]
    checked = next(n for n in ep.graph.nodes if n.name == check).args[0].name
    # precondition: the scale's check reads the swish's result
    assert checked == swish_out and calls.call_of(check) == "scale"
    (match,) = find(ep, swish, (torch.randn(3),))
    assert check not in match.nodes and match.call == "act"
    # so the swish is replaced beside a swap of the module that checks its result
    model = SwishThenCast()
    s = gs.Surgery.from_model(model, (torch.randn(4),))
    s.swap("scale", CastThenScale()).replace(swish, nn.SiLU(), (torch.randn(3),))
    x = torch.randn(4)
    torch.testing.assert_close(s.module(x), nn.functional.silu(x) * 3)


def test_a_match_that_is_not_convex_is_a_near_miss():
    def sine_times(a, b):
        s = torch.sin(a)
        return s, s * b

    ep = gs.export(NotConvex(), (torch.randn(4),))
    found = find(ep, sine_times, (torch.randn(3), torch.randn(3)))
    assert len(found) == 0
    (miss,) = found.near_misses
    assert miss.kind == "not convex"
    assert "`add` outside it reads its results and feeds it" in miss.reason


# -- module patterns: state matches state of the same shape ----------------------------------------------


def test_a_module_pattern_matches_parameters_of_the_same_shape():
    torch.manual_seed(0)
    model = LlamaLike(n_layers=2, hidden=32, heads=4, kv_heads=2, inner=64, vocab=50).eval()
    ep = gs.export(model, (torch.zeros(1, 8, dtype=torch.long),))
    norms = [name for name, m in model.named_modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 5  # precondition: two per layer and the final one
    pattern = RMSNorm(32)
    before = copy.deepcopy(pattern.state_dict())
    found = find(ep, pattern, (torch.randn(2, 5, 32),))
    assert found.calls == tuple(norms)
    weights = {spec.arg.name: spec.target for spec in ep.graph_signature.input_specs}
    assert [weights[dict(m.state)["weight"]] for m in found] == [f"{n}.weight" for n in norms]
    assert all(torch.equal(before[k], v) for k, v in pattern.state_dict().items())
    # a weight of another shape is not the program's: no match
    assert len(find(ep, RMSNorm(16), (torch.randn(2, 5, 16),))) == 0
    # the module is traced as it is now, not as it was on an earlier call
    pattern.eps = 1e-3
    changed = find(ep, pattern, (torch.randn(2, 5, 32),))
    assert len(changed) == 0 and len(changed.near_misses) == len(norms)
    assert "constant 1e-05, pattern 0.001" in changed.near_misses[0].reason


def rope(q, k, cos, sin):
    rotate = GroupedQueryAttention._rotate
    return rotate(q, cos, sin), rotate(k, cos, sin)


def test_the_rotary_pattern_of_the_meta_example_occurs_once_per_layer():
    layers = 3
    with torch.device("meta"):
        model = LlamaLike(n_layers=layers, hidden=64, heads=4, kv_heads=2, inner=128, vocab=100)
        tokens = torch.zeros(1, 8, dtype=torch.long)
    ep = gs.export(model, (tokens,))
    example = (
        torch.randn(2, 3, 5, 32),
        torch.randn(2, 1, 5, 32),
        torch.randn(5, 32),
        torch.randn(5, 32),
    )
    found = find(ep, rope, example)
    assert found.calls == tuple(f"layers.{i}.self_attn" for i in range(layers))
    assert [m.inputs[2:] for m in found] == [("cos", "sin")] * layers
    assert found.input_names == ("q", "k", "cos", "sin")


# -- Hugging Face: apply_rotary_pos_emb is a function, not a module ---------------------------------------

FAMILIES = ["Llama", "Qwen2", "Mistral"]


@pytest.fixture(scope="module", params=FAMILIES)
def decoder(request):
    kind = request.param
    model = hf_decoder(kind, layers=3)
    ids = torch.randint(0, 100, (1, 8))
    kwargs = {"use_cache": False}
    name = kind.lower()
    modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    ep = gs.export(model, (ids,), kwargs)
    return SimpleNamespace(kind=kind, model=model, ids=ids, kwargs=kwargs, modeling=modeling, ep=ep)


def rotary_example(layout: str = "heads first"):
    # batch 2, 3 query heads, 1 key/value head, 5 tokens, head size 16: none is the program's
    if layout == "heads first":
        q, k = torch.randn(2, 3, 5, 16), torch.randn(2, 1, 5, 16)
    else:
        q, k = torch.randn(2, 5, 3, 16), torch.randn(2, 5, 1, 16)
    return q, k, torch.randn(2, 5, 16), torch.randn(2, 5, 16)


def test_hugging_face_rotary_embedding_is_found_once_per_layer_in_its_attention(decoder):
    model, modeling, ep = decoder.model, decoder.modeling, decoder.ep
    layers = model.config.num_hidden_layers
    calls = []
    original = modeling.apply_rotary_pos_emb

    def counting(*args, **kw):
        calls.append(1)
        return original(*args, **kw)

    with mock.patch.object(modeling, "apply_rotary_pos_emb", counting), torch.no_grad():
        model(decoder.ids, **decoder.kwargs)
    assert len(calls) == layers  # precondition: the eager model calls it once per layer
    text = graph_text(ep)
    found = find(ep, modeling.apply_rotary_pos_emb, rotary_example())
    assert len(found) == layers, str(found)
    assert found.calls == tuple(f"model.layers.{i}.self_attn" for i in range(layers))
    assert found.input_names == ("q", "k", "cos", "sin")
    index = call_index(ep)
    for i, match in enumerate(found):
        q, k, cos, sin = match.inputs
        # q and k come from this layer's projections; cos and sin from the shared rotary_emb
        assert index.call_of(q) == index.call_of(k) == f"model.layers.{i}.self_attn"
        assert index.call_of(cos) == index.call_of(sin) == "model.rotary_emb"
        assert all(index.call_of(out) == f"model.layers.{i}.self_attn" for out in match.outputs)
    assert found.near_misses == ()
    assert graph_text(ep) == text  # the program is left as it was


def test_a_rotary_pattern_with_another_unsqueeze_dim_is_a_near_miss_per_layer(decoder):
    layers = decoder.model.config.num_hidden_layers
    modeling, ep = decoder.modeling, decoder.ep
    found = find(
        ep, modeling.apply_rotary_pos_emb, rotary_example("tokens first"), {"unsqueeze_dim": 2}
    )
    assert len(found) == 0
    assert len(found.near_misses) == layers
    for miss in found.near_misses:
        assert miss.kind == "differs"
        assert miss.reason.startswith("14 of 16 ops match; differs at `unsqueeze")
        assert "(aten.unsqueeze, dim): constant 1, pattern 2" in miss.reason
        assert miss.reason.endswith("; and 1 more difference")


def test_a_hugging_face_rms_norm_module_is_found_with_its_weight(decoder):
    model, ep = decoder.model, decoder.ep
    norm_type = getattr(decoder.modeling, f"{decoder.kind}RMSNorm")
    norms = [name for name, m in model.named_modules() if isinstance(m, norm_type)]
    assert len(norms) == 2 * model.config.num_hidden_layers + 1  # precondition
    # its .to(float32) leaves _assert_tensor_metadata nodes in both graphs
    assert ops_of(ep, aten._assert_tensor_metadata.default)
    pattern = norm_type(32, eps=model.config.rms_norm_eps)
    found = find(ep, pattern, (torch.randn(2, 5, 32),))
    assert found.calls == tuple(norms)
    for match in found:
        asserts = [n for n in match.nodes if n.startswith("_assert_tensor_metadata")]
        assert asserts, "bookkeeping that reads the match goes with it"


# -- errors, display, what is left alone ----------------------------------------------------------------


def test_what_find_refuses_raises_a_graphsurgeon_error_that_says_what_to_do(tiny_gpt):
    model, _, ep = tiny_gpt
    with pytest.raises(NotAProgramError, match=r"export it first"):
        find(model, swish, (torch.randn(3),))
    with pytest.raises(GraphSurgeonError, match=r"must be a function or an nn.Module, got an int"):
        find(ep, 3, (torch.randn(3),))
    # a list is refused as by every entry point (graphsurgeon._program.as_inputs)
    with pytest.raises(GraphSurgeonError, match=r"example_args: expected a tuple.*got a list"):
        find(ep, swish, [torch.randn(3)])

    def data_dependent(x):
        return x * 2 if x.sum() > 0 else x * 3

    with pytest.raises(GraphSurgeonError, match=r"'data_dependent' could not be traced") as error:
        find(ep, data_dependent, (torch.randn(3),))
    assert error.value.__cause__ is not None
    with pytest.raises(GraphSurgeonError, match=r"computes nothing"):
        find(ep, lambda x: x, (torch.randn(3),))


def test_a_result_shows_itself_in_a_notebook_and_in_a_terminal():
    ep = gs.export(SwishTwoWays(), (torch.randn(4),))

    def pattern_with_a_strange_name(t):
        return t * torch.sigmoid(t)

    pattern_with_a_strange_name.__name__ = "<b>swish</b>"
    found = find(ep, pattern_with_a_strange_name, (torch.randn(3),))
    assert len(found) == 1 and len(found.near_misses) == 1
    assert repr(found) == "<Matches of <b>swish</b> (2 ops): 1 match, 1 near-miss>"
    text = str(found)
    assert text.splitlines()[0] == "find <b>swish</b> (2 ops): 1 match, 1 near-miss"
    assert "0. (top level): 2 ops, (t=x) → (mul)" in text
    bundle = found._repr_mimebundle_()
    assert bundle["text/plain"] == repr(found)
    html = bundle["text/html"]
    assert "&lt;b&gt;swish&lt;/b&gt;" in html and "<b>swish</b>" not in html
    assert "near-miss" in html and "differs at `mul_2`" in html.replace("&#x27;", "'")
    assert list(found) == [found[0]] and found.matches[0] is found[0]
    for part in (found[0], found.near_misses[0]):
        shown = part._repr_mimebundle_()
        assert shown["text/plain"] == str(part) and "gs-table" in shown["text/html"]


def test_find_is_deterministic_and_leaves_the_program_alone(tiny_gpt):
    model, _, ep = tiny_gpt
    text = graph_text(ep)
    gelu = lambda t: nn.functional.gelu(t)  # noqa: E731 - a pattern is often a lambda
    first = find(ep, gelu, (torch.randn(3, 7),))
    second = find(ep, gelu, (torch.randn(3, 7),))
    assert first == second and len(first) == len(model.layers)
    assert first.calls == tuple(f"layers.{i}.mlp.act" for i in range(len(model.layers)))
    assert graph_text(ep) == text


def test_a_module_holding_a_replaced_pattern_says_which_step_holds_it_and_how_to_free_it():
    """Was: "'blocks.0' and 'swish:blocks.0.act' share nodes (e.g. 'sigmoid'); request only
    one of them", without the step that made the region or a way out."""
    torch.manual_seed(0)
    model, x = Blocks().eval(), torch.randn(2, 6)
    s = gs.Surgery.from_model(model, (x,))
    s.replace(swish, nn.SiLU(), (torch.randn(3, 6),))
    version = s.version
    with pytest.raises(ConflictError) as caught:
        s.swap("blocks.0", copy.deepcopy(model.blocks[0]))
    message = str(caught.value)
    assert "'swish:blocks.0.act' in it were replaced by a SiLU in step 1 (replace swish" in message
    assert "undo step 1 (s.undo()): that frees 'blocks.0' to be swapped" in message
    with pytest.raises(ConflictError, match=r"a fused call runs the program's own ops\. Undo"):
        s.fuse("blocks.1")
    assert s.version == version
    s.undo().swap("blocks.0", copy.deepcopy(model.blocks[0]))  # freed, as the message says
    assert list(s.replacements) == ["blocks.0"]


def test_a_pattern_that_cannot_be_traced_is_one_message_and_nothing_on_stderr(capfd):
    """Was: refused, but torch wrote the partial graph of each attempt to stderr (63 lines)."""
    ep = gs.export(nn.Sequential(nn.Linear(4, 4)).eval(), (torch.randn(2, 4),))
    capfd.readouterr()
    with pytest.raises(PatternError, match=r"could not be traced to aten ops"):
        gs.find(ep, lambda t: t * 2 if t.sum() > 0 else t, (torch.randn(2, 4),))
    out, err = capfd.readouterr()
    assert err == "" and out == ""


def my_gelu(x):
    return nn.functional.gelu(x, approximate="tanh")


def test_a_plain_function_is_a_replacement_as_the_contract_says():
    """Was: "the replacement for 'gelu_tanh' is a function, not a torch.nn.Module"."""
    torch.manual_seed(0)
    model, x = InlineGelu().eval(), torch.randn(2, 8)
    s = gs.Surgery.from_model(model, (x,))
    s.replace(gelu_tanh, my_gelu, (torch.randn(3, 8),))
    assert str(s.history[-1]) == "replace gelu_tanh (1 match) -> my_gelu"
    replacement = s.replacements["gelu_tanh:(top)"]
    assert type(replacement).__name__ == "my_gelu" and replacement.function is my_gelu
    with torch.no_grad():
        expected = model.b(my_gelu(model.a(x)))
        assert not torch.equal(expected, model(x))  # the precondition: it changes something
        torch.testing.assert_close(s.module(x), expected)
        torch.testing.assert_close(s.export().module()(x), expected)
    # a region takes a function too; a function that cannot take the call is refused as a
    # module's forward would be
    s.undo().swap_region(s.region_signature(["tanh"]).nodes, torch.sigmoid, name="squash")
    with pytest.raises(gs.errors.ReplacementError, match=r"cannot take the arguments"):
        s.undo().swap_region(["tanh"], lambda: 0, name="none")
