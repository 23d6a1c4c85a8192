"""module_tree() and partition(): which nodes each call owns, and whether it can be swapped."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.export_models import (
    Block,
    Branching,
    CalledTwice,
    CountsTwice,
    HoldsMixer,
    Keywords,
    Model,
    PassThrough,
    ReadsLeak,
    RepeatedCallName,
    SecondCallTo,
)
from helpers.references import check_swap
from torch import nn

import graphsurgeon as gs
from graphsurgeon.partition import program_index


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    model = Model()
    return gs.export(model, (torch.randn(2, 4),))


def test_the_tree_lists_every_module_with_its_type_calls_and_nodes(program):
    tree = gs.module_tree(program)
    assert list(tree) == [
        "",
        "blocks",
        "blocks.0",
        "blocks.0.lin",
        "blocks.0.act",
        "blocks.1",
        "blocks.1.lin",
        "blocks.1.act",
        "shared",
    ]
    assert tree["blocks.0"].type_name == "Block" and tree["blocks.0"].calls == 1
    assert tree["blocks.0"].num_nodes == 2 and tree["blocks.0"].children == (
        "blocks.0.lin",
        "blocks.0.act",
    )
    assert tree["shared"].calls == 2 and tree["shared"].call_names == ("shared", "shared@1")
    assert tree[""].children == ("blocks", "shared")


def test_a_container_has_no_calls_and_says_so(program):
    info = gs.module_tree(program)["blocks"]
    assert info.calls == 0 and not info.swappable and "never called" in info.reason


def test_partitions_hold_nodes_in_graph_order_and_signature_names(program):
    parts = gs.partition(program)
    block = parts["blocks.1"]
    names = [n.name for n in program.graph.nodes]
    assert list(block.nodes) == sorted(block.nodes, key=names.index)
    assert block.nodes == ("linear_1", "relu_1")
    assert block.input_names == ("relu",) and block.output_names == ("relu_1",)
    assert parts["shared@1"].call_index == 1 and parts["shared@1"].input_names == ("linear_2",)


def test_every_preserved_module_is_swappable_here(program):
    tree = gs.module_tree(program)
    assert [f for f, i in tree.items() if f and not i.swappable] == ["blocks"]


def test_the_table_reads_as_a_tree(program):
    table = gs.module_tree(program).table()
    lines = table.splitlines()
    assert lines[0].split() == ["module", "type", "calls", "nodes", "swappable"]
    assert any(line.startswith("      lin ") for line in lines)
    assert "never called" in table


def test_an_unknown_fqn_says_did_you_mean(program):
    with pytest.raises(gs.errors.UnknownModuleError, match="Did you mean 'shared'"):
        gs.module_tree(program)["sharde"]


def test_not_preserved_modules_say_how_to_preserve(program):
    model = Model()
    ep = torch.export.export(
        model, (torch.randn(2, 4),), preserve_module_call_signature=("shared",)
    )
    info = gs.module_tree(ep)["blocks.0"]
    assert not info.preserved and not info.swappable
    assert "preserve_module_call_signature" in info.reason


def test_a_module_left_out_of_preserve_says_to_add_it_there():
    model = Model()
    ep = gs.export(model, (torch.randn(2, 4),), preserve=["shared"])
    info = gs.module_tree(ep)["blocks.0"]
    assert not info.preserved
    assert "preserve=[..., 'blocks.0']" in info.reason and "torch.export" not in info.reason


def test_a_module_without_nodes_is_not_swappable_and_says_why():
    # torch.export itself records no node for nn.Identity: nothing says where it is called
    ep = torch.export.export(
        PassThrough(), (torch.randn(3),), preserve_module_call_signature=("ident",)
    )
    assert gs.partition(ep)["ident"].nodes == ()  # precondition: no node records the call
    info = gs.module_tree(ep)["ident"]
    assert not info.swappable and "no nodes of its own" in info.reason
    assert "returns its input 'x' as it is" in info.reason and "gs.export" in info.reason
    with pytest.raises(gs.errors.NotSwappableError, match=r"'ident'.*swap the module that calls"):
        gs.swap(ep, {"ident": nn.ReLU()})


def test_gs_export_records_where_a_module_without_ops_is_called():
    # gs.export gives nn.Identity's result an alias node of its own: it can be swapped
    torch.manual_seed(0)
    model, x = PassThrough(), torch.randn(3)
    ep = gs.export(model, (x,))
    part = gs.partition(ep)["ident"]
    assert part.swappable and len(part.nodes) == 1
    check_swap(model, (x,), {"ident": nn.Tanh()}, ep=ep)


@pytest.mark.filterwarnings("ignore:The tensor attribute self.leaky.last_hidden")
def test_a_side_output_makes_a_module_not_swappable():
    ep = gs.export(ReadsLeak(), (torch.randn(3),))
    part = gs.partition(ep)["leaky"]
    assert not part.swappable and "is not one of its outputs" in part.reason


@pytest.mark.filterwarnings(
    r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"
)
def test_a_partition_that_is_not_convex_is_reported():
    #   x -> block(lin -> act);  the lin node is taken out of the block's partition by hand,
    #   so a node outside the block sits between two of its nodes
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Tanh()))
    ep = gs.export(model, (torch.randn(2, 4),))
    assert gs.partition(ep)["0"].swappable
    broken = copy.deepcopy(ep)
    relu = next(n for n in broken.graph.nodes if n.name == "relu")
    relu.meta["nn_module_stack"] = {
        k: v for k, v in relu.meta["nn_module_stack"].items() if v[0] in ("",)
    }
    part = gs.partition(broken)["0"]
    assert not part.swappable and "not convex" in part.reason and "'relu'" in part.reason


def test_partition_rejects_a_non_program():
    with pytest.raises(TypeError, match="ExportedProgram"):
        gs.partition(nn.Linear(2, 2))


def test_every_verb_refuses_a_non_program_with_a_hint_back_to_the_program():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    ep = gs.export(model, (torch.randn(1, 2),))
    gm = gs.swap(ep, {})
    verbs = {
        "swap": lambda p: gs.swap(p, {}),
        "fuse": lambda p: gs.fuse(p, ["0"]),
        "module_tree": gs.module_tree,
        "partition": gs.partition,
    }
    for call in verbs.values():
        with pytest.raises(gs.errors.NotAProgramError, match=r"swap_info\(gm\)\.program"):
            call(gm)
        with pytest.raises(gs.GraphSurgeonError, match=r"a model: export it first"):
            call(model)
        with pytest.raises(TypeError, match=r"got an int"):  # still a TypeError as well
            call(3)


def test_the_cached_index_does_not_keep_a_program_alive():
    import gc
    import weakref

    ep = gs.export(Model(), (torch.randn(2, 4),))
    gs.partition(ep)
    gs.swap(ep, {})  # the unswapped result is dropped at once; only the caches remain
    alive = weakref.ref(ep)
    del ep
    gc.collect()
    assert alive() is None


def test_a_loaded_program_knows_its_root_type(tmp_path):
    ep = gs.export(Model(), (torch.randn(2, 4),))
    torch.export.save(ep, tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2")
    assert gs.module_tree(loaded)[""].type_name == "Model"


def test_a_module_named_like_a_repeated_call_is_refused_at_export_and_in_the_tree():
    x = torch.randn(2, 4)
    with pytest.raises(gs.ExportError, match=r"'blk@1' could be the second call of 'blk'.*'blk_1'"):
        gs.export(RepeatedCallName(), (x,))
    ep = torch.export.export(RepeatedCallName(), (x,))  # made elsewhere: refused when read
    with pytest.raises(gs.errors.PartitionError, match="could be the second call of 'blk'"):
        gs.module_tree(ep)


def test_a_module_lost_from_the_call_graph_is_not_preserved_rather_than_unknown():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    assert gs.module_tree(gs.export(Model(), (x,)))["blocks.1"].swappable  # precondition
    ep = gs.export(Model(), (x,))
    # A program made (or transformed) elsewhere may record fewer module signatures.
    ep._module_call_graph = [e for e in ep.module_call_graph if e.fqn != "blocks.1"]
    info = gs.module_tree(ep)["blocks.1"]
    assert not info.swappable and info.reason.startswith("not preserved")
    with pytest.raises(gs.errors.NotPreservedError, match=r"'blocks\.1'.*not preserved"):
        gs.swap(ep, {"blocks.1": Block()})


def test_a_module_called_only_inside_a_cond_branch_says_so():
    ep = gs.export(Branching(), (torch.randn(2, 4),))
    tree = gs.module_tree(ep)
    assert tree["inside"].calls == 0  # precondition: the program's graph has no call of it
    assert "called only inside a torch.cond branch" in tree["inside"].reason
    assert "never called during export" in tree["unused"].reason


def test_module_names_that_are_keywords_or_hold_quotes_work_everywhere():
    torch.manual_seed(0)
    model = Keywords().eval()
    x = torch.randn(2, 4)
    ep = gs.export(model, (x,))
    names = ["d.in", "d.a'b", 'd.c"d\ne']
    assert all(gs.module_tree(ep)[n].swappable for n in names)
    replacements = {n: nn.Linear(4, 4) for n in names}
    gm = gs.swap(ep, replacements)
    reference = copy.deepcopy(model)
    for name, module in replacements.items():
        reference.d[name[2:]] = module
    with torch.no_grad():
        assert not torch.allclose(reference(x), model(x))  # precondition
        torch.testing.assert_close(gm(x), reference(x))
    assert gs.verify(reference, gm, (x,)).ok
    stepper = gs.Stepper(gm, x)
    assert stepper.run_to(module="d.in").reason == "target"
    stepper.continue_()
    torch.testing.assert_close(stepper.output, reference(x))
    fused = gs.fuse(ep, names)  # (torch's own ep.module() fails on the newline: SyntaxError)
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
    assert "d.in" in gs.to_dot(gm)


def test_a_module_writing_a_buffer_in_place_called_twice_swaps_every_call_or_one():
    # The second call reads the buffer through the first call's add_: that is state, not an
    # input the signature forgot.
    torch.manual_seed(0)
    model, x = CountsTwice(), torch.randn(3, 3)
    ep = gs.export(copy.deepcopy(model), (x,))
    tree = gs.module_tree(ep)
    assert tree["counter"].swappable, tree["counter"].reason
    replacement = copy.deepcopy(model.counter)
    with torch.no_grad():
        replacement.lin.bias.add_(1.0)
    every = copy.deepcopy(model)
    every.counter = copy.deepcopy(replacement)
    one = copy.deepcopy(model)
    one.counter = SecondCallTo(copy.deepcopy(model.counter), copy.deepcopy(replacement))
    with torch.no_grad():
        # (on copies: running a model writes its buffer)
        changed = copy.deepcopy(model)(x), copy.deepcopy(every)(x)
        assert not torch.allclose(*changed), "precondition: the swap changes it"
        for name, reference in (("counter", every), ("counter@1", one)):
            fresh = copy.deepcopy(reference)
            gm = gs.swap(ep, {name: copy.deepcopy(replacement)})
            torch.testing.assert_close(gm(x), fresh(x))


def test_asking_the_tree_for_a_module_it_does_not_have():
    tree = gs.module_tree(gs.export(nn.Sequential(nn.Linear(2, 2)), (torch.randn(1, 2),)))
    assert "0" in tree and "1" not in tree and "" in tree
    assert tree.get("1") is None
    with pytest.raises(gs.errors.UnknownModuleError, match=r"no module '1'"):
        tree["1"]


def test_a_partition_says_how_the_program_calls_the_module(tiny_gpt):
    _, _, ep = tiny_gpt
    part = gs.partition(ep)["layers.1.attn"]
    assert part.call_text == "(x: f32[1, 16, 64]) → f32[1, 16, 64]"
    assert "called as" in part._repr_mimebundle_()["text/html"]
    unpreserved = gs.partition(torch.export.export(Model(), (torch.randn(2, 4),)))
    assert unpreserved and not any(p.preserved for p in unpreserved.values())
    assert all(p.call_text == "" for p in unpreserved.values())


def test_every_entry_point_reads_a_name_the_same_way():
    model, x = CalledTwice().eval(), torch.randn(2, 4)
    s = gs.Surgery.from_model(model, (x,))
    ep = s.program
    index = program_index(ep)
    assert index.resolve("blk@0").name == "blk" and index.resolve("blk").calls == ("blk", "blk@1")
    # "blk@0" is the first call everywhere: swap, the picture, the stepper, the widget
    first = gs.swap(ep, {"blk@0": nn.Identity()})
    assert torch.allclose(first(x), model.head(model.blk(x)))
    assert "blk" in gs.render.graph_view(ep, highlight="blk@0").highlighted
    stepper = gs.Stepper(ep, x)
    stepper.run_to("blk@0")
    assert stepper.current.name == "linear"
    widget = gs.SurgeryWidget(s, namespace={})
    widget.select("blk@0")
    assert widget.selected == "blk"
    # an unknown name: one error class from every entry point, each saying what is close
    calls = {
        "swap": lambda name: gs.swap(ep, {name: nn.Identity()}),
        "fuse": lambda name: gs.fuse(ep, [name]),
        "to_dot": lambda name: gs.to_dot(ep, highlight=name),
        "stepper": lambda name: gs.Stepper(ep, x).run_to(name),
        "widget": lambda name: widget.select(name),
        "tree": lambda name: gs.module_tree(ep)[name],
    }
    for entry, call in calls.items():
        with pytest.raises(gs.errors.UnknownNameError, match=r"Did you mean 'blk'") as caught:
            call("blkk")
        assert isinstance(caught.value, KeyError), entry
    for call in list(calls.values())[:3]:
        with pytest.raises(gs.errors.UnknownModuleError, match=r"there is no call 'blk@2'"):
            call("blk@2")


def test_a_module_whose_weights_a_parent_reads_says_to_swap_the_parent():
    """Was: "never called during export (a container such as nn.ModuleList, or unused)"."""
    ep = gs.export(HoldsMixer(), (torch.randn(1, 5, 4),))
    info = gs.module_tree(ep)["mixer.conv1d"]
    assert info.calls == 0 and not info.swappable
    assert "its weights ('weight', 'bias') are read by 'mixer' directly" in info.reason
    assert info.reason.endswith("swap 'mixer'")
    with pytest.raises(gs.errors.NotSwappableError, match=r"read by 'mixer' directly"):
        gs.swap(ep, {"mixer.conv1d": nn.Identity()})
    assert gs.module_tree(ep)["mixer"].swappable and gs.module_tree(ep)["mixer"].note is None
