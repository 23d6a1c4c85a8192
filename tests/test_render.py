"""render: to_dot (exact text on tiny models), collapse, highlight, diff, escaping, SVG ids."""

from __future__ import annotations

import ast
import dataclasses
import gc
import inspect
import math
import re
import shutil
import subprocess
import types
import weakref
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from helpers.imports import import_graph
from helpers.models import Halves, NoCausalMask, Residual, SizedHeads, hf_decoder
from helpers.view_models import (
    ConvBN,
    Fan,
    LayoutProbe,
    LinearThenInlineSilu,
    OddlyNamed,
    PatchEncoder,
    Positions,
    SharedSplitCat,
    SmallResNet,
)
from torch import nn

import graphsurgeon as gs
from graphsurgeon import _meta, render
from graphsurgeon.examples import FusedAttention, TinyGPT
from graphsurgeon.partition import program_index
from graphsurgeon.render import RenderError, graph_view, to_dot, to_svg
from graphsurgeon.render import graphviz as graphviz_runner
from graphsurgeon.render.picture import (
    ClusterRow,
    EdgeRow,
    NodeRow,
    Picture,
    PictureCluster,
    PictureEdge,
    PictureNode,
)
from graphsurgeon.swap import swap_info

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` not installed")
SVG = "{http://www.w3.org/2000/svg}"


def exported(model: nn.Module, *args, **kwargs):
    """gs.export, without stack traces: exact DOT texts must not depend on line numbers."""
    ep = gs.export(model, args, **kwargs)
    for node in ep.graph.nodes:
        node.meta.pop("stack_trace", None)
    return ep


def body(dot: str) -> str:
    """The DOT text without its first five lines (name and default attributes) and last one."""
    lines = dot.splitlines()
    assert lines[0].startswith("digraph ") and lines[-1] == "}"
    return "\n".join(lines[4:-1]) + "\n"


def qualified(text: str) -> str:
    """Expected texts name this module's classes as <tests>.Class, wherever pytest imports it."""
    return text.replace("<tests>", __name__)


# x ──▶ block: Inner ( lin: Linear ──▶ relu ) ──▶ head: Linear ──▶ out


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Inner()
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(self.block(x))


class Doubler(nn.Module):
    """The replacement for ``block`` in the swap tests."""

    def forward(self, x):
        return x * 2


@pytest.fixture(scope="module")
def outer():
    torch.manual_seed(0)
    return exported(Outer(), torch.randn(1, 2))


@pytest.fixture(scope="module")
def swapped(outer):
    return gs.swap(outer, {"block": Doubler()})


HEADER = """\
digraph "Outer" {
  graph [rankdir=TB, fontname="Helvetica", fontsize=10, labeljust=l, nodesep=0.18, ranksep=0.28, outputorder=edgesfirst];
  node [shape=box, style="rounded,filled", fillcolor="#ffffff", color="#6b7280", fontname="Helvetica", fontsize=9, height=0.3, margin="0.08,0.03"];
  edge [color="#6b7280", arrowsize=0.5, penwidth=0.8, fontname="Helvetica", fontsize=7];
"""

X = '  "x" [id="node:x", class="input", label="x\\nf32[1, 2]", tooltip="x: input of the program\\nf32[1, 2]", style=filled, fillcolor="#e5e7eb"];\n'
LINEAR = '    "linear" [id="node:linear", class="op module", label="block.lin: Linear\\naten.linear\\nf32[1, 2]\\n+ weight, bias", tooltip="block.lin: torch.nn.modules.linear.Linear\\n1 node, 6 parameters\\nswappable\\n\\nlinear = aten.linear.default\\nf32[1, 2]\\nparameter block.lin.weight f32[2, 2]\\nparameter block.lin.bias f32[2]", fillcolor="#e1def7"];\n'
RELU = '    "relu" [id="node:relu", class="op", label="aten.relu\\nf32[1, 2]", tooltip="relu = aten.relu.default\\nf32[1, 2]"];\n'
HEAD = '  "linear_1" [id="node:linear_1", class="op module", label="head: Linear\\naten.linear\\nf32[1, 2]\\n+ weight, bias", tooltip="head: torch.nn.modules.linear.Linear\\n1 node, 6 parameters\\nswappable\\n\\nlinear_1 = aten.linear.default\\nf32[1, 2]\\nparameter head.weight f32[2, 2]\\nparameter head.bias f32[2]", fillcolor="#e1def7"];\n'
OUTPUT = '  "output" [id="node:output", class="output", label="output", tooltip="output of the program", style=filled, fillcolor="#e5e7eb"];\n'


def test_analyze_works_out_ahead_what_a_picture_reads_and_changes_no_picture(tiny_gpt):
    # the widget analyzes a swap it built ahead on a background thread: the picture drawn
    # after reads what was worked out, and is the picture drawn without it
    from graphsurgeon._derived import derived
    from graphsurgeon.render import analyze
    from graphsurgeon.render._scene import ANALYSIS_KEY

    model, _tokens, ep = tiny_gpt
    request = {"layers.1.attn": FusedAttention(model.layers[1].attn)}
    ahead, plain = gs.swap(ep, request), gs.swap(ep, request)
    assert ANALYSIS_KEY not in derived(ahead), "precondition: nothing worked out yet"
    analyze(ahead)
    assert ANALYSIS_KEY in derived(ahead) and ANALYSIS_KEY in derived(ep)
    for diff in (None, "merged", "split"):
        assert gs.to_dot(ahead, diff=diff) == gs.to_dot(plain, diff=diff)
    fused = gs.fuse(ep, ["layers.1.mlp"])
    analyze(fused)  # drawn with its fused call opened: worked out too
    assert ANALYSIS_KEY in derived(fused)
    assert gs.to_dot(fused) == gs.to_dot(gs.fuse(ep, ["layers.1.mlp"]))


def test_to_dot_draws_one_cluster_per_module_and_inlines_single_node_modules(outer):
    assert len(gs.partition(outer)["block"].nodes) == 2  # a cluster, not an inlined node
    expected = (
        HEADER
        + X
        + qualified("""\
  subgraph "cluster:block" {
    id="cluster:block";
    class="module";
    label="block: Inner";
    tooltip="block: <tests>.Inner\\n2 nodes, 6 parameters\\nswappable";
    style="filled";
    fillcolor="#f7def1";
    color="#9ca3af";
    penwidth=0.8;
""")
        + LINEAR
        + RELU
        + "  }\n"
        + HEAD
        + OUTPUT
        + """\
  "x" -> "linear" [id="edge:x->linear"];
  "linear" -> "relu" [id="edge:linear->relu"];
  "relu" -> "linear_1" [id="edge:relu->linear_1"];
  "linear_1" -> "output" [id="edge:linear_1->output"];
}
"""
    )
    assert to_dot(outer) == expected


def test_highlight_gives_the_cluster_a_bold_border_and_a_stronger_fill(outer):
    plain = to_dot(outer)
    assert 'class="module highlighted"' not in plain
    expected = qualified("""\
  subgraph "cluster:block" {
    id="cluster:block";
    class="module highlighted";
    label="block: Inner";
    tooltip="block: <tests>.Inner\\n2 nodes, 6 parameters\\nswappable";
    style="filled";
    fillcolor="#f7a1e3";
    color="#c026d3";
    penwidth=2.5;
""")
    dot = to_dot(outer, highlight="block")
    assert expected in dot
    # nothing else changes
    unhighlighted = (
        expected.replace("module highlighted", "module")
        .replace("#f7a1e3", "#f7def1")
        .replace('color="#c026d3";\n    penwidth=2.5;', 'color="#9ca3af";\n    penwidth=0.8;')
    )
    assert dot.replace(expected, unhighlighted) == plain
    assert graph_view(outer, highlight=["block"]).highlighted == ("block",)


def test_highlight_of_a_single_node_module_marks_the_node(outer):
    dot = to_dot(outer, highlight="head")
    assert '"linear_1" [id="node:linear_1", class="op module highlighted"' in dot
    assert 'fillcolor="#aaa1f7", color="#c026d3", penwidth=2.5];' in dot


def test_collapse_depth_draws_each_top_level_module_as_one_box(outer):
    assert graph_view(outer, collapse=None).collapsed == ()
    expected = (
        X
        + qualified("""\
  "module:block" [id="module:block", class="module collapsed", label="block: Inner\\n2 nodes · 6 params", tooltip="block: <tests>.Inner\\n2 nodes, 6 parameters\\nswappable\\ncollapsed", shape=box3d, margin="0.1,0.06", style=filled, fillcolor="#f7def1"];
  "module:head" [id="module:head", class="module collapsed", label="head: Linear\\n1 node · 6 params", tooltip="head: torch.nn.modules.linear.Linear\\n1 node, 6 parameters\\nswappable\\ncollapsed", shape=box3d, margin="0.1,0.06", style=filled, fillcolor="#e1def7"];
""")
        + OUTPUT
        + """\
  "x" -> "module:block" [id="edge:x->module:block"];
  "module:block" -> "module:head" [id="edge:module:block->module:head"];
  "module:head" -> "output" [id="edge:module:head->output"];
"""
    )
    assert body(to_dot(outer, collapse=1)) == expected
    view = graph_view(outer, collapse=1)
    assert view.collapsed == ("block", "head") and view.drawn_nodes == 4


def test_collapse_a_set_of_modules_boxes_exactly_those(outer):
    expected = (
        X
        + qualified("""\
  "module:block" [id="module:block", class="module collapsed", label="block: Inner\\n2 nodes · 6 params", tooltip="block: <tests>.Inner\\n2 nodes, 6 parameters\\nswappable\\ncollapsed", shape=box3d, margin="0.1,0.06", style=filled, fillcolor="#f7def1"];
""")
        + HEAD
        + OUTPUT
        + """\
  "x" -> "module:block" [id="edge:x->module:block"];
  "module:block" -> "linear_1" [id="edge:module:block->linear_1"];
  "linear_1" -> "output" [id="edge:linear_1->output"];
"""
    )
    assert body(to_dot(outer, collapse={"block"})) == expected
    assert graph_view(outer, collapse=["block.lin"]).collapsed == ("block.lin",)


def test_collapse_none_opens_everything_and_auto_fits_the_budget(outer):
    everything = graph_view(outer, collapse=None)
    assert everything.drawn_nodes == 5 and everything.clusters == ("block",)
    assert graph_view(outer).dot == everything.dot  # 5 nodes fit in the default budget
    tight = graph_view(outer, max_nodes=4)
    assert tight.drawn_nodes <= 4 and tight.collapsed == ("block",)
    # a highlighted module stays open, whatever the budget
    assert graph_view(outer, max_nodes=4, highlight="block").clusters == ("block",)
    assert graph_view(outer, collapse=1, highlight="block").clusters == ("block",)


# x ──▶ layers.0 … layers.23 (ReLU each) ──▶ out   (24 top-level modules, a budget of 10)


def test_auto_folds_runs_of_sibling_modules_when_the_top_level_is_too_big():
    model = nn.Sequential(*[nn.ReLU() for _ in range(24)])
    ep = exported(model, torch.randn(2, 2), preserve="none")
    assert graph_view(ep, collapse=None).drawn_nodes == 26
    view = graph_view(ep, max_nodes=10)
    assert view.drawn_nodes == 3 and len(view.collapsed) == 24
    assert (
        '"modules:0..23" [id="modules:0..23", class="module collapsed", label="0 … 23: ReLU × 24\\n24 nodes"'
        in view.dot
    )
    assert '"input" -> "modules:0..23" [id="edge:input->modules:0..23"];' in view.dot


def test_auto_keeps_a_32_layer_decoder_within_budget_and_opens_whole_groups():
    model = TinyGPT(32).eval()
    preserve = [f"layers.{i}" for i in range(32)] + [f"layers.{i}.attn" for i in range(32)]
    ep = gs.export(model, (model.example_input(),), preserve=preserve)
    assert len(ep.graph.nodes) > 1000
    view = graph_view(ep)
    assert 200 < view.drawn_nodes <= 300
    # every layer and MLP open, every attention one box: a regular picture
    assert [f"layers.{i}.attn" for i in range(32)] == list(view.collapsed)
    assert {f"layers.{i}" for i in range(32)} | {f"layers.{i}.mlp" for i in range(32)} <= set(
        view.clusters
    )
    assert graph_view(ep, max_nodes=100).drawn_nodes <= 100
    highlighted = graph_view(ep, highlight="layers.7.attn")
    assert "layers.7.attn" in highlighted.clusters and "layers.7.attn" not in highlighted.collapsed


class _CountedCalls(dict):
    """A scene's calls that count how many times one is read."""

    reads = 0

    def __getitem__(self, name):
        self.reads += 1
        return super().__getitem__(name)


def test_showing_a_layer_of_a_folded_stack_reads_only_what_it_opens():
    # The default view of a stack too deep for its budget folds the layers into run boxes.
    # Showing one layer (a search, the stepper) is planned on top of that view, which is
    # worked out once per scene: it reads the calls it opens, not every layer of the stack.
    from graphsurgeon.render._scene import _analysis, _plan, _state

    reads = {}
    for layers in (8, 32):
        model = TinyGPT(layers).eval()
        preserve = [f"layers.{i}" for i in range(layers)]
        preserve += [f"layers.{i}.attn" for i in range(layers)]
        ep = gs.export(model, (model.example_input(),), preserve=preserve)
        graph_view(ep, max_nodes=12)
        scene = _analysis(ep, _state(ep)).scenes[(False, False)]["scene"]
        scene.calls = _CountedCalls(scene.calls)
        base, base_runs = _plan(scene, "auto", set(), set(), 12)
        assert "layers.3" not in base and any("layers.3" in r for r in base_runs.values())
        assert scene.calls.reads == 0, "the view without what it shows was planned once"
        open_, runs = _plan(scene, "auto", set(), set(), 12, shown={"layers.3.attn"})
        assert {"layers.3", "layers.3.attn"} <= open_
        assert not any("layers.3" in r for r in runs.values()), "the run split around it"
        reads[layers] = scene.calls.reads
        # the planner reads every layer when it plans the view afresh
        scene.memo("plans").clear()
        scene.calls.reads = 0
        assert _plan(scene, "auto", set(), set(), 12, shown={"layers.3.attn"}) == (open_, runs)
        reads[layers, "afresh"] = scene.calls.reads
    assert reads[32, "afresh"] > 2 * reads[8, "afresh"], "precondition: counted reads grow"
    assert 0 < reads[32] == reads[8]


def test_fold_runs_draws_the_closed_layers_of_a_stack_a_run_to_a_box_around_those_open():
    model = TinyGPT(12).eval()
    ep = gs.export(model, (model.example_input(),), preserve=[f"layers.{i}" for i in range(12)])
    closed = {c for c in gs.partition(ep) if c not in ("layers.5",)} - {"layers"}
    every_box = graph_view(ep, collapse=closed)
    assert {f"layers.{i}" for i in range(12) if i != 5} <= set(every_box.collapsed)
    folded = graph_view(ep, collapse=closed, fold_runs=8)
    boxes = {n.id for n in folded.picture.nodes if n.kind == "box"}
    # split around the open layer; the glue around the stack is drawn as before
    assert {"modules:layers.0..layers.4", "modules:layers.6..layers.11"} <= boxes
    assert "layers.5" in folded.clusters and folded.drawn_nodes < every_box.drawn_nodes - 8
    assert folded.collapsed == every_box.collapsed, "each call of a run is listed, as in auto"
    # a piece of one layer is its own box; the layers kept unfolded, a box each
    kept = graph_view(ep, collapse=closed - {"layers.1"}, fold_runs=8, unfolded="layers.7")
    boxes = {n.id for n in kept.picture.nodes if n.kind == "box"}
    assert {"module:layers.0", "modules:layers.2..layers.4", "module:layers.7"} <= boxes
    assert {"module:layers.6", "modules:layers.8..layers.11"} <= boxes
    # a stack shorter than fold_runs is left a box a layer; a depth or "auto" is not changed
    assert graph_view(ep, collapse=closed, fold_runs=13).dot == every_box.dot
    assert graph_view(ep, collapse=2, fold_runs=8).dot == graph_view(ep, collapse=2).dot
    for wrong in (1, True, "8"):
        with pytest.raises(RenderError, match="fold_runs: expected an int of 2 or more"):
            graph_view(ep, collapse=closed, fold_runs=wrong)
    with pytest.raises(gs.errors.UnknownModuleError, match="unfolded"):
        graph_view(ep, collapse=closed, fold_runs=8, unfolded="layers.99")


@pytest.mark.parametrize(
    "what", ["attention", "layer", "fused layer", "fused attention", "three", "llama attention"]
)
def test_a_results_pictures_lay_out_the_layers_as_its_own_would(what, monkeypatch):
    # A swap or fuse result is given its original's layer stacks (worked out once per
    # original): every picture of it must be what working them out on the result gives.
    if what.startswith("llama"):
        model = hf_decoder("Llama", 12)
        ids = torch.randint(0, 100, (1, 8))
        ep = gs.export(model, (ids,), {"use_cache": False})
        s = gs.Surgery(ep)
        s.swap("model.layers.4.self_attn", model.model.layers[4].self_attn)
    else:
        model = TinyGPT(12).eval()
        preserve = [f"layers.{i}" for i in range(12)] + [f"layers.{i}.attn" for i in range(12)]
        ep = gs.export(model, (model.example_input(),), preserve=preserve)
        s = gs.Surgery(ep)
        if what == "attention":
            s.swap("layers.4.attn", FusedAttention(model.layers[4].attn))
        elif what == "layer":
            s.swap("layers.4", model.layers[4])
        elif what == "fused layer":
            s.fuse("layers.4")
        elif what == "fused attention":
            s.fuse("layers.4.attn")
        else:
            for i in (0, 5, 11):
                s.swap(f"layers.{i}.attn", FusedAttention(model.layers[i].attn))
    views = [{}, {"collapse": 1}, {"max_nodes": 10}]
    if not what.startswith("fused"):  # a diff compares swaps
        views += [{"diff": "merged"}, {"diff": "split"}, {"diff": "merged", "max_nodes": 10}]
    given = [to_dot(s, **view) for view in views]
    given_stacks = [graph_view(s, **view).clusters for view in views]
    monkeypatch.setattr(render._scene, "_stacks_of_original", lambda *args: None)
    gs.forget(s.module)
    gs.forget(s.program)
    assert given == [to_dot(s, **view) for view in views]
    assert given_stacks == [graph_view(s, **view).clusters for view in views]
    assert any("modules:" in text for text in given) or what.startswith("llama"), (
        "precondition: a run of layers is drawn as one box somewhere"
    )


# x ──▶ lin ──▶ lin@1 (the same Linear, twice) ──▶ split ──[1]──▶ cat ◀──[0]── split
#                                         scale (buffer) ──▶ mul ◀── cat ;  + constant ──▶ out


@pytest.fixture(scope="module")
def shared():
    return exported(SharedSplitCat().eval(), torch.randn(3, 4))


def test_repeated_calls_a_folded_buffer_constants_and_getitem_glue(shared):
    assert {"lin", "lin@1"} <= set(gs.partition(shared))
    expected = """\
  "c_lifted_tensor_0" [id="node:c_lifted_tensor_0", class="constant", label="lifted_tensor_0\\nf32[4]", tooltip="c_lifted_tensor_0: constant lifted_tensor_0\\nf32[4]", shape=note, style=filled, fillcolor="#f3f4f6"];
  "x" [id="node:x", class="input", label="x\\nf32[3, 4]", tooltip="x: input of the program\\nf32[3, 4]", style=filled, fillcolor="#e5e7eb"];
  "linear" [id="node:linear", class="op module", label="lin: Linear\\naten.linear\\nf32[3, 4]\\n+ weight, bias", tooltip="lin: torch.nn.modules.linear.Linear\\n1 node, 20 parameters\\nswappable\\n\\nlinear = aten.linear.default\\nf32[3, 4]\\nparameter lin.weight f32[4, 4]\\nparameter lin.bias f32[4]", fillcolor="#e1def7"];
  "linear_1" [id="node:linear_1", class="op module", label="lin@1: Linear\\naten.linear\\nf32[3, 4]\\n+ weight, bias", tooltip="lin@1: torch.nn.modules.linear.Linear\\n1 node, 20 parameters\\nswappable\\n\\nlinear_1 = aten.linear.default\\nf32[3, 4]\\nparameter lin.weight f32[4, 4]\\nparameter lin.bias f32[4]", fillcolor="#e1def7"];
  "split" [id="node:split", class="op", label="aten.split\\n[f32[3, 2], f32[3, 2]]", tooltip="split = aten.split.Tensor\\nsplit_size=2, dim=1\\n[f32[3, 2], f32[3, 2]]"];
  "cat" [id="node:cat", class="op", label="aten.cat\\nf32[3, 4]", tooltip="cat = aten.cat.default\\ndim=1\\nf32[3, 4]"];
  "mul" [id="node:mul", class="op", label="aten.mul\\nf32[3, 4]\\n+ scale", tooltip="mul = aten.mul.Tensor\\nf32[3, 4]\\nbuffer scale f32[4]"];
  "lift_fresh_copy" [id="node:lift_fresh_copy", class="op", label="aten.lift_fresh_copy\\nf32[4]", tooltip="lift_fresh_copy = aten.lift_fresh_copy.default\\nf32[4]"];
  "detach_" [id="node:detach_", class="op", label="aten.detach_\\nf32[4]", tooltip="detach_ = aten.detach_.default\\nf32[4]"];
  "add" [id="node:add", class="op", label="aten.add\\nf32[3, 4]", tooltip="add = aten.add.Tensor\\nf32[3, 4]"];
  "output" [id="node:output", class="output", label="output", tooltip="output of the program", style=filled, fillcolor="#e5e7eb"];
  "x" -> "linear" [id="edge:x->linear"];
  "linear" -> "linear_1" [id="edge:linear->linear_1"];
  "linear_1" -> "split" [id="edge:linear_1->split"];
  "split" -> "cat" [id="edge:split->cat", taillabel="[1]"];
  "split" -> "cat" [id="edge:split->cat:2", taillabel="[0]"];
  "cat" -> "mul" [id="edge:cat->mul"];
  "c_lifted_tensor_0" -> "lift_fresh_copy" [id="edge:c_lifted_tensor_0->lift_fresh_copy"];
  "lift_fresh_copy" -> "detach_" [id="edge:lift_fresh_copy->detach_"];
  "mul" -> "add" [id="edge:mul->add"];
  "detach_" -> "add" [id="edge:detach_->add"];
  "add" -> "output" [id="edge:add->output"];
"""
    assert body(to_dot(shared)) == expected


def test_highlight_a_module_called_twice_or_one_of_its_calls(shared):
    assert graph_view(shared, highlight="lin").highlighted == ("lin", "lin@1")
    assert graph_view(shared, highlight="lin@1").highlighted == ("lin@1",)
    dot = to_dot(shared, highlight="lin@1")
    assert '"linear" [id="node:linear", class="op module",' in dot
    assert '"linear_1" [id="node:linear_1", class="op module highlighted",' in dot


def test_a_container_name_highlights_what_every_entry_point_reads_it_as(tiny_gpt):
    _, _, ep = tiny_gpt
    covered = program_index(ep).calls_covered("layers")  # the one reading of a container
    assert covered == ("layers.0", "layers.1"), "precondition: a ModuleList of two layers"
    view = graph_view(ep, highlight="layers")
    assert view.highlighted == covered
    assert to_dot(ep, highlight="layers") == to_dot(ep, highlight=list(covered))
    with pytest.raises(gs.errors.UnknownModuleError, match=r"highlight: .*'layers'"):
        to_dot(ep, highlight="layerz")


def test_the_drawing_entry_points_share_one_set_of_options(outer):
    fields = dataclasses.fields(render.DrawOptions)
    expected = [(f.name, f.default) for f in fields]
    for function in (to_dot, to_svg, gs.draw, graph_view):
        parameters = inspect.signature(function).parameters.values()
        keywords = [(p.name, p.default) for p in parameters if p.kind == p.KEYWORD_ONLY]
        assert keywords == expected, function.__name__
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'colapse'"):
            function(outer, colapse=1)
    # max_nodes not told is the same budget everywhere: the auto budget for a picture's text
    assert render.DrawOptions().max_nodes is None
    assert to_dot(outer, max_nodes=None) == to_dot(outer, max_nodes=render.AUTO_MAX_NODES)
    options = render.DrawOptions(collapse=1)
    assert graph_view(outer, options).dot == to_dot(outer, collapse=1)
    assert graph_view(outer, options, collapse=None).dot == to_dot(outer, collapse=None)


def test_show_parameters_draws_them_with_edges_to_their_users(outer):
    folded = to_dot(outer)
    assert "p_head_weight" not in folded
    dot = to_dot(outer, show_parameters=True)
    assert (
        '  "p_head_weight" [id="node:p_head_weight", class="parameter", label="head.weight\\nf32[2, 2]", '
        'tooltip="p_head_weight: parameter head.weight\\nf32[2, 2]", shape=cylinder, style=filled, '
        'fillcolor="#f3f4f6"];\n'
    ) in dot
    assert '"p_head_weight" -> "linear_1" [id="edge:p_head_weight->linear_1"];' in dot
    # a module's parameters are drawn inside its cluster
    cluster = dot[dot.index('subgraph "cluster:block"') : dot.index("  }\n")]
    assert '"p_block_lin_weight" [' in cluster


# x ──▶ heads.0 … heads.9 (each a Linear of x) ──▶ stack ──▶ out : x has ten users


def test_a_value_with_many_users_is_named_by_them_instead_of_drawing_every_edge():
    ep = exported(Fan(), torch.randn(1, 2))
    assert len(ep.graph.find_nodes(op="placeholder", target="x")[0].users) == 10
    dot = to_dot(ep)
    assert not re.search(r'"x" -> ', dot)
    assert 'label="x\\nf32[1, 2]\\nx → 10 users"' in dot
    assert dot.count("\\nshared: x") == 10
    assert dot.count('-> "stack"') == 10


def test_diff_merged_greys_removed_nodes_and_marks_the_added_box(outer, swapped):
    assert swap_info(swapped).call_nodes == {"block": "swapped_block"}
    expected = (
        X
        + qualified("""\
  subgraph "cluster:block" {
    id="cluster:block";
    class="module swapped-boundary";
    label="block: Inner → Doubler";
    tooltip="block: <tests>.Inner\\n2 nodes, 6 parameters\\nswappable";
    style="filled,dashed";
    fillcolor="#f7def1";
    color="#c2410c";
    penwidth=1.5;
""")
        + """\
    "linear" [id="node:linear", class="op module removed", label="block.lin: Linear\\naten.linear\\nf32[1, 2]\\n+ weight, bias", tooltip="block.lin: torch.nn.modules.linear.Linear\\n1 node, 6 parameters\\nswappable\\n\\nlinear = aten.linear.default\\nf32[1, 2]\\nparameter block.lin.weight f32[2, 2]\\nparameter block.lin.bias f32[2]", fillcolor="#f3f4f6", style="rounded,filled,dashed", color="#9ca3af", fontcolor="#6b7280"];
    "relu" [id="node:relu", class="op removed", label="aten.relu\\nf32[1, 2]", tooltip="relu = aten.relu.default\\nf32[1, 2]", style="rounded,filled,dashed", color="#9ca3af", fontcolor="#6b7280", fillcolor="#f3f4f6"];
"""
        + qualified("""\
    "swapped_block" [id="node:swapped_block", class="swapped added", label="+ block: swapped\\nDoubler\\n(x: f32[1, 2]) → f32[1, 2]", tooltip="swapped_block: block runs <tests>.Doubler\\nin place of 2 nodes of Inner", style="filled,bold", peripheries=2, fillcolor="#fed7aa", color="#15803d", penwidth=2];
  }
""")
        + HEAD
        + OUTPUT
        + """\
  "x" -> "linear" [id="edge:x->linear", style=dashed, color="#9ca3af"];
  "linear" -> "relu" [id="edge:linear->relu", style=dashed, color="#9ca3af"];
  "x" -> "swapped_block" [id="edge:x->swapped_block", color="#15803d", penwidth=1.5];
  "swapped_block" -> "linear_1" [id="edge:swapped_block->linear_1", color="#15803d", penwidth=1.5];
  "linear_1" -> "output" [id="edge:linear_1->output"];
  "relu" -> "linear_1" [id="edge:relu->linear_1", style=dashed, color="#9ca3af"];
"""
    )
    assert body(to_dot(swapped, diff=True)) == expected
    assert to_dot(swapped, diff="merged") == to_dot(swapped, diff=True)


def test_the_swapped_program_alone_shows_one_box_for_the_swapped_module(swapped):
    expected = (
        X
        + qualified("""\
  "swapped_block" [id="node:swapped_block", class="swapped", label="block: swapped\\nDoubler\\n(x: f32[1, 2]) → f32[1, 2]", tooltip="swapped_block: block runs <tests>.Doubler\\nin place of 2 nodes of Inner", style="filled,bold", peripheries=2, fillcolor="#fed7aa", color="#c2410c"];
""")
        + HEAD
        + OUTPUT
        + """\
  "x" -> "swapped_block" [id="edge:x->swapped_block"];
  "swapped_block" -> "linear_1" [id="edge:swapped_block->linear_1"];
  "linear_1" -> "output" [id="edge:linear_1->output"];
"""
    )
    assert body(to_dot(swapped)) == expected
    view = graph_view(swapped, highlight="block")
    assert view.highlighted == ("block",) and view.swapped == ("block",)
    assert 'class="swapped highlighted"' in view.dot


def test_diff_split_draws_two_aligned_pictures_with_prefixed_ids(swapped):
    dot = to_dot(swapped, diff="split")
    assert dot.count('subgraph "cluster:before" {') == dot.count('subgraph "cluster:after" {') == 1
    assert 'id="before/node:linear", class="op module removed"' in dot
    assert 'id="after/node:swapped_block", class="swapped added"' in dot
    # the swapped module's boundary is in both pictures
    assert 'id="before/cluster:block";' in dot and 'id="after/cluster:block";' in dot
    # each kept node is level with itself: the two pictures line up
    for name in ("x", "linear_1", "output"):
        assert f'  {{rank=same; "before/{name}"; "after/{name}";}}\n' in dot
    assert '"before/linear" -> "before/relu" [id="before/edge:linear->relu"' in dot
    assert "before/swapped_block" not in dot and "after/relu" not in dot


def test_diff_draws_an_input_renamed_by_the_swap_once():
    # input ──▶ lin ──▶ add ◀── input ;  add ──▶ head ──▶ out   (lin swapped for Identity)
    ep = exported(Residual(), torch.randn(1, 2))
    gm = gs.swap(ep, {"lin": nn.Identity()})
    assert swap_info(gm).node_map["input"] == "input_1"  # named after a builtin: renamed
    dot = to_dot(gm, diff=True)
    assert dot.count('class="input"') == 1
    assert '"input_1" -> "linear" [id="edge:input_1->linear", style=dashed' in dot
    assert '"input_1" -> "swapped_lin" [id="edge:input_1->swapped_lin"' in dot
    assert '{rank=same; "before/input"; "after/input_1";}' in to_dot(gm, diff="split")


def test_diff_keeps_the_original_order_in_a_decoder():
    model = TinyGPT(2).eval()
    ep = exported(model, model.example_input())
    gm = gs.swap(ep, {"layers.1.attn": FusedAttention(model.layers[1].attn)})
    dot = to_dot(gm, diff=True, collapse=None)
    names = re.findall(r'^\s+"(\w+)" \[id="node:', dot, flags=re.M)
    original = [n.name for n in ep.graph.nodes if f'"{n.name}" [id=' in dot]
    kept = [n for n in names if n in set(original)]
    assert kept == original  # removed nodes sit where they were, nothing reordered
    assert names.index("swapped_layers_1_attn") == names.index("linear_9") + 1
    assert "(x: f32[1, 16, 64]) → f32[1, 16, 64]" in dot


def test_labels_and_ids_are_escaped():
    # x ──▶ 'we"ird\N' (a module of type Odd"Name<&>) ──▶ out
    odd = type('Odd"Name<&>', (nn.Module,), {"forward": lambda self, x: x * 2})

    class Weird(nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module('we"ird\\N', odd())

        def forward(self, x):
            return getattr(self, 'we"ird\\N')(x)

    ep = exported(Weird(), torch.randn(1, 2))
    assert 'we"ird\\N' in gs.partition(ep)
    dot = to_dot(ep)
    assert 'label="we\\"ird\\\\N: Odd\\"Name<&>\\naten.mul\\nf32[1, 2]"' in dot
    # tooltips: graphviz expands escapes in them twice, so backslashes become U+29F5
    assert 'tooltip="we\\"ird\u29f5N: ' in dot
    if shutil.which("dot"):
        svg = to_svg(ep)
        texts = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]
        assert 'we"ird\\N: Odd"Name<&>' in texts


# Names an id cannot carry as they are (NUL ends dot's input, XML has no control characters,
# parsers rewrite newlines in attributes), a name with the escape character, and a long one.
ODD_NAMES = {
    "nul": "a\x00b",
    "newline": "line\nbreak",
    "controls": "tab\there\rand\x1b[31m",
    "percent": "50%",
    "long": "x" * 10_000,
}


def test_ids_keep_ordinary_names_and_escape_the_rest_reversibly():
    from graphsurgeon.display import id_text, name_of_id_text

    for name in ("layers.0.attn", "shared@1", 'we"ird\\N', "<img src=x>", "a b", "ünï"):
        assert id_text(name) == name, "ordinary names are ids as they are"
    assert id_text("a\x00b") == "a%00b" and id_text("line\nbreak") == "line%0Abreak"
    assert id_text("50%") == "50%25", "the escape character itself, so ids stay distinct"
    for name in [*ODD_NAMES.values(), "a%00b", "\ud800", "%", "%2", "é\x85"]:
        text = id_text(name)
        assert name_of_id_text(text) == name
        assert not re.search("[\x00-\x1f\x7f-\x9f\ud800-\udfff]", text), repr(text)
    assert id_text("a%00b") != id_text("a\x00b")


@pytest.mark.parametrize("kind", list(ODD_NAMES))
def test_any_module_name_draws_with_ids_that_resolve_back_to_it(kind):
    name = ODD_NAMES[kind]
    ep = exported(OddlyNamed(name), torch.randn(1, 2))
    assert name in gs.partition(ep), "precondition: torch keeps the name as it is"
    from graphsurgeon.display import id_text

    for collapse, prefix in ((None, "cluster:"), (1, "module:")):
        view = graph_view(ep, collapse=collapse)
        element = view.picture[prefix + id_text(name)]
        assert name in (getattr(element, "call", None), *getattr(element, "calls", ()))
        assert "\x00" not in view.dot, "dot reads C strings: a NUL would end its input"
        assert to_dot(ep, collapse=collapse) == view.dot, "deterministic"
        labels = [element.label for element in view.picture.nodes + view.picture.clusters]
        assert max(len(line) for label in labels for line in label.splitlines()) < 100
        if shutil.which("dot"):
            root = ET.fromstring(to_svg(ep, collapse=collapse))  # well-formed XML
            ids = {g.get("id") for g in root.iter(f"{SVG}g")} - {None}
            ids = {i for i in ids if not i.startswith("a_")}  # dot's own tooltip anchors
            assert prefix + id_text(name) in ids and ids <= set(view.picture) | {"graph0"}
            width = float(root.get("width").removesuffix("pt"))
            assert width < 1000, f"a {len(name):,}-character name made a {width}pt-wide picture"
    if shutil.which("dot"):
        assert "<svg" in gs.draw(ep)._repr_mimebundle_()["text/html"]


def test_labels_show_control_characters_and_shorten_long_names():
    dot = to_dot(exported(OddlyNamed("a\x00b\nc"), torch.randn(1, 2)), collapse=None)
    assert 'label="a␀b␊c: TwoLinears"' in dot, "visible, and the newline is not a line break"
    assert 'id="cluster:a%00b%0Ac"' in dot and 'tooltip="a␀b␊c: ' in dot
    long = to_dot(exported(OddlyNamed("x" * 10_000), torch.randn(1, 2)), collapse=1)
    label = re.search(r'"module:x+" \[[^\]]*label="([^"]*)"', long).group(1)
    assert label.startswith("x" * 30 + "…" + "x" * 29 + ": TwoLinears"), label[:80]
    tooltip = re.search(r'"module:x+" \[[^\]]*tooltip="([^"]*)"', long).group(1)
    assert "…" in tooltip and len(tooltip) < 600


def test_tooltips_show_where_the_node_comes_from():
    # x ──▶ relu ──▶ out, written in this file
    class Relu(nn.Module):
        def forward(self, x):
            return torch.relu(x)

    line = inspect.getsourcelines(Relu.forward)[1] + 1
    dot = to_dot(gs.export(Relu(), (torch.randn(1, 2),)))
    assert f"test_render.py:{line} in forward\\n  return torch.relu(x)" in dot
    assert str(Path(__file__).parent) not in dot  # file names only, never paths


def test_source_lines_skip_torch_frames_and_never_show_paths():
    trace = (
        'File "C:\\work\\model.py", line 12, in forward\n    x = layer(x)\n'
        'File "<stdin>", line 3, in forward\n'
        'File "/opt/site-packages/torch/nn/modules/linear.py", line 134, in forward\n'
        "    return F.linear(input, self.weight, self.bias)"
    )
    assert _meta._source_of_trace(trace) == "<stdin>:3 in forward\ncalled from model.py:12"


def test_source_lines_skip_a_wrapper_that_only_passes_the_call_on():
    # transformers wraps apply_rotary_pos_emb in a `kernels` module: the model's line is shown
    trace = (
        'File "/env/site-packages/transformers/models/llama/modeling_llama.py", line 249, in forward\n'
        "    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)\n"
        'File "/env/site-packages/kernels/_internals/layer/layer.py", line 856, in forward\n'
        "    return func(*args, **kwargs)"
    )
    assert _meta._source_of_trace(trace).startswith("modeling_llama.py:249 in forward")


def test_the_same_program_gives_the_same_text_every_time(outer):
    again = exported(Outer(), torch.randn(1, 2))
    assert again is not outer
    assert to_dot(again) == to_dot(outer)
    assert to_dot(outer, collapse=1, highlight="head") == to_dot(
        outer, collapse=1, highlight="head"
    )


def test_a_surgery_is_drawn_through_its_module_or_program(outer, swapped):
    surgery = gs.Surgery(outer)
    assert to_dot(surgery) == to_dot(outer)  # nothing swapped: the program itself
    with pytest.raises(RenderError, match="no swaps to compare"):
        to_dot(surgery, diff=True)
    surgery.swap("block", Doubler())
    assert to_dot(surgery) == to_dot(surgery.module) == to_dot(swapped)
    assert to_dot(surgery, diff="split") == to_dot(swapped, diff="split")
    # anything shaped like one
    assert to_dot(types.SimpleNamespace(module=swapped, program=outer)) == to_dot(swapped)
    assert to_dot(types.SimpleNamespace(module=None, program=outer)) == to_dot(outer)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"highlight": "blok"},
            gs.errors.UnknownModuleError,
            "no module 'blok'. Did you mean 'block' or 'block.lin'?",
        ),
        ({"collapse": {"heed"}}, gs.errors.UnknownModuleError, "Did you mean 'head'?"),
        ({"collapse": "block"}, RenderError, "to collapse one module pass {'block'}"),
        ({"collapse": 0}, RenderError, "use collapse=None to collapse nothing"),
        ({"collapse": True}, RenderError, "expected 'auto', None, a depth"),
        ({"highlight": [""]}, RenderError, "the root module '' is the whole picture"),
        ({"highlight": 3}, RenderError, "expected a module name or a collection"),
        ({"diff": True}, RenderError, "this program has no swaps to compare"),
        ({"max_nodes": 0}, RenderError, "max_nodes: expected a positive int"),
    ],
)
def test_bad_requests_say_what_is_wrong(outer, kwargs, error, message):
    with pytest.raises(error) as caught:
        to_dot(outer, **kwargs)
    assert message in str(caught.value)
    assert isinstance(caught.value, gs.GraphSurgeonError)


def test_things_that_are_not_programs_are_refused(outer, swapped):
    # the one refusal of every entry point that takes a program (was a RenderError)
    with pytest.raises(gs.errors.NotAProgramError, match=r"gs\.swap or gs\.fuse did not make"):
        to_dot(outer.module())
    with pytest.raises(gs.errors.NotAProgramError, match="got a str"):
        to_dot("program.pt2")
    with pytest.raises(RenderError, match="expected None, True, 'merged' or 'split'"):
        to_dot(swapped, diff="both")


def test_drawing_does_not_keep_programs_alive():
    # x ──▶ 0: Linear ──▶ 1: ReLU ──▶ out; drawn before and after a swap, then dropped
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    ep = gs.export(model, (torch.randn(1, 2),))
    swapped = gs.swap(ep, {"1": nn.Tanh()})
    assert to_dot(swapped, diff="split") and to_dot(ep)
    program, result = weakref.ref(ep), weakref.ref(swapped)
    del ep, swapped
    gc.collect()
    assert program() is None and result() is None


def test_render_does_not_import_optional_ui_packages():
    files = sorted(Path(render.__file__).parent.glob("*.py"))
    assert len(files) >= 5, "precondition: render is a package of stages"
    imported = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert "torch" in imported
    assert not imported & {"graphviz", "ipywidgets", "IPython"}


def test_render_and_the_modules_that_show_pictures_import_no_circle():
    # render sits below drawing, report and the widget; display and the name rules below render
    edges = import_graph(Path(render.__file__).parent.parent)
    assert "graphsurgeon.render._scene" in edges["graphsurgeon.render"], "precondition"
    mine = {m for m in edges if m.startswith("graphsurgeon.render")}
    mine |= {"graphsurgeon.drawing", "graphsurgeon.display", "graphsurgeon.report"}

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for module in edges[todo.pop()] - seen:
                seen.add(module)
                todo.append(module)
        return seen

    circles = sorted(m for m in mine if m in reachable(m))
    assert circles == [], f"imported back by what they import: {circles}"
    assert "graphsurgeon.drawing" not in reachable("graphsurgeon.render")
    assert not reachable("graphsurgeon.display") & (mine - {"graphsurgeon.display"})


# -- SVG -------------------------------------------------------------------------------------


@needs_dot
def test_svg_carries_the_ids_of_nodes_clusters_and_edges(outer):
    svg = to_svg(outer)
    root = ET.fromstring(svg)
    groups = {g.get("id"): g.get("class") for g in root.iter(f"{SVG}g")}
    assert groups["cluster:block"] == "cluster module"
    assert groups["node:linear"] == "node op module"
    assert groups["node:x"] == "node input"
    assert groups["edge:relu->linear_1"] == "edge"
    view = graph_view(outer)
    assert sum(1 for c in groups.values() if c and c.startswith("node ")) == view.drawn_nodes
    # tooltips survive as link titles
    titles = [a.get("{http://www.w3.org/1999/xlink}title") for a in root.iter(f"{SVG}a")]
    assert any(t and t.startswith("relu = aten.relu.default") for t in titles)


@needs_dot
def test_svg_of_collapsed_and_diff_views_keeps_their_ids(outer, swapped):
    collapsed = ET.fromstring(to_svg(outer, collapse=1))
    ids = {g.get("id") for g in collapsed.iter(f"{SVG}g")}
    assert {"module:block", "module:head", "edge:module:block->module:head"} <= ids
    split = ET.fromstring(to_svg(swapped, diff="split"))
    ids = {g.get("id") for g in split.iter(f"{SVG}g")}
    assert {"diff:before", "diff:after", "before/cluster:block", "after/cluster:block"} <= ids
    assert {"before/node:relu", "after/node:swapped_block", "after/edge:x->swapped_block"} <= ids


@needs_dot
def test_layouts_are_cached_by_dot_text(monkeypatch):
    calls = []
    real_run = subprocess.run

    def counting_run(*args, **kwargs):
        calls.append(args)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(graphviz_runner.subprocess, "run", counting_run)
    # a program no other test draws: its DOT text cannot be in the cache yet
    probe = exported(LayoutProbe(), torch.randn(1, 2))
    first = to_svg(probe, highlight="layouts_cache_probe")
    second = to_svg(probe, highlight="layouts_cache_probe")
    assert first == second and len(calls) == 1
    to_svg(probe)
    assert len(calls) == 2


def test_a_missing_dot_binary_names_the_install_command(outer, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("dot") is None
    with pytest.raises(gs.errors.MissingDependencyError, match=r"apt-get install graphviz"):
        to_svg(outer)
    assert to_dot(outer)  # DOT needs no binary


# -- fused calls: one box that opens into the program's own nodes ---------------------------


def test_a_fused_call_is_one_box_that_opens_into_its_own_nodes(outer):
    fused = gs.fuse(outer, "block")
    view = graph_view(fused)
    assert view.fused == ("block",) and view.collapsed == ("block",)
    box = next(line for line in view.dot.splitlines() if 'id="module:block"' in line)
    assert 'class="module collapsed fused"' in box and "(fused)" in box
    assert 'id="node:linear"' not in view.dot, "closed: its nodes are not drawn"
    opened = graph_view(fused, collapse=None)
    assert "block" in opened.clusters and 'class="module fused"' in opened.dot
    # open, it is exactly what the program draws: the same nodes, ids and edges
    plain = graph_view(outer, collapse=None).dot
    node_ids = set(re.findall(r'id="(node:[^"]+)"', plain))
    assert node_ids == set(re.findall(r'id="(node:[^"]+)"', opened.dot))
    assert graph_view(fused, highlight="block").clusters[:1] == ("block",), "highlight opens"
    assert "block" in graph_view(fused, collapse={"head"}).clusters, "a set names the boxes"


def test_a_surgery_with_a_fused_and_a_swapped_call_draws_both(outer):
    surgery = gs.Surgery(outer).fuse("head").swap("block", Doubler())
    view = graph_view(surgery, collapse=None)
    assert view.swapped == ("block",) and view.fused == ("head",)
    assert 'id="node:swapped_block"' in view.dot and "head" in view.clusters
    diff = graph_view(surgery, diff="split", collapse=None)
    assert diff.swapped == ("block",), "the diff shows the swap; the fused call changed nothing"
    assert 'id="after/node:linear_1"' in diff.dot, "the fused head's own node, in both pictures"


def test_a_fused_program_is_drawn_from_its_own_graph_without_running_the_rewrite(monkeypatch):
    ep = exported(Residual(), torch.randn(1, 2))
    surgery = gs.Surgery(ep).fuse("head").swap("lin", nn.Identity())
    program = surgery.module
    tags = {n.meta.get(gs._meta.FUSED) for n in program.graph.nodes} - {None}
    assert tags == {"head"} and swap_info(program).swapped == ("lin",), "precondition"
    made = []
    real_init = torch.fx.GraphModule.__init__

    def counting_init(self, *args, **kwargs):
        made.append(type(self).__name__)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.GraphModule, "__init__", counting_init)
    view = graph_view(program, collapse=None)
    split = graph_view(surgery, diff="split", collapse=None)
    assert made == [], "drawing a fused program made a program: it ran the rewrite"
    monkeypatch.undo()
    # drawn as the program the stepper runs: its own names (the argument "input" is "input_1")
    names = {n.name for n in program.graph.nodes}
    assert "input_1" in names and "input" not in names, "precondition: the rewrite renamed it"
    assert 'id="node:input_1"' in view.dot and 'id="node:input"' not in view.dot
    # the fused call opens into the original node it runs, fed by the swapped box
    assert view.fused == ("head",) and view.swapped == ("lin",)
    assert '"swapped_lin" -> "add"' in view.dot and '"add" -> "linear_1"' in view.dot
    assert view.picture["cluster:head"].style == ("fused",)
    assert 'id="after/node:linear_1"' in split.dot and 'id="before/node:linear"' in split.dot
    # no module of the renderer imports a verb of the rewrite
    for file in Path(render.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("swap"):
                assert {a.name for a in node.names} <= {"SwapInfo", "swap_info"}, file.name


# -- the Picture: the drawing as data; it agrees with the stepper ----------------------------


class Looped(nn.Module):
    #   x ──▶ block ──▶ block (again: "block@1") ──▶ head ──▶ out
    def __init__(self):
        super().__init__()
        self.block = Inner()
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(self.block(self.block(x)))


def _drawn_call(picture, node: str) -> str:
    """The module call the picture draws fx node ``node`` in ("" at the top level)."""
    element = picture.element_of_node(node)
    if element.calls:
        return element.calls[-1]
    return picture[element.cluster].call if element.cluster else ""


@pytest.mark.parametrize("make", ["program", "swapped", "fused", "looped", "gpt-swapped"])
def test_the_picture_and_the_stepper_put_every_node_in_the_same_module(make, request):
    torch.manual_seed(0)
    if make == "gpt-swapped":
        model, x, ep = request.getfixturevalue("tiny_gpt")
        program = gs.swap(ep, {"layers.1.attn": FusedAttention(model.layers[1].attn)})
    else:
        model, x = (Looped() if make == "looped" else Outer()), torch.randn(1, 2)
        ep = gs.export(model, (x,))
        program = {
            "program": ep,
            "looped": ep,
            "swapped": gs.swap(ep, {"block": Doubler()}),
            "fused": gs.fuse(ep, "block"),
        }[make]
    picture = graph_view(program, collapse=None).picture
    stepper = gs.Stepper(program, x)
    views = [(stepper._layout, ())]
    if make == "fused":  # drawn as the program's own nodes: the fused call's, once entered
        stepper.run_to("block")
        stepper.step_into()
        inner = stepper._frame
        views.insert(0, (inner.stepper._layout, inner.prefix))
    compared = 0
    for node in picture.nodes:
        for layout, prefix in views:
            fx_node = layout.by_name.get(node.node)
            if fx_node is not None and not (prefix and fx_node.op in ("placeholder", "output")):
                break  # (a fused call's own arguments and result are not the program's)
        else:
            continue
        stack = prefix + layout.stacks[layout.position[fx_node]]
        if fx_node.op == "call_module":
            stack = stack[:-1]  # a swapped box is drawn where its module was, not inside it
        assert _drawn_call(picture, node.node) == (stack[-1] if stack else ""), node.node
        compared += 1
    assert compared >= 3, "precondition: the two views share nodes"


def test_the_picture_maps_every_svg_id_to_what_it_draws(outer, swapped):
    view = graph_view(swapped, diff="split")
    picture = view.picture
    assert picture.to_dot() == view.dot
    ids = set(re.findall(r'\bid="([^"]+)"', view.dot))
    assert ids == set(picture), "every id in the text is an element, and nothing else is"
    assert picture["after/node:swapped_block"].kind == "swapped"
    assert picture["before/cluster:block"].call == "block"
    assert picture["before/node:linear"].cluster == "before/cluster:block"
    edge = picture["after/edge:x->swapped_block"]
    assert (edge.tail, edge.head) == ("after/node:x", "after/node:swapped_block")
    with pytest.raises(RenderError, match=r"no element 'node:nope'"):
        picture["node:nope"]
    boxed = graph_view(outer, collapse=1).picture
    box = boxed["module:block"]
    assert box.kind == "box" and box.calls == ("block",) and box.members == ("linear", "relu")
    assert boxed.element_of_node("relu") is box


def test_the_picture_answers_what_draws_a_call_what_is_inside_and_what_feeds_what(outer, swapped):
    picture = graph_view(outer, collapse=None).picture
    assert picture.elements_of_call("block") == ("cluster:block",)
    assert picture.elements_of_call("head") == ("node:linear_1",), "a one-node call: its node"
    assert picture.elements_of_call("block.lin") == ("node:linear",)
    assert picture.inside("cluster:block") == ("node:linear", "node:relu")
    assert picture.inside("node:linear") == ()
    assert [e.id for e in picture.edges_in("node:relu")] == ["edge:linear->relu"]
    assert [e.head for e in picture.edges_out("node:relu")] == ["node:linear_1"]
    boxed = graph_view(outer, collapse=1).picture
    assert boxed.elements_of_call("block") == ("module:block",)
    assert boxed.elements_of_call("block.lin") == (), "inside a box: nothing draws it alone"
    assert [e.tail for e in boxed.edges_in("module:head")] == ["module:block"]
    split = graph_view(swapped, diff="split").picture
    assert split.elements_of_call("block") == ("before/cluster:block", "after/cluster:block")
    assert split.inside("diff:after")[:2] == ("after/node:x", "after/node:swapped_block")
    with pytest.raises(RenderError, match=r"no element 'cluster:blok'"):
        picture.inside("cluster:blok")


def test_the_picture_is_semantic_and_to_dot_owns_every_dot_style(outer, swapped):
    fields = {f.name for f in dataclasses.fields(PictureNode)}
    assert not fields & {"statement", "dot_name", "attributes"}
    tokens = {"highlighted", "removed", "added", "fused", "swapped-boundary", "side"}
    views = [
        graph_view(outer, highlight="block"),
        graph_view(outer, collapse=1),
        graph_view(swapped, diff="split"),
        graph_view(gs.fuse(outer, "block")),
    ]
    for view in views:
        picture = view.picture
        for element in [*picture.nodes, *picture.clusters, *picture.edges]:
            text = " ".join(str(v) for v in dataclasses.astuple(element))
            assert not re.search(r"#[0-9a-f]{6}|penwidth|fillcolor|\[id=|;$", text), element
            style = getattr(element, "style", (getattr(element, "mark", "") or None,))
            assert set(style) - {None} <= tokens, element
    assert views[0].picture["cluster:block"].color == "Inner", "coloured by type"
    assert views[0].picture["cluster:block"].style == ("highlighted",)
    # a picture made of records alone: to_dot decides the text
    node = ("node:x", "input", "x", (), ("input",), "x", "x: input", None, (), None, ())
    box = ("module:m", "box", None, ("m",), ("module", "collapsed"), "m", "m", None, ("y",), "m")
    picture = Picture(
        "P",
        ("node:x", "module:m"),
        {"node:x": node, "module:m": (*box, ("removed",))},
        (("edge:x->module:m", "node:x", "module:m", "", "removed", None),),
    )
    assert body(picture.to_dot()) == (
        '  "x" [id="node:x", class="input", label="x", tooltip="x: input", style=filled, '
        'fillcolor="#e5e7eb"];\n'
        '  "module:m" [id="module:m", class="module collapsed", label="m", tooltip="m", '
        'shape=box3d, margin="0.1,0.06", style="filled,dashed", fillcolor="#f3f4f6", '
        'color="#9ca3af", fontcolor="#6b7280"];\n'
        '  "x" -> "module:m" [id="edge:x->module:m", style=dashed, color="#9ca3af"];\n'
    )


def test_the_rows_a_picture_keeps_are_its_records_fields_by_name():
    pairs = ((NodeRow, PictureNode), (ClusterRow, PictureCluster), (EdgeRow, PictureEdge))
    for row, record in pairs:
        fields = dataclasses.fields(record)
        assert row._fields == tuple(f.name for f in fields), record.__name__
        defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
        assert row._field_defaults == defaults, record.__name__
    picture = graph_view(gs.export(Outer(), (torch.randn(1, 2),)), collapse=1).picture
    assert {type(row) for row in picture.rows.values()} <= {NodeRow, ClusterRow}
    assert {type(row) for row in picture.edge_rows} == {EdgeRow}
    box = picture.rows["module:block"]
    assert (box.kind, box.calls, box.members) == (
        "box",
        ("block",),
        picture["module:block"].members,
    )


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_buffers_nothing_reads_are_not_drawn_and_one_readers_fold_into_it(train):
    torch.manual_seed(0)
    model = ConvBN().train(train)
    ep = gs.export(model, (torch.randn(2, 3, 8, 8),))
    buffers = {n.name for n in ep.graph.nodes if n.name.startswith("b_")}
    assert "b_bn_num_batches_tracked" in buffers, "precondition: BatchNorm buffers are inputs"
    dot = to_dot(ep, collapse=None)
    drawn = set(re.findall(r'id="node:(b_[^"]+)"', dot))
    assert drawn == set(), "each buffer is unread or read by one node: none is drawn alone"
    norm = next(line for line in dot.splitlines() if 'id="node:batch_norm' in line)
    assert "+ weight, bias, running_mean, running_var" in norm
    assert "buffer bn.running_mean f32[4]" in norm
    if train:  # the counter is read (and written) by its add_: folded there
        assert "+ num_batches_tracked" in dot
    else:  # eval: nothing reads it
        assert "num_batches_tracked" not in dot
    shown = to_dot(ep, collapse=None, show_parameters=True)
    assert 'id="node:b_bn_running_mean"' in shown, "show_parameters draws them, with edges"


# -- real models: the default view ------------------------------------------------------------
#
# Hugging Face models built from small configs (no download), an encoder of
# nn.MultiheadAttention and a ResNet: mask and position building in the model's own forward,
# runtime checks, stacks of identical layers.


def _hf(kind: str, layers: int):
    import transformers  # the dev extra installs it

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "gpt2":  # its default attention: the mask is built in GPT2Model.forward
        config = transformers.GPT2Config(
            n_layer=layers, n_embd=32, n_head=2, vocab_size=100, n_positions=32
        )
        model = transformers.GPT2LMHeadModel(config).eval()
        return model, (torch.randint(0, 100, (1, 8)),), {"use_cache": False}
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        model = transformers.LlamaForCausalLM(config).eval()
        mask = torch.ones(2, 12, dtype=torch.long)
        mask[1, 9:] = 0
        ids = torch.randint(0, 128, (2, 12))
        return model, (ids,), {"attention_mask": mask, "use_cache": False}
    config = transformers.BertConfig(
        num_hidden_layers=layers,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=32,
    )
    model = transformers.BertModel(config).eval()
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    return model, (torch.randint(0, 100, (2, 8)),), {"attention_mask": mask}


# name -> (how to build it, its layers' fqn pattern, the number of layers, a layer's attention)
REAL_MODELS = {
    "gpt2": (lambda: _hf("gpt2", 4), "transformer.h.{}", 4, ".attn"),
    "llama": (lambda: _hf("llama", 4), "model.layers.{}", 4, ".self_attn"),
    "llama-32": (lambda: _hf("llama", 32), "model.layers.{}", 32, ".self_attn"),
    "bert": (lambda: _hf("bert", 4), "encoder.layer.{}", 4, ".attention"),
    "vit": (
        lambda: (PatchEncoder().eval(), (torch.randn(2, 3, 16, 16),), {}),
        "encoder.layers.{}",
        4,
        ".self_attn",
    ),
    "resnet": (
        lambda: (SmallResNet().eval(), (torch.randn(1, 3, 16, 16),), {}),
        "layer2.{}",
        2,
        ".conv1",
    ),
}


@pytest.fixture(scope="module")
def real_models():
    made = {}

    def get(name: str):
        if name not in made:
            build, *_ = REAL_MODELS[name]
            model, args, kwargs = build()
            made[name] = gs.export(model, args, kwargs)
        return made[name]

    return get


def dot_edges(dot: str) -> list[tuple[str, str]]:
    """The (tail, head) DOT names of every edge statement."""
    return re.findall(r'^\s*"((?:[^"\\]|\\.)*)" -> "((?:[^"\\]|\\.)*)"', dot, flags=re.M)


def has_cycle(edges: list[tuple[str, str]]) -> bool:
    """Whether the edges close a cycle (Kahn's algorithm leaves nodes behind)."""
    heads: dict[str, list[str]] = {}
    indegree: dict[str, int] = {}
    for tail, head in edges:
        heads.setdefault(tail, []).append(head)
        indegree[head] = indegree.get(head, 0) + 1
        indegree.setdefault(tail, 0)
    ready = [n for n, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for head in heads.get(node, ()):
            indegree[head] -= 1
            if indegree[head] == 0:
                ready.append(head)
    return seen < len(indegree)


@needs_dot
@pytest.mark.parametrize("name", list(REAL_MODELS))
def test_a_real_model_shows_every_layer_without_cycles_in_readable_text(name, real_models):
    from graphsurgeon.display import svg_size
    from graphsurgeon.drawing import FIT_WIDTH, MIN_SCALE

    ep = real_models(name)
    _, pattern, count, attention = REAL_MODELS[name]
    layers = [pattern.format(i) for i in range(count)]
    assert all(layer in gs.partition(ep) for layer in layers), "precondition: its layers"
    drawing = gs.draw(ep)
    view = drawing.view
    for layer in layers:  # each a box of its own (up to 32 layers: no run), or open
        (element,) = drawing.picture.elements_of_call(layer)
        assert element in (f"module:{layer}", f"cluster:{layer}"), (element, view.caption())
    assert not has_cycle(dot_edges(drawing.dot))
    width, _ = svg_size(drawing.svg)
    assert min(1.0, FIT_WIDTH / width) >= MIN_SCALE and drawing.scale >= MIN_SCALE, width
    # showing a layer's attention (the stepper about to run it) draws that layer more, only:
    # in draw's view (the budget it chose) and in graph_view's
    layer = layers[1]
    for default in (view, graph_view(ep)):
        budget = drawing.max_nodes if default is view else render.AUTO_MAX_NODES
        shown = graph_view(ep, highlight=layer + attention, max_nodes=budget)
        opened = set(shown.clusters) - set(default.clusters)
        assert shown.picture.elements_of_call(layer + attention), "drawn, not in a box"
        assert all(c == layer or c.startswith(layer + ".") for c in opened), opened
        assert shown.drawn_nodes - default.drawn_nodes <= len(gs.partition(ep)[layer].nodes)
        assert not has_cycle(dot_edges(shown.dot))
    assert layer in set(
        graph_view(ep, highlight=layer + attention, max_nodes=drawing.max_nodes).clusters
    )


def test_the_mask_building_of_a_decoder_is_one_box_that_opens_like_a_module(real_models):
    from graphsurgeon.partition import call_index

    ep = real_models("gpt2")
    # the precondition: GPT2Model.forward builds its mask itself, in ~45 ops of no submodule
    chains = call_index(ep).chains
    assert sum(1 for chain in chains.values() if chain[-1:] == ("transformer",)) > 40
    view = graph_view(ep, max_nodes=20)
    box = view.picture["ops:transformer"]
    assert box.kind == "ops" and box.calls == ("transformer",) and len(box.members) >= 30
    assert box.label.startswith("GPT2Model: ") and " ops\n" in box.label
    assert view.folded_ops == ("ops:transformer",)
    assert [e.tail for e in view.picture.edges_in("ops:transformer")] == ["node:input_ids"]
    assert all(layer in view.collapsed for layer in ("transformer.h.0", "transformer.h.3"))
    # opened like a module: by name, fully open, by depth
    opened = graph_view(ep, collapse={"transformer.h.0"})
    assert not opened.folded_ops and all(f"node:{n}" in opened.picture for n in box.members)
    assert not graph_view(ep, collapse=None).folded_ops
    assert graph_view(ep, collapse=2).folded_ops == ("ops:transformer",)
    assert graph_view(ep, collapse=3).folded_ops == ()
    with pytest.raises(gs.errors.UnknownModuleError, match="transfromer"):
        graph_view(ep, collapse={"ops:transfromer"})
    assert graph_view(ep, highlight="ops:transformer", max_nodes=20).folded_ops == ()


def test_the_default_view_opens_a_decoders_layers_before_its_mask_building(real_models):
    ep = real_models("gpt2")
    # the top level's own ops (~45 mask-building ops) open only when no group of modules fits
    # any more: they were the cheapest group, opened before the attentions
    seen = []
    for budget in range(60, 400, 20):
        view = graph_view(ep, max_nodes=budget)
        attentions = {c for c in view.clusters if c.endswith(".attn")}
        seen.append((bool(view.folded_ops), bool(attentions)))
    assert (True, True) in seen, "the attentions open while the mask building stays one box"
    assert (False, True) in seen and (True, False) in seen  # with more room, and with less


def test_the_top_level_own_ops_are_a_box_too():
    ep = exported(Positions(), torch.randn(2, 4))
    assert graph_view(ep).folded_ops == (), "a small program: everything open, as before"
    view = graph_view(ep, collapse=1)
    assert view.folded_ops == ("ops:",)
    box = view.picture["ops:"]
    assert box.calls == () and box.label.startswith("Positions: 5 ops")
    assert box.members == ("arange", "unsqueeze", "to", "mul", "add"), "from the inputs alone"
    assert [e.head for e in view.picture.edges_out("ops:")] == ["module:lin"]
    assert [e.tail for e in view.picture.edges_in("ops:")] == ["node:x"]
    assert graph_view(ep, collapse={"ops:"}).folded_ops == ("ops:",)


def test_checks_are_hidden_unless_asked(real_models):
    ep = real_models("llama")
    checks = [n.name for n in ep.graph.nodes if "_assert_tensor_metadata" in str(n.target)]
    assert checks, "precondition: the program records run-time checks"
    hidden = to_dot(ep, collapse=None)
    assert not any(f'id="node:{name}"' in hidden for name in checks)
    shown = to_dot(ep, collapse=None, show_checks=True)
    assert all(f'id="node:{name}"' in shown for name in checks)


def test_run_boxes_only_over_chains_and_never_a_cycle():
    torch.manual_seed(0)
    model = TinyGPT(4).eval()
    ep = gs.export(model, (model.example_input(),))
    attention = ["layers.1.attn.q", "layers.1.attn.k", "layers.1.attn.v", "layers.1.attn.o"]
    # the precondition: q, k, v, o are siblings of one type in a row, and so are embed, pos;
    # but only v feeds o (through the attention), and the projection reads what q, k, v made
    calls = list(gs.partition(ep))
    assert calls[calls.index(attention[0]) : calls.index(attention[0]) + 4] == attention
    for budget in (8, 20, 30, 50):
        view = graph_view(ep, highlight="layers.1.attn", max_nodes=budget)
        runs = [e for e in view.picture.nodes if e.kind == "box" and len(e.calls) > 1]
        for run in runs:
            assert not {"layers.1.attn.q", "layers.1.attn.o"} <= set(run.calls), run.label
            assert not {"embed", "pos"} <= set(run.calls), run.label
        assert not has_cycle(dot_edges(view.dot)), budget
    stacked = graph_view(ep, max_nodes=4)
    assert "layers.0 … layers.3: Block × 4" in stacked.dot, "a chain of layers is one run"


def test_identical_layers_have_one_colour_and_stay_in_model_order(real_models):
    view = graph_view(real_models("llama"), collapse=2)
    fills = {
        e.id: re.search(r'fillcolor="(#\w+)"', line).group(1)
        for e in view.picture.nodes
        if e.id.startswith("module:model.layers.")
        for line in view.dot.splitlines()
        if f'id="{e.id}"' in line
    }
    assert len(fills) == 4 and len(set(fills.values())) == 1, fills
    if shutil.which("dot"):
        root = ET.fromstring(to_svg(real_models("llama"), collapse=2))
        tops = []
        for i in range(4):
            group = next(
                g for g in root.iter(f"{SVG}g") if g.get("id") == f"module:model.layers.{i}"
            )
            points = next(group.iter(f"{SVG}polygon")).get("points").split()
            tops.append(min(float(p.split(",")[1]) for p in points))
        assert tops == sorted(tops), "layers.0 drawn above layers.1, and so on"


# -- overlays: values painted on the picture --------------------------------------------------


@pytest.fixture(scope="module")
def ten_swaps():
    """A Surgery of a 5-layer decoder with 10 swaps: exact copies, but for a wrong attention
    in layer 1 and an approximate MLP in layer 3."""
    import copy

    from graphsurgeon.examples import GeluTanhMLP

    torch.manual_seed(0)
    model = TinyGPT(5).eval()
    tokens = model.example_input()
    s = gs.Surgery.from_model(model, (tokens,))
    for i, layer in enumerate(model.layers):
        s.swap(
            f"layers.{i}.attn", NoCausalMask(layer.attn) if i == 1 else copy.deepcopy(layer.attn)
        )
        s.swap(f"layers.{i}.mlp", GeluTanhMLP(layer.mlp) if i == 3 else copy.deepcopy(layer.mlp))
    return s


@needs_dot
def test_the_error_overlay_marks_the_first_wrong_swap_and_nothing_drawn_before_it(ten_swaps):
    s = ten_swaps
    assert len(s.replacements) == 10, "precondition"
    assert not gs.verify(s.program, s.module, s.args), "precondition: two swaps are wrong"
    drawing = gs.draw(s, overlay="error", collapse=None)
    overlay, picture = drawing.overlay, drawing.picture
    assert overlay and set(overlay) <= set(picture), "keyed by the ids drawn"
    marked = next(i for i in picture if overlay.get(i, 0) > 1)
    assert marked == "node:swapped_layers_1_attn"
    before = [overlay[i] for i in list(picture)[: list(picture).index(marked)] if i in overlay]
    assert len(before) > 10 and max(before) <= 1e-6
    values = drawing.overlay_values
    assert overlay[marked] == values.nodes["swapped_layers_1_attn"] > 1e3
    # heat colours: hottest beyond the tolerance; the tooltip says the value
    line = next(x for x in drawing.dot.splitlines() if 'id="node:swapped_layers_1_attn"' in x)
    assert 'fillcolor="#f87171"' in line and "error: 4.7" in line
    html = drawing._repr_html_()
    assert 'class="gs-legend"' in html and "error overlay" in html
    # a box by the worst of its members: a module, a run of layers
    boxed = graph_view(s, overlay=values, collapse=1)
    assert boxed.overlay["module:layers.1"] == values.calls["layers.1"] >= overlay[marked]
    assert values.calls["layers.1"] == max(
        values.nodes[n] for n in boxed.picture["module:layers.1"].members if n in values.nodes
    )
    assert boxed.overlay["module:layers.0"] == 0.0 and boxed.overlay_values is values
    run = graph_view(s, overlay=values, max_nodes=4)
    assert run.overlay["modules:layers.0..layers.4"] == max(values.nodes.values())
    assert drawing.view.overlay == graph_view(s, overlay=values, collapse=None).overlay


def test_latency_boxes_sum_their_members_and_values_of_ones_own_show_as_given():
    from graphsurgeon.checks.overlay import overlay_values

    torch.manual_seed(0)
    model = TinyGPT(2).eval()
    tokens = model.example_input()
    ep = gs.export(model, (tokens,))
    latency = overlay_values(ep, (tokens,), kind="latency", repeat=1)
    view = graph_view(ep, overlay=latency, collapse=1)
    members = view.picture["module:layers.0"].members
    assert view.overlay["module:layers.0"] == pytest.approx(
        math.fsum(latency.nodes[n] for n in members if n in latency.nodes)
    )
    assert view.picture.heat.low == 0 and view.picture.heat.high == max(view.overlay.values())
    mine = graph_view(ep, overlay={"layers.1": 3.0, "layers.0.attn": 0.5}, collapse=1)
    assert mine.overlay["module:layers.1"] == 3.0 and "values: 3" in mine.dot
    assert mine.overlay["module:layers.0"] == 0.5, "the worst of what it holds"
    with pytest.raises(RenderError, match="runs the program: pass its inputs"):
        to_dot(ep, overlay="latency")
    assert 'id="node:tokens"' in to_dot(ep, overlay="latency", args=(tokens,), collapse=None)


# -- a stack of layers, laid out one layer at a time ------------------------------------------


def _positions(svg: str, cluster: str) -> list[tuple[float, float]]:
    """The first text position of every node inside ``cluster``'s box, relative to its corner."""
    root = ET.fromstring(svg)
    groups = {g.get("id"): g for g in root.iter(f"{SVG}g")}
    points = next(groups[cluster].iter(f"{SVG}polygon")).get("points").split()
    left = min(float(p.split(",")[0]) for p in points)
    top = min(float(p.split(",")[1]) for p in points)
    bottom = max(float(p.split(",")[1]) for p in points)
    found = []
    for group_id, group in groups.items():
        if not (group_id or "").startswith("node:"):
            continue
        text = next(group.iter(f"{SVG}text"), None)
        if text is None:
            continue
        x, y = float(text.get("x")), float(text.get("y"))
        if top <= y <= bottom and x >= left:
            found.append((round(x - left, 1), round(y - top, 1)))
    return sorted(found)


@needs_dot
def test_a_stack_of_identical_layers_is_laid_out_one_layer_at_a_time(monkeypatch):
    from graphsurgeon.render import _stack

    monkeypatch.setattr(_stack, "MIN_NODES", 0)  # a small stack, to keep the test quick
    torch.manual_seed(0)
    model = TinyGPT(10).eval()
    ep = gs.export(model, (model.example_input(),))
    view = graph_view(ep, collapse=None)
    assert len(view.clusters) == 30 and "layers.9.mlp" in view.clusters, "precondition: open"
    runs = []
    real_run = graphviz_runner.run

    def counting_run(texts, arguments, program="dot"):
        runs.append((program, len(texts)))
        return real_run(texts, arguments, program)

    monkeypatch.setattr(graphviz_runner, "run", counting_run)
    graphviz_runner._LAYOUTS.clear()
    svg = view.laid_out("svg").decode()
    # a few layouts of one layer each, the picture around the stack, then drawn as one
    assert runs[0][0] == "dot" and runs[0][1] < 10 and runs[1:] == [("dot", 1), ("neato", 1)]
    whole = subprocess.run(["dot", "-Tsvg"], input=view.dot.encode(), capture_output=True)
    ids = set(re.findall(r'<g id="([^"]+)"', svg))
    assert ids == set(re.findall(r'<g id="([^"]+)"', whole.stdout.decode())), "the same picture"
    # one column in model order, identical layers laid out alike
    root = ET.fromstring(svg)
    boxes = []
    for i in range(10):
        group = next(g for g in root.iter(f"{SVG}g") if g.get("id") == f"cluster:layers.{i}")
        points = [p.split(",") for p in next(group.iter(f"{SVG}polygon")).get("points").split()]
        xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
        boxes.append((min(xs), max(xs), min(ys), max(ys)))
    assert len({(round(a), round(b)) for a, b, _, _ in boxes}) == 1, "one column"
    assert [top for _, _, top, _ in boxes] == sorted(top for _, _, top, _ in boxes)
    assert _positions(svg, "cluster:layers.2") == _positions(svg, "cluster:layers.7")
    # no stack, no parts: laid out whole
    assert _stack._stack(graph_view(exported(Outer(), torch.randn(1, 2))).picture) is None
    # the layout of the text alone is dot's, whatever was laid out before (pure, by text)
    runs.clear()
    assert graphviz_runner.layout(view.dot) == whole.stdout and not runs


@needs_dot
def test_a_stack_laid_out_in_parts_that_cannot_be_joined_says_what_failed(monkeypatch):
    from graphsurgeon.render import _stack

    monkeypatch.setattr(_stack, "MIN_NODES", 0)
    torch.manual_seed(0)
    model = TinyGPT(8).eval()
    view = graph_view(gs.export(model, (model.example_input(),)), collapse=None)
    real_run = graphviz_runner.run

    def losing_the_placeholder(texts, arguments, program="dot"):
        outputs = real_run(texts, arguments, program)
        if program == "dot" and len(texts) == 1:  # the skeleton: its placeholder goes missing
            return [out.replace(b'"name": "stack:"', b'"name": "lost"') for out in outputs]
        return outputs

    monkeypatch.setattr(graphviz_runner, "run", losing_the_placeholder)
    graphviz_runner._LAYOUTS.clear()
    message = r"8 layers layers\.0 … layers\.7 laid out one at a time failed while placing"
    with pytest.raises(RenderError, match=message):
        view.laid_out("svg")


def test_a_diff_draws_what_the_swap_says_it_removed_size_arithmetic_dropped_outside_calls_too():
    torch.manual_seed(0)
    tokens = torch.export.Dim("tokens", max=64)
    ep = exported(SizedHeads(), torch.randn(1, 5, 4), dynamic_shapes=({1: tokens},))
    gm = gs.swap(ep, {"heads": Halves()})
    diff = swap_info(gm).diff
    assert diff.removed_by_call[""] == ("sym_size_int_1",), "precondition: dropped, no call's"

    def marked(picture, token: str) -> set[str]:
        return {node.node for node in picture.nodes if token in node.style}

    merged = graph_view(gm, diff="merged", collapse=None).picture
    assert marked(merged, "removed") == set(diff.removed)  # the swap's answer, all of it
    assert marked(merged, "added") == {"swapped_heads"} and "swapped_heads" in diff.added
    # greyed where it was: after the input it reads, not first
    assert merged.top.index("node:sym_size_int_1") == merged.top.index("node:x") + 1
    split = graph_view(gm, diff="split", collapse=None).picture
    assert "removed" in split["before/node:sym_size_int_1"].style


def test_a_replaced_region_of_ops_is_drawn_before_and_after_like_a_swap():
    def silu(x):
        return x * torch.sigmoid(x)

    torch.manual_seed(0)
    s = gs.Surgery.from_model(
        nn.Sequential(LinearThenInlineSilu(), LinearThenInlineSilu()), (torch.randn(2, 4),)
    )
    s.replace(silu, nn.SiLU(), (torch.randn(3, 4),))
    assert list(s.regions) == ["silu:0", "silu:1"]  # precondition: two regions, no modules
    # was KeyError: 'silu:0' (a diff opens the swapped calls, and the original has no such call)
    for diff in (True, "split"):
        dot = to_dot(s, diff=diff, collapse=None)
        assert "(x: f32[2, 4]) → f32[2, 4]" in dot and "(?)" not in dot
    merged = graph_view(s, diff=True, collapse=None).picture
    inside = set(merged.inside("cluster:silu:0"))
    removed = set(s.regions["silu:0"].nodes)
    assert {f"node:{name}" for name in removed} <= inside  # what it replaced, in its box
    assert not {f"node:{name}" for name in s.regions["silu:1"].nodes} & inside


def test_show_opens_like_highlight_without_marking(tiny_gpt):
    _, _, ep = tiny_gpt
    closed = graph_view(ep, collapse=1)
    assert "layers.1.attn" not in closed.clusters  # precondition: collapsed at depth 1
    marked = graph_view(ep, collapse=1, highlight="layers.1.attn")
    shown = graph_view(ep, collapse=1, show="layers.1.attn")
    assert shown.clusters == marked.clusters and "layers.1.attn" in shown.clusters
    assert marked.highlighted and not shown.highlighted
    assert "highlighted" not in shown.dot


def test_layer_calls_reads_repeated_blocks_at_any_length_asked():
    # stages.0 .. stages.2 under the root; inside stages.1 two blocks of one type; a stack
    # (MIN_LAYERS) needs eight
    from types import SimpleNamespace as Call

    from graphsurgeon.render import layer_calls

    calls = {
        "stem": Call(parent="", type="Conv"),
        "stages.0": Call(parent="", type="Stage"),
        "stages.1": Call(parent="", type="Stage"),
        "stages.1.layers.0": Call(parent="stages.1", type="Block"),
        "stages.1.layers.1": Call(parent="stages.1", type="Block"),
        "stages.2": Call(parent="", type="Stage"),
        "head": Call(parent="", type="Linear"),
    }
    assert layer_calls(calls) == frozenset()
    assert layer_calls(calls, at_least=2) == {
        "stages.0",
        "stages.1",
        "stages.2",
        "stages.1.layers.0",
        "stages.1.layers.1",
    }
