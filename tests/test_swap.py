"""swap(): every defect of torch's own engine, fixed; and what it gets right, kept right.

Each test draws its model in a comment. Every swap is compared with the eager reference (a deep
copy of the model with the replacement set by setattr), after checking that the replacement
really changes the output.
"""

from __future__ import annotations

import copy
import linecache
import operator
import pickle
from collections import OrderedDict

import pytest
import torch
import torch.utils._pytree as pytree
from helpers.check_models import Returns
from helpers.models import Scale, TimesTwo
from helpers.references import assert_close_tree, check_swap, clone_tree, eager_reference
from helpers.swap_models import (
    AttentionHolder,
    Batch,
    BatchNormed,
    Branchy,
    CallsScaled,
    CastResidual,
    ConstantScale,
    ConvNet,
    Counts,
    CrossedReplacement,
    DataclassModel,
    DictOtherOrder,
    DictOut,
    DoubleCounter,
    EncoderReplacement,
    FusedRMSNorm,
    Halve,
    HeadsReplacement,
    HoldsScale,
    InPlaceBlock,
    LinearInside,
    LoopedSequential,
    MakesNewOutput,
    MultipliesInPlace,
    MutatesInput,
    Nested,
    NestedSequential,
    NormLayer,
    OnlyTensor,
    Outer,
    Pair,
    PairReplacement,
    PairsAndKeywords,
    PassThroughRead,
    PassThroughUnread,
    ReadsChild,
    ReadsWrittenBuffer,
    RecordsCaller,
    ResidualMLP,
    Result,
    ReturnsTuple,
    ScaledTwice,
    ScalesByParameter,
    SequentialModel,
    SharedTwice,
    SizeUser,
    TakesDict,
    TakesKeywordReplacement,
    TakesTupleReplacement,
    TakesTwoReplacement,
    ThreeReplacement,
    Tied,
    TiedEmbeddingHead,
    TupleChain,
    UsesCounter,
    UsesCrossed,
    UsesFactor,
    UsesKeyed,
    UsesLastOutput,
    UsesNan,
    UsesNone,
    WithIntInput,
)
from torch import nn

import graphsurgeon as gs
from graphsurgeon.partition import program_index
from graphsurgeon.swap import swap_info

# -- defect 1: outputs bound by name, not by graph position ------------------------------


def test_outputs_are_bound_by_signature_name_not_graph_position():
    model, x = UsesCrossed(), torch.randn(3)
    check_swap(model, (x,), {"crossed": CrossedReplacement()})


def test_an_output_nobody_uses_does_not_shift_the_others():
    model, x = UsesLastOutput(), torch.randn(4)
    check_swap(model, (x,), {"three": ThreeReplacement()})


# -- defect 2: constant arguments reach the replacement as their values -------------------


def test_constant_arguments_are_passed_as_their_values():
    model, x = CallsScaled(), torch.randn(4)
    gm, _, _ = check_swap(model, (x,), {"scaled": ScaledTwice()})
    call = next(n for n in gm.graph.nodes if n.op == "call_module")
    assert call.kwargs["scale"] == 2.5 and call.kwargs["flip"] is True and call.kwargs["stop"] == 2


def test_transformer_encoder_self_attention_gets_its_boolean_and_none_arguments():
    #   TransformerEncoder(2 x TransformerEncoderLayer(self_attn, linear1, linear2, norms))
    layer = nn.TransformerEncoderLayer(
        d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
    )
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 16)
    new_attn = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    check_swap(model, (x,), {"layers.0.self_attn": new_attn}, rtol=1e-4, atol=1e-5)


# -- defect 3: glue between two swapped modules respects how the consumer takes arguments --


def test_consecutive_swapped_modules_keep_positional_and_keyword_calling_conventions():
    model, x = PairsAndKeywords(), torch.randn(3)
    replacements = {
        "foo": PairReplacement(),
        "bar": TakesTwoReplacement(),
        "one": Scale(3.0),
        "baz": TakesKeywordReplacement(),
    }
    gm, _, _ = check_swap(model, (x,), replacements)
    bar = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "bar")
    assert len(bar.args) == 2, "bar(p, q) is still called with two arguments"
    baz = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "baz")
    assert list(baz.kwargs) == ["x"], "baz(x=...) is still called by keyword"


def test_a_structure_passed_whole_between_swapped_calls_is_not_taken_apart():
    model, x = TupleChain(), torch.randn(3)
    gm, _, _ = check_swap(model, (x,), {"make": ReturnsTuple(), "use": TakesTupleReplacement()})
    use = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "use")
    (argument,) = use.args
    assert isinstance(argument, torch.fx.Node), "the tuple goes through as one value, no rebuild"
    getitems = [n for n in gm.graph.nodes if n.target is operator.getitem]
    assert getitems == [], "no flatten/unflatten glue between the two calls"


# -- defect 4: any attribute layout in the replacement ------------------------------------


def test_a_linear_replaced_by_a_sequential_leaves_no_orphaned_parameters():
    model, x = LinearInside(), torch.randn(2, 4)
    replacement = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
    gm, _, _ = check_swap(model, (x,), {"lin": replacement})
    names = dict(gm.named_parameters())
    assert "lin.weight" not in names and "lin.bias" not in names
    assert set(names) == {"lin.0.weight", "lin.0.bias", "lin.2.weight", "lin.2.bias"}
    assert gm.lin is replacement, "the replacement is used as given"


# -- defect 5: a module called more than once --------------------------------------------


