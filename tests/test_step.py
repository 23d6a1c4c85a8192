"""Stepper: order, moves, breakpoints, errors, memory-light mode, on tiny models and TinyGPT."""

from __future__ import annotations

import re

import pytest
import torch
from helpers.models import Chain, NormedBlock, Shared
from helpers.view_models import (
    CleanedLog,
    DataDependent,
    DataDependentLog,
    Fusable,
    LongResidualChain,
    RaisesWhileBroken,
    Unstable,
    WritesInputThenLinear,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import graphsurgeon as gs
from graphsurgeon import _meta
from graphsurgeon.errors import (
    AlreadyRanError,
    GraphSurgeonError,
    UnknownModuleError,
    UnknownNameError,
)
from graphsurgeon.examples import FusedAttention
from graphsurgeon.partition import program_index
from graphsurgeon.render import graph_view
from graphsurgeon.step import (
    Breakpoint,
    NodeError,
    StepError,
    Stepper,
    StepResult,
    Summary,
    UnknownNodeError,
)
from graphsurgeon.swap import swap_info

# -- tiny models --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chain():
    torch.manual_seed(0)
    model = Chain().eval()
    x = torch.randn(2, 4)
    return model, x, gs.export(model, (x,))


@pytest.fixture(scope="module")
def gpt(tiny_gpt):
    model, tokens, ep = tiny_gpt
    swapped = gs.swap(ep, {"layers.0.attn": FusedAttention(model.layers[0].attn)})
    return model, tokens, ep, swapped


def names(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes]


def first_op(stepper: Stepper, module: str) -> str:
    """Where a move into a module call stops: its first op (the weights it reads come first)."""
    graph = {n.name: n for n in stepper.graph_module.graph.nodes}
    return next(name for name in stepper.nodes_of(module) if _meta.computes(graph[name]))


# -- order and the end result ---------------------------------------------------------------


def test_step_order_is_graph_order_and_the_end_result_is_the_programs(chain):
    model, x, ep = chain
    stepper = Stepper(ep, x)
    order = names(stepper.graph_module)
    assert stepper.total == len(order) > 3 and stepper.position == 0
    by_name = {node.name: node for node in stepper.graph_module.graph.nodes}
    ran = []
    while not stepper.done:
        assert stepper.current.name == order[stepper.position]
        result = stepper.step()
        # a step runs one op (the first, the inputs before the first op) and what carries or
        # checks values after it: it stops only before an op, or at the end
        ops = [name for name in result.ran if _meta.computes(by_name[name])]
        assert len(ops) == (1 if ran else 0)
        assert not ops or result.ran[0] == ops[0]
        assert stepper.done or _meta.computes(stepper.current)
        ran.extend(result.ran)
    assert ran == order and stepper.current is None and result.reason == "end"
    assert sum(map(_meta.computes, by_name.values())) >= 3  # precondition: steps had ops
    with torch.no_grad():
        assert torch.allclose(stepper.output, model(x))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(moves=st.lists(st.sampled_from(["1", "3", "over", "out", "continue"]), min_size=1))
def test_any_sequence_of_moves_runs_each_node_once_in_graph_order(chain, moves):
    _, x, ep = chain
    stepper = Stepper(ep, x)
    stepper.breakpoints.enter("act")  # so that "continue" does not always run to the end
    order = names(stepper.graph_module)
    ran = []
    for move in moves:
        if stepper.done:
            break
        if move in ("1", "3"):
            result = stepper.step(int(move))
        elif move == "over":
            result = stepper.step_over()
        elif move == "out":
            result = stepper.step_out()
        else:
            result = stepper.continue_()
        assert result.position == stepper.position
        ran.extend(result.ran)
    assert ran == order[: stepper.position]


def test_continue_to_the_end_matches_the_swapped_program_on_a_transformer(gpt):
    _, tokens, _, swapped = gpt
    stepper = Stepper(swapped, tokens)
    assert any(n.op == "call_module" for n in swapped.graph.nodes)  # a swapped call to step
    result = stepper.continue_()
    assert result.reason == "end" and result.ran == tuple(names(swapped))
    with torch.no_grad():
        assert torch.equal(stepper.output, swapped(tokens))


@settings(max_examples=15, deadline=None, derandomize=True)
@given(values=st.lists(st.floats(-10, 10), min_size=8, max_size=8))
def test_the_stepper_computes_what_the_program_computes_for_any_input(chain, values):
    model, _, ep = chain
    x = torch.tensor(values, dtype=torch.float32).reshape(2, 4)
    stepper = Stepper(ep, x)
    stepper.continue_()
    with torch.no_grad():
        assert torch.allclose(stepper.output, model(x), atol=1e-6)


def test_kwargs_map_onto_placeholders_by_name_and_reset_replays_the_run():
    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(2, 4)
    ep = gs.export(model, (x,), {"scale": 3.0})
    stepper = Stepper(ep, x=x, scale=3.0)
    first = stepper.continue_()
    output = stepper.output.clone()
    stepper.reset()
    assert stepper.position == 0 and len(stepper.env) == 0
    assert stepper.continue_().ran == first.ran
    assert torch.equal(stepper.output, output)
    with torch.no_grad():
        assert torch.allclose(output, model(x, scale=3.0))


# -- step_over, step_out, run_to ------------------------------------------------------------


def test_step_over_runs_exactly_the_modules_nodes(gpt):
    _, tokens, ep, _ = gpt
    stepper = Stepper(ep, tokens)
    before = stepper.run_to("layers.1.attn")
    attention = stepper.nodes_of("layers.1.attn")
    # the call's first op: its q projection's weights ran on the way
    first = attention.index(stepper.current.name)
    assert before.ran[-first:] == attention[:first] and first == 2
    assert stepper.current.target is torch.ops.aten.linear.default
    assert stepper.stack[-1] == "layers.1.attn.q"
    result = stepper.step_over()
    rest = len(attention) - first
    assert result.ran[:rest] == attention[first:]
    graph = {n.name: n for n in stepper.graph_module.graph.nodes}
    computed = [
        name for name in before.ran[-first:] + result.ran[:rest] if graph[name].op != "get_attr"
    ]
    assert computed == list(gs.partition(ep)["layers.1.attn"].nodes)
    # then what only carries values, up to the next op: the residual add
    assert not any(_meta.computes(graph[name]) for name in result.ran[rest:])
    assert stepper.module_of(stepper.current.name) == "layers.1"


def test_step_over_a_swapped_call_runs_the_call_and_its_check(gpt):
    _, tokens, _, swapped = gpt
    stepper = Stepper(swapped, tokens)
    stepper.run_to("layers.0.attn")
    call = swap_info(swapped).call_nodes["layers.0.attn"]
    assert stepper.current.name == call
    result = stepper.step_over()
    assert result.ran == stepper.nodes_of("layers.0.attn")
    # the call, what it must return (a constant), and the check of what it returned
    assert result.ran[0] == call and result.ran[-1] == f"{call}_checked" and len(result.ran) == 3


def test_step_over_a_plain_node_runs_one_node_and_step_out_leaves_the_call(gpt):
    _, tokens, ep, _ = gpt
    stepper = Stepper(ep, tokens)
    stepper.run_to("transpose")  # inside layers.0.attn, after its q projection
    assert stepper.stack == ("layers.0", "layers.0.attn")
    over = stepper.step_over()
    # the transpose, then the k projection's weights on the way to its op (no stops)
    assert over.ran[0] == "transpose" and stepper.current.target is torch.ops.aten.linear.default
    assert all(name.startswith("p_") for name in over.ran[1:])
    # at the k projection's entry, so in the attention's frame: step_out leaves the attention
    assert stepper.stack == ("layers.0", "layers.0.attn", "layers.0.attn.k")
    result = stepper.step_out()
    attention = stepper.nodes_of("layers.0.attn")
    assert result.ran[-1] == attention[-1] and "transpose" not in result.ran
    assert stepper.stack == ("layers.0",)
    out = stepper.step_out()
    assert stepper.nodes_of("layers.0")[-1] in out.ran and stepper.stack[0] == "layers.1"


def test_run_to_a_node_a_module_call_or_a_predicate():
    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(2, 4)
    stepper = Stepper(gs.export(model, (x,)), x)
    second = stepper.nodes_of("shared@1")
    assert second and set(second).isdisjoint(stepper.nodes_of("shared@0"))
    assert stepper.run_to("shared@1").reason == "target"
    assert stepper.current.name == second[0]
    assert stepper.run_to("shared@1").ran == ()  # already there: nothing runs
    stepper.reset()
    stepper.run_to(lambda node: node.target == torch.ops.aten.tanh.default)
    assert stepper.current.name == "tanh" and stepper.stack == ("mid",)
    stepper.run_to(node="mul")
    assert stepper.current.name == "mul"
    with pytest.raises(AlreadyRanError, match=r"already ran .*; reset\(\) to run from the start"):
        stepper.run_to("tanh")
    with pytest.raises(AlreadyRanError, match=r"no call of 'mid' starts") as behind:
        stepper.run_to("mid")
    assert (
        behind.value.what.startswith("no call of 'mid' starts") and "reset" not in behind.value.what
    )


# -- breakpoints ----------------------------------------------------------------------------


def test_node_enter_and_leave_breakpoints(gpt):
    _, tokens, ep, _ = gpt
    stepper = Stepper(ep, tokens)
    assert stepper.continue_().reason == "end"  # precondition: nothing stops it by itself
    stepper.reset()
    at_node = stepper.breakpoints.node("softmax_1")
    enter = stepper.breakpoints.enter("layers.1.mlp")
    leave = stepper.breakpoints.leave("layers.0.attn")
    assert len(stepper.breakpoints) == 3

    result = stepper.continue_()
    assert result.reason == "breakpoint" and result.breakpoints == (leave,)
    assert result.last == stepper.nodes_of("layers.0.attn")[-1]
    result = stepper.continue_()
    assert result.breakpoints == (at_node,) and stepper.current.name == "softmax_1"
    result = stepper.continue_()
    assert result.breakpoints == (enter,)
    assert stepper.current.name == first_op(stepper, "layers.1.mlp")
    assert stepper.continue_().reason == "end"

    stepper.breakpoints.remove(at_node)
    assert at_node not in stepper.breakpoints and len(stepper.breakpoints) == 2
    stepper.breakpoints.clear()
    stepper.reset()
    assert stepper.continue_().reason == "end"


def test_enter_breakpoint_on_a_module_stops_at_every_call():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    stepper = Stepper(gs.export(Shared(), (x,)), x)
    stepper.breakpoints.enter("shared")
    starts = [first_op(stepper, "shared@0"), first_op(stepper, "shared@1")]
    stops = []
    while stepper.continue_().reason == "breakpoint":
        stops.append(stepper.current.name)
    assert stops == starts


def test_the_nan_breakpoint_stops_at_the_first_node_producing_a_nan():
    model = Unstable()
    x = torch.tensor([[4.0, -1.0, 0.0]])
    with torch.no_grad():
        assert torch.isnan(model(x)).any()  # precondition: NaN reaches the output
    ep = gs.export(model, (x,))
    stepper = Stepper(ep, x)
    stepper.breakpoints.nan()
    result = stepper.continue_()
    assert result.reason == "breakpoint" and result.trigger == "sqrt"
    assert stepper.summary("sqrt").nan == 1 and stepper.summary("linear").nan == 0
    assert stepper.current.name == "log"  # stopped right after the culprit
    assert "NaN" in str(result) and "'sqrt'" in str(result)


def test_nan_ignores_inf_but_nan_or_inf_and_magnitude_catch_it():
    model = Unstable()
    x = torch.tensor([[4.0, 1.0, 0.0]])  # log(sqrt(0)) = -inf, and no NaN anywhere
    with torch.no_grad():
        output = model(x)
    assert torch.isinf(output).any() and not torch.isnan(output).any()
    ep = gs.export(model, (x,))
    stepper = Stepper(ep, x)
    stepper.breakpoints.nan()
    assert stepper.continue_().reason == "end"
    stepper.breakpoints.clear()
    stepper.breakpoints.nan_or_inf()
    stepper.reset()
    assert stepper.continue_().trigger == "log"
    stepper.breakpoints.clear()
    stepper.breakpoints.magnitude_over(1.5)
    stepper.reset()
    assert stepper.continue_().trigger == "x"  # the input itself holds 4.0


def test_a_custom_condition_sees_each_tensor_and_its_errors_are_reported(chain):
    _, x, ep = chain
    stepper = Stepper(ep, x)
    seen = []
    stepper.breakpoints.condition(lambda t: seen.append(t.shape) or False, label="never")
    # every node yields one tensor but the input check and the guard it reads
    assert stepper.continue_().reason == "end" and len(seen) == stepper.total - 2
    stepper.breakpoints.clear()
    stepper.breakpoints.condition(lambda t: t.missing_attribute, label="broken")
    stepper.reset()
    with pytest.raises(StepError, match=r"raised AttributeError"):
        stepper.continue_()
    assert stepper.position == 1  # the placeholder ran; the stepper is still usable
    stepper.breakpoints.clear()
    assert stepper.continue_().reason == "end"


# -- errors ---------------------------------------------------------------------------------


def test_an_exception_stops_at_the_node_keeps_the_error_and_the_stepper_recovers(chain):
    model, x, ep = chain
    flaky = RaisesWhileBroken()
    swapped = gs.swap(ep, {"act": flaky})
    stepper = Stepper(swapped, x)
    call = swap_info(swapped).call_nodes["act"]
    with pytest.raises(NodeError, match=f"while executing node '{call}'.*in module 'act'") as info:
        stepper.continue_()
    error = info.value
    assert stepper.error is error and error.node == call and error.call == "act"
    assert isinstance(error.cause, RuntimeError) and error.__cause__ is error.cause
    assert stepper.current.name == call and not stepper.done
    assert "linear" in stepper.env and call not in stepper.env
    assert "raised RuntimeError" in repr(stepper)
    flaky.broken = False  # fix the cause, then carry on from where it stopped
    assert stepper.continue_().reason == "end" and stepper.error is None
    with torch.no_grad():
        assert torch.allclose(stepper.output, model(x))
    stepper.reset()
    assert stepper.continue_().reason == "end"


def test_an_aten_op_failing_is_caught_the_same_way():
    #   tokens ──▶ embed (Embedding, 10 rows) ──▶ out;  token 12 is out of range
    model = nn.Sequential(nn.Embedding(10, 4))
    ep = gs.export(model, (torch.tensor([[1, 2]]),))
    stepper = Stepper(ep, torch.tensor([[1, 12]]))
    with pytest.raises(NodeError, match=r"while executing node 'embedding'.*in module '0'"):
        stepper.continue_()
    assert stepper.current.name == "embedding" and stepper.env["p_0_weight"].shape == (10, 4)


def test_inputs_the_program_refuses_stop_at_its_input_check(chain):
    _, _, ep = chain
    stepper = Stepper(ep, torch.randn(2, 5))  # the program was exported for 4 features
    with pytest.raises(NodeError, match=r"node 'check_inputs'.*dimension 1 is 5.*exported for 4"):
        stepper.continue_()
    assert isinstance(stepper.error.cause, gs.GuardError)


def test_user_errors_name_the_object_and_what_to_do(chain):
    model, x, ep = chain
    # the one refusal of every entry point that takes a program (was a StepError)
    with pytest.raises(gs.errors.NotAProgramError, match=r"a model: export it first"):
        Stepper(model, x)
    with pytest.raises(StepError, match=r"takes"):
        Stepper(ep, x, x)
    stepper = Stepper(ep, x)
    with pytest.raises(StepError, match=r"at least 1"):
        stepper.step(0)
    with pytest.raises(UnknownNodeError, match=r"Did you mean 'linear'"):
        stepper.summary("linaer")
    with pytest.raises(UnknownModuleError, match=r"Did you mean 'first'"):
        stepper.breakpoints.enter("frist")
    with pytest.raises(UnknownNodeError, match=r"has not run yet"):
        stepper.env["linear"]
    with pytest.raises(StepError, match=r"not finished"):
        _ = stepper.output
    stepper.continue_()
    with pytest.raises(StepError, match=r"reset"):
        stepper.step()
    assert issubclass(StepError, GraphSurgeonError) and issubclass(UnknownNodeError, KeyError)


def test_a_submodule_of_a_swapped_call_cannot_be_stepped_into(gpt):
    _, tokens, _, swapped = gpt
    stepper = Stepper(swapped, tokens)
    with pytest.raises(
        UnknownModuleError, match=r"inside the swapped call 'layers.0.attn'.*step_into"
    ):
        stepper.breakpoints.enter("layers.0.attn.q")
    # a container is no longer refused: it stands for the calls it covers (see below)
    assert stepper.run_to("layers").reason == "target" and stepper.stack[0] == "layers.0"


def test_run_to_a_container_runs_to_the_next_call_it_covers(gpt):
    # "layers" (an nn.ModuleList) has no call of its own: as a highlight of it does, it stands
    # for the outermost calls of its submodules (ProgramIndex.calls_covered, the one reading)
    _, tokens, ep, swapped = gpt
    assert program_index(ep).calls_covered("layers") == ("layers.0", "layers.1")
    assert graph_view(ep, highlight="layers").highlighted == ("layers.0", "layers.1")
    for program in (ep, swapped):
        stepper = Stepper(program, tokens)
        layers = stepper.nodes_of("layers.0") + stepper.nodes_of("layers.1")
        assert stepper.nodes_of("layers") == layers
        assert stepper.run_to("layers").reason == "target"
        assert stepper.stack[0] == "layers.0" and stepper.current.name == first_op(
            stepper, "layers.0"
        )
        assert stepper.run_to("layers").ran == ()  # already there: nothing runs
        stepper.run_to("layers.0.mlp")  # past the first layer's entry: the next is the second's
        assert stepper.run_to(module="layers").reason == "target"
        assert stepper.current.name == first_op(stepper, "layers.1")
        stepper.run_to("layers.1.mlp")
        with pytest.raises(AlreadyRanError, match=r"no call of 'layers' starts"):
            stepper.run_to("layers")
    stepper = Stepper(ep, tokens)
    stepper.breakpoints.enter("layers")  # each call it covers: each layer
    assert stepper.continue_().reason == "breakpoint" and stepper.stack[0] == "layers.0"
    assert stepper.continue_().reason == "breakpoint" and stepper.stack[0] == "layers.1"
    assert stepper.continue_().reason == "end"


def test_a_container_or_the_root_is_refused_where_every_entry_point_refuses_it(chain):
    model, x, _ = chain
    spare = Chain().eval()
    spare.load_state_dict(model.state_dict())
    spare.unused = nn.ModuleList([nn.Linear(4, 4)])  # a container nothing calls
    ep = gs.export(spare, (x,))
    stepper = Stepper(ep, x)
    why = program_index(ep).why_no_calls("unused")
    with pytest.raises(UnknownModuleError, match=re.escape(why)):
        stepper.run_to("unused")
    with pytest.raises(gs.errors.NotSwappableError, match=re.escape(why)):
        gs.swap(ep, {"unused": nn.Identity()})
    # the root is the whole program: the picture and fuse refuse it too
    with pytest.raises(UnknownModuleError, match=r"the root module '' is the whole program"):
        stepper.run_to("")
    with pytest.raises(UnknownModuleError, match=r"the root module '' is the whole program"):
        stepper.breakpoints.enter("")
    with pytest.raises(gs.errors.RenderError, match=r"the root module ''"):
        gs.to_dot(ep, highlight="")
    assert stepper.position == 0, "a refused move runs nothing"


def test_the_stepper_and_the_overlay_walk_run_nodes_through_one_runner(monkeypatch):
    """One node-by-node runner (checks._exec.NodeRunner) for the stepper and the overlays: on
    the same program and inputs, the overlay's walk sees at every node the value the stepper's
    env holds, inside a fused call too (the module-call handling), on private copies of the
    buffers the run writes (BatchNorm statistics in training mode)."""
    from graphsurgeon.checks._exec import NodeRunner, RandomState, bind_inputs
    from graphsurgeon.checks.overlay import _Walk, overlay_values

    made: list[torch.fx.GraphModule] = []
    make = NodeRunner.__init__

    def recording(self, gm, *args, **kwargs):
        made.append(gm)
        make(self, gm, *args, **kwargs)

    monkeypatch.setattr(NodeRunner, "__init__", recording)
    torch.manual_seed(0)
    model, x = NormedBlock().train(), torch.randn(4, 3)
    program = gs.fuse(gs.export(model, (x,)), "block")
    call = swap_info(program).call_nodes["block"]
    fused_module = program.get_submodule(swap_info(program).installed_at["block"])

    walk = _Walk(NodeRunner(program, bind_inputs(program, (x,), {})), RandomState(), "program")
    walk.expand = {call}
    walked, walked_inside = {}, {}
    while (step := walk.step()) is not None:
        walked[step[0].name] = step[1]
        walked_inside.update((node.name, value) for node, value in walk.inner)
        walk.inner = []

    stepper = Stepper(program, x)
    assert made[-1] is program, "the stepper runs its program through the runner"
    stepper.breakpoints.node(f"block/{next(reversed(fused_module.graph.nodes))}")
    stepper.continue_()
    assert stepper.frames == ("block",)  # stopped before the fused call's output
    inside = dict(stepper.env)
    stepper.continue_()
    outside = dict(stepper.env)

    assert walked.keys() == outside.keys() and walked_inside.keys() <= inside.keys()
    assert len(walked_inside) >= 5, "precondition: the fused call's own nodes were walked"
    for seen, kept in ((walked, outside), (walked_inside, inside)):
        for name, value in seen.items():
            leaves, spec = torch.utils._pytree.tree_flatten(value)
            kept_leaves, kept_spec = torch.utils._pytree.tree_flatten(kept[name])
            assert spec == kept_spec, name
            for a, b in zip(leaves, kept_leaves):
                same = torch.equal(a, b) if isinstance(a, torch.Tensor) else a is b or a == b
                assert same, name
    torch.testing.assert_close(
        walk.runner.state_of(walk.runner.gm.graph.find_nodes(op="call_module")[0]),
        stepper._interpreter.private_buffers[str(swap_info(program).installed_at["block"])],
    )
    # and the overlays made from the program walk it with the same runner
    made.clear()
    overlay_values(program, (x,), kind="error")
    assert program in made and any(gm is fused_module for gm in made)


def test_a_node_that_is_also_a_module_must_be_disambiguated():
    #   x ──▶ relu (module named "relu") ──▶ relu (the aten node, also named "relu") ──▶ out
    model = nn.Sequential()
    model.add_module("relu", nn.ReLU())
    x = torch.randn(3)
    stepper = Stepper(gs.export(model, (x,)), x)
    assert stepper.module_of("relu") == "relu"  # precondition: a node and a module, one name
    with pytest.raises(StepError, match=r"both a node and a module"):
        stepper.run_to("relu")
    assert stepper.run_to(module="relu").reason == "target"


# -- values: env, summaries, memory-light mode ------------------------------------------------


def test_env_is_a_read_only_view_by_node_name(chain):
    _, x, ep = chain
    stepper = Stepper(ep, x)
    stepper.run_to("relu")
    assert list(stepper.env)[-1] == "linear" and len(stepper.env) == stepper.position
    assert stepper.env.get("relu") is None and "relu" not in stepper.env
    with pytest.raises(TypeError):
        stepper.env["linear"] = 1  # type: ignore[index]


def test_summary_of_tensors_and_of_other_values():
    summary = Summary.of(torch.tensor([[1.0, -3.0], [float("inf"), float("nan")]]), name="t")
    assert summary.shape == (2, 2) and summary.dtype == "float32" and summary.device == "cpu"
    assert (summary.min, summary.max, summary.mean, summary.std) == (-3.0, 1.0, -1.0, 2.0)
    assert (summary.nan, summary.inf) == (1, 1) and not summary.finite
    assert str(summary) == (
        "t: Tensor[2, 2] float32 cpu  min -3  max 1  mean -1  std 2  nan 1  inf 1"
    )
    integers = Summary.of(torch.tensor([1, 2, 3]))
    assert integers.dtype == "int64" and (integers.min, integers.max, integers.mean) == (1, 3, 2)
    assert Summary.of(torch.tensor([True, False])).mean == 0.5
    assert Summary.of(torch.empty(0)).min is None
    meta = Summary.of(torch.empty(2, device="meta"), name="m")
    assert meta.shape == (2,) and not meta.measured
    assert str(meta) == "m: Tensor[2] float32 meta  no values", (
        "not 'nan 0 inf 0': nothing was looked at"
    )
    assert meta.row()[-1] == "no values"
    assert str(Summary.of(16, name="size")) == "size: int 16"
    pair = Summary.of((torch.ones(2), None), name="pair")
    assert pair.text == "(Tensor[2] float32, None)" and not pair.is_tensor


def test_memory_light_mode_keeps_only_live_values_and_every_summary(gpt):
    _, tokens, ep, _ = gpt
    full = Stepper(ep, tokens)
    full.run_to("layers.1")
    light = Stepper(ep, tokens)
    light.memory_light = True
    light.run_to("layers.1")
    assert len(full.env) == full.position and len(light.env) < full.position
    graph = light.graph_module.graph
    live = {n.name for n in graph.nodes if any(light.position <= _at(light, u) for u in n.users)}
    state = {n.name for n in graph.nodes if n.op == "get_attr"}  # held by the module anyway
    # exactly what later nodes still need, and the parameters
    assert set(light.env) == (live | state) & set(full.env)
    assert len(set(light.env) - state) < 10
    for name in full.env:
        assert light.summary(name) == full.summary(name)
    with pytest.raises(UnknownNodeError, match=r"dropped in memory-light mode"):
        light.env["embedding"]
    light.continue_()
    full.continue_()
    assert [n for n in light.env if n not in state] == ["output"]
    assert torch.equal(light.output, full.output)


def _at(stepper: Stepper, node: torch.fx.Node) -> int:
    return list(stepper.graph_module.graph.nodes).index(node)


def test_switching_to_memory_light_mid_run_drops_what_is_dead(chain):
    _, x, ep = chain
    stepper = Stepper(ep, x)
    stepper.run_to("last")
    assert "linear" in stepper.env  # used by relu only, which already ran
    stepper.memory_light = True
    assert "linear" not in stepper.env and "relu" in stepper.env
    assert stepper.summary("linear").shape == (2, 4)


@pytest.fixture(scope="module")
def deep():
    torch.manual_seed(0)
    model = LongResidualChain().eval()
    x = torch.randn(2, 3)
    return model, x, gs.export(model, (x,))


def test_by_default_a_stepper_keeps_the_needed_and_the_recent_values_and_says_how_to_keep_more(
    deep,
):
    #   x ─▶ blocks.0 ─▶ ... ─▶ blocks.149 ─▶ head ─▶ log: ~900 nodes, 128 kept values
    model, x, ep = deep
    stepper = Stepper(ep, x)
    assert stepper.keep == "recent" and not stepper.memory_light
    stepper.run_to("blocks.120")
    state = {n.name for n in stepper.graph_module.graph.nodes if n.op == "get_attr"}
    assert 0 < len(set(stepper.env) - state) <= 130  # bounded: the recent window and what is live
    ran = names(stepper.graph_module)[: stepper.position]
    assert set(ran[-5:]) <= set(stepper.env)  # the recent ones, for the panel
    with pytest.raises(UnknownNodeError) as refused:
        stepper.env["linear"]
    message = str(refused.value)
    assert isinstance(refused.value, GraphSurgeonError) and isinstance(refused.value, KeyError)
    assert "'linear'" in message and "st.keep = 'all'" in message and "reset()" in message
    assert "linear" not in stepper.env and stepper.env.get("linear") is None
    husk = stepper.summary("linear")  # its shape and dtype, from the program
    assert husk.shape == (2, 3) and husk.dtype == "float32" and not husk.measured
    assert str(husk).endswith("value not kept") and husk.row()[-1] == "value not kept"
    stepper.continue_()
    with torch.no_grad():
        torch.testing.assert_close(stepper.output, model(x), equal_nan=True)
    with pytest.raises(UnknownNodeError, match=r"'p_blocks_0_0_weight'|has not run"):
        Stepper(ep, x).env["p_blocks_0_0_weight"]


def test_keep_all_keeps_every_value_and_names_keep_those_on_top_of_the_recent(deep):
    _, x, ep = deep
    everything = Stepper(ep, x)
    everything.keep = "all"
    everything.continue_()
    assert len(everything.env) == everything.total

    chosen = Stepper(ep, x)
    chosen.keep = ["linear", "blocks.1"]
    assert chosen.keep == ("linear", "blocks.1")
    chosen.continue_()
    for name in ["linear", *chosen.nodes_of("blocks.1")]:
        assert torch.equal(chosen.env[name], everything.env[name]), name
    assert "linear_2" not in chosen.env  # blocks.2's: neither named nor recent
    with pytest.raises(UnknownNameError, match=r"blocks\.1000|did you mean"):
        chosen.keep = ["blocks.1000"]
    with pytest.raises(StepError, match=r"'recent', 'all', 'needed'"):
        chosen.keep = "everything"
    assert chosen.keep == ("linear", "blocks.1"), "a refused setting changes nothing"

    switched = Stepper(ep, x)  # from all to recent mid-run: what is old goes at once
    switched.keep = "all"
    switched.run_to("blocks.140")
    assert "linear" in switched.env
    switched.keep = "recent"
    assert "linear" not in switched.env and len(switched.env) < switched.position
    assert switched.continue_().reason == "end"


def test_breakpoints_and_step_into_work_on_values_kept_by_default(deep):
    model, x, ep = deep
    stepper = Stepper(ep, x)
    stepper.breakpoints.nan()
    result = stepper.continue_()
    assert result.reason == "breakpoint" and result.trigger == "log"
    assert stepper.summary("log").nan > 0 and stepper.summary("linear_150").measured
    assert torch.isnan(stepper.env["log"]).any()

    swapped = gs.swap(ep, {"blocks.149": model.blocks[149]})
    stepper = Stepper(swapped, x)
    stepper.run_to("blocks.149")
    assert stepper.step_into().note == "entered swapped call 'blocks.149'"
    stepper.step_out()
    assert stepper.frames == () and stepper.continue_().reason == "end"
    with torch.no_grad():
        torch.testing.assert_close(stepper.output, model(x), equal_nan=True)


# -- program kinds and the user's objects -------------------------------------------------


def test_every_kind_of_program_can_be_stepped(chain):
    model, x, ep = chain

    class HasModule:  # stands for an object with a current .module, e.g. a Surgery
        module = gs.swap(ep, {})

    programs = [ep, gs.swap(ep, {}), ep.module(), torch.fx.symbolic_trace(model), HasModule()]
    for program in programs:
        stepper = Stepper(program, x)
        stepper.breakpoints.enter("act")
        assert stepper.continue_().reason == "breakpoint", type(program).__name__
        stepper.continue_()
        with torch.no_grad():
            assert torch.allclose(stepper.output, model(x)), type(program).__name__


def test_stepping_leaves_the_inputs_the_program_and_its_modules_as_they_were():
    #   x ──▶ x.add_(1) (in place, on the input) ──▶ lin ──▶ out
    model = WritesInputThenLinear()
    x = torch.zeros(1, 2)
    ep = gs.export(model, (x.clone(),))
    replacement = nn.Linear(2, 2)
    swapped = gs.swap(ep, {"lin": replacement})
    before = [n.format_node() for n in swapped.graph.nodes]
    stepper = Stepper(swapped, x)
    stepper.continue_()
    first = stepper.output.clone()
    stepper.reset()
    stepper.continue_()
    assert torch.equal(x, torch.zeros(1, 2))  # the user's input was never written
    assert torch.equal(stepper.output, first)  # each run got fresh inputs
    assert [n.format_node() for n in swapped.graph.nodes] == before
    assert not replacement._forward_hooks and not replacement._forward_pre_hooks


def test_step_result_reads_well():
    result = StepResult(("a", "b", "c", "d"), 4, "step")
    assert str(result) == "ran 4 nodes (a .. d)" and result.last == "d"
    assert str(StepResult((), 0, "target")) == "ran nothing"


def test_a_program_that_updates_its_buffers_runs_on_private_copies():
    #   x ──▶ lin ──▶ norm (BatchNorm1d, training: updates running statistics) ──▶ act ──▶ out
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.ReLU()).train()
    x = torch.randn(4, 3)
    swapped = gs.swap(gs.export(model, (x,)), {"2": nn.ReLU()})
    mean = swapped.get_buffer("1.running_mean")
    before = mean.clone()
    stepper = Stepper(swapped, x)
    stepper.continue_()
    first = stepper.output.clone()
    stepper.reset()
    stepper.continue_()
    assert torch.equal(mean, before) and torch.equal(stepper.output, first)
    assert not torch.equal(stepper.env["b_1_running_mean"], before)  # it did run the update
    with torch.no_grad():
        swapped(x)
    assert not torch.equal(mean, before)  # precondition: calling the program does update it


