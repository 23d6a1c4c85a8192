"""A SurgeryWidget's region: ops chosen by hand (shift-click, a shift-drag rectangle) to be one
call, what that call would take and return, and where else the program computes the same.

:class:`Regions` owns the region's nodes, its plan (:meth:`graphsurgeon.Surgery.region_signature`)
or why it cannot be one call, and what Find similar found. Fusing or swapping the region is an
edit of the Surgery: the session does it, with :meth:`Regions.plan` as its precondition.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from .. import _meta
from ..errors import GraphSurgeonError, UnknownNameError, WidgetError
from ..partition import program_index
from ..rewrite import swap_info
from ._picker import REGION

__all__ = ["Regions"]


class Regions:
    """The region of a :class:`~graphsurgeon.widget.SurgerySession`.

    State: :attr:`region` (fx node names), :attr:`region_plan` (its
    :class:`~graphsurgeon.patterns.region.RegionPlan`; ``call_text`` is what a replacement
    takes), :attr:`region_problem` (why the nodes cannot be one call) and :attr:`similar`
    (what :meth:`find_similar` found: :class:`graphsurgeon.patterns.find.Matches`).
    """

    def __init__(self, session: Any):
        self.session = session
        self.region: list[str] = []
        self.region_plan: Any = None
        self.region_problem = ""
        self.similar: Any = None

    def toggle_region(self, element_id: str) -> None:
        """Add what a shift-click hit to the region, or take it out again: a node, or every
        op of a box or of an open module."""
        nodes = self._region_nodes(element_id)
        if not nodes:
            raise WidgetError(f"{element_id!r} holds no op of the program to put in a region")
        if all(n in self.region for n in nodes):
            self.set_region([n for n in self.region if n not in nodes])
        else:
            self.set_region([*self.region, *nodes])

    def add_to_region(self, element_ids: Iterable[str]) -> None:
        """Add the ops of every element a shift-drag's rectangle holds to the region (the
        inputs, outputs and checks it also holds are left out)."""
        if isinstance(element_ids, str) or not all(isinstance(i, str) for i in element_ids):
            raise WidgetError(f"expected a list of element ids, got {element_ids!r}")
        nodes = [n for element in element_ids for n in self._region_nodes(element)]
        if not nodes:
            raise WidgetError(
                "the rectangle holds no op of the program: drag over the ops (or boxes) to "
                "put in the region"
            )
        self.set_region([*self.region, *nodes])

    def _region_nodes(self, element_id: str) -> list[str]:
        """The ops of the program an element of the picture stands for: its node, or every
        op of a box or of an open module."""
        picture = self.session.viewer.scene.picture
        if element_id not in picture:
            raise WidgetError(f"the picture has no element {element_id!r}")
        element = picture[element_id]
        node = getattr(element, "node", None)
        if node:
            nodes = [node]
        elif getattr(element, "members", ()):
            nodes = list(element.members)
        else:
            nodes = [
                picture[i].node for i in picture.inside(element_id) if picture[i].node is not None
            ]
        by_name = program_index(self.session.surgery.program).by_name
        return [n for n in nodes if n in by_name and _meta.computes(by_name[n])]

    def set_region(self, nodes: Iterable[str]) -> None:
        """Make ``nodes`` (fx node names of the program, as the picture names them) the
        region: what it would take and return as one call is worked out at once
        (:attr:`region_plan`), or why it cannot be one call (:attr:`region_problem`). A name
        the program has no node of is refused (UnknownNodeError, with the names it may mean)
        and the region is left as it was: it is a mistake in the call, not a region."""
        nodes = list(dict.fromkeys(nodes or ()))
        plan, problem = None, ""
        if nodes:
            try:
                plan = self.session.surgery.region_signature(nodes)
            except UnknownNameError:
                raise
            except GraphSurgeonError as error:
                problem = str(error)
        self.region, self.region_plan, self.region_problem, self.similar = (
            nodes,
            plan,
            problem,
            None,
        )
        session = self.session
        if session.picker.replacement_for == REGION and not nodes:
            session.picker.clear()
        session.touch("region", "choice")
        session.selection.mark()

    def clear_region(self) -> None:
        """Forget the region (and what Find similar found)."""
        self.set_region([])

    def after_change(self) -> None:
        """The Surgery changed: the region (planned in the program as it was) goes, and so
        does a replacement chosen for it."""
        self.region, self.region_plan, self.region_problem, self.similar = [], None, "", None
        picker = self.session.picker
        if picker.replacement_for == REGION:
            picker.clear()

    def plan(self, verb: str) -> Any:
        """The region's plan, for ``verb`` (fuse region, swap region, find similar); raises,
        saying why, when there is no region or it cannot be one call."""
        if not self.region:
            raise WidgetError(f"{verb}: shift-click the nodes of a region first")
        if self.region_plan is None:
            raise WidgetError(f"{verb}: {self.region_problem}")
        return self.region_plan

    def find_similar(self) -> Any:
        """Where else the program computes what the region computes: the matches are marked
        in the picture and listed, the near-misses with what differs. Only places the current
        program still has are listed: a match whose nodes an earlier swap removed is not."""
        self.plan("find similar")
        session = self.session
        session.busy("looking for the region elsewhere…")
        found = session.surgery.find_similar(list(self.region))
        self.similar = self._still_in_program(found)
        session.touch("region")
        session.selection.mark()
        return self.similar

    def _still_in_program(self, found: Any) -> Any:
        """``found`` (:class:`graphsurgeon.patterns.find.Matches`, looked for in the original
        program) without the places the current program no longer has: a match or near-miss
        with a node an earlier swap removed is left out, and a note says how many were. A
        fused call still computes its nodes: what it holds stays. Each match kept is the Match
        found, unchanged (its ``index`` is its place among the original program's matches)."""
        gone = self._removed_nodes()
        matches = tuple(m for m in found.matches if gone.isdisjoint(m.nodes))
        near_misses = tuple(n for n in found.near_misses if gone.isdisjoint(n.nodes))
        left_out = len(found.matches) - len(matches) + len(found.near_misses) - len(near_misses)
        if not left_out:
            return found
        note = (
            f"{left_out} place{'s' if left_out != 1 else ''} left out: earlier swaps removed "
            f"{'their' if left_out != 1 else 'its'} nodes"
        )
        return replace(found, matches=matches, near_misses=near_misses, notes=(*found.notes, note))

    def _removed_nodes(self) -> frozenset[str]:
        """The nodes of the original program that the current program no longer computes
        (swaps removed them); the nodes of a fused call are computed still."""
        session = self.session
        info = swap_info(session.surgery.module) if session.viewer.can_diff else None
        if info is None:
            return frozenset()
        fused = {n for call in info.fused for n in info.partitions[call].nodes}
        return frozenset(info.diff.removed).difference(fused)
