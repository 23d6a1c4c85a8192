"""fuse: each named call becomes one call_module of its own nodes; nothing else changes."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.swap_models import NormThenReshape, SelfAttention
from torch import nn

import graphsurgeon as gs
from graphsurgeon import _meta
from graphsurgeon.examples import TinyGPT
from graphsurgeon.swap import swap_info


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    model = TinyGPT(n_layers=2).eval()
    idx = torch.randint(0, 256, (2, 8))
    return model, idx, gs.export(model, (idx,))


def _fused_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_module" and n.meta.get(_meta.FUSED)]


def test_fused_calls_compute_the_program_bit_for_bit(gpt):
    model, idx, ep = gpt
    names = ["layers.0.attn", "layers.1.mlp", "ln_f"]
    gm = gs.fuse(ep, names)
    assert [n.target for n in _fused_nodes(gm)] != []  # precondition: something was fused
    assert len(_fused_nodes(gm)) == 3
    with torch.no_grad():
        assert torch.equal(gm(idx), ep.module()(idx))
        assert torch.equal(gm(idx), model(idx))


def test_a_fused_call_holds_exactly_the_calls_original_nodes(gpt):
    _model, _idx, ep = gpt
    gm = gs.fuse(ep, "layers.0.attn")
    block = swap_info(gm).calls["layers.0.attn"]
    original = gs.partition(ep)["layers.0.attn"]
    inner = [n.name for n in block.graph.nodes if n.op == "call_function"]
    by_name = {n.name: n for n in ep.graph.nodes}
    computed = [n for n in original.nodes if by_name[n].op == "call_function"]
    assert len(computed) > 5 and inner == computed
    assert "def forward" in block.code  # printable


def test_a_fused_call_runs_on_its_own_and_exports_again(gpt):
    model, _idx, ep = gpt
    gm = gs.fuse(ep, "layers.1.mlp")
    block = swap_info(gm).calls["layers.1.mlp"]
    h = torch.randn(2, 8, 64)
    with torch.no_grad():
        assert torch.equal(block(h), model.layers[1].mlp(h))
    again = torch.export.export(block, (h,))
    with torch.no_grad():
        torch.testing.assert_close(again.module()(h), model.layers[1].mlp(h))


def test_fuse_and_swap_in_one_program(gpt):
    model, idx, ep = gpt
    s = gs.Surgery(ep, args=(idx,))
    s.fuse("layers.0.mlp").swap("layers.1.mlp.act", nn.ReLU())
    assert [str(h) for h in s.history] == [
        "fuse layers.0.mlp -> fused",
        "swap layers.1.mlp.act -> ReLU",
    ]
    assert s.fused == ("layers.0.mlp",) and list(s.replacements) == ["layers.1.mlp.act"]
    reference = TinyGPT(n_layers=2).eval()
    reference.load_state_dict(model.state_dict())
    reference.layers[1].mlp.act = nn.ReLU()
    with torch.no_grad():
        assert not torch.equal(reference(idx), model(idx))  # precondition
        torch.testing.assert_close(s.module(idx), reference(idx))
    assert len(_fused_nodes(s.module)) == 1
    s.undo()
    assert s.fused == ("layers.0.mlp",) and not s.replacements


def test_fuse_refuses_what_swap_refuses_with_the_same_words(gpt):
    _model, _idx, ep = gpt
    with pytest.raises(gs.errors.UnknownModuleError, match=r"Did you mean .layers\.0\.attn."):
        gs.fuse(ep, "layers.0.atn")
    with pytest.raises(gs.SwapError, match="root module is the whole program"):
        gs.fuse(ep, "")
    with pytest.raises(gs.SwapError, match="no module named"):
        gs.fuse(ep, [])
    with pytest.raises(gs.SwapError, match="expected module names"):
        gs.fuse(ep, 3)


def test_fuse_leaves_the_program_as_it_was(gpt):
    _model, idx, ep = gpt
    before = str(ep.graph)
    state = {k: v.clone() for k, v in ep.state_dict.items()}
    gm = gs.fuse(ep, ["layers.0", "head"])
    gm(idx)
    assert str(ep.graph) == before
    assert all(torch.equal(state[k], v) for k, v in ep.state_dict.items())


@pytest.mark.parametrize(
    ("model", "name", "features"), [(NormThenReshape(), "r", 4), (SelfAttention(), "attn", 8)]
)
def test_a_call_reading_dynamic_sizes_of_the_model_input_fuses_and_compares(model, name, features):
    model = model.eval()
    batch = torch.export.Dim("batch", min=2, max=16)
    x = torch.randn(3, 5, features)
    ep = gs.export(model, (x,), dynamic_shapes=({0: batch},))
    inside = set(gs.partition(ep)[name].nodes)
    sizes_of_x = [
        n
        for n in ep.graph.nodes
        if n.target is torch.ops.aten.sym_size.int and n.args[0].name == "x"
    ]
    reached, frontier = set(), list(sizes_of_x)
    while frontier:  # everything computed from those sizes
        node = frontier.pop()
        reached.add(node.name)
        frontier += [u for u in node.users if u.name not in reached]
    assert reached & inside, "precondition: the call uses a size read off the model input"
    fused = gs.fuse(ep, name)
    other = torch.randn(7, 5, features)
    assert torch.equal(fused(other), ep.module()(other))
    # compare runs the cut on the replacement's inputs: a changed replacement is found
    changed = copy.deepcopy(model.get_submodule(name))
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.5)
    if name == "r":
        changed = nn.Tanh()
    swapped = gs.swap(ep, {name: changed})
    comparison = gs.compare(ep, swapped, (other,))
    assert comparison.first_divergence == name
