"""Functions the generated code of a swapped or fused program calls at run time.

They live in their own module so the generated code can name them. Each raises a
:class:`~graphsurgeon.GraphSurgeonError` that names the call or the input, what came and what
was expected. The common case (everything as expected) costs a comparison or two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from .._meta import describe_spec, describe_value, format_structure, leaf_keystrs, tensor_text
from ..errors import GuardError, InputStructureError, ReplacementError

_STRIDED = torch.strided

__all__ = [
    "ExpectedConstant",
    "ExpectedTensor",
    "check_constant",
    "check_inputs",
    "check_same",
    "check_structure",
    "check_tensor",
    "flatten_input",
    "flatten_output",
    "unflatten",
]


class ExpectedTensor:
    """What one output of a module call was at export: its dtype, the sizes that are static
    (a dynamic size is None), and where each dynamic size can be read at run time: the same
    symbol in a size of one of the call's arguments. A replacement's output is checked
    against it. A meta tensor where the program computes real values is always wrong."""

    __slots__ = ("dtype", "links", "meta", "shape", "sizes", "static")

    def __init__(self, value: torch.Tensor, links: Sequence[tuple[int, int, int]] = ()):
        self.dtype = value.dtype
        self.sizes = tuple(d if isinstance(d, int) else None for d in value.shape)
        self.static = None not in self.sizes
        self.shape = torch.Size(self.sizes) if self.static else None
        # (output dim, argument, argument dim): that output size equals that argument's size
        self.links = tuple(links)
        self.meta = value.device.type == "meta"

    def matches(self, value: torch.Tensor, arguments: Sequence[torch.Tensor] = ()) -> bool:
        if value.dtype != self.dtype or (value.is_meta and not self.meta):
            return False
        if value.is_nested or value.layout is not torch.strided:
            return False  # the program's nodes read a plain (strided) tensor here
        if self.static:
            return value.shape == self.shape
        shape = value.shape
        if len(shape) != len(self.sizes):
            return False
        if not all(want is None or got == want for got, want in zip(shape, self.sizes)):
            return False
        return all(shape[d] == arguments[i].shape[j] for d, i, j in self.links)

    def text(self, arguments: Sequence[torch.Tensor] = ()) -> str:
        """``f32[1, 15, 64]``: the sizes known at run time filled in, ``?`` for the rest."""
        sizes: list[Any] = ["?" if d is None else d for d in self.sizes]
        for d, i, j in self.links:
            sizes[d] = arguments[i].shape[j]
        return tensor_text(sizes, self.dtype)

    def __str__(self) -> str:
        return tensor_text(["?" if d is None else d for d in self.sizes], self.dtype)

    def __repr__(self) -> str:
        return f"ExpectedTensor({self})"


class ExpectedConstant:
    """An output of a module call that the program holds as a constant (an int, a float, a
    bool, None, a string): the nodes reading it have its value baked in, so a replacement must
    return that very value there."""

    __slots__ = ("value",)
    links = ()  # no size of it is read off the call's arguments

    def __init__(self, value: Any):
        self.value = value

    def matches(self, value: Any, arguments: Sequence[torch.Tensor] = ()) -> bool:
        expected = self.value
        if type(value) is not type(expected):
            return False
        if isinstance(expected, float) and expected != expected:
            return value != value  # NaN is NaN
        try:
            return bool(value == expected)
        except Exception:  # an == that does not answer True or False
            return False

    def text(self, arguments: Sequence[torch.Tensor] = ()) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return repr(self.value)

    def __repr__(self) -> str:
        return f"ExpectedConstant({self.value!r})"


def _wrong_constant(value: Any, expected: ExpectedConstant, call_name: str, type_name: str, where):
    return ReplacementError(
        f"{call_name!r} ({type_name}) returned {describe_value(value)} for {where}, but the "
        f"program was exported with {expected.value!r} there: a value that is not a tensor is "
        "baked into the nodes that read it, so another value would be ignored. Make the "
        f"replacement return {expected.value!r} there, or put the replacement into the eager "
        "model and export that (gs.export) to have its value used."
    )


def _same_keys_in_order(value: Any, spec: pytree.TreeSpec) -> Any:
    """``value`` with every dict whose keys are those of ``spec`` in another order rebuilt in
    ``spec``'s order (code reads a dict by key, so the order is not part of what it returns);
    anything else as it is."""
    if spec.is_leaf():
        return value
    if spec.type is dict and isinstance(value, dict):
        keys = list(spec.context)
        if set(value) != set(keys) or len(value) != len(keys):
            return value
        return {k: _same_keys_in_order(value[k], c) for k, c in zip(keys, spec.children())}
    if spec.type in (tuple, list) and type(value) is spec.type and len(value) == spec.num_children:
        rebuilt = [_same_keys_in_order(v, c) for v, c in zip(value, spec.children())]
        return tuple(rebuilt) if spec.type is tuple else rebuilt
    return value


def _wrong_output(
    value: Any, expected: ExpectedTensor, call_name: str, type_name: str, where, arguments=()
):
    got = describe_value(value)
    if isinstance(value, torch.Tensor) and value.is_meta and not expected.meta:
        got += " on the meta device"
    return ReplacementError(
        f"{call_name!r} ({type_name}) returned {got} for {where}, the program expects "
        f"{expected.text(arguments)} there, as the original module returned. Make the "
        "replacement return the same shapes, dtypes and device."
    )


def check_tensor(
    value: Any,
    expected: ExpectedTensor | None,
    call_name: str,
    type_name: str,
    *arguments: torch.Tensor,
):
    """Pass ``value`` through when it is a tensor as ``expected`` (its dynamic sizes read off
    the call's ``arguments``); else say what came."""
    # the common case, a plain tensor of static sizes, checked inline: with every layer of a
    # program swapped this runs once per layer, and a call of ``matches`` costs as much again
    if (
        expected is not None
        and expected.shape is not None
        and type(value) is torch.Tensor
        and not value.is_nested  # first: a nested tensor has no .shape to read
        and value.layout is _STRIDED
        and value.dtype == expected.dtype
        and value.shape == expected.shape
        and (expected.meta or not value.is_meta)
    ):
        return value
    if isinstance(value, torch.Tensor) and (expected is None or expected.matches(value, arguments)):
        return value
    if not isinstance(value, torch.Tensor):
        raise ReplacementError(
            f"{call_name!r} ({type_name}) returned {describe_value(value)}, but the program "
            "expects a single Tensor there, as the original module returned. Make its forward "
            "return the same structure as the original's."
        )
    raise _wrong_output(value, expected, call_name, type_name, "its output", arguments)


def check_structure(
    value: Any,
    spec: pytree.TreeSpec,
    expected: Sequence[ExpectedTensor | None],
    call_name: str,
    type_name: str,
    *arguments: torch.Tensor,
) -> Any:
    """Pass ``value`` through when its structure is ``spec`` and each tensor leaf is as
    ``expected`` (None: not checked; dynamic sizes read off the call's ``arguments``); else
    say what differs."""
    leaves, actual = pytree.tree_flatten(value)
    if actual != spec:
        value = _same_keys_in_order(value, spec)
        leaves, actual = pytree.tree_flatten(value)
    if actual != spec:
        # written out with the values' own types and shapes: (f32[1, 8, 32], None), not (*, *)
        got = format_structure(actual, [describe_value(leaf) for leaf in leaves])
        wanted = format_structure(spec, ["?" if e is None else e.text(arguments) for e in expected])
        raise ReplacementError(
            f"{call_name!r} ({type_name}) returned {got}, but the program expects {wanted} "
            f"(the original module's output structure): "
            f"{structure_difference(actual, spec, 'output')}. Make its forward return the same "
            "structure."
        )
    for i, (leaf, want) in enumerate(zip(leaves, expected)):
        if want is None:
            continue
        if isinstance(want, ExpectedConstant):
            if not want.matches(leaf):
                where = f"output {leaf_keystrs(spec)[i] or i}"
                raise _wrong_constant(leaf, want, call_name, type_name, where)
            continue
        if not isinstance(leaf, torch.Tensor) or not want.matches(leaf, arguments):
            where = f"output {leaf_keystrs(spec)[i] or i}"
            raise _wrong_output(leaf, want, call_name, type_name, where, arguments)
    return value


def flatten_output(value: Any, spec: pytree.TreeSpec, call_name: str, type_name: str) -> list:
    """The leaves of a (checked) replacement's output of a type ``[k]`` cannot index."""
    leaves, actual = pytree.tree_flatten(value)
    if actual != spec:  # dict keys in another order; anything else check_structure refused
        leaves, actual = pytree.tree_flatten(_same_keys_in_order(value, spec))
        if actual != spec:
            check_structure(value, spec, [None] * spec.num_leaves, call_name, type_name)
    return leaves


def flatten_input(value: Any, spec: pytree.TreeSpec, argument: str) -> list:
    """The leaves of one argument of the program, after checking its structure."""
    leaves, actual = pytree.tree_flatten(value)
    if actual != spec:
        raise InputStructureError(
            f"input {argument!r} has the structure {describe_spec(actual)}, but the program "
            f"was exported with {describe_spec(spec)}: "
            f"{structure_difference(actual, spec, argument)}. Call it with inputs structured "
            "as at export."
        )
    return leaves


def check_inputs(guard, *leaves: Any) -> None:
    """Check the program's inputs (see :mod:`graphsurgeon.rewrite._guards`); returns nothing."""
    guard(*leaves)


def check_constant(value: Any, expected: Any, call_name: str, where: str) -> None:
    """A fused call takes a constant argument it was exported with (``scale=2.5``)."""
    if type(value) is type(expected) and (
        value == expected or (value != value and expected != expected)  # NaN is NaN
    ):
        return
    raise GuardError(
        f"{call_name}: argument {where} is {describe_value(value)}, but the call was exported "
        f"with {expected!r}: a constant is baked into its nodes. Export again with that value."
    )


def check_same(first: Any, other: Any, call_name: str, first_where: str, other_where: str) -> None:
    """A fused call exported with one value in two arguments (``attn(h, h, h)``) reads only the
    first: refuse two different values rather than ignore the second."""
    if other is first:
        return
    raise GuardError(
        f"{call_name} was exported with the same value as {first_where} and {other_where} (as "
        f"in attn(h, h, h)), and its nodes read it once; it was given two different values. "
        "Pass the same tensor, or export with distinct inputs."
    )


def unflatten(leaves: list, spec: pytree.TreeSpec) -> Any:
    """Rebuild a structure of a registered pytree type (dataclass, namedtuple...) from leaves."""
    return pytree.tree_unflatten(list(leaves), spec)


def structure_difference(actual: pytree.TreeSpec, expected: pytree.TreeSpec, root: str) -> str:
    """Where two structures first differ, said in words: ``d['b'] is missing``.

    Example:
        >>> import torch.utils._pytree as pytree
        >>> got = pytree.tree_structure({"a": 1})
        >>> want = pytree.tree_structure({"a": 1, "b": 2})
        >>> structure_difference(got, want, "d")
        "d['b'] is missing"
    """

    def kind(spec: pytree.TreeSpec) -> str:
        if spec.is_leaf():
            return "a leaf (a tensor or a value)"
        name = getattr(spec.type, "__name__", str(spec.type))
        return f"a {name} of {spec.num_children}"

    def walk(a: pytree.TreeSpec, b: pytree.TreeSpec, path: str) -> str | None:
        if a == b:
            return None
        if a.is_leaf() or b.is_leaf() or a.type is not b.type:
            return f"{path} is {kind(a)} where the program takes {kind(b)}"
        if b.type is dict:
            missing = [k for k in b.context if k not in a.context]
            if missing:
                return f"{path}[{missing[0]!r}] is missing"
            extra = [k for k in a.context if k not in b.context]
            if extra:
                return f"{path}[{extra[0]!r}] is not an input of the program"
            children_a = dict(zip(a.context, a.children()))
            for key, child in zip(b.context, b.children()):
                found = walk(children_a[key], child, f"{path}[{key!r}]")
                if found:
                    return found
            return None
        if a.num_children != b.num_children:
            return f"{path} is {kind(a)} where the program takes {kind(b)}"
        if a.context != b.context:
            return f"{path} has fields {a.context!r} where the program takes {b.context!r}"
        for i, (x, y) in enumerate(zip(a.children(), b.children())):
            found = walk(x, y, f"{path}[{i}]")
            if found:
                return found
        return None

    return walk(actual, expected, root) or f"{root} differs"
