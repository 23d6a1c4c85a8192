"""Eager references every swap is checked against, written independently of the library so
that a bug there cannot hide in both; and comparisons of output trees."""

from __future__ import annotations

import copy

import torch
import torch.utils._pytree as pytree

import graphsurgeon as gs


def eager_reference(model: torch.nn.Module, replacements: dict) -> torch.nn.Module:
    """A deep copy of ``model`` with each replacement set by setattr, parents before children.

    Written out here, independently of the library, so a bug there cannot hide in both.
    """
    reference = copy.deepcopy(model)
    for name in sorted(replacements, key=lambda n: n.count(".")):
        parent_name, _, leaf = name.rpartition(".")
        parent = reference.get_submodule(parent_name) if parent_name else reference
        setattr(parent, leaf, copy.deepcopy(replacements[name]))
    return reference


def clone_tree(value):
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value)


def assert_close_tree(actual, expected, rtol=1e-5, atol=1e-5):
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert actual_spec == expected_spec, f"structure {actual_spec} != {expected_spec}"
    for a, e in zip(actual_leaves, expected_leaves):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol)
        else:
            assert a == e


def differs(a, b) -> bool:
    a_leaves, a_spec = pytree.tree_flatten(a)
    b_leaves, b_spec = pytree.tree_flatten(b)
    if a_spec != b_spec:
        return True
    for x, y in zip(a_leaves, b_leaves):
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or not torch.equal(x, y):
                return True
        elif x != y:
            return True
    return False


def check_swap(
    model, args, replacements, kwargs=None, *, ep=None, rtol=1e-5, atol=1e-5, **export_options
):
    """Swap ``replacements`` into ``model``'s program and check it against the eager reference.

    The precondition comes first: the reference must compute something other than the
    original model, so a swap that silently does nothing cannot pass.
    """
    kwargs = kwargs or {}
    reference = eager_reference(model, replacements)
    with torch.no_grad():
        original_out = model(*clone_tree(args), **clone_tree(kwargs))
        expected = reference(*clone_tree(args), **clone_tree(kwargs))
    assert differs(original_out, expected), "precondition: the replacement must change the output"
    if ep is None:
        ep = gs.export(model, args, kwargs, **export_options)
    gm = gs.swap(ep, replacements)
    with torch.no_grad():
        actual = gm(*clone_tree(args), **clone_tree(kwargs))
    assert_close_tree(actual, expected, rtol=rtol, atol=atol)
    return gm, ep, reference
