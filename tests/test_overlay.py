"""overlay_values(): error, own error, latency and the user's values, keyed as the picture is drawn.

Each error is checked against numbers computed here from eager runs (the original module and
the replacement on the same inputs), and the keys against the ids of the fully open picture.
"""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from helpers.check_models import DropoutAfterBatchNorm, Fails, Slow
from helpers.grad_models import NormStack, fused_norms
from helpers.models import NoCausalMask, Residual, Shared
from torch import nn

import graphsurgeon as gs
from graphsurgeon.checks._grad import seeded_upstream
from graphsurgeon.checks.overlay import OverlayValues, overlay_values
from graphsurgeon.errors import CompareError, RenderError, UnknownModuleError, UnknownNameError
from graphsurgeon.examples import FusedAttention, TinyGPT
from graphsurgeon.partition import call_index
from graphsurgeon.swap import swap_info

RTOL = ATOL = 1e-5


@pytest.fixture(scope="module")
def decoder():
    """A 4-layer TinyGPT in eval mode, its tokens and its program (not changed by the tests)."""
    torch.manual_seed(0)
    model = TinyGPT(n_layers=4).eval()
    tokens = model.example_input()
    return model, tokens, gs.export(model, (tokens,))


def drawn(program) -> tuple[list[str], list[str]]:
    """The node names and call names the fully open picture of ``program`` draws."""
    ids = re.findall(r'id="((?:node|cluster|module):[^"]+)"', gs.to_dot(program, collapse=None))
    nodes = [i.split(":", 1)[1] for i in ids if i.startswith("node:")]
    calls = [i.split(":", 1)[1] for i in ids if not i.startswith("node:")]
    return nodes, calls