# -- step_into: fused and swapped calls ------------------------------------------------------


def test_step_into_a_fused_call_steps_through_the_programs_own_nodes(gpt):
    model, tokens, ep, _ = gpt
    fused = gs.fuse(ep, "layers.1.attn")
    stepper = Stepper(fused, tokens)
    stepper.run_to("layers.1.attn")
    call = stepper.current
    assert call.op == "call_module", "precondition: the fused call is one node here"
    entered = stepper.step_into()
    assert entered.ran == () and entered.note == "entered fused call 'layers.1.attn'"
    assert stepper.frames == ("layers.1.attn",)
    # entering binds the call's inputs and weights: the first stop is its first op
    assert stepper.stack == ("layers.1", "layers.1.attn", "layers.1.attn.q")
    assert stepper.current.target is torch.ops.aten.linear.default
    inside = stepper.run_to("layers.1.attn.k")
    assert stepper.stack == ("layers.1", "layers.1.attn", "layers.1.attn.k")
    # the nodes are the program's, with its names, and compute the program's values
    original = Stepper(ep, tokens)
    original.run_to(stepper.current.name)
    for name in inside.ran:
        if name in original.env and name != "x":
            assert torch.equal(stepper.env[name], original.env[name]), name
    part = gs.partition(ep)["layers.1.attn"]
    left = stepper.step_out()
    assert left.note == "left fused call 'layers.1.attn'" and left.last == call.name
    assert stepper.frames == () and stepper.current.name != call.name
    assert set(part.nodes) <= set(inside.ran + left.ran) | {"x"}
    stepper.continue_()
    assert torch.equal(stepper.output, fused(tokens))
    assert torch.equal(stepper.output, model(tokens))


