"""What graphsurgeon derives from a program, and the one rule for when it is made again
(graphsurgeon._derived): every view reads one record, so all see the program as it was, or
all as it is."""

from __future__ import annotations

import gc
import itertools
import weakref

import pytest
import torch
from helpers.swap_models import Loop, Spelled, Twice
from torch import nn

import graphsurgeon as gs
from graphsurgeon._calls import CallIndex
from graphsurgeon.checks._exec import runnable_original
from graphsurgeon.examples import FusedAttention
from graphsurgeon.partition import call_index, program_index
from graphsurgeon.rewrite import FUSE


def _program():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU()).eval()
    x = torch.randn(2, 3)
    return model, x, gs.export(model, (x,))


def test_what_is_derived_is_made_once():
    _, _, ep = _program()
    assert program_index(ep) is program_index(ep)
    assert call_index(ep) is call_index(ep)
    assert runnable_original(ep) is runnable_original(ep)


def test_copies_of_a_program_share_its_call_index_until_its_graph_is_forgotten():
    import copy

    _, _, ep = _program()
    index = call_index(ep)
    twin = copy.copy(ep)
    assert twin is not ep and twin.graph is ep.graph  # the precondition: one graph, two objects
    assert call_index(twin) is index, "the index depends on the graph: a copy reads the same one"
    # the program's GraphModule shares the graph, not the program's lifted state: its own index
    assert call_index(ep.graph_module) is not index
    gs.forget(twin)  # an edit through one copy is an edit of the graph they share
    assert call_index(ep) is not index


def test_a_graph_edited_in_place_is_read_the_same_stale_way_until_forgotten():
    model, x, ep = _program()
    before = runnable_original(ep)
    index = program_index(ep)
    picture = gs.to_dot(ep, collapse=None)
    assert "aten.relu" in picture and "aten.sigmoid" not in picture
    relu = next(n for n in ep.graph.nodes if n.target is torch.ops.aten.relu.default)
    relu.target = torch.ops.aten.sigmoid.default  # same nodes, same count: the rule cannot see it
    assert runnable_original(ep) is before and program_index(ep) is index  # all stale, together
    gs.forget(ep)
    after = runnable_original(ep)
    assert after is not before and program_index(ep) is not index  # all fresh, together
    picture = gs.to_dot(ep, collapse=None)
    assert "aten.sigmoid" in picture and "aten.relu" not in picture, "the picture is read again"
    with torch.no_grad():
        assert torch.allclose(after(x), torch.sigmoid(model[0](x)))


def test_a_graph_that_gained_a_node_is_read_again_by_every_view():
    _, _, ep = _program()
    index, calls = program_index(ep), call_index(ep)
    output = next(n for n in ep.graph.nodes if n.op == "output")
    with ep.graph.inserting_before(output):
        extra = ep.graph.call_function(torch.ops.aten.neg.default, (output.args[0][0],))
    output.args = ((extra,),)
    assert program_index(ep) is not index and call_index(ep) is not calls
    assert extra in program_index(ep).nodes


def test_the_records_keep_no_program_alive():
    _, x, ep = _program()
    gs.module_tree(ep), runnable_original(ep), gs.verify(ep, ep, (x,))
    swapped = gs.swap(ep, {"1": nn.Tanh()})
    call_index(swapped)
    alive = weakref.ref(ep), weakref.ref(swapped)
    del ep, swapped
    gc.collect()
    assert alive[0]() is None and alive[1]() is None


def test_forget_takes_a_surgery_and_drops_its_built_states():
    _, x, ep = _program()
    s = gs.Surgery(ep).swap("1", nn.Tanh())
    module = s.module
    gs.forget(s)
    assert s.module is not module
    assert torch.allclose(s.module(x), module(x))


def _same_index(read, alone) -> None:
    for field in ("chains", "order", "root_type", "ambiguous", "members"):
        assert getattr(read, field) == getattr(alone, field), field
    assert list(read.calls.items()) == list(alone.calls.items()), "the calls, in graph order"
    # neighbours share one chain object where a read of the graph alone shares it (a picture
    # cuts its vertices into runs by that identity)
    order = alone.order
    for a, b in itertools.pairwise(order):
        same = read.chains[a] is read.chains[b]
        assert same == (alone.chains[a] is alone.chains[b]), (a, b)


@pytest.mark.parametrize(
    ("make", "strict", "requests", "read_from_program"),
    [
        ("gpt", False, {"layers.1.attn": "fast", "layers.0.mlp": FUSE}, True),
        ("gpt", False, {"layers.1": FUSE}, True),
        ("twice", False, {"blk@1": "linear"}, True),
        ("loop", False, {"blk@2": "linear"}, True),
        ("twice", True, {"blk": "linear"}, True),
        # strict export numbers a module reached by two spellings by the order the graph
        # reaches its calls: such an index is read from the swap's own graph
        ("spelled", True, {"layers.0@1": "linear", "d.q": "linear"}, False),
    ],
)
def test_a_swaps_call_index_read_from_its_programs_is_the_one_its_graph_gives(
    tiny_gpt, make, strict, requests, read_from_program
):
    # a swap copies every node of its program with the very same stack objects: its index is
    # read from the program's (a lookup per node), and must say exactly what a read of the
    # swap's own graph says
    if make == "gpt":
        model, _, ep = tiny_gpt
    else:
        model = {"twice": Twice, "loop": Loop, "spelled": Spelled}[make]().eval()
        ep = gs.export(model, (torch.randn(2, 4),), strict=strict)
    replacements = {
        name: FUSE
        if how is FUSE
        else FusedAttention(model.get_submodule(name))
        if how == "fast"
        else nn.Linear(4, 4)
        for name, how in requests.items()
    }
    gm = gs.swap(ep, replacements) if FUSE not in replacements.values() else None
    if gm is None:
        s = gs.Surgery(ep)
        for name, module in replacements.items():
            s.fuse(name) if module is FUSE else s.swap(name, module)
        gm = s.module
    read = call_index(gm)
    assert ("_by_stack" in call_index(ep).__dict__) == read_from_program, "the path taken"
    _same_index(read, CallIndex(gm.graph))
    assert read.calls, "precondition: calls to compare"


def test_a_region_call_shares_its_neighbours_chain_as_a_read_of_its_graph_does(tiny_gpt):
    # a fused region's call sits in the call that holds its nodes: its chain is worked out
    # here, and must be the very object its neighbours (read from the program's) carry
    _, _, ep = tiny_gpt
    chains = call_index(ep).chains
    inside = [
        n.name
        for n in ep.graph.nodes
        if n.op == "call_function" and chains[n.name] == ("layers.0", "layers.0.attn")
    ]
    s = gs.Surgery(ep).fuse_region(inside[5:7])
    read = call_index(s.module)
    assert "_by_stack" in call_index(ep).__dict__, "precondition: read from the program's"
    regions = [n for n in read.order if n.startswith("fused_region")]
    assert regions, "precondition: the region's call is in the program"
    _same_index(read, CallIndex(s.module.graph))