def tolerance_ratio(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |a - b| / (atol + rtol |b|), b expected: written out here, apart from the library."""
    a, b = actual.double(), expected.double()
    return float(((a - b).abs() / (ATOL + RTOL * b.abs())).max())


def inputs_of(module: nn.Module, model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """What ``module`` receives when the eager ``model`` runs on ``tokens``."""
    seen = []
    handle = module.register_forward_pre_hook(lambda _, args: seen.append(args[0].clone()))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        handle.remove()
    return seen[0]


def test_the_error_overlay_marks_the_first_wrong_swap_and_nothing_before_it(decoder):
    model, tokens, ep = decoder
    k = 2
    gm = gs.swap(ep, {f"layers.{k}.attn": NoCausalMask(model.layers[k].attn)})
    assert not gs.verify(ep, gm, (tokens,))  # the precondition: it is wrong

    error = overlay_values(gm, (tokens,), kind="error")

    order = [n.name for n in gm.graph.nodes]
    call_node = swap_info(gm).call_nodes[f"layers.{k}.attn"]
    before = set(order[: order.index(call_node)])
    nodes, calls = drawn(gm)
    members = call_index(gm).members
    for name in nodes:
        if name in before:
            assert name in error.nodes, name  # every value drawn before it is a tensor here
            assert error.nodes[name] <= 1e-6, (name, error.nodes[name])
    for call in calls:
        if set(members[call]) <= before:
            assert error.calls[call] <= 1e-6, (call, error.calls[call])
    assert error.nodes[call_node] > 1e3 and error.calls[f"layers.{k}.attn"] > 1e3
    assert next(n for n in order if error.nodes.get(n, 0) > 1) == call_node
    # the wrong call's value is its outputs' error, checked against the eager modules
    x = inputs_of(model.layers[k].attn, model, tokens)
    with torch.no_grad():
        expected = tolerance_ratio(NoCausalMask(model.layers[k].attn)(x), model.layers[k].attn(x))
    assert error.nodes[call_node] == pytest.approx(expected, rel=1e-3)
    # and the output's is the programs' outputs' error
    with torch.no_grad():
        at_output = tolerance_ratio(gm(tokens), ep.module()(tokens))
    assert error.nodes["output"] == pytest.approx(at_output, rel=1e-6)


def test_own_error_tells_where_error_starts_from_where_it_spreads(decoder):
    model, tokens, ep = decoder
    wrong = NoCausalMask(model.layers[1].attn)
    faithful = FusedAttention(model.layers[3].attn)
    gm = gs.swap(ep, {"layers.1.attn": wrong, "layers.3.attn": faithful})
    info = swap_info(gm)
    error = overlay_values(gm, (tokens,), kind="error")
    own = overlay_values(gm, (tokens,), kind="own error")

    # the precondition: the error spreads, downstream kept nodes and the faithful call show it
    computed = {n.name for n in gm.graph.nodes if n.op == "call_function"}
    kept_after = [n for n in call_index(gm).members["layers.2.mlp"] if n in computed]
    assert kept_after and all(error.nodes[n] > 1 for n in kept_after)
    assert error.calls["layers.3.attn"] > 1
    # own error: every kept node 0, the wrong call large, the faithful call within tolerance
    calls = set(info.call_nodes.values())
    checks = {n.name for n in gm.graph.nodes if n.name.endswith("_checked")}
    assert all(v == 0.0 for n, v in own.nodes.items() if n not in calls | checks)
    assert own.calls["layers.1.attn"] > 1e3 and own.calls["layers.3.attn"] < 1
    # each call's own error is what the eager replacement does on the original's inputs
    for name, replacement in (("layers.1.attn", wrong), ("layers.3.attn", faithful)):
        layer = model.get_submodule(name)
        x = inputs_of(layer, model, tokens)
        with torch.no_grad():
            expected = tolerance_ratio(replacement(x), layer(x))
        assert own.calls[name] == pytest.approx(expected, rel=1e-3, abs=1e-3)


def test_latency_shares_of_the_forward_and_a_slow_call_stands_out(decoder):
    model, tokens, ep = decoder

    gm = gs.swap(ep, {"layers.1.mlp": Slow(copy.deepcopy(model.layers[1].mlp))})
    state = torch.random.get_rng_state()
    latency = overlay_values(gm, (tokens,), kind="latency", repeat=2)

    assert latency.unit == "share of the forward" and latency.aggregate == "sum"
    assert latency.forward_seconds >= 0.02
    call_node = swap_info(gm).call_nodes["layers.1.mlp"]
    assert latency.nodes[call_node] > 0.5 and latency.calls["layers.1.mlp"] > 0.5
    assert latency.top(1, of="nodes")[0][0] == call_node
    assert 0.8 <= math.fsum(latency.nodes.values()) <= 1.2
    members = call_index(gm).members["layers.0"]
    assert latency.calls["layers.0"] == pytest.approx(
        math.fsum(latency.nodes[n] for n in members if n in latency.nodes)
    )
    nodes, calls = drawn(gm)
    assert all(n in latency.nodes for n in nodes) and all(c in latency.calls for c in calls)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_an_exported_program_has_nothing_swapped(decoder):
    _, tokens, ep = decoder
    error = overlay_values(ep, kind="error")  # no run needed: the program against itself
    nodes, calls = drawn(ep)
    assert all(error.nodes[n] == 0.0 for n in nodes) and all(error.calls[c] == 0 for c in calls)
    assert "Nothing is swapped" in error.description
    latency = overlay_values(ep, (tokens,), kind="latency", repeat=1)
    assert all(n in latency.nodes for n in nodes)  # keyed by the program's own node names


def test_a_surgery_with_a_fused_call_is_valued_as_it_is_drawn(decoder):
    model, tokens, ep = decoder
    s = gs.Surgery(ep, args=(tokens,))
    s.fuse("layers.0.attn").swap("layers.2.attn", NoCausalMask(model.layers[2].attn))
    nodes, calls = drawn(s)
    for kind in ("error", "own error", "latency"):
        values = overlay_values(s, kind=kind, repeat=1)  # the Surgery's own inputs
        assert all(n in values.nodes for n in nodes), kind
        assert all(c in values.calls for c in calls), kind
    error = overlay_values(s, kind="error")
    assert error.calls["layers.0.attn"] == 0.0  # a fused call computes exactly its nodes
    assert error.calls["layers.2.attn"] > 1e3
    direct = overlay_values(s.module, (tokens,), kind="error")
    assert dict(direct.nodes) == dict(error.nodes)
    assert overlay_values(gs.Surgery(ep), kind="error").description.startswith("Nothing")


def test_random_ops_and_state_both_programs_draw_the_same_and_nothing_changes():
    torch.manual_seed(0)
    model = DropoutAfterBatchNorm().train()  # dropout draws, batch norm writes its statistics
    x = torch.randn(6, 4)
    ep = gs.export(model, (x,))
    gm = gs.swap(ep, {"drop": nn.Dropout(0.5), "b": copy.deepcopy(model.b)})
    twin = copy.deepcopy(gm)
    assert not torch.equal(twin(x), twin(x))  # the precondition: another random state differs
    state = torch.random.get_rng_state()
    buffers = {k: v.clone() for k, v in gm.named_buffers()}
    program = {k: v.clone() for k, v in ep.state_dict.items()}

    for kind in ("error", "own error"):
        values = overlay_values(gm, (x,), kind=kind)
        assert values.nodes and all(v == 0.0 for v in values.nodes.values()), kind
    overlay_values(gm, (x,), kind="latency", repeat=1)

    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(v, dict(gm.named_buffers())[k]) for k, v in buffers.items())
    assert all(torch.equal(v, ep.state_dict[k]) for k, v in program.items())


def test_values_of_your_own_are_checked_and_made_the_same_type():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    ep = gs.export(Shared(), (x,))
    given = overlay_values(ep, kind={"tanh": 2, "shared@1": torch.tensor(5.0), "shared@0": 1.5})
    assert isinstance(given, OverlayValues) and given.kind == "values"
    assert given.nodes == {"tanh": 2.0} and isinstance(given.nodes["tanh"], float)
    assert dict(given.calls) == {"shared": 1.5, "mid": 2.0, "shared@1": 5.0}  # model order
    whole = overlay_values(ep, kind={"shared": 3.0, "shared@1": 4.0})
    assert dict(whole.calls) == {
        "shared": 3.0,
        "shared@1": 4.0,
    }  # one call's wins over its module's
    summed = overlay_values(ep, kind={"linear": 1.0, "tanh": 2.0}, aggregate="sum")
    assert summed.calls["shared"] == 1.0 and summed.calls["mid"] == 2.0
    assert dict(overlay_values(ep, kind={"linear": 1.0}, aggregate=None).calls) == {}

    # a node or a module: the one error for an unknown name, as every entry point raises it
    with pytest.raises(UnknownNameError, match=r"no node or module 'shraed'.*'shared'") as info:
        overlay_values(ep, kind={"shraed": 1.0})
    assert isinstance(info.value, KeyError)
    with pytest.raises(UnknownNameError, match=r"'tahn'.*Did you mean 'tanh'"):
        overlay_values(ep, kind={"tahn": 1.0})
    with pytest.raises(
        UnknownModuleError, match=r"called 2 times \(shared, shared@1\).*'shared@2'"
    ):
        overlay_values(ep, kind={"shared@2": 1.0})
    with pytest.raises(RenderError, match=r"value for 'tanh' must be a number.*got a str"):
        overlay_values(ep, kind={"tanh": "high"})
    with pytest.raises(RenderError, match="got NaN"):
        overlay_values(ep, kind={"tanh": math.nan})
    with pytest.raises(RenderError, match="got a bool"):
        overlay_values(ep, kind={"tanh": True})
    with pytest.raises(RenderError, match="root module"):
        overlay_values(ep, kind={"": 1.0})


def test_mistakes_are_clear_errors(decoder):
    model, tokens, ep = decoder
    gm = gs.swap(ep, {"layers.0.mlp": copy.deepcopy(model.layers[0].mlp)})
    with pytest.raises(RenderError, match=r"unknown kind 'errors'\. Did you mean 'error'"):
        overlay_values(gm, (tokens,), kind="errors")
    with pytest.raises(RenderError, match=r"kind: expected 'error'.*got an int"):
        overlay_values(gm, (tokens,), kind=3)
    with pytest.raises(RenderError, match=r"runs the program: pass its inputs"):
        overlay_values(gm, kind="error")
    # inputs and objects are refused as by every entry point (graphsurgeon._program)
    with pytest.raises(gs.InputStructureError, match=r"args: expected a tuple"):
        overlay_values(gm, [tokens], kind="error")
    with pytest.raises(RenderError, match="rtol=-1"):
        overlay_values(gm, (tokens,), rtol=-1)
    with pytest.raises(RenderError, match="repeat=0"):
        overlay_values(gm, (tokens,), kind="latency", repeat=0)
    with pytest.raises(RenderError, match="aggregate='mean'"):
        overlay_values(gm, kind={"layers.0": 1.0}, aggregate="mean")
    with pytest.raises(gs.errors.NotAProgramError, match="got a Linear"):
        overlay_values(nn.Linear(2, 2), (tokens,))
    with pytest.raises(gs.errors.NotAProgramError, match=r"gs.swap or gs.fuse did not make"):
        overlay_values(torch.fx.symbolic_trace(nn.ReLU()), (tokens,))
    with pytest.raises(gs.GuardError):  # what the program refuses, it refuses here too
        overlay_values(gm, (torch.zeros(1, 70, dtype=torch.long),), kind="error")

    failing = gs.swap(ep, {"layers.1.mlp": Fails()})
    with pytest.raises(
        CompareError, match=r"swapped program failed at node 'swapped_layers_1_mlp'.*boom"
    ):
        overlay_values(failing, (tokens,), kind="error")


def test_it_shows_itself_and_reads_as_a_mapping(decoder):
    model, tokens, ep = decoder
    gm = gs.swap(ep, {"layers.1.attn": NoCausalMask(model.layers[1].attn)})
    error = overlay_values(gm, (tokens,))
    assert error.kind == "error" and error.unit == "x tolerance" and error.threshold == 1.0
    assert (error.rtol, error.atol) == (RTOL, ATOL)
    assert error["layers.1.attn"] == error.calls["layers.1.attn"]
    assert error["linear"] == 0.0 and "linear" in error and "nope" not in error
    assert error.get("nope") is None and len(error) == len(list(error))
    with pytest.raises(KeyError, match=r"no value for 'lienar'.*'linear'"):
        error["lienar"]
    ranked = error.top(3)
    assert [v for _, v in ranked] == sorted((v for _, v in ranked), reverse=True)
    assert ranked[0][1] == max(error.calls.values())
    text = str(error)
    assert text.startswith("error overlay") and "largest calls" in text
    bundle = error._repr_mimebundle_()
    assert bundle["text/plain"] == repr(error) and "beyond" in bundle["text/html"]
    with pytest.raises(AttributeError):
        error.kind = "latency"  # frozen
    with pytest.raises(TypeError):
        error.nodes["linear"] = 1.0  # read-only


def test_a_swapped_program_whose_statistics_were_written_shows_it():
    torch.manual_seed(0)
    model = DropoutAfterBatchNorm().train()
    x = torch.randn(6, 4)
    ep = gs.export(model, (x,))
    gm = gs.swap(ep, {"b": copy.deepcopy(model.b)})
    gm(x)  # a run in training mode: the swapped program's batch norm statistics move on
    assert not torch.equal(gm.get_buffer("norm.running_mean"), ep.state_dict["norm.running_mean"])
    error = overlay_values(gm, (x,), kind="error")
    own = overlay_values(gm, (x,), kind="own error")
    # compared as it is: its statistics are not the original's, and the overlay says where
    assert (
        error.nodes["b_norm_running_mean"] > 1
        and error.nodes["b_norm_num_batches_tracked"] == math.inf
    )
    assert own.nodes["batch_norm"] == 0.0  # on the original's statistics it computes the same


def test_the_profiled_copy_is_made_once_and_keeps_nothing_alive():
    import gc
    import weakref

    from graphsurgeon.checks import overlay

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    gm = gs.swap(gs.export(model, (x,)), {"1": nn.GELU()})
    overlay_values(gm, (x,), kind="latency", repeat=1)
    timed = overlay._TIMED[gm][1]
    overlay_values(gm, (x,), kind="latency", repeat=1)
    assert overlay._TIMED[gm][1] is timed  # made once
    collected = weakref.ref(gm)
    del gm
    gc.collect()
    assert collected() is None  # the cache of profiled copies does not keep the program alive


def test_a_fused_program_is_valued_as_drawn_from_its_own_graph_without_a_rewrite(monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(1, 2)
    ep = gs.export(Residual(), (x,))
    s = gs.Surgery(ep, args=(x,)).fuse("head").swap("lin", nn.Identity())
    program = s.module
    assert swap_info(program).fused == ("head",), "precondition: a fused call"
    from graphsurgeon.checks._exec import runnable_original

    runnable_original(ep)  # the original's one runnable copy, made once per program
    made = []
    real_init = torch.fx.GraphModule.__init__

    def counting_init(self, *args, **kwargs):
        made.append(type(self).__name__)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.GraphModule, "__init__", counting_init)
    error = overlay_values(s, kind="error")
    own = overlay_values(s, kind="own error")
    assert made == [], "valuing a fused program made a program: it ran the rewrite"
    monkeypatch.undo()
    nodes, calls = drawn(s)
    assert "input_1" in nodes and "linear_1" in nodes, "its own names, the fused call's nodes"
    for values in (error, own, overlay_values(s, kind="latency", repeat=1)):
        assert all(n in values.nodes for n in nodes), values.kind
        assert set(values.nodes) <= {n.name for n in program.graph.nodes} | {"linear_1"}
        assert all(c in values.calls for c in calls), values.kind
    # the fused call's own node: computed exactly as the original (its input moved: identity)
    with torch.no_grad():
        original = ep.module()(x)
        expected = tolerance_ratio(program(x), original)
    assert error.nodes["linear_1"] == pytest.approx(expected, rel=1e-6) and expected > 1
    assert own.nodes["linear_1"] == 0.0 and own.calls["lin"] > 1


# -- the gradient overlays ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def norms():
    """A 6-layer stack with a fused RMSNorm (a hand-written backward) in every place, two of
    them wrong in their backward only: layers.1 (a weight-gradient factor) and layers.4 (a
    missing mean term)."""
    torch.manual_seed(0)
    model = NormStack(dim=8, layers=6)
    x = torch.randn(2, 3, 8)
    s = gs.Surgery.from_model(model, (x,))
    for name, replacement in fused_norms(model, BACKWARD_BUGS).items():
        s.swap(name, replacement)
    return model, x, s


BACKWARD_BUGS = {"layers.1.norm": "weight factor", "layers.4.norm": "missing mean"}


def _autograd_ratio(original, replacement, x, upstream):
    """The worst gradient error of ``replacement`` against ``original`` at input ``x`` from
    ``upstream``, relative to the tolerance, by torch's own autograd."""
    worst = 0.0
    grads = []
    for module in (original, replacement):
        leaf = x.detach().requires_grad_(True)
        grads.append(torch.autograd.grad(module(leaf), (leaf, module.weight), upstream))
    for expected, actual in zip(*grads):
        allowed = expected.abs() * RTOL + ATOL
        worst = max(worst, float(((actual - expected).abs() / allowed).max()))
    return worst


def test_own_grad_error_lights_exactly_the_calls_whose_backward_is_wrong(norms):
    model, x, s = norms
    # the precondition: the forward is right everywhere, so no forward overlay can see it
    assert max(overlay_values(s, kind="error").calls.values()) == 0
    own = overlay_values(s, kind="own grad error")
    lit = {call for call, value in own.calls.items() if value > 1 and call.endswith("norm")}
    assert lit == set(BACKWARD_BUGS)
    assert own.kind == "own grad error" and own.unit == "x tolerance"
    # the value is the one torch's autograd gives on the eager modules, on the original's
    # values at the call's input and the original's gradient at its output
    captured = {}
    target = model.layers[4].norm
    handle = target.register_forward_hook(lambda m, a, out: captured.update(x=a[0], out=out))
    out = model(x)
    handle.remove()
    upstream = torch.autograd.grad(
        out, captured["out"], seeded_upstream(out.detach().requires_grad_())
    )[0]
    fused = s.module.get_submodule("layers.4.norm")
    expected = _autograd_ratio(target, fused, captured["x"], upstream)
    assert own.calls["layers.4.norm"] == pytest.approx(expected, rel=1e-3)


def test_grad_error_spreads_from_a_wrong_backward_to_everything_before_it(norms):
    _, _, s = norms
    grad = overlay_values(s, kind="grad error")
    calls = grad.calls
    # gradients flow from the outputs back: after the last wrong backward (layers.4) all is
    # right, at it and before it all is wrong
    assert calls["norm"] < 1 and calls["layers.5"] < 1  # a right backward: within tolerance
    assert all(calls[f"layers.{i}"] > 1 for i in range(5))
    assert grad["x"] > 1  # the input's gradient
    assert "gradients" in grad.description


def test_grad_overlays_draw_with_a_legend_and_on_an_exported_program_are_zero(norms, decoder):
    _, _, s = norms
    drawing = gs.draw(s, overlay="own grad error")
    assert drawing.overlay and "own grad error" in drawing._repr_html_()
    _, _, ep = decoder
    assert set(overlay_values(ep, kind="grad error").values()) == {0.0}
