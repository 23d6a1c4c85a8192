"""Pytree structures as the generated code reads them: which can be indexed with ``[key]``,
and the subtrees of a structure by where their leaves start."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.utils._pytree as pytree

from .. import _meta

_STATIC_GET = (tuple, list, dict)
_STATIC_BUILD = (tuple, list, dict, type(None))


def _indexable(spec: pytree.TreeSpec) -> bool:
    """Whether every leaf of ``spec`` can be reached with plain ``[key]`` lookups."""
    if spec.is_leaf():
        return True
    kind = spec.type
    if not (kind in _STATIC_GET or kind is type(None) or _is_namedtuple(kind)):
        return False
    return all(_indexable(c) for c in spec.children())


def _is_namedtuple(kind: type) -> bool:
    return isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields")


def _subtrees(spec, start=0, path=(), out=None):
    """``{(first leaf, number of leaves): [(path, subspec), ...]}`` of every indexable subtree."""
    if out is None:
        out = {}
    out.setdefault((start, spec.num_leaves), []).append((path, spec))
    if spec.is_leaf() or spec.type is type(None):
        return out
    offset = start
    for key, child in zip(_meta.children_keys(spec), spec.children()):
        _subtrees(child, offset, (*path, key), out)
        offset += child.num_leaves
    return out


def build_structure(
    spec: pytree.TreeSpec,
    values: list,
    child: Callable[[pytree.TreeSpec, list], Any],
    other: Callable[[pytree.TreeSpec, list], Any],
) -> Any:
    """The structure ``spec`` over ``values`` (one per leaf) as a graph's code writes it: a
    tuple, list, dict or None as that Python value, each child built by ``child(spec,
    values)``; any other container (a dataclass, a model output) by ``other(spec, values)``.
    The rewrite and the re-export's module rebuild both build structures this way."""
    kind = spec.type
    if kind not in _STATIC_BUILD:
        return other(spec, values)
    children, offset = [], 0
    for sub in spec.children():
        children.append(child(sub, values[offset : offset + sub.num_leaves]))
        offset += sub.num_leaves
    if kind is tuple:
        return tuple(children)
    if kind is list:
        return children
    if kind is dict:
        return dict(zip(spec.context, children))
    return None
