"""What a swapped or fused program was made from (:class:`SwapInfo`, kept in
``gm.meta["graphsurgeon"]``) and what a swap changed (:class:`Diff`)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram

from .. import _meta
from ..errors import (
    SwapError,
)
from ..partition import (
    Partition,
)

__all__ = ["Diff", "Region", "SwapInfo", "swap_info"]


@dataclass(frozen=True)
class SwapInfo:
    """What a swapped or fused program was made from; kept in ``gm.meta["graphsurgeon"]``.

    Attributes:
        program: the ExportedProgram it was made from (not modified).
        requests: the request as given, ``{name: replacement}`` (fused names map to the
            GraphModule cut for their first call).
        calls: call name -> the module now running it (a replacement, or for a fused call the
            GraphModule of its own nodes), in graph order.
        fused: the calls that are fused rather than swapped, in graph order.
        installed_at: call name -> attribute path of that module in the result.
        call_nodes: call name -> name of its ``call_module`` node in the result.
        partitions: call name -> the original :class:`Partition` that was replaced.
        regions: the calls that are :class:`Region` s of ops (``Surgery.replace``), by name.
        node_map: node name in the program -> name of the node holding its value in the
            result. Names are kept where possible; they differ for an argument named after a
            Python builtin (``input`` -> ``input_1``) and for a swapped call's outputs (now
            taken from the call). Nodes of swapped calls that are not outputs are absent.
        copies: node name in the result -> the program node it is a copy of.
        result_nodes: the computation nodes of the result, in graph order.
        given_state: attribute paths of the parameters and constants a replacement is given as
            an argument: the result holds its own copies of those (a replacement may write
            them in place), and the checks put their values back after a run.
        diff: what the swap removed, added and kept (:class:`Diff`).
    """

    # the program, or a weak reference to it: the runnable original graphsurgeon caches for a
    # program (verify, compare, the stepper) must not keep that program alive
    _program: ExportedProgram | weakref.ref = field(repr=False)
    requests: Mapping[str, torch.nn.Module] = field(repr=False)
    calls: Mapping[str, torch.nn.Module] = field(repr=False)
    installed_at: Mapping[str, str]
    call_nodes: Mapping[str, str]
    partitions: Mapping[str, Partition] = field(repr=False)
    node_map: Mapping[str, str] = field(default_factory=dict, repr=False)
    copies: Mapping[str, str] = field(default_factory=dict, repr=False)
    result_nodes: tuple[str, ...] = field(default=(), repr=False)
    fused: tuple[str, ...] = ()
    regions: Mapping[str, Region] = field(default_factory=dict, repr=False)
    given_state: tuple[str, ...] = field(default=(), repr=False)

    @property
    def program(self) -> ExportedProgram:
        """The ExportedProgram it was made from."""
        program = self.program_if_alive
        if program is None:
            raise SwapError("the program this GraphModule was made from no longer exists")
        return program

    @property
    def program_if_alive(self) -> ExportedProgram | None:
        """:attr:`program`, or None when it no longer exists (a result made for a cache of
        the program's own holds it weakly)."""
        program = self._program
        return program() if isinstance(program, weakref.ref) else program

    @functools.cached_property
    def diff(self) -> Diff:
        """What the swap changed in the graph, as a :class:`Diff` (computed once)."""
        return _diff(self)

    @property
    def swapped(self) -> tuple[str, ...]:
        """The calls replaced by eager modules (not fused), in graph order."""
        return tuple(c for c in self.calls if c not in self.fused)

    def __str__(self) -> str:
        parts = [f"{len(self.swapped)} swapped"]
        if self.fused:
            parts.append(f"{len(self.fused)} fused")
        return f"SwapInfo: {', '.join(parts)} ({', '.join(self.calls)}); {self.diff}"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display as d

        rows = []
        for call, module in self.calls.items():
            kind = "fused" if call in self.fused else "swapped"
            part = self.partitions.get(call)
            replaced = f"{len(part.nodes)} nodes of {part.type_name}" if part else ""
            runs = "its own nodes" if kind == "fused" else type(module).__name__
            rows.append(
                [d.badge(kind, "info"), call, runs, replaced, self.call_nodes.get(call, "")]
            )
        table = d.table(
            ["", "call", "runs", "in place of", "call node"],
            [[r[0], *(d.escape(c) for c in r[1:])] for r in rows],
            raw=range(5),
        )
        body = f'<div class="gs-title">{d.escape(str(self))}</div>{table}'
        return d.bundle(body, str(self), include, exclude)


@dataclass(frozen=True)
class Region:
    """Nodes of a program replaced as one call though they are no module's: a match of
    :func:`graphsurgeon.find`, made a call by ``Surgery.replace``.

    Attributes:
        name: how every view names it (``"rope:layers.0.self_attn"``), never a module's name.
        call: the module call it sits in (``""`` at the top level): the call of its replacement
            is drawn, stepped and exported inside it.
        nodes: the program's nodes it covers, in graph order.
        signature: its call as a module call signature: the program values it reads, and the
            constants its pattern was called with, as the pattern's arguments (``in_spec``); the
            nodes that compute its results, as the pattern returns them (``out_spec``).
        type_name: what it is, the pattern's name (``"rope"``).
        parameters: the names of the pattern's arguments, for the call text.
    """

    name: str
    call: str
    nodes: tuple[str, ...]
    signature: Any = field(repr=False)
    type_name: str = "pattern"
    parameters: tuple[str, ...] = ()


def scheduled(nodes: list[Any], groups: list[list[Any]]) -> list[Any]:
    """``nodes`` (fx nodes, in the program's order) in the order a rewrite emits them when each
    of ``groups`` (the nodes of one region made a call) runs as one call at its first node:
    what a group reads and the program computes only after that first node comes before it
    (a causal mask made after the scores it is applied to). Convexity, checked when the region
    was made, keeps such values free of the group, so they can run before its call. The one
    rule of the rewrite pass and of the re-export's rebuilt modules."""
    order = list(nodes)
    for group in groups:
        members = set(group)
        position = {node: i for i, node in enumerate(order)}
        if group[0] not in position:
            continue
        first = position[group[0]]
        late: set[Any] = set()
        todo = [i for m in group for i in m.all_input_nodes if i not in members]
        while todo:
            node = todo.pop()
            if node in late or node in members or position.get(node, -1) < first:
                continue
            late.add(node)
            todo += node.all_input_nodes
        if late:
            moved = sorted(late, key=position.__getitem__)
            order = order[:first] + moved + [n for n in order[first:] if n not in late]
    return order


_COMPUTATION = ("call_function", "call_module", "call_method")


@dataclass(frozen=True)
class Diff:
    """Graph nodes removed, added and kept by a swap, compared with its program.

    Only computation nodes count (calls of ops, functions and modules); names are in graph
    order. This is the one definition of what a swap changed: ``Surgery.diff()`` returns it and
    the before/after pictures draw it.

    Attributes:
        removed: nodes of the program that the result no longer computes.
        added: nodes of the result that are not copies of program nodes (the calls of the
            replacements, the checks of what they return, glue that takes outputs apart).
        kept: nodes of the program that the result still computes.
        removed_by_call: swapped call -> its removed nodes; under ``""`` the nodes outside
            every swapped call that the swap left unused and dropped (size arithmetic).
        renamed: program node -> its name in the result, where the two differ (an argument
            named after a Python builtin: ``input`` -> ``input_1``).
    """

    removed: tuple[str, ...]
    added: tuple[str, ...]
    kept: tuple[str, ...]
    removed_by_call: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    renamed: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __str__(self) -> str:
        return f"{len(self.removed)} removed, {len(self.added)} added, {len(self.kept)} kept"

    def __repr__(self) -> str:
        return f"<Diff: {self}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display as d

        head = (
            f'<div class="gs-title">{d.badge(f"{len(self.removed)} removed", "bad")} '
            f"{d.badge(f'{len(self.added)} added', 'ok')} "
            f"{d.badge(f'{len(self.kept)} kept', 'info')} "
            '<span class="gs-muted">computation nodes, against the original program</span></div>'
        )
        folds = []
        for call, nodes in self.removed_by_call.items():
            where = f"removed by {call}" if call else "removed outside any call (size arithmetic)"
            folds.append(d.details(f"{d.escape(where)}: {len(nodes)}", d.names(nodes)))
        folds.append(d.details(f"added: {len(self.added)}", d.names(self.added)))
        folds.append(d.details(f"kept: {len(self.kept)}", d.names(self.kept)))
        if self.renamed:
            pairs = [f"{old} → {new}" for old, new in self.renamed.items()]
            folds.append(d.details(f"renamed: {len(pairs)}", d.names(pairs)))
        return d.bundle(head + "".join(folds), repr(self), include, exclude)


def _diff(info: SwapInfo) -> Diff:
    before = [n.name for n in info.program.graph.nodes if n.op in _COMPUTATION]
    copied = set(info.copies.values())
    kept = tuple(n for n in before if n in copied)
    removed = tuple(n for n in before if n not in copied)
    removed_set = set(removed)
    by_call: dict[str, tuple[str, ...]] = {}
    in_calls: set[str] = set()
    for call, part in info.partitions.items():
        by_call[call] = tuple(n for n in part.nodes if n in removed_set)
        in_calls.update(by_call[call])
    dropped = tuple(n for n in removed if n not in in_calls)
    if dropped:
        by_call[""] = dropped
    added = tuple(new for new in info.result_nodes if new not in info.copies)
    renamed = {
        old: new for old, new in info.node_map.items() if old != new and old not in removed_set
    }
    return Diff(removed, added, kept, by_call, renamed)


def swap_info(gm: torch.nn.Module) -> SwapInfo | None:
    """The :class:`SwapInfo` of a program made by :func:`swap` or :func:`graphsurgeon.fuse`,
    or None for any other module."""
    meta = getattr(gm, "meta", None)
    return meta.get(_meta.INFO) if isinstance(meta, dict) else None
