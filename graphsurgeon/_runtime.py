"""Functions the swapped program's generated code calls at run time.

They live in their own module so the generated code can import them by name (and the program
pickles). Each raises a :class:`GraphSurgeonError` that names the module and both structures.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from .errors import InputStructureError, ReplacementError

__all__ = ["check_structure", "check_tensor", "flatten_input", "flatten_output", "unflatten"]


def describe_spec(spec: pytree.TreeSpec) -> str:
    """A compact, readable form of a pytree structure: ``(*, {'a': *})``."""
    if spec.is_leaf():
        return "*"
    children = [describe_spec(c) for c in spec.children()]
    kind = spec.type
    if kind is tuple:
        return "(" + ", ".join(children) + ("," if len(children) == 1 else "") + ")"
    if kind is list:
        return "[" + ", ".join(children) + "]"
    if kind is dict:
        return "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(spec.context, children)) + "}"
    if kind is type(None):
        return "None"
    return f"{getattr(kind, '__name__', kind)}(" + ", ".join(children) + ")"


def describe_value(value: Any) -> str:
    """What a value is, for an error message: ``Tensor[2, 4] float32``, ``tuple of 2``..."""
    if isinstance(value, torch.Tensor):
        return f"Tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return f"{type(value).__name__} with structure {describe_spec(pytree.tree_structure(value))}"


def check_tensor(value: Any, call_name: str, type_name: str) -> Any:
    """Pass ``value`` through when it is a tensor; else name the replacement and what it returned."""
    if isinstance(value, torch.Tensor):
        return value
    raise ReplacementError(
        f"the replacement for {call_name!r} ({type_name}) returned {describe_value(value)}, "
        f"but the program expects a single Tensor there, as the original module returned. "
        "Make its forward return the same structure as the original's."
    )


def check_structure(value: Any, spec: pytree.TreeSpec, call_name: str, type_name: str) -> Any:
    """Pass ``value`` through when its pytree structure is ``spec``; else say how it differs."""
    actual = pytree.tree_structure(value)
    if actual == spec:
        return value
    raise ReplacementError(
        f"the replacement for {call_name!r} ({type_name}) returned the structure "
        f"{describe_spec(actual)}, but the program expects {describe_spec(spec)} (the original "
        "module's output structure). Make its forward return the same structure."
    )


def flatten_output(value: Any, spec: pytree.TreeSpec, call_name: str, type_name: str) -> list:
    """The leaves of a replacement's output, after checking its structure."""
    leaves, actual = pytree.tree_flatten(value)
    if actual != spec:
        check_structure(value, spec, call_name, type_name)
    return leaves


def flatten_input(value: Any, spec: pytree.TreeSpec, argument: str) -> list:
    """The leaves of one argument of the program, after checking its structure."""
    leaves, actual = pytree.tree_flatten(value)
    if actual != spec:
        raise InputStructureError(
            f"argument {argument!r} has the structure {describe_spec(actual)}, but the program "
            f"was exported with {describe_spec(spec)}. Call it with inputs shaped as at export."
        )
    return leaves


def unflatten(leaves: list, spec: pytree.TreeSpec) -> Any:
    """Rebuild a structure of a registered pytree type (dataclass, namedtuple...) from leaves."""
    return pytree.tree_unflatten(list(leaves), spec)
