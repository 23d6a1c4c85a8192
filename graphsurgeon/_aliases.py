"""Which tensor an op's result is at run time: what it writes in place, what it is a view of,
and what it returns as the very object it was given.

torch.export records every op as a node of its own; eager code sees an in-place op's result, a
conversion with nothing to do or eval-mode dropout as the tensor they were given. The swap, the
partitions and the checks read these answers from here.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.fx import Node

__all__ = [
    "DROPOUTS",
    "aliased_input",
    "in_place_alias",
    "merges_reads",
    "op_argument",
    "returned_object",
    "returned_root",
]


def in_place_alias(node: Node) -> Node | None:
    """For an in-place or ``out=`` op, the argument node its result aliases (and writes); else None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    written = _written_argument(target)
    if written is None:
        return None
    position, name, kwarg_only = written
    if kwarg_only or position >= len(node.args):
        value = node.kwargs.get(name)
    else:
        value = node.args[position]
    return value if isinstance(value, Node) else None


@functools.lru_cache(maxsize=1024)  # asked of every node a swap or a partition reads
def _written_argument(op: torch._ops.OpOverload) -> tuple[int, str, bool] | None:
    """(position, name, keyword-only) of the argument an op writes and returns, by its schema
    (read once per op: each read of ``_schema`` makes its Python objects anew); else None."""
    schema = op._schema
    if not schema.returns or schema.returns[0].alias_info is None:
        return None
    if not schema.returns[0].alias_info.is_write:
        return None
    alias_set = schema.returns[0].alias_info.before_set
    for position, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is None or not info.is_write or info.before_set != alias_set:
            continue
        return position, argument.name, argument.kwarg_only
    return None


def aliased_input(node: Node) -> Node | None:
    """The argument node whose storage ``node``'s result shares: a view (``t``, ``view``,
    ``select``, ``expand``...), an in-place op, or a conversion that may return the tensor
    itself (``to`` the dtype it has); else None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    if target in _CONVERSIONS:
        first = node.args[0] if node.args else None
        return first if isinstance(first, Node) else None
    aliased = _aliased_argument(target)
    if aliased is None:
        return None
    position, name, kwarg_only = aliased
    value = (
        node.kwargs.get(name) if kwarg_only or position >= len(node.args) else node.args[position]
    )
    return value if isinstance(value, Node) else None


@functools.lru_cache(maxsize=1024)
def _aliased_argument(op: torch._ops.OpOverload) -> tuple[int, str, bool] | None:
    """(position, name, keyword-only) of the argument whose storage an op's first result
    shares, by its schema; else None."""
    schema = op._schema
    if not schema.returns or schema.returns[0].alias_info is None:
        return None
    alias_set = schema.returns[0].alias_info.before_set
    for position, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is not None and info.before_set == alias_set:
            return position, argument.name, argument.kwarg_only
    return None


_aten = torch.ops.aten
# Ops that return their first argument itself (the very tensor object, not a view) when they
# have nothing to do: a conversion to the dtype, device and layout the tensor already has.
_CONVERSIONS = frozenset(
    {
        _aten.to.dtype,
        _aten.to.dtype_layout,
        _aten.to.device,
        _aten.to.other,
        _aten.type_as.default,
    }
)
DROPOUTS = frozenset(
    {
        _aten.dropout.default,
        _aten.feature_dropout.default,
        _aten.alpha_dropout.default,
        _aten.feature_alpha_dropout.default,
    }
)


def op_argument(node: Node, name: str, default: Any = None) -> Any:
    """The value of argument ``name`` of an op node, by its schema (positional or keyword;
    the schema's default when not given)."""
    if name in node.kwargs:
        return node.kwargs[name]
    schema = node.target._schema
    for position, argument in enumerate(schema.arguments):
        if argument.name == name:
            if not argument.kwarg_only and position < len(node.args):
                return node.args[position]
            return argument.default_value if argument.has_default_value() else default
    return default


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


def _converts_nothing(node: Node, source: Node) -> bool:
    """Whether a ``to``/``type_as`` node returns ``source`` itself: as ``aten.to`` decides
    (same dtype, layout and device, no ``copy=True``, a memory format the tensor has)."""
    before, after = _val(source), _val(node)
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    if (before.dtype, before.layout, before.device) != (after.dtype, after.layout, after.device):
        return False
    if node.target is _aten.type_as.default:
        return True
    if op_argument(node, "copy", False):
        return False
    memory_format = op_argument(node, "memory_format")
    if memory_format in (None, torch.preserve_format):
        return True
    try:
        return bool(before.is_contiguous(memory_format=memory_format))
    except (RuntimeError, TypeError):  # a symbolic stride: cannot tell, so not the same
        return False


def returned_object(node: Node) -> Node | None:
    """The node whose very tensor object ``node`` returns at run time, or None when it returns
    a tensor of its own (views are tensors of their own).

    Eager code sees these as one tensor: an in-place or ``out=`` op returns the tensor it wrote;
    a conversion with nothing to do (``x.to(torch.float32)`` of a float32 ``x``, ``.float()``,
    ``.type_as``, ``.to("cpu")``) and dropout in eval mode (or with ``p=0``) return their input.
    torch.export records such an op as a node of its own and reads every later use of that
    tensor from it, also uses that are, in the model's code, uses of the op's input.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> class Norm(torch.nn.Module):
        ...     def forward(self, x):
        ...         return x.to(torch.float32) * 2
        >>> ep = gs.export(Norm(), (torch.randn(2, 4),))
        >>> to = next(n for n in ep.graph.nodes if n.name == "to")
        >>> returned_object(to).name
        'x'
    """
    written = in_place_alias(node)
    if written is not None:
        return written
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], Node):
        return None
    target, source = node.target, node.args[0]
    if target in _CONVERSIONS:
        return source if _converts_nothing(node, source) else None
    if target in DROPOUTS:
        train, p = op_argument(node, "train", True), op_argument(node, "p", 0.5)
        return source if train is False or p == 0 else None
    if target in (_aten.flatten.using_ints, _aten.contiguous.default):
        value = _val(source)
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return None
        if target is _aten.contiguous.default:
            memory_format = op_argument(node, "memory_format", torch.contiguous_format)
            try:
                return source if value.is_contiguous(memory_format=memory_format) else None
            except (RuntimeError, TypeError):
                return None
        start, end = op_argument(node, "start_dim", 0), op_argument(node, "end_dim", -1)
        if not isinstance(start, int) or not isinstance(end, int):
            return None
        return source if start % value.dim() == end % value.dim() else None
    return None


# Ops that return their input at run time (eval-mode dropout) but that torch.export traces as a
# tensor of their own: later reads of the input are recorded as reads of the input.
_TRACED_APART = frozenset({_aten.dropout.default, _aten.feature_dropout.default})


def merges_reads(node: Node) -> Node | None:
    """The node whose reads torch.export recorded as reads of ``node`` too: the input of an op
    that returned it (traced as the same tensor object), or None."""
    if node.op == "call_function" and node.target in _TRACED_APART:
        return None
    return returned_object(node)


def returned_root(node: Node, members: set[Node] | frozenset[Node] = frozenset()) -> Node:
    """Follow :func:`returned_object` from ``node`` while it stays among ``members`` (or as far
    as it goes): the first node whose tensor ``node`` is at run time."""
    for _ in range(10_000):  # a chain of in-place ops, bounded against a malformed graph
        source = returned_object(node)
        if source is None:
            return node
        node = source
        if members and node not in members:
            return node
    return node