def test_step_into_a_swapped_call_steps_through_the_replacements_graph(gpt):
    _, tokens, _, swapped = gpt
    stepper = Stepper(swapped, tokens)
    stepper.run_to("layers.0.attn")
    result = stepper.step_into()
    assert result.note == "entered swapped call 'layers.0.attn'"
    # its inputs and weights are bound on the way in: the first stop is its first op, in the
    # replacement's own module (named as the replacement names it), an aten op
    assert stepper.frames == ("layers.0.attn",) and stepper.position > 0
    assert stepper.stack == ("layers.0", "layers.0.attn", "layers.0.attn.qkv")
    assert stepper.current.target == torch.ops.aten.linear.default, "aten ops, not eager code"
    assert stepper.run_to("qkv").ran == (), "already in it"
    assert "in swapped call 'layers.0.attn'" in stepper.where()
    finished = stepper.continue_()
    assert finished.reason == "end" and stepper.frames == ()
    with torch.no_grad():
        expected = swapped(tokens)
    torch.testing.assert_close(stepper.output, expected)


def test_a_replacement_that_does_not_export_is_stepped_over_saying_why(chain):
    _, x, ep = chain
    swapped = gs.swap(ep, {"act": DataDependent()})
    stepper = Stepper(swapped, x)
    stepper.run_to("act")
    call = stepper.current.name
    result = stepper.step_into()
    assert result.ran[0] == call and stepper.frames == ()
    assert not any(_meta.computes(stepper._layout.by_name[n]) for n in result.ran[1:])
    assert "stepped over 'act' (it ran as one node)" in result.note
    assert "does not export" in result.note
    stepper.continue_()
    torch.testing.assert_close(stepper.output, swapped(x))


