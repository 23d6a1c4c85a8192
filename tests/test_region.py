"""Regions chosen by hand (graphsurgeon.patterns.region, Surgery.fuse_region / swap_region /
find_similar): a set of a program's ops made one call, checked against eager references."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.pattern_models import (
    Gated,
    GatedStack,
    ScaleAndMask,
    SharedWithGate,
    ShiftedSiLU,
    TanhBetweenLinears,
)
from torch import nn

import graphsurgeon as gs
from graphsurgeon import _meta
from graphsurgeon.errors import ConflictError, SurgeryError, UnknownNodeError
from graphsurgeon.step import Stepper


@pytest.fixture
def stack():
    torch.manual_seed(0)
    model = GatedStack().eval()
    x = torch.randn(3, 4)
    return model, x, gs.Surgery.from_model(model, (x,))


def gate_nodes(surgery, block: int) -> list[str]:
    """The sigmoid and mul of ``blocks.<block>``'s gate, by what they compute."""
    index_nodes = surgery.program.graph.nodes
    calls = gs.partition(surgery.program)
    members = set(calls[f"blocks.{block}"].nodes)
    return [
        n.name
        for n in index_nodes
        if n.name in members
        and n.target in (torch.ops.aten.sigmoid.default, torch.ops.aten.mul.Tensor)
    ]


def test_a_fused_region_computes_what_its_nodes_did(stack):
    model, x, s = stack
    nodes = gate_nodes(s, 1)
    assert len(nodes) == 2  # precondition: the gate's two ops
    s.fuse_region(nodes)
    (name,) = s.fused
    assert name == "region:blocks.1" and s.regions[name].nodes == tuple(nodes)
    fused = [n for n in s.module.graph.nodes if n.meta.get(_meta.FUSED) == name]
    assert len(fused) == 1 and not set(nodes) & {n.name for n in s.module.graph.nodes}
    with torch.no_grad():
        assert torch.equal(s.module(x), model(x))
    s.undo()
    assert s.fused == () and s.regions == {}
    # the undone region's name is free again (a new change drops the undone one for good);
    # a region kept in the history keeps its name, and the next one is numbered
    s.swap_region(nodes, ShiftedSiLU())
    assert s.history[-1].name == name and not s.can_redo
    assert s.region_signature(nodes).region.name == f"{name}#1"
    with torch.no_grad():
        patched = copy.deepcopy(model)
        patched.blocks[1].gate = ShiftedSiLU()
        torch.testing.assert_close(s.module(x), patched(x))


def test_a_swapped_region_equals_the_eager_model_with_its_code_patched(stack):
    model, x, s = stack
    plan = s.region_signature(gate_nodes(s, 0))
    assert plan.inputs == ("linear",) and plan.outputs == ("mul",)
    assert plan.call_text == "(linear: f32[3, 4]) → f32[3, 4]"
    s.swap_region(plan.nodes, ShiftedSiLU())
    patched = copy.deepcopy(model)
    patched.blocks[0].gate = ShiftedSiLU()
    with torch.no_grad():
        assert not torch.allclose(patched(x), model(x))  # precondition: it changes the output
        torch.testing.assert_close(s.module(x), patched(x))
    report = s.verify()  # against the original model: no eager module holds a region
    assert not report and report.original is None and "patch the function" in report.against
    # stepped into as a swapped call is, and exported again
    stepper = Stepper(s, x)
    stepper.run_to("region:blocks.0")
    assert stepper.step_into().note == "entered swapped call 'region:blocks.0'"
    stepper.continue_()
    torch.testing.assert_close(stepper.output, patched(x))
    stepper.reset()
    entered = stepper.breakpoints.enter("region:blocks.0")
    assert stepper.continue_().breakpoints == (entered,) and stepper.current.op == "call_module"
    again = s.export()
    torch.testing.assert_close(again.module()(x), patched(x))


def test_find_similar_finds_the_region_in_every_layer(stack):
    _, _, s = stack
    found = s.find_similar(gate_nodes(s, 1))
    assert [m.call for m in found] == ["blocks.0", "blocks.1", "blocks.2"]
    assert any(set(m.nodes) >= set(gate_nodes(s, 1)) for m in found)


def test_a_region_that_cannot_be_one_call_says_which_node_is_in_the_way(stack):
    _, _, s = stack
    index = {n.name: n for n in s.program.graph.nodes}
    sigmoid, mul = gate_nodes(s, 0)
    linear = index[sigmoid].args[0].name
    # linear and mul without the sigmoid between them: the sigmoid reads and feeds the region
    with pytest.raises(SurgeryError, match=rf"`{sigmoid}`, outside it, reads its values and feeds"):
        s.region_signature([linear, mul])
    # blocks.0's sigmoid with blocks.1's first op: a part of module call blocks.0
    add = next(u.name for u in index[mul].users)
    next_linear = gate_nodes(s, 1)[0]
    next_linear = index[next_linear].args[0].name
    with pytest.raises(SurgeryError, match=r"1 of the 4 ops of module call 'blocks\.0'"):
        s.region_signature([sigmoid, next_linear])
    with pytest.raises(SurgeryError, match=r"not an op"):
        s.region_signature([index[linear].args[1].name])
    with pytest.raises(SurgeryError, match=r"not an op"):
        s.region_signature(["x"])
    with pytest.raises(UnknownNodeError, match=r"'nope'"):
        s.region_signature(["nope"])
    with pytest.raises(SurgeryError, match=r"list of node names"):
        s.region_signature("mul")
    assert s.region_signature([sigmoid, mul, add]).outputs == (add,)


