"""Programs exported with strict=True work as the non-strict ones do.

torch's strict tracer (dynamo) records a program differently: its guards name the inputs
``L['flat_args'][i]``, and its module stacks key each call by the module's id and record the
path as the Python expression that reached the module (``d._modules['a"b']``,
``getattr(L['self'], 'blk@1')``). Each test exports the same model both ways and checks the
swapped program against the eager reference.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.references import check_swap, clone_tree, eager_reference
from helpers.swap_models import (
    Ambiguous,
    Containers,
    Deep,
    Keys,
    Loop,
    NestedInputs,
    Parity,
    Rows,
    Spelled,
    Twice,
    Varargs,
    _OnlyCall,
)
from torch import nn
from torch.export import Dim

import graphsurgeon as gs
from graphsurgeon.partition import split_call_name

BOTH = pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])


def _refused_by_torch(ep, *args, **kwargs):
    """The precondition of each guard test: torch's own ep.module() refuses these inputs too."""
    with pytest.raises(Exception, match="Guard failed"):
        ep.module()(*args, **kwargs)


def _changed(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with other weights: a replacement that changes the numbers."""
    replacement = copy.deepcopy(module)
    with torch.no_grad():
        for parameter in replacement.parameters():
            parameter.add_(0.5)
    return replacement


# -- 1. the tracer's guards, however torch names the inputs ---------------------------------


@BOTH
def test_a_shape_condition_is_checked_and_says_what_arrived(strict):
    model, x = Parity().eval(), torch.randn(4, 4)
    ep = gs.export(model, (x,), dynamic_shapes=({0: Dim.AUTO},), strict=strict)
    gm, _, reference = check_swap(model, (x,), {"a": _changed(model.a)}, ep=ep)
    with torch.no_grad():
        for batch in (2, 6):
            y = torch.randn(batch, 4)
            torch.testing.assert_close(gm(y), reference(y))
    odd = torch.randn(5, 4)
    _refused_by_torch(ep, odd)
    message = r"condition of the program: x\.size\(\)\[0\] % 2 == 0 \(x\.size\(\)\[0\] is 5\)"
    with pytest.raises(gs.GuardError, match=message):
        gm(odd)
    with pytest.raises(gs.GuardError, match=message):
        gs.fuse(ep, ["a"])(odd)


@BOTH
def test_the_conditions_on_a_dynamic_int_are_checked(strict):
    model, x = Rows().eval(), torch.randn(4, 4)
    ep = gs.export(model, (x, 3), dynamic_shapes=(None, Dim.DYNAMIC), strict=strict)
    gm, _, reference = check_swap(model, (x, 3), {"a": _changed(model.a)}, ep=ep)
    with torch.no_grad():
        torch.testing.assert_close(gm(x, 2), reference(x, 2))
    _refused_by_torch(ep, x, 1)
    with pytest.raises(gs.GuardError, match=r"k != 1 \(k is 1\)"):
        gm(x, 1)
    _refused_by_torch(ep, x, 0)
    with pytest.raises(gs.GuardError, match=r"4 \* k >= 2 \(k is 0\)"):
        gm(x, 0)


@BOTH
def test_each_leaf_of_structured_inputs_is_found_in_the_conditions(strict):
    # strict export numbers the leaves across every argument: L['flat_args'][4] is w
    model = NestedInputs().eval()
    x, d, w = torch.randn(2, 4), {"a": torch.randn(6)}, torch.randn(2)
    lst = [torch.randn(2), torch.randn(4)]
    dynamic = {
        "x": None,
        "d": {"a": {0: Dim.AUTO}},
        "lst": [None, {0: Dim.AUTO}],
        "w": {0: Dim.AUTO},
    }
    ep = gs.export(model, (x, d, lst), {"w": w}, dynamic_shapes=dynamic, strict=strict)
    gm, _, reference = check_swap(model, (x, d, lst), {"a": _changed(model.a)}, {"w": w}, ep=ep)
    # other sizes for which every condition holds as at export
    d9, lst8, w4 = {"a": torch.randn(9)}, [torch.randn(2), torch.randn(8)], torch.randn(4)
    with torch.no_grad():
        torch.testing.assert_close(gm(x, d9, lst8, w=w4), reference(x, d9, lst8, w=w4))
    wrong = {
        r"d\['a'\]\.size\(\)\[0\] % 3 == 0 \(d\['a'\]\.size\(\)\[0\] is 7\)": (
            (x, {"a": torch.randn(7)}, lst),
            {"w": w},
        ),
        r"lst\[1\]\.size\(\)\[0\] % 2 == 0 \(lst\[1\]\.size\(\)\[0\] is 5\)": (
            (x, d, [lst[0], torch.randn(5)]),
            {"w": w},
        ),
        r"w\.size\(\)\[0\] % 2 == 0 \(w\.size\(\)\[0\] is 3\)": (
            (x, d, lst),
            {"w": torch.randn(3)},
        ),
    }
    for message, (args, kwargs) in wrong.items():
        _refused_by_torch(ep, *args, **kwargs)
        with pytest.raises(gs.GuardError, match=message):
            gm(*args, **kwargs)


@BOTH
def test_a_condition_on_a_varargs_input_is_checked(strict):
    # the program takes *args as args_0, args_1; non-strict export names them L['args'][0]
    model, x, rest = Varargs().eval(), torch.randn(2, 4), (torch.randn(4), torch.randn(3))
    dynamic = {"x": None, "args": ({0: Dim.AUTO}, None)}
    ep = torch.export.export(
        model,
        (x, *rest),
        dynamic_shapes=dynamic,
        strict=strict,
        preserve_module_call_signature=("a",),
    )
    gm, _, reference = check_swap(model, (x, *rest), {"a": _changed(model.a)}, ep=ep)
    with torch.no_grad():
        six = torch.randn(6)
        torch.testing.assert_close(gm(x, six, rest[1]), reference(x, six, rest[1]))
    _refused_by_torch(ep, x, torch.randn(5), rest[1])
    with pytest.raises(gs.GuardError, match=r"args_0\.size\(\)\[0\] % 2 == 0 \(args_0\.size"):
        gm(x, torch.randn(5), rest[1])


def _lose_argument_names(ep):
    """The program as one that does not record its argument names (an older or hand-made
    program): its inputs are then called arg_0, arg_1... and torch's L['x'] names nothing."""
    root = next(entry for entry in ep.module_call_graph if entry.fqn == "")
    root.signature.forward_arg_names = None
    return ep


@BOTH
def test_a_condition_naming_no_input_is_still_checked_by_its_symbols(strict):
    model, x = Parity().eval(), torch.randn(4, 4)
    ep = _lose_argument_names(
        gs.export(model, (x,), dynamic_shapes=({0: Dim.AUTO},), strict=strict)
    )
    gm, _, reference = check_swap(model, (x,), {"a": _changed(model.a)}, ep=ep)
    even = torch.randn(6, 4)
    with torch.no_grad():
        torch.testing.assert_close(gm(even), reference(even))
    odd = torch.randn(5, 4)  # (ep.module() fails on any input: its guard names L['x'])
    with pytest.raises(
        gs.GuardError, match=r"condition of the program: .*\(arg_0\.\w+\(?\)?\[0\] is 5\)"
    ):
        gm(odd)


def test_a_condition_that_cannot_be_checked_refuses_the_program(tmp_path):
    # a loaded program keeps its conditions as text only: with its argument names lost, the
    # non-strict condition L['x'] names nothing the swapped program has
    model, x = Parity().eval(), torch.randn(4, 4)
    ep = gs.export(model, (x,), dynamic_shapes=({0: Dim.AUTO},))
    torch.export.save(ep, tmp_path / "parity.pt2")
    loaded = _lose_argument_names(torch.export.load(tmp_path / "parity.pt2"))
    with pytest.raises(gs.errors.SwapError, match=r"cannot check .*L\['x'\]\.size\(\)\[0\] % 2"):
        gs.swap(loaded, {"a": _changed(model.a)})


# -- 2. repeated calls: strict programs partition as the non-strict ones --------------------


# model -> (a module called more than once, one of its calls) to swap in both programs
REPEATED = {
    Twice: ("blk", "blk@1"),
    Loop: ("blk", "blk@1"),
    Containers: ("layers.0", "layers.0@1"),
    Keys: ("d.in", "d.in@1"),
    Deep: ("outer.p.0.blk", "outer.p.0.blk@4"),
    Spelled: ("layers.0", "layers.0@1"),
}


_EXPORTED: dict = {}


def _exported(model_type, strict: bool):
    """One model of ``model_type`` and its program, exported once per test session (strict
    exports take seconds); nothing here changes either."""
    if model_type not in _EXPORTED:
        torch.manual_seed(0)
        _EXPORTED[model_type] = (model_type().eval(), {})
    model, programs = _EXPORTED[model_type]
    if strict not in programs:
        programs[strict] = gs.export(model, (torch.randn(2, 4),), strict=strict)
    return model, programs[strict]


def _summary(ep):
    parts = gs.partition(ep)
    tree = gs.module_tree(ep)
    return (
        list(parts),
        {name: part.nodes for name, part in parts.items()},
        {fqn: (info.calls, info.num_nodes) for fqn, info in tree.items()},
    )


@pytest.mark.parametrize("model_type", REPEATED, ids=lambda t: t.__name__)
def test_strict_programs_partition_like_non_strict_ones(model_type):
    names, nodes, calls = _summary(_exported(model_type, False)[1])
    strict_names, strict_nodes, strict_calls = _summary(_exported(model_type, True)[1])
    assert strict_names == names
    assert {n: len(v) for n, v in strict_nodes.items()} == {n: len(v) for n, v in nodes.items()}
    assert strict_nodes == nodes
    assert strict_calls == calls
    every, one = REPEATED[model_type]
    assert nodes[every] and nodes[one]  # precondition: the module is called more than once


def _one_call_reference(model, call, replacement):
    fqn, index = split_call_name(call)
    reference = eager_reference(model, {})
    wrapped = _OnlyCall(reference.get_submodule(fqn), copy.deepcopy(replacement), index)
    parent, _, leaf = fqn.rpartition(".")
    setattr(reference.get_submodule(parent) if parent else reference, leaf, wrapped)

    def run(*args):
        wrapped.seen = 0
        with torch.no_grad():
            return reference(*clone_tree(args))

    return run


@BOTH
@pytest.mark.parametrize("model_type", REPEATED, ids=lambda t: t.__name__)
def test_every_call_and_one_call_of_a_repeated_module_swap(model_type, strict):
    model, ep = _exported(model_type, strict)
    x = torch.randn(2, 4)
    every, one = REPEATED[model_type]
    replacement = _changed(model.get_submodule(every))
    check_swap(model, (x,), {every: replacement}, ep=ep)
    expected = _one_call_reference(model, one, replacement)(x)
    with torch.no_grad():
        assert not torch.allclose(expected, model(x))  # precondition: the call matters
        torch.testing.assert_close(gs.swap(ep, {one: replacement})(x), expected)


def test_strict_names_torch_cannot_preserve_are_refused_with_the_reason():
    # strict export loses the call signature of a module whose name holds a quote, a newline
    # or a backslash (none, or an empty one); the partition is right all the same, and the
    # swap says why it cannot be done where the non-strict program swaps
    (model, ep), x = _exported(Keys, True), torch.randn(2, 4)
    non_strict = _exported(Keys, False)[1]
    reasons = {'d.a"b': "could not keep its signature", "d.c\nd": "empty call signature"}
    for name, reason in reasons.items():
        replacement = _changed(model.get_submodule(name))
        check_swap(model, (x,), {name: replacement}, ep=non_strict)
        assert gs.partition(ep)[name].nodes == gs.partition(non_strict)[name].nodes
        with pytest.raises(gs.errors.SwapError, match=reason):
            gs.swap(ep, {name: replacement})


@BOTH
def test_a_module_named_like_a_repeated_call_is_refused(strict):
    x = torch.randn(2, 4)
    ep = torch.export.export(
        Ambiguous().eval(), (x,), strict=strict, preserve_module_call_signature=("blk", "blk@1")
    )
    for use in (gs.partition, gs.module_tree, lambda ep: gs.swap(ep, {"blk@1": nn.Identity()})):
        with pytest.raises(gs.errors.PartitionError, match="has a module named 'blk@1'"):
            use(ep)