def test_a_replacement_that_does_not_export_writes_nothing_to_stderr(chain, capfd):
    import logging
    import warnings

    _, x, ep = chain
    swapped = gs.swap(ep, {"act": DataDependent()})
    stepper = Stepper(swapped, x)
    stepper.run_to("act")
    levels = {n: logging.getLogger(n).level for n in ("torch", "torch.export", "torch._dynamo")}
    filters = list(warnings.filters)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)  # torch's loggers do not propagate to the root
    handler.emit = records.append
    shapes = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    shapes.addHandler(handler)
    capfd.readouterr()
    try:
        result = stepper.step_into()
    finally:
        shapes.removeHandler(handler)
    # torch printed the partial graph of the failed export and logged a warning about it
    assert capfd.readouterr().err == "" and records == []
    assert "stepped over 'act'" in result.note and "GuardOnDataDependentSymNode" in result.note
    assert {n: logging.getLogger(n).level for n in levels} == levels
    assert warnings.filters == filters
    stepper.continue_()
    torch.testing.assert_close(stepper.output, swapped(x))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_a_torchscript_replacement_is_stepped_over_saying_so(chain):
    _, x, ep = chain
    swapped = gs.swap(ep, {"act": torch.jit.script(nn.GELU())})
    stepper = Stepper(swapped, x)
    stepper.run_to("act")
    result = stepper.step_into()
    assert stepper.frames == ()
    # was "its replacement RecursiveScriptModule does not export ... (ExportError: ...
    # ValueError: Exporting a ScriptModule is not supported. Maybe try ... TS2EPConverter"
    assert "is a TorchScript module (scripted GELU)" in result.note
    assert "swap the eager module" in result.note
    stepper.continue_()
    torch.testing.assert_close(stepper.output, swapped(x))


