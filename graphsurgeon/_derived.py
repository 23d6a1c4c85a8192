"""Everything graphsurgeon works out about a program, kept in one place under one rule.

What is derived from a program (its call index, its program index and partitions, its runnable
original, the cuts of its calls, the analyses a picture is drawn from) is computed once and kept
in one record per program object (an ExportedProgram, or a GraphModule such as a swap result),
for as long as that object lives (the records hold it weakly, and hold nothing that keeps it
alive). What depends on the graph alone, the call index, is kept in the record of the graph
object itself: copies of a program (``copy.copy(ep)``) share it.

The one rule: a record is valid while its program's graph is the same graph object, with the
same number of nodes, the same first node and the same last node (:func:`_fingerprint`, O(1)).
Any other change of the graph, such as an edit of a node's arguments in place, is not seen:
``gs.forget(program)`` drops the record, and everything is worked out again on next use. Every
view reads the same record, so they all see the program as it was, or all as it is.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.export import ExportedProgram

from ._program import is_surgery, not_a_program

__all__ = ["cached", "derived", "forget"]

T = TypeVar("T")


class _Record:
    __slots__ = ("fingerprint", "values")

    def __init__(self, fingerprint: tuple):
        self.fingerprint = fingerprint
        self.values: dict[str, Any] = {}


_RECORDS: weakref.WeakKeyDictionary[Any, _Record] = weakref.WeakKeyDictionary()


def _graph(owner: Any) -> torch.fx.Graph:
    return owner if isinstance(owner, torch.fx.Graph) else owner.graph


def _fingerprint(graph: torch.fx.Graph) -> tuple:
    """What a record is valid for: the graph object, its node count, its first and last nodes."""
    nodes = graph.nodes
    first = next(iter(nodes), None)
    last = next(reversed(nodes), None) if len(nodes) else None
    return id(graph), len(nodes), id(first), id(last)


def derived(owner: Any) -> dict[str, Any]:
    """The record of ``owner`` (an ExportedProgram, a GraphModule or a Graph): a dict of what has
    been derived from it, emptied first if its graph changed (see the module docstring)."""
    fingerprint = _fingerprint(_graph(owner))
    record = _RECORDS.get(owner)
    if record is None or record.fingerprint != fingerprint:
        record = _RECORDS[owner] = _Record(fingerprint)
    return record.values


def cached(owner: Any, key: str, make: Callable[[], T]) -> T:
    """``derived(owner)[key]``, made by ``make()`` the first time."""
    values = derived(owner)
    if key not in values:
        values[key] = make()
    return values[key]


def forget(program: Any) -> None:
    """Forget what graphsurgeon worked out about ``program``: after editing its graph in place
    (``node.args = ...``), call this so the next view reads the graph as it now is. Edits that
    add or remove nodes are noticed without it.

    Args:
        program: an ExportedProgram, a GraphModule (a swap or fuse result) or a Surgery (its
            program and the modules built for it).

    Raises:
        NotAProgramError: ``program`` is none of them (a model), as from every entry point.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> ep = gs.export(torch.nn.Sequential(torch.nn.Linear(2, 2)), (torch.randn(1, 2),))
        >>> gs.module_tree(ep)["0"].num_nodes
        1
        >>> gs.forget(ep)
    """
    # any GraphModule has derived facts; a Surgery's current module is not built to be dropped
    if not isinstance(program, (ExportedProgram, torch.fx.GraphModule)) and not is_surgery(program):
        raise not_a_program(program, "forget")  # a model: refused as by every verb
    owners = [program]
    inner = getattr(program, "program", None)  # a Surgery: its program, and its built states
    if inner is not None:
        owners.append(inner)
        drop = getattr(program, "_forget_built", None)
        if callable(drop):
            drop()
    for owner in owners:
        for key in (owner, getattr(owner, "graph", None)):
            if key is not None:
                _RECORDS.pop(key, None)