def test_swapping_a_shared_module_replaces_every_call():
    model, x = SharedTwice(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    assert set(gs.partition(ep)) >= {"shared", "shared@1"}
    gm, _, _ = check_swap(model, (x,), {"shared": nn.Linear(4, 4)}, ep=ep)
    calls = [n for n in gm.graph.nodes if n.op == "call_module"]
    assert [c.target for c in calls] == ["shared", "shared"]


def test_swapping_one_call_of_a_shared_module_leaves_the_other_call():
    model, x = SharedTwice(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    replacement = Scale(-1.0)
    gm = gs.swap(ep, {"shared@1": replacement})
    expected = -model(x).detach() + 0  # second call replaced by x * -1
    with torch.no_grad():
        expected = -torch.relu(model.shared(x))
        assert not torch.allclose(expected, model(x))
        torch.testing.assert_close(gm(x), expected)
    first_only = gs.swap(ep, {"shared@0": Scale(0.5)})
    with torch.no_grad():
        torch.testing.assert_close(first_only(x), model.shared(torch.relu(x * 0.5)))


def test_a_loop_over_one_block_swaps_every_iteration():
    model, x = LoopedSequential(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    assert {"block", "block@1", "block@2"} <= set(gs.partition(ep))
    check_swap(model, (x,), {"block": nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())}, ep=ep)


# -- defect 6: parent and child both requested -------------------------------------------


def test_parent_and_child_both_requested_is_an_error_naming_both():
    model, x = NestedSequential(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    with pytest.raises(gs.errors.ConflictError) as caught:
        gs.swap(ep, {"outer": nn.Identity(), "outer.1": nn.Tanh()})
    message = str(caught.value)
    assert "'outer'" in message and "'outer.1'" in message and "inside the replacement" in message


def test_a_call_requested_twice_is_an_error():
    model, x = SharedTwice(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    with pytest.raises(gs.errors.ConflictError, match="shared@1"):
        gs.swap(ep, {"shared": nn.Identity(), "shared@1": nn.Identity()})


# -- defect 7: in-place mutation inside the swapped module -------------------------------


def test_a_swapped_module_that_writes_its_input_in_place():
    model, x = MutatesInput(), torch.randn(3)
    ep = gs.export(model, (x.clone(),))
    gm = gs.swap(ep, {"inplace": MultipliesInPlace()})
    reference = eager_reference(model, {"inplace": MultipliesInPlace()})
    x_ref, x_gm = x.clone(), x.clone()
    expected = reference(x_ref)
    assert not torch.allclose(expected, model(x.clone()))
    torch.testing.assert_close(gm(x_gm), expected)
    torch.testing.assert_close(x_gm, x_ref, msg="the caller sees the same write")


def test_a_swapped_module_that_writes_its_own_buffer_in_place():
    model, x = UsesCounter(), torch.randn(3)
    ep = gs.export(model, (x,))
    replacement = DoubleCounter()
    gm = gs.swap(ep, {"counter": replacement})
    reference = eager_reference(model, {"counter": DoubleCounter()})
    for _ in range(3):
        torch.testing.assert_close(gm(x), reference(x))
    assert float(replacement.count) == 6.0, "the replacement's own buffer was written"
    assert float(ep.state_dict["counter.count"]) == 0.0, "the program's buffer was not"


# -- defect 8: bad requests -------------------------------------------------------------


def test_an_unknown_name_says_did_you_mean():
    model, x = NestedSequential(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    with pytest.raises(gs.errors.UnknownModuleError, match=r"'outr'.*Did you mean 'outer'"):
        gs.swap(ep, {"outr": nn.Identity()})


def test_a_module_not_preserved_says_how_to_preserve_it():
    model, x = NestedSequential(), torch.randn(2, 4)
    ep = torch.export.export(model, (x,))  # nothing preserved
    with pytest.raises(gs.errors.NotPreservedError) as caught:
        gs.swap(ep, {"outer": nn.Identity()})
    assert "preserve_module_call_signature" in str(caught.value)
    assert "'outer'" in str(caught.value)
    assert not isinstance(caught.value, KeyError)


def test_a_replacement_that_is_not_a_module_is_refused():
    model, x = NestedSequential(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    with pytest.raises(gs.ReplacementError, match=r"not a torch\.nn\.Module"):
        gs.swap(ep, {"outer": torch.relu})


def test_a_replacement_returning_the_wrong_structure_names_the_module_at_run_time():
    model, x = UsesCrossed(), torch.randn(3)
    ep = gs.export(model, (x,))
    gm = gs.swap(ep, {"crossed": Scale(2.0)})  # returns one tensor, a pair is expected
    with pytest.raises(gs.ReplacementError) as caught:
        gm(x)
    message = str(caught.value)
    assert "'crossed'" in message and "Scale" in message
    assert "returned f32[3], but the program expects (f32[3], f32[3])" in message, message


def test_a_wrong_structure_is_written_with_its_values_not_pytree_stars():
    x = torch.randn(2, 3)
    gm = gs.swap(gs.export(Outer(), (x,)), {"pair": OnlyTensor()})
    with pytest.raises(
        gs.ReplacementError, match=r"returned f32\[2, 3\], but the program expects \(f32\[2, 3\], "
    ):
        gm(x)


def test_a_replacement_returning_a_tuple_for_a_tensor_names_the_module():
    model, x = LinearInside(), torch.randn(2, 4)
    gm = gs.swap(gs.export(model, (x,)), {"lin": Pair()})
    with pytest.raises(gs.ReplacementError, match=r"'lin' \(Pair\) returned tuple \(f32"):
        gm(x)


def test_swapping_a_container_or_the_root_is_refused_clearly():
    model = nn.Sequential(nn.ModuleList([nn.Linear(4, 4)]))
    model.forward = lambda x: model[0][0](x)  # the list is a container, never called
    x = torch.randn(2, 4)
    ep = gs.export(model, (x,))
    with pytest.raises(gs.errors.NotSwappableError, match="never called"):
        gs.swap(ep, {"0": nn.Identity()})
    with pytest.raises(gs.SwapError, match="root"):
        gs.swap(ep, {"": nn.Identity()})


def test_a_failed_swap_changes_nothing():
    model, x = NestedSequential(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    before = str(ep.graph)
    with pytest.raises(gs.errors.ConflictError):
        gs.swap(ep, {"outer": nn.Identity(), "outer.0": nn.Identity()})
    assert str(ep.graph) == before


# -- defect 9: no global reordering ----------------------------------------------------


def test_untouched_nodes_keep_their_names_and_order():
    from graphsurgeon.examples import TinyGPT

    model = TinyGPT(n_layers=3).eval()
    tokens = model.example_input()
    ep = gs.export(model, (tokens,))
    gm = gs.swap(ep, {"layers.1.mlp": copy.deepcopy(model.layers[1].mlp)})
    original = [n.name for n in ep.graph.nodes if n.op == "call_function"]
    swapped = gs.partition(ep)["layers.1.mlp"].nodes
    kept = [n for n in original if n not in swapped]
    after = [n.name for n in gm.graph.nodes if n.op == "call_function" and n.name in set(original)]
    assert after == kept


# -- the program and the modules are never modified -------------------------------------


def test_swap_modifies_neither_program_nor_model_nor_replacement():
    model, x = LinearInside(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    graph_before = str(ep.graph)
    state_before = {k: v.clone() for k, v in ep.state_dict.items()}
    model_before = copy.deepcopy(model.state_dict())
    replacement = nn.Linear(4, 4)
    replacement_before = copy.deepcopy(replacement.state_dict())
    gm = gs.swap(ep, {"lin": replacement})
    gm(x)
    assert str(ep.graph) == graph_before
    for key, value in ep.state_dict.items():
        torch.testing.assert_close(value, state_before[key])
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, model_before[key])
    for key, value in replacement.state_dict().items():
        torch.testing.assert_close(value, replacement_before[key])
    assert gm.lin is replacement


# -- what torch's engine gets right stays right ------------------------------------------


def test_conv_net_with_batchnorm_in_train_mode_updates_running_stats_like_eager():
    model, x = ConvNet().train(), torch.randn(4, 3, 8, 8)
    ep = gs.export(copy.deepcopy(model), (x,))
    replacements = {"act": nn.GELU()}
    gm = gs.swap(ep, replacements)
    reference = eager_reference(model, replacements)
    before = ep.state_dict["bn.running_mean"].clone()
    for _ in range(2):
        out_gm, out_ref = gm(x), reference(x)
        torch.testing.assert_close(out_gm, out_ref, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(reference.bn.running_mean, before), "precondition: stats moved"
    torch.testing.assert_close(gm.get_buffer("bn.running_mean"), reference.bn.running_mean)
    torch.testing.assert_close(gm.get_buffer("bn.running_var"), reference.bn.running_var)
    torch.testing.assert_close(ep.state_dict["bn.running_mean"], before, msg="program untouched")


def test_conv_net_batchnorm_swapped_in_train_mode():
    model, x = ConvNet().train(), torch.randn(4, 3, 8, 8)
    new_bn = nn.BatchNorm2d(8, momentum=0.5)
    with torch.no_grad():
        new_bn.weight.fill_(2.0)
    gm, _, _ = check_swap(copy.deepcopy(model), (x,), {"bn": new_bn}, rtol=1e-4)
    assert gm.bn is new_bn


def test_transformer_encoder_swaps_linear1_and_a_whole_layer():
    layer = nn.TransformerEncoderLayer(
        d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True
    )
    model = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False).eval()
    x = torch.randn(2, 6, 16)
    ep = gs.export(model, (x,))
    check_swap(model, (x,), {"layers.1.linear1": nn.Linear(16, 32)}, ep=ep, rtol=1e-4)
    new_layer = nn.TransformerEncoderLayer(
        d_model=16, nhead=2, dim_feedforward=8, dropout=0.0, batch_first=True
    ).eval()
    check_swap(model, (x,), {"layers.2": new_layer}, ep=ep, rtol=1e-4)


def test_transformer_decoder_swaps_self_attention_and_a_layer():
    layer = nn.TransformerDecoderLayer(
        d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
    )
    model = nn.TransformerDecoder(layer, num_layers=2).eval()
    tgt, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    ep = gs.export(model, (tgt, memory))
    new_attn = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    check_swap(model, (tgt, memory), {"layers.0.self_attn": new_attn}, ep=ep, rtol=1e-4)
    new_layer = nn.TransformerDecoderLayer(
        d_model=16, nhead=4, dim_feedforward=16, dropout=0.0, batch_first=True
    ).eval()
    check_swap(model, (tgt, memory), {"layers.1": new_layer}, ep=ep, rtol=1e-4)


def test_multihead_attention_swapped_with_its_tuple_output_and_keyword():
    model = AttentionHolder().eval()
    q, k, v = torch.randn(1, 3, 8), torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    check_swap(
        model, (q, k, v), {"mha": nn.MultiheadAttention(8, 4, batch_first=True).eval()}, rtol=1e-4
    )


def test_gpt_like_decoder_swapping_attention_mlp_and_layers():
    from graphsurgeon.examples import FusedAttention, GeluTanhMLP, TinyGPT

    model = TinyGPT(n_layers=4).eval()
    tokens = model.example_input()
    ep = gs.export(model, (tokens,))
    check_swap(model, (tokens,), {"layers.2.mlp": GeluTanhMLP(model.layers[2].mlp)}, ep=ep)
    broken = FusedAttention(model.layers[0].attn)
    with torch.no_grad():
        broken.o.bias.add_(1.0)
    check_swap(
        model,
        (tokens,),
        {"layers.0.attn": broken, "layers.3": copy.deepcopy(model.layers[0])},
        ep=ep,
    )


def test_strict_export_swaps_too():
    model, x = PairsAndKeywords(), torch.randn(3)
    check_swap(
        model, (x,), {"foo": PairReplacement(), "baz": TakesKeywordReplacement()}, strict=True
    )


def test_dynamic_shapes_survive_the_swap():
    model = LinearInside()
    batch = torch.export.Dim("batch", min=2, max=64)
    x = torch.randn(3, 4)
    ep = gs.export(model, (x,), dynamic_shapes=({0: batch},))
    replacement = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    gm = gs.swap(ep, {"lin": replacement})
    reference = eager_reference(model, {"lin": replacement})
    for n in (2, 7, 33):
        y = torch.randn(n, 4)
        torch.testing.assert_close(gm(y), reference(y))


def test_a_dynamic_int_input():
    model = WithIntInput()
    x = torch.randn(2, 4)
    ep = gs.export(model, (x, 3), dynamic_shapes=(None, torch.export.Dim.DYNAMIC))
    gm = gs.swap(ep, {"body": Scale(2.0)})
    for n in (3, 5):
        torch.testing.assert_close(gm(x, n), x * 2.0 * n)


def test_torch_cond_programs_swap_around_the_cond():
    model = Branchy()
    x = torch.randn(2, 4)
    ep = gs.export(model, (x,), preserve=["head"])
    gm = gs.swap(ep, {"head": nn.Linear(4, 2)})
    reference = eager_reference(model, {"head": gm.head})
    for sign in (1.0, -1.0):
        y = x.abs() * sign
        torch.testing.assert_close(gm(y), reference(y))


def test_gradients_flow_through_the_swapped_program():
    model, x = LinearInside(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    replacement = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    gm = gs.swap(ep, {"lin": replacement})
    reference = eager_reference(model, {"lin": replacement})
    gm(x).sum().backward()
    reference(x).sum().backward()
    grad = replacement[0].weight.grad
    assert grad is not None and grad.abs().sum() > 0
    torch.testing.assert_close(grad, reference.lin[0].weight.grad)


def test_gradients_reach_untouched_parameters():
    model, x = ResidualMLP(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    gm = gs.swap(ep, {"b": nn.Linear(4, 4)})
    gm(x).sum().backward()
    weight = gm.get_parameter("a.weight")
    assert weight.grad is not None and weight.grad.abs().sum() > 0


def test_the_swapped_program_can_be_exported_again():
    model, x = PairsAndKeywords(), torch.randn(3)
    replacements = {"foo": PairReplacement(), "bar": TakesTwoReplacement()}
    gm, _, reference = check_swap(model, (x,), replacements)
    again = torch.export.export(gm, (x,))
    torch.testing.assert_close(again.module()(x), reference(x))
    assert any(n.target == torch.ops.aten.sub.Tensor for n in again.graph.nodes)


pytree.register_dataclass(Batch)
pytree.register_dataclass(Result)


def test_dataclass_and_dict_inputs_and_outputs_and_kwargs():
    model = DataclassModel()
    batch = Batch(torch.randn(2, 4), torch.randn(4))
    extra = {"shift": torch.randn(4)}
    gm, _, _ = check_swap(
        model, (batch,), {"body": Scale(3.0)}, kwargs={"extra": extra, "scale": 2.0}
    )
    out = gm(batch, extra=extra, scale=2.0)
    assert isinstance(out, Result)


def test_a_swapped_module_whose_output_is_the_model_output_is_returned_whole():
    model, x = DictOut(), torch.randn(3)
    gm, _, _ = check_swap(model, (x,), {"head": HeadsReplacement()})
    output = next(n for n in gm.graph.nodes if n.op == "output")
    (returned,) = output.args
    assert isinstance(returned, torch.fx.Node), (
        "no final flatten/unflatten: the dict goes out as is"
    )


def test_sequential_names_and_untouched_parameters_are_kept():
    model, x = SequentialModel(), torch.randn(2, 4)
    gm, ep, _ = check_swap(model, (x,), {"layers.2": nn.Linear(4, 4)})
    assert gm.get_parameter("layers.0.weight") is ep.state_dict["layers.0.weight"]


def test_tied_weights_survive_swapping_the_module_that_owns_them():
    model, tokens = Tied(), torch.tensor([[1, 2, 3]])
    replacement = nn.Embedding(10, 4)
    gm, _, _ = check_swap(model, (tokens,), {"embed": replacement})
    assert gm.embed is replacement


def test_interpret_runs_under_the_fx_interpreter_with_the_same_result():
    model, x = PairsAndKeywords(), torch.randn(3)
    ep = gs.export(model, (x,))
    compiled_replacement, interpreted_replacement = RecordsCaller(), RecordsCaller()
    compiled = gs.swap(ep, {"foo": compiled_replacement})
    interpreted = gs.swap(ep, {"foo": interpreted_replacement}, interpret=True)
    expected = compiled(x)
    assert compiled_replacement.interpreted is False
    torch.testing.assert_close(interpreted(x), expected)
    assert interpreted_replacement.interpreted is True
    torch.testing.assert_close(interpreted(x=x), expected)


def test_swap_works_on_a_program_exported_by_torch_directly():
    model, x = PairsAndKeywords(), torch.randn(3)
    ep = torch.export.export(model, (x,), preserve_module_call_signature=("foo", "baz"))
    check_swap(model, (x,), {"foo": PairReplacement(), "baz": TakesKeywordReplacement()}, ep=ep)


def test_swap_info_records_what_was_done():
    model, x = SharedTwice(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    replacement = nn.Linear(4, 4)
    gm = gs.swap(ep, {"shared": replacement})
    info = swap_info(gm)
    assert info.program is ep
    assert list(info.calls) == ["shared", "shared@1"]
    assert info.calls["shared@1"] is replacement
    assert info.partitions["shared"].nodes == gs.partition(ep)["shared"].nodes
    assert set(info.call_nodes.values()) == {
        n.name for n in gm.graph.nodes if n.op == "call_module"
    }
    assert swap_info(nn.Linear(2, 2)) is None


def test_no_swap_gives_the_original_program_unlifted():
    model, x = ConvNet().eval(), torch.randn(2, 3, 8, 8)
    ep = gs.export(model, (x,))
    gm = gs.swap(ep, {})
    torch.testing.assert_close(gm(x), model(x))
    first, *rest = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert first.name == "check_inputs"  # the program's input checks, then its own nodes
    assert [n.name for n in rest] == [n.name for n in ep.graph.nodes if n.op == "call_function"]


def test_inputs_of_another_structure_are_refused_clearly():
    model = DataclassModel()
    batch = Batch(torch.randn(2, 4), torch.randn(4))
    gm = gs.swap(gs.export(model, (batch, {"shift": torch.randn(4)})), {})
    with pytest.raises(gs.InputStructureError, match="'batch'"):
        gm((batch.features, batch.bias), {"shift": torch.randn(4)})


def test_outputs_match_for_repeated_calls():
    model, x = PairsAndKeywords(), torch.randn(3)
    gm, _, reference = check_swap(model, (x,), {"foo": PairReplacement()})
    for _ in range(3):
        assert_close_tree(gm(clone_tree(x)), reference(x))


# -- functional programs (after run_decompositions): mutations are outputs, written back ---

_DECOMPOSED_WARNING = "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"


@pytest.mark.filterwarnings(_DECOMPOSED_WARNING)
def test_a_functional_program_writes_buffer_updates_back():
    model, x = ConvNet().train(), torch.randn(4, 3, 8, 8)
    ep = gs.export(copy.deepcopy(model), (x,)).run_decompositions({})
    assert "BUFFER_MUTATION" in {s.kind.name for s in ep.graph_signature.output_specs}
    gm = gs.swap(ep, {"fc": nn.Linear(8, 5)})
    reference = eager_reference(model, {"fc": gm.fc})
    for _ in range(2):
        torch.testing.assert_close(gm(x), reference(x), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gm.get_buffer("bn.running_mean"), reference.bn.running_mean)
    assert int(gm.get_buffer("bn.num_batches_tracked")) == 2


@pytest.mark.filterwarnings(_DECOMPOSED_WARNING)
def test_a_functional_program_swaps_a_module_that_writes_its_input():
    model, x = MutatesInput(), torch.randn(3)
    ep = gs.export(model, (x.clone(),)).run_decompositions({})
    assert "USER_INPUT_MUTATION" in {s.kind.name for s in ep.graph_signature.output_specs}
    gm = gs.swap(ep, {"inplace": MultipliesInPlace()})
    reference = eager_reference(model, {"inplace": MultipliesInPlace()})
    x_gm, x_ref = x.clone(), x.clone()
    torch.testing.assert_close(gm(x_gm), reference(x_ref))
    torch.testing.assert_close(x_gm, x_ref)


@pytest.mark.filterwarnings(_DECOMPOSED_WARNING)
def test_a_signature_that_no_longer_describes_the_graph_is_refused():
    # run_decompositions renames nodes and can leave preserved signatures naming other values
    model, x = ConvNet().train(), torch.randn(4, 3, 8, 8)
    ep = gs.export(model, (x,)).run_decompositions({})
    with pytest.raises(
        gs.errors.NotSwappableError, match=r"'act'.*not one of its inputs.*run_decompositions"
    ):
        gs.swap(ep, {"act": nn.GELU()})


def test_a_model_input_passed_whole_to_a_swapped_module_is_not_taken_apart():
    model = TakesDict()
    batch = {"ids": torch.randn(3), "mask": torch.randn(3)}
    gm, _, _ = check_swap(model, (batch,), {"enc": EncoderReplacement()})
    enc = next(n for n in gm.graph.nodes if n.op == "call_module")
    (argument,) = enc.args
    assert argument.op == "placeholder", "the dict goes in as the model received it"
    assert [n for n in gm.graph.nodes if n.target is operator.getitem] == []


def test_node_map_follows_renamed_arguments_and_swapped_outputs():
    model, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    assert "input" in {n.name for n in ep.graph.nodes}, "precondition: an argument named input"
    gm = gs.swap(ep, {"1": nn.GELU()})
    node_map = swap_info(gm).node_map
    names = {n.name for n in gm.graph.nodes}
    assert node_map["input"] in names and node_map["input"] != "input"
    assert node_map["relu"] == "swapped_1_checked", "the output is now the call's"
    assert node_map["linear"] == "linear"


def test_an_unswapped_program_keeps_nodes_the_program_left_unused():
    model, x = UsesLastOutput(), torch.randn(4)
    ep = gs.export(model, (x,))
    unused = [n.name for n in ep.graph.nodes if n.op == "call_function" and not n.users]
    assert unused, "precondition: export kept outputs nobody uses"
    gm = gs.swap(ep, {})
    assert set(unused) <= {n.name for n in gm.graph.nodes}


def test_generated_nodes_say_which_module_they_belong_to():
    model, x = UsesCrossed(), torch.randn(3)
    gm = gs.swap(gs.export(model, (x,)), {"crossed": CrossedReplacement()})
    call = next(n for n in gm.graph.nodes if n.op == "call_module")
    checked = next(iter(call.users))
    assert [v[0] for v in call.meta["nn_module_stack"].values()] == ["", "crossed"]
    assert checked.meta["nn_module_stack"] == call.meta["nn_module_stack"]
    for getitem in checked.users:
        assert [v[0] for v in getitem.meta["nn_module_stack"].values()] == [""]


def test_the_interpreted_forward_has_the_model_signature():
    import inspect

    model, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4)
    gm = gs.swap(gs.export(model, (x,)), {"1": nn.GELU()}, interpret=True)
    assert list(inspect.signature(gm.forward).parameters) == ["input"]
    torch.testing.assert_close(gm(input=x), nn.functional.gelu(model[0](x)))


def test_generated_code_uses_bindings_only_where_they_take_the_schema_arguments():
    from graphsurgeon.rewrite._codegen import fast_function

    aten = torch.ops.aten
    assert fast_function(aten.linear.default) is torch._C._nn.linear
    assert fast_function(aten.view.default) is torch.Tensor.view
    assert fast_function(aten.__and__.Tensor) is None, "a method the code could not name"
    assert fast_function(aten.to.dtype_layout) is None, "Tensor.to has its own signature"
    assert fast_function(aten.add_.Tensor) is None, "in-place ops keep their OpOverload"
    assert fast_function(operator.getitem) is None


def test_size_arithmetic_only_the_swapped_module_used_is_dropped():
    model, x = SizeUser(), torch.randn(4, 3)
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = gs.export(model, (x,), dynamic_shapes=({0: batch},), strict=True)
    sizes = [n for n in ep.graph.nodes if n.target == torch.ops.aten.sym_size.int]
    assert sizes and sizes[0].name not in gs.partition(ep)["m"].nodes, "precondition"
    gm, _, reference = check_swap(model, (x,), {"m": nn.Tanh()}, ep=ep)
    assert not [n for n in gm.graph.nodes if n.target == torch.ops.aten.sym_size.int]
    y = torch.randn(9, 3)
    torch.testing.assert_close(gm(y), reference(y))


def test_a_passed_through_output_nothing_reads_is_swapped():
    # torch's own test_unflatten_preserve_with_unused_input has this shape.
    torch.manual_seed(0)
    model = PassThroughUnread().eval()
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    ep = gs.export(model, (x, y))
    assert gs.module_tree(ep)["p"].swappable
    check_swap(model, (x, y), {"p": MakesNewOutput()}, ep=ep)


def test_a_passed_through_output_read_after_the_call_swaps_as_eager():
    # gs.export gives a module that returns its input as it is an alias of its own, so the
    # graph tells the module's result (read by nothing else) from its input (read by the add)
    torch.manual_seed(0)
    model = PassThroughRead().eval()
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    ep = gs.export(model, (x, y))
    assert gs.module_tree(ep)["p"].swappable
    check_swap(model, (x, y), {"p": MakesNewOutput()}, ep=ep)


def test_a_passed_through_output_read_after_the_call_is_refused_without_gs_export():
    # The rule: in a program torch.export made itself, the graph holds one value for the
    # module's output and its input, so a later reader cannot say which it meant; refuse,
    # naming the reader and what to do, rather than guess.
    torch.manual_seed(0)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    ep = torch.export.export(
        PassThroughRead().eval(), (x, y), preserve_module_call_signature=("p", "head")
    )
    info = gs.module_tree(ep)["p"]
    assert not info.swappable
    assert "returns its input 'y' itself" in info.reason and "'add' after the call" in info.reason
    with pytest.raises(gs.errors.NotSwappableError, match=r"cannot swap 'p'.*gs\.export.*clone"):
        gs.swap(ep, {"p": MakesNewOutput()})
    # only p is refused: the rest of the program stays swappable
    assert gs.module_tree(ep)["head"].swappable


# -- aliasing: a module whose result is, at run time, a tensor from before it ran ----------
#
# torch.export follows tensors by object: once an op returns the very tensor it was given (an
# in-place op, x.to(the dtype x has)), every later read of that tensor reads the op's node,
# reads that eager code makes of the module's *input* (a residual) included.


def test_a_module_returning_its_input_swaps_as_eager():
    model, x = CastResidual().eval(), torch.randn(2, 8)
    ep = gs.export(model, (x,))
    assert gs.module_tree(ep)["cast"].swappable
    check_swap(model, (x,), {"cast": TimesTwo()}, ep=ep)


def test_a_replacement_writing_the_aliased_input_shows_that_write_to_later_readers():
    # eager: Halve writes x in place, so the residual reads the halved x too
    model, x = CastResidual().eval(), torch.randn(2, 8)
    gm, _, _ = check_swap(model, (x,), {"cast": Halve()})
    assert torch.allclose(gm(x.clone()), x * 0.5 + model.lin(x * 0.5))


def test_without_gs_export_a_module_returning_its_input_is_refused_in_the_users_words():
    model, x = CastResidual().eval(), torch.randn(2, 8)
    ep = torch.export.export(model, (x,), preserve_module_call_signature=("cast", "lin"))
    info = gs.module_tree(ep)["cast"]
    assert not info.swappable
    assert "returns its input 'x' itself" in info.reason
    assert "node 'to' converts it to the dtype and device it already has" in info.reason
    assert "'linear', 'add' after the call read it" in info.reason
    with pytest.raises(gs.errors.NotSwappableError, match=r"gs\.export\(model, args\)") as caught:
        gs.swap(ep, {"cast": TimesTwo()})
    assert info.reason in str(caught.value)  # the tree and swap say the same
    with pytest.raises(gs.errors.NotSwappableError):
        gs.fuse(ep, ["cast"])


@pytest.mark.parametrize(
    "replacement",
    [nn.GELU(), nn.LeakyReLU(0.2, inplace=True), nn.Identity()],
    ids=["new tensor", "in place", "identity"],
)
def test_an_in_place_module_whose_input_is_read_again_swaps_as_eager(replacement):
    model, x = InPlaceBlock().eval(), torch.randn(4, 8)
    ep = gs.export(model, (x,))
    assert gs.module_tree(ep)["act"].swappable
    check_swap(model, (x,), {"act": replacement}, ep=ep)
    fused = gs.fuse(ep, ["act"])
    assert torch.equal(fused(x.clone()), model(x.clone()))  # fuse: bit for bit


@pytest.mark.parametrize(
    "returns_input",
    [
        lambda x: x.float(),
        lambda x: x.type_as(x),
        lambda x: x.to("cpu"),
        lambda x: x.to(device="cpu", dtype=torch.float32),
        lambda x: torch.nn.functional.dropout(x, 0.5, training=False),
        lambda x: x.add_(1),
        lambda x: x,
    ],
    ids=["float", "type_as", "to cpu", "to dtype_layout", "dropout eval", "add_", "as is"],
)
def test_every_way_of_returning_the_input_swaps_as_eager(returns_input):
    class ReturnsInput(nn.Module):
        def forward(self, x):
            return returns_input(x)

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = ReturnsInput()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            return y + self.lin(self.inner(y))

    model, x = Residual().eval(), torch.randn(2, 8)
    check_swap(model, (x,), {"inner": TimesTwo()})


@pytest.mark.parametrize("exporter", ["gs.export", "torch.export"])
def test_an_rmsnorm_whose_internal_cast_is_read_by_the_residual_swaps_as_eager(exporter):
    model, x = NormLayer().eval(), torch.randn(2, 3, 8)
    if exporter == "gs.export":
        ep = gs.export(model, (x,))
    else:
        ep = torch.export.export(model, (x,), preserve_module_call_signature=("norm", "mlp"))
    part = gs.partition(ep)["norm"]
    # precondition: a node of the norm is read after the call without being its output
    outside = [
        n.name
        for n in ep.graph.nodes
        if n.name in part.nodes and n.name not in part.output_names
        for user in n.users
        if user.name not in part.nodes
    ]
    assert outside == ["to"]
    assert part.swappable
    check_swap(model, (x,), {"norm": FusedRMSNorm(model.norm)}, ep=ep)


def test_a_module_returning_its_own_parameter():
    model, x = ScalesByParameter().eval(), torch.randn(2, 8)
    check_swap(model, (x,), {"p": ConstantScale()})  # gs.export: an alias of its own
    ep = torch.export.export(model, (x,), preserve_module_call_signature=("p", "lin"))
    reason = gs.module_tree(ep)["p"].reason
    assert "returns the parameter 'p.w' as it is" in reason and "its input" not in reason


# -- constant outputs: what the program baked in -----------------------------------------


def _returning(*values):
    class Returns(nn.Module):
        def forward(self, x):
            return (x * 5, *values)

    return Returns()


def test_a_replacement_returning_another_constant_than_the_program_baked_in_is_refused():
    x = torch.randn(2, 8)
    ep = gs.export(UsesFactor().eval(), (x,))
    # precondition: the program multiplies by the constant 3 it was exported with
    assert any(3 in n.args for n in ep.graph.nodes if n.op == "call_function")
    with pytest.raises(
        gs.ReplacementError, match=r"'m' \(Returns\) returned 4 for output \[1\].*exported with 3"
    ):
        gs.swap(ep, {"m": _returning(4)})(x)
    with pytest.raises(gs.ReplacementError, match=r"returned 3\.0 for output \[1\]"):
        gs.swap(ep, {"m": _returning(3.0)})(x)  # another type is another value
    # the same constant: swapped, and as eager
    check_swap(UsesFactor().eval(), (x,), {"m": _returning(3)}, ep=ep)


def test_a_tensor_where_the_program_had_none_is_refused():
    x = torch.randn(2, 8)
    ep = gs.export(UsesNone().eval(), (x,))
    with pytest.raises(
        gs.ReplacementError, match=r"returned f32\[1\] for output \[1\].*exported with None"
    ):
        gs.swap(ep, {"m": _returning(torch.ones(1))})(x)
    check_swap(UsesNone().eval(), (x,), {"m": _returning(None)}, ep=ep)


def test_a_nan_constant_output_matches_nan():
    x = torch.randn(2, 8)
    gm = gs.swap(gs.export(UsesNan().eval(), (x,)), {"m": _returning(float("nan"))})
    assert torch.equal(gm(x), x * 5)


def test_a_dict_returned_with_its_keys_in_another_order_is_the_same_dict():
    check_swap(UsesKeyed().eval(), (torch.randn(2, 8),), {"d": DictOtherOrder()})


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_nested_tensor_returned_is_a_replacement_error_not_torchs_internal_error():
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval(), torch.randn(2, 8)
    gm = gs.swap(gs.export(model, (x,)), {"1": Nested()})
    with pytest.raises(
        gs.ReplacementError, match=r"'1' \(Nested\) returned a nested tensor of 2 parts"
    ):
        gm(x)


@pytest.mark.parametrize(
    ("make", "got"),
    [
        (lambda x: x[:, :4], r"f32\[2, 4\]"),
        (lambda x: x.double(), r"f64\[2, 8\]"),
        (lambda x: x.to("meta"), r"f32\[2, 8\] on the meta device"),
        (lambda x: x.to_sparse(), r"sparse"),
        (lambda x: x[None], r"f32\[1, 2, 8\]"),
    ],
    ids=["shape", "dtype", "meta device", "sparse layout", "another rank"],
)
def test_a_single_tensor_output_is_checked_on_each_rule(make, got):
    # the common case is checked inline (no call of ExpectedTensor.matches): each rule of the
    # full check must still refuse, naming the call
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval(), torch.randn(2, 8)
    ep = gs.export(model, (x,))
    assert torch.equal(gs.swap(ep, {"1": Returns(torch.relu)})(x), model(x))  # precondition
    gm = gs.swap(ep, {"1": Returns(make)})
    with pytest.raises(gs.ReplacementError, match=rf"'1' \(Returns\) returned .*{got}"):
        gm(x)


def test_a_parameter_returned_where_a_tensor_is_expected_passes():
    # a Tensor subclass takes the full check, not the inline one: still accepted
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval(), torch.randn(2, 8)
    held = nn.Parameter(torch.randn(2, 8))
    gm = gs.swap(gs.export(model, (x,)), {"1": Returns(lambda _x: held)})
    assert torch.equal(gm(x), model[2](held))


def test_a_module_set_on_the_swapped_program_is_the_one_its_forward_calls():
    # the forward reads each called module from the program's module tree at run time (through
    # _modules, not nn.Module.__getattr__): one set afterwards, as on any module, is called
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval(), torch.randn(2, 8)
    gm = gs.swap(gs.export(model, (x,)), {"1": nn.ReLU()})
    written = "".join(
        "".join(linecache.getlines(p.__code__.co_filename)) for p in _part_functions(gm)
    )
    assert "self._modules['1'](" in written
    assert torch.equal(gm(x), model(x))  # precondition
    setattr(gm, "1", nn.Tanh())
    assert torch.equal(gm(x), model[2](torch.tanh(model[0](x))))


# -- modes: a swapped program keeps the mode its nodes were exported in --------------------


def test_train_and_eval_never_make_a_mixed_mode_program():
    x = torch.randn(16, 8)
    model = BatchNormed().train()
    replacement = copy.deepcopy(model.out)
    gm = gs.swap(gs.export(model, (x,)), {"out": replacement})
    with pytest.raises(
        gs.errors.ModeError, match=r"eval\(\): this program's nodes were exported in training mode"
    ):
        gm.eval()
    assert replacement.training and gm.training  # refused: nothing changed
    assert gm.train() is gm  # the mode it has: accepted
    # exported in eval mode: eval() is true for every node and sets the replacement's mode too
    model.eval()
    replacement = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train()
    gm = gs.swap(gs.export(model, (x,)), {"out": replacement})
    assert not gm.training  # the program's own flag says how it was exported
    gm.eval()
    assert not replacement.training
    reference = eager_reference(model, {"out": replacement}).eval()
    assert torch.allclose(gm(x), reference(x), atol=1e-6)
    with pytest.raises(gs.errors.ModeError, match=r"train\(\).*exported in eval mode"):
        gm.train()
    fused = gs.fuse(gs.export(model, (x,)), ["out"])
    with pytest.raises(gs.errors.ModeError):
        fused.train()


def test_a_program_made_elsewhere_knows_its_mode_from_its_nodes_or_refuses():
    x = torch.randn(16, 8)
    model = BatchNormed().train()
    ep = torch.export.export(model, (x,), preserve_module_call_signature=("out",))
    gm = gs.swap(ep, {"out": nn.Linear(8, 8)})
    with pytest.raises(gs.errors.ModeError, match=r"node 'batch_norm'.*training mode"):
        gm.eval()
    plain = torch.export.export(nn.Sequential(nn.Linear(8, 8)), (x,))
    with pytest.raises(gs.errors.ModeError, match=r"does not record the mode"):
        gs.swap(plain, {}).eval()


# -- a parent that reads a swapped child's parameter or buffer directly ---------------------


def test_a_parent_reading_a_swapped_childs_state_reads_the_replacements():
    """Was: the parent kept reading the original's buffer (``+ 3``) while eager, with the
    child replaced, reads the replacement's (``+ 5``)."""
    model, x = ReadsChild().eval(), torch.randn(2, 4)
    replacement = HoldsScale(5.0)
    gm, ep, _ = check_swap(model, (x,), {"c": replacement})
    # the replacement is read at run time, not copied onto: the user's module is unchanged
    assert gm.c is replacement and set(dict(replacement.named_buffers())) == {"s"}
    with torch.no_grad():
        replacement.s.fill_(7.0)  # a later change of the replacement is what the program reads
        torch.testing.assert_close(gm(x), (x * 7 + 7) * 6)
    info = gs.module_tree(ep)["c"]
    assert info.swappable and "buffer 's' (f32[4])" in info.note and "'inner.w'" in info.note
    # the same through a Surgery, verified faithful and exported again
    s = gs.Surgery.from_model(model, (x,)).swap("c", HoldsScale(5.0))
    assert s.verify()
    with torch.no_grad():
        torch.testing.assert_close(s.export().module()(x), (x * 5 + 5) * 6)


@pytest.mark.parametrize(
    ("replacement", "has"),
    [(Scale(5.0), "has none"), (HoldsScale(5.0, size=3), r"has f32\[3\]")],
    ids=["missing", "another shape"],
)
def test_a_replacement_without_the_state_its_parent_reads_is_refused(replacement, has):
    model, x = ReadsChild().eval(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    with pytest.raises(
        gs.errors.ReplacementError, match=rf"f32\[4\]\) outside its call .*\) {has}\. Give"
    ):
        gs.swap(ep, {"c": replacement})


@pytest.mark.parametrize("graph", ["in place", "functional"])
def test_a_parent_reading_a_buffer_its_swapped_child_wrote_reads_the_replacements(graph):
    """Was: the graph reads the written value (the in-place op's result, or in a functional
    graph the buffer's new value), not the buffer, so the read went unseen: the swapped
    program read the original's buffer while eager reads the replacement's, as it wrote it."""
    model, x = ReadsWrittenBuffer().eval(), torch.randn(3, 4)
    if graph == "in place":
        ep = gs.export(model, (x,))
    else:
        ep = torch.export.export(
            model, (x,), preserve_module_call_signature=("c",)
        ).run_decompositions()
    replacement = Counts(step=1.0)
    with torch.no_grad():
        replacement.total.fill_(10.0)
    reference = copy.deepcopy(model)
    reference.c = copy.deepcopy(replacement)
    # precondition: reading the original's buffer gives another answer
    assert not torch.allclose(copy.deepcopy(model)(x), copy.deepcopy(reference)(x))
    gm = gs.swap(ep, {"c": replacement})
    for _ in range(2):  # the second run reads what the first wrote
        torch.testing.assert_close(gm(x), reference(x))
    assert "buffer 'total' (f32[4])" in gs.module_tree(ep)["c"].note
    with pytest.raises(gs.errors.ReplacementError, match=r"buffer 'total' \(f32\[4\]\) outside"):
        gs.swap(ep, {"c": Scale(2.0)})


def test_a_tied_weight_read_outside_a_swapped_module_keeps_the_original():
    #   ids -> emb -> head (its weight is emb's) -> out: eager with emb swapped keeps head's
    torch.manual_seed(0)
    model, ids = TiedEmbeddingHead().eval(), torch.tensor([1, 2, 3])
    for name in ("emb", "head"):
        replacement = copy.deepcopy(getattr(model, name))
        with torch.no_grad():
            replacement.weight.mul_(2)
        check_swap(model, (ids,), {name: replacement})


def _decoder_program(layers: int):
    """The GPT-like decoder of graphsurgeon.examples with ``layers`` layers, its tokens, and a
    fresh program of it with every layer's call preserved (its own caches: nothing compiled)."""
    from graphsurgeon.examples import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(n_layers=layers).eval()
    tokens = model.example_input()
    return (
        model,
        tokens,
        gs.export(model, (tokens,), preserve=[f"layers.{i}" for i in range(layers)]),
    )


def _part_functions(gm) -> list:
    """The functions a program's forward calls in parts (see graphsurgeon.rewrite._parts)."""
    return [v for k, v in gm.forward.__globals__.items() if k.startswith("_gs_part_")]


def test_a_second_swap_of_a_program_compiles_only_the_code_near_what_it_changed():
    # TinyGPT(12): swap layer 2, then layer 9 of the same program: the second forward is the
    # first's parts but those around layers 2 and 9, and computes what eager does

    model, tokens, ep = _decoder_program(12)
    first = gs.swap(ep, {"layers.2": copy.deepcopy(model.layers[2])})
    cache = first.graph._codegen.parts
    compiled = len(cache.code)
    request = {"layers.9": copy.deepcopy(model.layers[9])}
    second = gs.swap(ep, request)
    parts = _part_functions(second)
    assert second.graph._codegen.parts is cache  # one cache for the programs of one program
    # new: the parts around layer 2 (its nodes again) and layer 9 (swapped), not the others
    assert len(cache.code) - compiled <= 4 < len(parts)
    assert_close_tree(second(tokens), eager_reference(model, request)(tokens))
    # written whole by fx, the same graph computes the same
    second.graph._codegen.parts = None
    second.recompile()
    assert "_gs_part_" not in second.code
    assert_close_tree(second(tokens), eager_reference(model, request)(tokens))


def test_a_program_warmed_up_in_the_background_swaps_compiling_only_what_changed(monkeypatch):
    # rewrite.warm_up compiles the program's parts on a thread of its own; a swap after it
    # compiles only the parts around what it changed
    import threading

    import graphsurgeon.rewrite as rewrite_module
    from graphsurgeon.rewrite import warm_up
    from graphsurgeon.rewrite._builder import compiled_parts

    model, tokens, ep = _decoder_program(12)
    cache = compiled_parts(ep)
    assert not cache.code, "precondition: nothing of the program is compiled yet"
    thread = warm_up(ep, {})
    assert thread.daemon and thread is not threading.current_thread()
    request = {"layers.7": copy.deepcopy(model.layers[7])}
    thread.join(30)
    warmed = len(cache.code)
    assert warmed > 4
    swapped = gs.swap(ep, request)
    assert len(cache.code) - warmed <= 2  # the parts around layer 7
    assert_close_tree(swapped(tokens), eager_reference(model, request)(tokens))
    # a second warm-up finds the parts compiled and builds nothing
    built = []
    original = rewrite_module._rewrite
    monkeypatch.setattr(rewrite_module, "_rewrite", lambda *a: built.append(a) or original(*a))
    warm_up(ep, {}).join(30)
    assert built == []
    gs.swap(ep, request)
    assert len(built) == 1, "precondition: the patched rewrite counts the builds"


def test_a_warm_up_and_the_swaps_asked_for_meanwhile_take_turns():
    import graphsurgeon.rewrite as rewrite_module
    from graphsurgeon.rewrite import warm_up
    from graphsurgeon.rewrite._builder import compiled_parts

    model, tokens, ep = _decoder_program(12)
    # while a rewrite runs (its lock held here), the warm-up waits
    with rewrite_module._REWRITING:
        thread = warm_up(ep, {})
        thread.join(0.3)
        assert thread.is_alive() and not compiled_parts(ep).code
    thread.join(30)
    assert compiled_parts(ep).code, "then it compiles the parts"
    # swaps racing warm-ups: each computes what eager does
    requests = [{f"layers.{i}": copy.deepcopy(model.layers[i])} for i in (1, 6, 11)]
    threads = [warm_up(ep, request) for request in requests]  # racing the swaps below
    for request in requests:
        assert_close_tree(gs.swap(ep, request)(tokens), eager_reference(model, request)(tokens))
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()


def test_a_warm_up_pauses_while_an_interactive_action_runs_unless_it_waits_for_a_rewrite():
    # a warm-up never takes a click's time: it stops at its pause points while one runs; a
    # rewrite asked for meanwhile needs it finished, so it goes on at once (no deadlock)
    import threading

    from graphsurgeon.rewrite import interactive, warm_up
    from graphsurgeon.rewrite._builder import compiled_parts

    model, tokens, ep = _decoder_program(12)
    with interactive():
        thread = warm_up(ep, {})
        thread.join(0.5)
        assert thread.is_alive() and not compiled_parts(ep).code, "paused while a click runs"
    thread.join(30)
    assert not thread.is_alive() and compiled_parts(ep).code, "and went on after it"

    other = gs.export(model, (tokens,), preserve=[f"layers.{i}" for i in range(12)])
    request = {"layers.4": copy.deepcopy(model.layers[4])}
    swapped = []
    with interactive():
        thread = warm_up(other, {})
        thread.join(0.5)
        assert thread.is_alive(), "precondition: the warm-up is paused, holding the lock"
        asking = threading.Thread(
            target=lambda: swapped.append(gs.swap(other, request)), daemon=True
        )
        asking.start()
        asking.join(60)
        assert not asking.is_alive() and not thread.is_alive()
    assert_close_tree(swapped[0](tokens), eager_reference(model, request)(tokens))


def test_a_warm_up_parses_nothing_with_ast_on_its_own_thread(monkeypatch):
    # Python 3.11's ast cannot run on two threads at once ("AST constructor recursion depth
    # mismatch"), and a notebook parses every cell with it: the program's input guard, which
    # parses torch's guards, is made on the caller's thread before the warm-up's starts
    import ast
    import threading

    from graphsurgeon.examples import TinyGPT
    from graphsurgeon.rewrite import warm_up

    model = TinyGPT(n_layers=2).eval()
    tokens = model.example_input()
    ep = gs.export(model, (tokens,), dynamic_shapes=({1: torch.export.Dim("seq", max=64)},))
    threads = []
    parse = ast.parse
    monkeypatch.setattr(
        ast, "parse", lambda *a, **k: threads.append(threading.current_thread()) or parse(*a, **k)
    )
    thread = warm_up(ep, {"layers.1": copy.deepcopy(model.layers[1])}, keep=lambda m: None)
    thread.join(30)
    assert threads, "precondition: the program's guard parses torch's guards"
    assert thread not in threads and set(threads) == {threading.current_thread()}


def test_a_warm_up_runs_the_collector_s_full_pass_its_build_brings_due_while_nothing_waits():
    # its build's many objects bring a full pass of the collector due (0.5 s at 384 layers):
    # run on the warm-up's thread while nothing waits, it does not land in the next click
    import gc
    import threading

    from graphsurgeon.examples import TinyGPT
    from graphsurgeon.rewrite import warm_up

    model = TinyGPT(n_layers=4).eval()
    tokens = model.example_input()
    ep = gs.export(model, (tokens,))
    passes = []

    def record(phase, info):
        if phase == "start" and info["generation"] == 2:
            passes.append(threading.current_thread())

    gc.callbacks.append(record)
    try:
        thread = warm_up(ep, {})
        thread.join(30)
    finally:
        gc.callbacks.remove(record)
    assert thread in passes


def test_a_warm_up_inside_a_hold_leaves_the_collector_s_passes_to_the_hold():
    # a build the next click may want at once (a swap built ahead) runs inside the widget's
    # hold of the collector: its full pass (0.5 s at 384 layers) is not run on its thread then
    import contextlib
    import gc
    import threading

    from graphsurgeon.examples import TinyGPT
    from graphsurgeon.rewrite import warm_up

    model = TinyGPT(n_layers=4).eval()
    tokens = model.example_input()
    ep = gs.export(model, (tokens,))
    held, passes, kept = [], [], []

    @contextlib.contextmanager
    def hold():
        held.append(threading.current_thread())
        gc.disable()
        try:
            yield
        finally:
            gc.enable()

    def record(phase, info):
        if phase == "start" and info["generation"] == 2:
            passes.append(threading.current_thread())

    gc.callbacks.append(record)
    try:
        thread = warm_up(
            ep, {"layers.1": copy.deepcopy(model.layers[1])}, keep=kept.append, hold=hold
        )
        thread.join(30)
    finally:
        gc.callbacks.remove(record)
    assert held == [thread] and len(kept) == 1, "precondition: built inside the hold"
    assert thread not in passes


def test_the_statements_reused_from_earlier_swaps_are_those_written_afresh():
    # Each swap of one program writes its untouched nodes' statements from those of the earlier
    # swaps: after swaps that rename what the next layer reads (layer 2, then 9, then 2 and 3
    # fused), every part's text is the one a fresh cache writes for the same graph
    import linecache

    from graphsurgeon.rewrite import FUSE, rewrite
    from graphsurgeon.rewrite._codegen import fast_function
    from graphsurgeon.rewrite._parts import PartCache, write_in_parts

    model, tokens, ep = _decoder_program(6)
    requests = [
        {"layers.2": copy.deepcopy(model.layers[2])},
        {"layers.4": copy.deepcopy(model.layers[4])},
        {"layers.2": copy.deepcopy(model.layers[2]), "layers.3": FUSE},
        {},
    ]
    for request in requests:
        gm = rewrite(ep, request)
        parts = _part_functions(gm)
        written = {"".join(linecache.getlines(p.__code__.co_filename)) for p in parts}
        fresh = PartCache()
        write_in_parts(gm.graph.nodes, fresh, fast_function)
        assert written == set(fresh.code)
        expected = eager_reference(model, {k: v for k, v in request.items() if v is not FUSE})
        assert_close_tree(gm(tokens), expected(tokens))


def _swap_counting_parts(monkeypatch, ep, request):
    """gs.swap, the parts of its code, and how many of them its code writer wrote (a part
    taken whole from the cache is not written)."""
    from graphsurgeon.rewrite import _parts

    written = []
    original = _parts.PartCache.compiled
    with monkeypatch.context() as patch:
        patch.setattr(_parts, "CHECK_KEPT_PARTS", False)  # what a user runs
        patch.setattr(
            _parts.PartCache,
            "compiled",
            lambda self, text: written.append(text) or original(self, text),
        )
        gm = gs.swap(ep, request)
    return gm, len(_part_functions(gm)), len(written)


def test_a_part_no_edit_disturbed_is_taken_whole_from_the_cache(monkeypatch):
    # a swap writes the parts around what it changed; the parts of the program nodes it left
    # alone (not read by what it changed, not reading it) come whole from those an earlier
    # swap of the same program wrote, and compute the same

    model, tokens, ep = _decoder_program(32)
    at_two = {"layers.2": copy.deepcopy(model.layers[2])}
    at_nine = {"layers.9": copy.deepcopy(model.layers[9])}
    first, parts, written = _swap_counting_parts(monkeypatch, ep, at_two)
    assert parts > 12 and written == parts, "precondition: the first swap writes every part"
    # the parts around layer 9, and those around layer 2 (disturbed before: not kept then)
    second, parts, written = _swap_counting_parts(monkeypatch, ep, at_nine)
    assert 0 < written <= 6 < parts
    third, parts, again = _swap_counting_parts(monkeypatch, ep, at_nine)
    assert 0 < again < written  # around layer 9 only
    for gm, request in ((first, at_two), (second, at_nine), (third, at_nine)):
        assert_close_tree(gm(tokens), eager_reference(model, request)(tokens))
    assert third.code == second.code


def test_a_value_every_layer_reads_leaves_the_untouched_layers_parts_kept(monkeypatch):
    # a mask made once and read by every layer (as a decoder's attention mask and rotary
    # tables are): swapping one layer changes who reads it last, not how the other layers
    # read it, so their parts are still taken whole
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x, mask):
            h = torch.relu(self.a(x)) * mask
            return x + torch.tanh(self.b(h) + mask)

    class Stack(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.layers = torch.nn.ModuleList(Layer() for _ in range(n))

        def forward(self, x):
            mask = torch.sigmoid(x.sum(-1, keepdim=True))
            for layer in self.layers:
                x = layer(x, mask)
            return x

    torch.manual_seed(0)
    model = Stack(80).eval()
    x = torch.randn(2, 8)
    ep = gs.export(model, (x,))
    first = {"layers.60": copy.deepcopy(model.layers[60])}
    other = {"layers.5": copy.deepcopy(model.layers[5])}
    _swap_counting_parts(monkeypatch, ep, first)
    gm, parts, written = _swap_counting_parts(monkeypatch, ep, other)
    assert parts > 10, "precondition: the program is cut into many parts"
    assert 0 < written <= 6 < parts  # the parts around layers 5 and 60, and the first one
    assert_close_tree(gm(x), eager_reference(model, other)(x))


def test_a_kept_part_keeps_its_source_for_tracebacks(monkeypatch):
    # a part's source is in linecache while its code is cached by text; a kept part whose
    # code left that cache since puts its source back when taken, so a traceback through it
    # still shows its lines
    import linecache

    from graphsurgeon.rewrite._builder import compiled_parts
    from graphsurgeon.rewrite._parts import forget_lines

    model, tokens, ep = _decoder_program(32)
    request = {"layers.9": copy.deepcopy(model.layers[9])}
    gs.swap(ep, request)
    cache = compiled_parts(ep)
    assert cache.parts, "precondition: parts were kept"
    for code in cache.code.values():  # the code cache drops everything, as its limit would
        forget_lines(code.co_filename)
        assert not linecache.getlines(code.co_filename), "precondition: its lines are gone"
    cache.code.clear()
    gm, parts, written = _swap_counting_parts(monkeypatch, ep, request)
    assert written < parts, "precondition: parts were taken whole"
    for function in _part_functions(gm):
        assert linecache.getlines(function.__code__.co_filename), function.__code__.co_filename
    assert_close_tree(gm(tokens), eager_reference(model, request)(tokens))


def test_sources_let_go_on_another_thread_never_break_a_linecache_check_meanwhile():
    # a program's generated source is let go when the collector frees the program, on
    # whichever thread it runs (a widget builds on a warm-up thread); linecache.checkcache()
    # lists its entries, then reads each: an entry removed in between raised KeyError in it
    # (a doctest failed so). The entries stay, without their lines.
    import gc
    import linecache
    import os
    import threading
    import time

    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    ep = gs.export(model, (torch.randn(1, 2),), preserve=["0"])
    sources = torch.fx.graph_module._loader.eval_cache
    # entries of a real file, which each check reads with os.stat (letting the other thread
    # run): a check is then under way for a while, and each program below is let go while
    # one that listed its entry is. Removing the entries instead fails 24 of 25 programs.
    stat = os.stat(__file__)
    padding = [f"<padding {i}>" for i in range(2000)]
    linecache.cache.update({name: (stat.st_size, stat.st_mtime, [], __file__) for name in padding})
    errors, done, checks = [], threading.Event(), [0]

    def check() -> None:
        while not done.is_set():
            checks[0] += 1
            try:
                linecache.checkcache()
            except KeyError as error:
                errors.append(error)

    checker = threading.Thread(target=check)
    checker.start()
    keys = []
    try:
        for _ in range(25):
            gm = gs.swap(ep, {"0": nn.Linear(2, 2)})
            keys.append(type(gm).forward.__code__.co_filename)
            begun, deadline = checks[0], time.monotonic() + 30
            while checks[0] == begun:  # a check that lists this program's entry
                assert checker.is_alive() and time.monotonic() < deadline, "the checker stopped"
                time.sleep(0.0005)
            del gm
            gc.collect(1)  # the young generations hold the program's cycle
    finally:
        done.set()
        checker.join()
        for name in padding:
            linecache.cache.pop(name, None)
    assert not any(key in sources for key in keys), "precondition: every source was let go"
    assert errors == []
    assert all(not linecache.getlines(key) for key in keys), "their lines are gone too"


def test_a_kept_part_is_checked_against_the_program_nodes_it_copies():
    # a kept part is the text written for copies of some program nodes as they were: a
    # program edited in place since (fx gives an edited node new args) has its parts
    # written again; and the tests' check catches a kept part that differs from its text
    from graphsurgeon.rewrite import _parts
    from graphsurgeon.rewrite._builder import compiled_parts

    assert _parts.CHECK_KEPT_PARTS, "precondition: the tests compare every kept part"
    model, _, ep = _decoder_program(12)
    gs.swap(ep, {"layers.0": copy.deepcopy(model.layers[0])})
    cache = compiled_parts(ep)
    assert cache.parts, "precondition: the swap kept the parts it left alone"
    key, kept = next(reversed(cache.parts.items()))
    node = key[-1]
    node.args = (*node.args,)  # the same arguments, as an edit in place writes them
    assert cache.kept_part(key) is None and key not in cache.parts
    gs.swap(ep, {"layers.0": copy.deepcopy(model.layers[0])})
    key, kept = next(reversed(cache.parts.items()))
    kept.text += "# changed\n"
    with pytest.raises(AssertionError, match="a kept part differs"):
        gs.swap(ep, {"layers.0": copy.deepcopy(model.layers[0])})


def test_the_path_modules_of_a_result_are_plain_modules_as_torch_makes_them():
    # a swap's path modules (layers, layers.0 ...) are made with their state written at once:
    # the same attributes, values and fresh containers as torch.nn.Module()'s own, the hook
    # registries made on first use (each its own, of the same type)
    import gc

    from graphsurgeon.rewrite._writer import _plain_module

    made, plain = _plain_module(), torch.nn.Module()
    assert isinstance(made, torch.nn.Module) and repr(made) == repr(plain) == "Module()"
    lazy = {k for k, v in plain.__dict__.items() if type(v) in (OrderedDict, set)}
    assert len(lazy) == 12 and not lazy & set(made.__dict__)  # not made yet: nothing to track
    for key, value in plain.__dict__.items():  # asked for, each is there as torch makes it
        got = getattr(made, key)
        assert type(got) is type(value) and got == value
        assert got is getattr(made, key) and key in made.__dict__  # made once, then kept
        if isinstance(value, (dict, set)):
            assert got is not value
    assert made.__dict__ == plain.__dict__
    other = _plain_module()
    other.register_forward_hook(lambda *args: None)  # registries are never shared
    assert len(other._forward_hooks) == 1 and not _plain_module()._forward_hooks
    with pytest.raises(AttributeError, match="'Module' object has no attribute 'nothing'"):
        getattr(_plain_module(), "nothing")  # noqa: B009 (the lookup is what is tested)
    bare = type(made).__new__(type(made))  # as a copy starts, before its state is written
    assert getattr(bare, "weight", None) is None, "missing, as for nn.Module: no KeyError"
    untouched = _plain_module()
    assert sum(gc.is_tracked(v) for v in untouched.__dict__.values()) < sum(
        gc.is_tracked(v) for v in torch.nn.Module().__dict__.values()
    )

    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.nn.ReLU())
    x = torch.randn(1, 2)
    gm = gs.swap(gs.export(model, (x,)), {"1": torch.nn.Tanh()})
    path = gm.get_submodule("0")
    assert isinstance(path, torch.nn.Module) and "(0): Module(" in str(gm)
    assert list(gm.state_dict()) == ["0.0.weight", "0.0.bias"]
    torch.testing.assert_close(gm(x), torch.tanh(model[0](x)))
    copied = copy.deepcopy(gm)  # copies, pickles and re-exports as a plain module would
    torch.testing.assert_close(copied(x), gm(x))
    unpickled = pickle.loads(pickle.dumps(path))
    assert unpickled.__dict__.keys() <= plain.__dict__.keys()
    assert list(unpickled.state_dict()) == ["0.weight", "0.bias"]
    torch.testing.assert_close(torch.export.export(gm, (x,)).module()(x), gm(x))


def _footprints(monkeypatch, ep, request) -> tuple[torch.fx.GraphModule, list[frozenset]]:
    """gs.swap(ep, request), and the footprints its rewrite worked out before building."""
    from graphsurgeon.rewrite._builder import _Builder

    found = []
    original = _Builder._footprint
    with monkeypatch.context() as patch:
        patch.setattr(
            _Builder, "_footprint", lambda self: found.append(original(self)) or found[-1]
        )
        gm = gs.swap(ep, request)
    return gm, found


def test_an_edits_footprint_is_what_it_touches_not_what_the_program_holds(monkeypatch):
    # the nodes a swap may disturb are worked out before it builds, from the program's own
    # readers: the same nodes for the same layer whatever the program's length, none in a
    # layer the swapped one neither reads nor feeds; and the tests' check (each rewrite
    # compares its footprint with what the graph it made disturbed) fails on one too small
    from graphsurgeon.rewrite import _builder

    assert _builder.CHECK_FOOTPRINT, "precondition: the tests check every footprint"
    sizes = {}
    for layers in (8, 32):
        model, tokens, ep = _decoder_program(layers)
        request = {"layers.3": copy.deepcopy(model.layers[3])}
        gm, found = _footprints(monkeypatch, ep, request)
        assert len(found) == 1
        footprint = found[0]
        calls = program_index(ep).call_nodes
        layer_of = {n: i for i in range(layers) for n in calls[f"layers.{i}"]}
        reached = {layer_of[n] for n in footprint if n in layer_of}
        assert reached == {2, 3, 4}, f"the footprint reaches layers {sorted(reached)}"
        sizes[layers] = len(footprint)
        assert_close_tree(gm(tokens), eager_reference(model, request)(tokens))
    assert sizes[8] == sizes[32]

    model, _, ep = _decoder_program(8)
    swapped = program_index(ep).call_nodes["layers.3"]
    readers = {user for node in swapped for user in node.users} - set(swapped)
    assert readers, "precondition: the swapped layer's outputs are read"
    original = _builder._Builder._footprint
    monkeypatch.setattr(_builder._Builder, "_footprint", lambda self: original(self) - readers)
    with pytest.raises(AssertionError, match="footprint misses nodes it disturbed"):
        gs.swap(ep, {"layers.3": copy.deepcopy(model.layers[3])})


def test_copies_fx_names_otherwise_are_in_every_footprint(monkeypatch):
    # a program edited by hand may hold node names fx never gives (a builtin's: ``abs``),
    # and the very name fx then gives such a copy (``abs_1``), whose own copy is renamed in
    # its turn: both, and what reads them, are in every footprint (their parts are written
    # afresh), and every swap computes what eager runs
    from graphsurgeon.rewrite import _builder

    assert _builder.CHECK_FOOTPRINT, "precondition: the tests check every footprint"
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3))).eval()
    x = torch.randn(2, 4)
    ep = gs.export(model, (x,))
    nodes = {n.name: n for n in ep.graph.nodes}
    nodes["linear_1"].name = "abs"  # inside "1", not one of its outputs
    nodes["linear_2"].name = "abs_1"  # inside "2"
    nodes = {n.name: n for n in ep.graph.nodes}
    for request in ({}, {"0": nn.Sequential(nn.Linear(4, 4), nn.ReLU())}, {"2": nn.Identity()}):
        gm, (footprint,) = _footprints(monkeypatch, ep, request)
        renamed = {new: old for new, old in swap_info(gm).copies.items() if new != old}
        assert renamed.get("abs_1") == "abs", "precondition: fx named the copy otherwise"
        copied = {nodes[old] for old in renamed.values()}
        assert copied | {user for node in copied for user in node.users} <= footprint
        assert_close_tree(gm(x), eager_reference(model, request)(x))