def test_step_into_a_plain_node_is_a_step_and_reset_leaves_the_call(gpt):
    _, tokens, _, swapped = gpt
    stepper = Stepper(swapped, tokens)
    first = stepper.current.name
    assert stepper.step_into().ran[0] == first, "a node that is no call: one step"
    stepper.run_to("layers.0.attn")
    stepper.step_into()
    stepper.step(2)
    stepper.reset()
    assert stepper.frames == () and stepper.position == 0


def test_a_condition_breakpoint_fires_inside_an_entered_call():
    #   x ──▶ proj ──▶ sqrt (NaN for negatives) ──▶ log ──▶ + 1, proj..log fused as "proj"
    torch.manual_seed(0)

    model, x = Fusable(), torch.tensor([[1.0, -1.0, 2.0]])
    fused = gs.fuse(gs.export(model, (x,)), "body")
    stepper = Stepper(fused, x)
    stepper.breakpoints.nan()
    stepper.run_to("body")
    stepper.step_into()
    result = stepper.continue_()
    assert result.reason == "breakpoint" and result.trigger == "sqrt"
    assert stepper.frames == ("body",), "it stopped inside the call"
    assert stepper.summary("sqrt").nan == 1


def test_a_fused_call_that_updates_buffers_writes_the_steppers_private_copies():
    #   x ──▶ block (Linear, BatchNorm1d in training) fused ──▶ head ──▶ out
    torch.manual_seed(0)
    model, x = NormedBlock().train(), torch.randn(4, 3)
    fused = gs.fuse(gs.export(model, (x,)), "block")
    block = swap_info(fused).calls["block"]
    mean = block.get_buffer("1.running_mean")
    before = mean.clone()
    stepper = Stepper(fused, x)
    stepper.run_to("block")
    stepper.step_into()
    stepper.continue_()
    assert torch.equal(mean, before), "the program's buffers are untouched"
    updated = stepper._interpreter.private_buffers[swap_info(fused).installed_at["block"]]
    expected = fused(x)  # the real run: updates the fused module's statistics
    assert not torch.equal(mean, before), "precondition: a run updates the statistics"
    torch.testing.assert_close(stepper.output, expected)
    torch.testing.assert_close(updated["1.running_mean"], mean)


