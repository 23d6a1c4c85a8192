"""What a stepper keeps of the values it computed (:class:`Keeping`): the values later nodes
still read, those of the last :data:`RECENT` nodes run, and those the user named; or every
value; or only what later nodes read. Keeping every value of a long program costs memory and
time (fresh memory for every value, where a run that frees reuses it), so by default a
stepper keeps a bounded window, as ``torch.fx.Interpreter.run`` frees a value after its last
reader.

Example:
    The default keeps the last nodes' values; ``keep = "all"`` every value:

    >>> import torch, graphsurgeon as gs
    >>> layers = [torch.nn.Linear(2, 2) for _ in range(100)]
    >>> x = torch.ones(1, 2)
    >>> st = gs.Stepper(gs.export(torch.nn.Sequential(*layers), (x,)), x)
    >>> st.keep
    'recent'
    >>> _ = st.continue_()
    >>> st.env["linear_99"].shape  # among the last values: kept
    torch.Size([1, 2])
    >>> st.env["linear"]  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    graphsurgeon.errors.UnknownNodeError: the value of 'linear' is no longer kept (...); set st.keep = 'all', ...
    >>> print(st.summary("linear"))  # its shape and dtype are known all the same
    linear: Tensor[1, 2] float32 cpu  value not kept
    >>> st.keep = ["linear"]  # kept from the next run on, with the recent ones
    >>> st.reset(); _ = st.continue_()
    >>> st.env["linear"].shape
    torch.Size([1, 2])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.fx import Node

from ..errors import StepError
from ._layout import Layout
from ._summary import Summary

__all__ = ["RECENT", "Keeping"]

#: how many of the last nodes run keep their values by default (``keep = "recent"``): enough
#: for the stepper's panel and to look back over the layer just run, bounded at any size
RECENT = 128

_MODES = ("recent", "all", "needed")
_NEVER_DROPPED = ("output", "get_attr")  # the result; and state, which the module holds anyway


class Keeping:
    """Which values a stepper keeps, as a schedule of the values to drop after each position.

    ``keep`` is ``"recent"`` (the default: the values later nodes read, those of the last
    :data:`RECENT` nodes run, the parameters and buffers and the output), ``"all"`` (every
    value), ``"needed"`` (only the values later nodes read, each summarized as it is dropped:
    the memory-light mode), or names of nodes and module calls whose values are kept on top of
    the recent ones. :attr:`drops` is None when nothing is dropped, else for each position the
    values to drop once the node there has run."""

    def __init__(self, layout: Layout, keep: Any = "recent"):
        self._layout = layout
        self.keep: str | tuple[str, ...] = "recent"
        self.drops: list[tuple[Node, ...]] | None = None
        self.pinned: frozenset[Node] = frozenset()
        self.set(keep)

    @property
    def summarizes(self) -> bool:
        """Whether a dropped value is summarized as it goes (``"needed"``: the memory-light
        mode, where :meth:`Stepper.summary` answers with statistics for every node)."""
        return self.keep == "needed"

    @property
    def mode(self) -> str:
        """``"recent"``, ``"all"`` or ``"needed"`` (names given keep the recent ones too)."""
        return self.keep if isinstance(self.keep, str) else "recent"

    def set(self, keep: Any) -> None:
        """Change what is kept from now on (see the class); names are read as ``run_to`` reads
        them, a module or call name standing for each of its nodes."""
        layout = self._layout
        if isinstance(keep, str) and keep in _MODES:
            self.keep, self.pinned = keep, frozenset()
        elif isinstance(keep, str) or not isinstance(keep, Iterable):
            raise StepError(
                f"keep: expected 'recent', 'all', 'needed' or a list of node and module names; "
                f"got {keep!r}"
            )
        else:
            names = tuple(dict.fromkeys(keep))
            pinned: set[Node] = set()
            for name in names:
                if not isinstance(name, str):
                    raise StepError(f"keep: a name is a string; got {name!r}")
                if name in layout.by_name:
                    pinned.add(layout.by_name[name])
                elif layout.is_module(name):
                    calls = layout.calls_named(name)
                    pinned.update(layout.nodes[i] for c in calls for i in layout.members[c])
                else:
                    layout.refuse(name)
            self.keep, self.pinned = names, frozenset(pinned)
        self.drops = None if self.keep == "all" else self._schedule()

    def _schedule(self) -> list[tuple[Node, ...]]:
        """For each position, the values to drop once its node has run: a value goes after its
        last reader, and (``"recent"``) once it has left the window of the last nodes run."""
        layout = self._layout
        nodes, last_use = layout.nodes, layout.last_use
        window = 0 if self.keep == "needed" else RECENT
        total = len(nodes)
        pending: dict[int, list[Node]] = {}
        for j, node in enumerate(nodes):
            if node.op in _NEVER_DROPPED or node in self.pinned:
                continue
            at = max(last_use[j], j + window)
            if at < total:
                pending.setdefault(at, []).append(node)
        drops: list[tuple[Node, ...]] = [()] * total
        for at, values in pending.items():
            drops[at] = tuple(values)
        return drops

    def dropped_by(self, position: int) -> list[Node]:
        """The values the schedule has dropped once the nodes before ``position`` have run
        (what a change of ``keep`` in the middle of a run drops at once)."""
        if self.drops is None:
            return []
        return [node for i in range(min(position, len(self.drops))) for node in self.drops[i]]

    def why_no_value(self, node: Node, position: int) -> str:
        """Why the value of ``node`` is not at hand for a stepper at ``position``, and what to
        do: it has not run yet, or it was not kept (:meth:`not_kept`)."""
        at = self._layout.position[node]
        if at >= position:
            return (
                f"node {node.name!r} has not run yet (position {at}; the stepper is at "
                f"{position}); run_to({node.name!r}) then step() runs it"
            )
        return self.not_kept(node.name)

    def not_kept(self, name: str) -> str:
        """Why the value of node ``name``, which ran, is not at hand, and how to keep it."""
        if self.keep == "needed":
            return (
                f"the value of {name!r} was dropped in memory-light mode (no later node needs "
                f"it); summary({name!r}) still describes it; st.keep = 'all' keeps every value"
            )
        return (
            f"the value of {name!r} is no longer kept (the stepper keeps the values later "
            f"nodes read and those of the last {RECENT} nodes run); set st.keep = 'all', or "
            f"st.keep = [{name!r}], then reset() and run again to keep it; "
            f"summary({name!r}) gives its shape and dtype"
        )

    def husk(self, node: Node) -> Summary | None:
        """The summary of a value no longer kept: its shape and dtype as the program records
        them, no statistics; None when the program does not record a static one."""
        layout = self._layout
        stack = layout.stacks[layout.position[node]]
        value = node.meta.get("val")
        shape = getattr(value, "shape", None)
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        return Summary(
            name=node.name,
            type="Tensor",
            op=layout.op_text(node),
            module=stack[-1] if stack else "",
            shape=tuple(shape),
            dtype=str(value.dtype).removeprefix("torch."),
            device=str(value.device),
            numel=value.numel(),
            text="value not kept",
            measured=False,
        )