def test_a_region_overlapping_a_swap_is_refused_and_nothing_changes(stack):
    _, _, s = stack
    s.swap("blocks.0", Gated())
    version = s.version
    with pytest.raises(ConflictError, match=r"in 'blocks\.0', swapped for a Gated in step 1.*Undo"):
        s.swap_region(gate_nodes(s, 0), ShiftedSiLU())
    assert s.version == version and s.regions == {}


def test_a_region_reading_a_value_made_between_its_nodes_runs_after_it():
    from graphsurgeon.examples import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(2).eval()
    tokens = model.example_input()
    s = gs.Surgery.from_model(model, (tokens,))
    order = [n.name for n in s.program.graph.nodes]
    # precondition: the causal mask (triu) is made after the scale (div) it is applied with
    assert order.index("div") < order.index("triu") < order.index("masked_fill")
    plan = s.region_signature(["div", "masked_fill"])
    assert plan.inputs == ("matmul", "triu")
    with torch.no_grad():
        expected = model(tokens)
    # was TypeError: masked_fill() received (Tensor, NoneType, float): the call came first
    s.fuse_region(plan.nodes)
    with torch.no_grad():
        assert torch.equal(s.module(tokens), expected)

    s.undo().swap_region(plan.nodes, ScaleAndMask())
    with torch.no_grad():
        torch.testing.assert_close(s.module(tokens), expected)
        torch.testing.assert_close(s.export().module()(tokens), expected)


@pytest.mark.parametrize("name", ["blocks.0", "blocks", "head", "blocks.1@1", "nowhere@2"])
def test_a_region_cannot_take_a_name_that_names_a_module_or_call(stack, name):
    _, _, s = stack
    nodes = gate_nodes(s, 1)
    with pytest.raises(SurgeryError, match=rf"cannot be named {name!r}"):
        s.swap_region(nodes, ShiftedSiLU(), name=name)
    assert s.version == 0 and s.regions == {}
    s.swap_region(nodes, ShiftedSiLU(), name="gate")  # a name of its own is taken as it is
    assert list(s.replacements) == ["gate"]


def test_a_module_named_like_a_refused_region_is_swapped_as_the_module():
    """Was: a region called ``"a"`` took module ``a``'s name, and ``s.swap("a", X)`` then
    replaced the region while module ``a`` kept its weights."""
    torch.manual_seed(0)

    model, x = TanhBetweenLinears().eval(), torch.randn(2, 4)
    s = gs.Surgery.from_model(model, (x,))
    with pytest.raises(SurgeryError, match=r"name of module 'a'"):
        s.swap_region(["tanh"], nn.Sigmoid(), name="a")
    s.swap_region(["tanh"], nn.Sigmoid(), name="squash")
    new_a = nn.Linear(4, 4)
    s.swap("a", new_a)
    assert set(s.replacements) == {"squash", "a"}
    with torch.no_grad():
        torch.testing.assert_close(s.module(x), model.b(torch.sigmoid(new_a(x)) * 2))


def test_a_region_named_like_a_second_call_is_refused_and_the_call_keeps_its_name():
    """Was: a region named ``"sh@1"`` was accepted, and ``s.swap("sh", ...)`` then silently
    dropped it as a call the new request covered."""
    torch.manual_seed(0)
    model, x = SharedWithGate().eval(), torch.randn(2, 4)
    s = gs.Surgery.from_model(model, (x,))
    with pytest.raises(SurgeryError, match=r"call 1 of module 'sh'"):
        s.swap_region(["mul"], nn.Identity(), name="sh@1")
    s.swap_region(["mul"], nn.Identity(), name="halve")
    s.swap("sh", copy.deepcopy(model.sh))
    assert set(s.replacements) == {"halve", "sh"}
    with torch.no_grad():
        torch.testing.assert_close(s.module(x), model.sh(torch.tanh(model.sh(x))))


def test_a_region_name_in_force_is_not_given_twice(stack):
    _, _, s = stack
    s.swap_region(gate_nodes(s, 0), ShiftedSiLU(), name="gate")
    with pytest.raises(SurgeryError, match=r"named 'gate' exists already"):
        s.fuse_region(gate_nodes(s, 1), name="gate")
    assert list(s.replacements) == ["gate"] and s.fused == ()


def test_a_region_is_a_list_of_node_names_not_a_mapping(stack):
    _, _, s = stack
    with pytest.raises(SurgeryError, match=r"list of node names"):
        s.fuse_region(dict.fromkeys(gate_nodes(s, 0), "anything"))
    assert s.version == 0


def test_a_fused_region_keeps_the_faithful_check(stack):
    """Was: any region, a fused one too, turned verify into a comparison with the original
    that blamed "replaced patterns" nothing had replaced."""
    _, _, s = stack
    s.swap("head", nn.Linear(4, 2))
    assert s.verify().against == "the eager model with the same replacements"  # precondition
    s.fuse_region(gate_nodes(s, 1))
    report = s.verify()
    assert report and report.against == "the eager model with the same replacements"
    assert report.original is not None and not report.original  # the head differs
    s.swap_region(gate_nodes(s, 0), ShiftedSiLU())
    report = s.verify()
    assert report.against.startswith("the original model (swapped regions of ops have no eager")