# -- inside replacements: names, breakpoints, conditions, and no stops in the glue -------------


def test_run_to_a_node_inside_a_replacement_enters_the_call(chain):
    model, x, ep = chain
    swapped = gs.swap(ep, {"act": CleanedLog()})
    stepper = Stepper(swapped, x)
    assert stepper.call_graph is None
    result = stepper.run_to("act/mul")  # the replacement's own node, as its graph names it
    assert result.reason == "target" and stepper.frames == ("act",)
    assert stepper.current.name == "mul" and stepper.current.target is torch.ops.aten.mul.Tensor
    with torch.no_grad():
        expected = torch.log(torch.relu(model.first(x)))
    torch.testing.assert_close(stepper.env["log"], expected)
    assert stepper.continue_().reason == "end"
    torch.testing.assert_close(stepper.output, swapped(x))
    stepper.reset()
    with pytest.raises(UnknownNameError, match=r"inside call 'act'.* no node or module 'nope'"):
        stepper.run_to("act/nope")


def test_a_breakpoint_inside_a_replacement_stops_there_from_anywhere(chain):
    _, x, ep = chain
    swapped = gs.swap(ep, {"act": CleanedLog()})
    stepper = Stepper(swapped, x)
    inner = stepper.breakpoints.node("act/mul")
    result = stepper.continue_()
    assert result.reason == "breakpoint" and result.breakpoints == (Breakpoint("node", "mul"),)
    assert stepper.frames == ("act",) and stepper.current.name == "mul"
    assert stepper.current.graph is stepper.call_graph.graph  # what a view draws inside
    assert inner in stepper.breakpoints
    assert stepper.continue_().reason == "end"
    # from the call node itself (a move never stops where it starts, but it runs the call)
    stepper.reset()
    stepper.run_to("act")
    assert stepper.current.op == "call_module" and stepper.frames == ()
    assert stepper.step().reason == "breakpoint" and stepper.current.name == "mul"
    # a name the replacement's graph does not have is said when the call is entered
    stepper.breakpoints.clear()
    stepper.breakpoints.node("act/nope")
    stepper.reset()
    result = stepper.continue_()
    assert "'act/nope' names no node of its graph here" in result.note


def test_the_nan_or_inf_breakpoint_watches_inside_replacements(chain):
    model, x, ep = chain
    swapped = gs.swap(ep, {"act": CleanedLog()})
    with torch.no_grad():
        output = swapped(x)
        made = torch.log(torch.relu(model.first(x)))
    assert torch.isfinite(output).all() and not torch.isfinite(made).all()  # precondition
    stepper = Stepper(swapped, x)
    stepper.breakpoints.nan_or_inf()
    result = stepper.continue_()
    # was "end": the call ran as one node, and its output is finite
    assert result.reason == "breakpoint" and result.trigger == "log"
    assert stepper.frames == ("act",) and stepper.current.name == "mul"
    assert not torch.isfinite(stepper.env["log"]).all()
    triggers = []
    while (result := stepper.continue_()).reason == "breakpoint":
        triggers.append(result.trigger)
    assert triggers == ["mul"]  # -inf * 0.5, then nan_to_num cleans it up
    torch.testing.assert_close(stepper.output, output)


def test_a_condition_inside_a_replacement_that_does_not_export_stops_after_its_call(chain):
    _, x, ep = chain
    swapped = gs.swap(ep, {"act": DataDependentLog()})
    stepper = Stepper(swapped, x)
    stepper.breakpoints.nan_or_inf()
    result = stepper.continue_()
    call = swap_info(swapped).call_nodes["act"]
    assert result.reason == "breakpoint" and result.trigger == call and stepper.frames == ()
    assert "inside 'act', at aten.log.default" in result.note and "does not export" in result.note
    assert stepper.continue_().reason == "end"
    torch.testing.assert_close(stepper.output, swapped(x))


def test_steps_never_stop_in_the_glue_around_swapped_calls(gpt):
    _, tokens, _, swapped = gpt
    stepper = Stepper(swapped, tokens)
    graph = {n.name: n for n in swapped.graph.nodes}
    glue = [n for n in graph.values() if _meta.GLUE in n.meta or _meta.GUARD in n.meta]
    assert glue, "precondition: the swap added glue"
    call = swap_info(swapped).call_nodes["layers.0.attn"]
    before = list(graph).index(call)
    ops_before = sum(_meta.computes(graph[name]) for name in list(graph)[:before])
    steps = 0
    while stepper.current.name != call:
        stepper.step()
        steps += 1
        assert _meta.computes(stepper.current)
    assert steps == ops_before + 1  # one step per op (the first runs the inputs)
    while not stepper.done:
        stepper.step()
        assert stepper.done or _meta.computes(stepper.current)


def test_where_writes_out_every_argument_of_the_next_op(gpt):
    _, tokens, _, swapped = gpt
    stepper = Stepper(swapped, tokens)
    stepper.run_to("layers.0.attn/scaled_dot_product_attention")
    assert stepper.current.target is torch.ops.aten.scaled_dot_product_attention.default
    # those given (is_causal=True) and those left at their default (attn_mask=None)
    assert "is_causal=True" in stepper.where() and "attn_mask=None" in stepper.where()
