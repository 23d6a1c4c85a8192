"""The SurgeryWidget's session: its state and its actions, in plain Python, without HTML.

:class:`SurgerySession` holds a :class:`~graphsurgeon.Surgery`, the view (which calls are open,
which picture is shown, laid out, with which overlay), the selection, the search, a region of
ops chosen by hand, the replacement being chosen and a :class:`~graphsurgeon.Stepper`. Each action (a click, a button)
is a method that calls the Surgery, the renderer or the stepper and updates that state;
:attr:`~SurgerySession.changed` says which parts of the page it touched. What the page shows of
the state (the panels' HTML) is written by :mod:`graphsurgeon.widget._panels`, and
:class:`~graphsurgeon.SurgeryWidget` only routes the page's events here and copies the panels
into its traits, so tests drive every control without a browser. Nothing here imports
ipywidgets or IPython, or writes HTML.

The view is the user's (``auto``: as much as fits, or the calls they opened) with, on top, what
the stepper and the search need to show: the call being stepped (at most its layer) and the
modules around a match are opened for as long as they are needed, and closed again after.

It reads the other stages through their public faces only: the Surgery's state (``version``,
``position``, ``steps``, ``replacements``...), the Picture's lookups (what draws a call, what
is inside a cluster, what feeds an element), ``program_index(ep).resolve(name)`` for names
and ``.call_text(call)`` for how a call is made, :mod:`graphsurgeon._meta` for every printed
value, and :meth:`graphsurgeon.types.GraphView.laid_out` to lay a picture out.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.widget import SurgerySession
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> session = SurgerySession(gs.Surgery.from_model(model, (torch.randn(2, 4),)))
    >>> session.select("1")
    >>> session.selected, session.marks["selected"]
    ('1', ['node:relu'])
    >>> session.choose("identity")
    >>> session.swap()
    >>> session.surgery.replacements
    {'1': Identity()}
    >>> session.verify().ok  # the program is faithful to the eager model with Identity in it
    True
    >>> session.compare().first_divergence  # but Identity is not ReLU
    '1'
"""

from __future__ import annotations

import inspect
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .. import _meta, display
from .._meta import split_call_name
from ..checks.compare import Comparison
from ..checks.verify import VerifyReport
from ..drawing import draw
from ..errors import (
    AlreadyRanError,
    GraphSurgeonError,
    UnknownModuleError,
    UnknownNameError,
    WidgetError,
    did_you_mean,
    unknown_name,
)
from ..partition import ModuleInfo, Partition, call_index, partition, program_index
from ..render import GraphView, graph_view
from ..render.picture import Picture, PictureNode
from ..rewrite import swap_info
from ..step import Stepper, StepResult, Summary
from ..surgery import Surgery

__all__ = [
    "DEPTHS",
    "LARGE_LAYOUT",
    "OVERLAYS",
    "PARTS",
    "VIEWS",
    "Candidate",
    "Match",
    "PendingLayout",
    "Scene",
    "SurgerySession",
]

#: The pictures the graph panel can show: the current program, or before/after.
VIEWS = ("program", "merged", "split")
#: The depths the picture can be opened to (:meth:`SurgerySession.expand_to_depth`).
DEPTHS = ("auto", "1", "2", "3", "4", "5", "all")
#: The overlays the picture can be painted with (``""``: none); see
#: :func:`graphsurgeon.checks.overlay.overlay_values`.
OVERLAYS = ("", "error", "own error", "latency")
#: The parts of the page an action can change (:attr:`SurgerySession.changed`): the picture,
#: the marks in it (selection, producers, consumers, matches, culprits), the selection's
#: details, the module tree, the replacement chosen (picker and preview), the history, the
#: checks, the stepper, the stepper's current node, a request to scroll the selection into
#: view, the search and its results, a layout waiting for a confirmation, the picture of
#: the call the stepper is inside, and the region (its nodes, its call, what is similar).
PARTS = (
    "picture",
    "marks",
    "selection",
    "tree",
    "choice",
    "history",
    "checks",
    "stepper",
    "current",
    "scroll",
    "search",
    "warning",
    "inside",
    "region",
)
#: Drawn nodes past which a layout the user asks for (open all, a depth, a big module) waits
#: for a confirmation: about a second of graphviz on a laptop.
LARGE_LAYOUT = 1_500
# Pictures kept laid out, so that undo/redo and switching views back cost no new layout.
_KEPT_PICTURES = 12
# How many values the stepper panel summarizes (the next node's inputs, the last value).
_SUMMARIES = 12
# How many search matches are listed and marked.
_MATCHES = 1_000
#: What a replacement chosen for the region (not for a module) is chosen for.
REGION = "<region>"
# Characters that make a search text a regular expression.
_REGEX = set("\\^$[]()*+?|{}")


@dataclass(frozen=True)
class Candidate:
    """A replacement the picker offers: ``key`` identifies it, ``label`` is what is shown."""

    key: str
    label: str


@dataclass(frozen=True)
class Match:
    """One result of a search: a module (``kind="module"``, its type in ``what``) or an fx
    node (``"node"``, its op in ``what``)."""

    name: str
    kind: str
    what: str


@dataclass(frozen=True)
class PendingLayout:
    """A layout the user asked for that waits for a confirmation: ``what`` it shows, how many
    nodes it draws, and the calls it opens."""

    what: str
    drawn: int
    open: frozenset[str] = field(repr=False)


class _TooLarge(Exception):
    """Raised by a render that would lay out more than its limit of nodes."""

    def __init__(self, drawn: int):
        super().__init__(drawn)
        self.drawn = drawn


class Scene:
    """One laid-out picture: what it shows (:attr:`view`), its SVG as the page shows it, and
    where the current program is drawn in it (``prefix``: ``"after/"`` in a split diff).
    Every question about it is one of the Picture's lookups."""

    def __init__(self, view: GraphView, svg: str, prefix: str, module: Any):
        self.view = view
        self.svg = svg
        self.prefix = prefix
        self.module = module  # keeps id(module), part of the cache key, from being reused

    @property
    def picture(self) -> Picture:
        return self.view.picture

    def elements(self, calls: list[str]) -> list[str]:
        """The ids drawing any of ``calls`` (a cluster, a box, a call's one node), in order."""
        picture = self.picture
        found = [e for call in calls for e in picture.elements_of_call(call)]
        return list(dict.fromkeys(found))

    def node_element(self, node: str) -> PictureNode | None:
        """Where fx node ``node`` is drawn: in the current program's picture, else (a node
        that only the original has, in a split diff) in the other one; None: not drawn."""
        element = self.picture.element_of_node(node, self.prefix)
        if element is None and self.prefix:
            element = self.picture.element_of_node(node)
        return element

    def shows_node(self, node: str) -> bool:
        """Whether fx node ``node`` is drawn as a node of its own (not in a box)."""
        element = self.node_element(node)
        return element is not None and element.kind not in ("box", "ops")

    def flow(self, selected: list[str]) -> dict[str, list[str]]:
        """The selection's producers and consumers, and the edges between them and it."""
        picture = self.picture
        nodes: set[str] = set()
        for element_id in selected:
            nodes.update(picture.inside(element_id) or (element_id,))
        producers, consumers, edges = set(), set(), set()
        for node in nodes:
            for edge in picture.edges_in(node):
                if edge.tail not in nodes:
                    producers.add(edge.tail)
                    edges.add(edge.id)
            for edge in picture.edges_out(node):
                if edge.head not in nodes:
                    consumers.add(edge.head)
                    edges.add(edge.id)
        return {
            "producers": sorted(producers),
            "consumers": sorted(consumers),
            "edges": sorted(edges),
        }


class SurgerySession:
    """The state and the actions of a :class:`~graphsurgeon.SurgeryWidget`, without a widget.

    Args:
        surgery: the live Surgery every action works on (the widget's ``w.surgery``).
        namespace: returns the user's namespace (the notebook's globals), where the picker
            looks for replacements and evaluates expressions; None: no namespace.
        on_busy: called with a line of progress before slow work (layout, verify, compare,
            stepping); the caller clears it when the action is over.

    State read by the panels: :attr:`surgery`, :attr:`tree`, :attr:`partitions`,
    :attr:`view`, :attr:`scene`, :attr:`overlay`, :attr:`selected` (a call or module name),
    :attr:`selected_node` (an fx node; ``"call/node"`` inside a swapped call),
    :attr:`marks`, the search (:attr:`search_text`, :attr:`matches`, :attr:`match_index`),
    :attr:`pending` (a large layout waiting for a confirmation), the replacement chosen
    (:attr:`replacement_label`, :attr:`replacement_key`, :attr:`can_swap`), :attr:`report`,
    :attr:`comparison`, :attr:`bisection`, :attr:`stepper`, :attr:`last_step`,
    :attr:`breakpoints`, :attr:`break_on_nan`, :attr:`current` (the element id of the
    stepper's node), :attr:`inside` (the picture of the swapped call the stepper is in) and
    :attr:`inside_current`, and the scroll requests :attr:`scroll` and
    :attr:`scroll_current` (counters: bumped, scroll).
    """

    def __init__(
        self,
        surgery: Surgery,
        namespace: Callable[[], Mapping[str, Any]] | None = None,
        on_busy: Callable[[str], None] | None = None,
    ):
        if not isinstance(surgery, Surgery):
            raise WidgetError(
                f"SurgerySession: expected a gs.Surgery, got {type(surgery).__name__}; "
                "use gs.SurgeryWidget(program_or_surgery, args=...)"
            )
        self.surgery = surgery
        self._namespace = namespace or dict
        self._on_busy = on_busy or (lambda text: None)
        #: The parts of the page (:data:`PARTS`) changed since :meth:`take_changes`.
        self.changed: set[str] = set(PARTS)
        self.view = "program"
        self._open: set[str] | None = None  # None: the renderer chooses ("auto")
        # what the stepper and the search open on top of the user's view, by who asked
        self._reveal: dict[str, frozenset[str]] = {}
        self._pictures: OrderedDict[tuple, Scene] = OrderedDict()
        self._ops_keys: set[str] = set()  # the own-ops boxes seen (``ops:model``)
        self.scene: Scene | None = None
        self.pending: PendingLayout | None = None
        self.overlay = ""
        self._overlays: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
        self.selected: str | None = None  # a call or module name
        self.selected_node: str | None = None  # an fx node, when a node was picked
        self._selected_elements: list[str] = []
        self.marks: dict[str, Any] = {}
        self.search_text = ""
        self.matches: list[Match] = []
        self.match_index = -1
        # The replacement the next swap uses belongs to the selection it was chosen for:
        # selecting another module clears it, so a second Swap never reuses the first's.
        self.replacement: Any = None  # the module (or _COPY), or None: nothing chosen
        self.replacement_label = ""  # what the picker and the preview call it
        self.replacement_key = ""  # its picker key ("copy", "ns:fast"), "expression", "module"
        self.replacement_for: str | None = None  # the selection it was chosen for
        # a region: nodes chosen by hand (shift-click), made one call by fusing or swapping
        self.region: list[str] = []
        self.region_plan: Any = None  # its RegionPlan (call_text: what a replacement takes)
        self.region_problem = ""  # why the nodes cannot be one call
        self.similar: Any = None  # what find_similar found (graphsurgeon.patterns.find.Matches)
        self.stepper: Stepper | None = None
        self._stepper_module: Any = None
        self.last_step: StepResult | None = None
        self.breakpoints: list[tuple[str, str]] = []  # ("node" | "enter", name), to re-apply
        self.break_on_nan = False
        self._budget: int | None = None  # the node budget of the default view, once chosen
        self.current = ""
        self.inside: Scene | None = None
        self.inside_current = ""
        self._inside_pictures: OrderedDict[int, Scene] = OrderedDict()
        self._view_before_inside: str | None = None
        self._original_stepper: Stepper | None = None
        self.scroll = 0
        self.scroll_current = 0
        self.comparison: Comparison | None = None
        self.bisection: Any = None
        self.report: VerifyReport | None = surgery.last_verify
        self.partitions: dict[str, Partition] = partition(surgery.program)
        self.tree = surgery.tree
        self._single = _single_node_calls(surgery.program, self.partitions)
        self._seen = surgery.version
        self._render()

    # -- what changed ---------------------------------------------------------------------

    def _touch(self, *parts: str) -> None:
        self.changed.update(parts)

    def take_changes(self) -> set[str]:
        """The parts of the page changed since the last call (:data:`PARTS`), and forget them."""
        changed, self.changed = self.changed, set()
        return changed

    def sync(self) -> None:
        """Catch up with the Surgery when it was changed from code (``w.surgery.swap(...)``
        in a cell): every action of the widget starts with this."""
        if self.surgery.version != self._seen:
            self._after_change()

    def refresh(self) -> None:
        """Show the Surgery as it is now (after it was changed from code, not by the widget)."""
        self._after_change()

    def _busy(self, text: str) -> None:
        self._on_busy(text)

    # -- the picture ----------------------------------------------------------------------

    @property
    def can_diff(self) -> bool:
        """Whether a before/after picture can be shown: something is swapped (a fused call
        computes the program's own nodes)."""
        return bool(self.surgery.replacements)

    @property
    def opened_by_user(self) -> frozenset[str] | None:
        """The calls the user opened, or None for the default view (as much as fits)."""
        return None if self._open is None else frozenset(self._open)

    @property
    def revealed(self) -> frozenset[str]:
        """What is opened on top of the user's view: the call the stepper is in (at most its
        layer) and the modules around the current search match."""
        return frozenset().union(*self._reveal.values()) if self._reveal else frozenset()

    def _shown(self, view: str) -> tuple[str, ...]:
        """The names the picture opens (unmarked: show=) on top of the view: those of
        :attr:`revealed` that the picture of ``view`` has."""
        drawn = call_index(self.drawn_program()).calls
        original = call_index(self.surgery.program).calls
        return tuple(
            sorted(
                name
                for name in self.revealed
                if name.startswith("ops:")
                or name in drawn
                or (view != "program" and name in original)
            )
        )

    def _collapse(self, shown: Iterable[str] = ()) -> Any:
        """The collapse set of the user's view: every call not opened by the user or shown on
        top of it (calls drawn as their one node are never boxes), and the own-ops boxes
        (``ops:<call>``) not opened either."""
        opened = set(self._open)
        for name in shown:
            owner = name[len("ops:") :] if name.startswith("ops:") else name
            if owner in self.partitions:
                opened.update(self._ancestors(owner))
                opened.add(owner)
            opened.add(name)
        calls = {c for c in self.partitions if c not in opened and c not in self._single}
        return calls | {key for key in self._ops_keys if key not in opened}

    def _render(self, limit: int | None = None) -> None:
        """Show the picture of the current state (a cached one when it was laid out before).
        ``limit``: raise :class:`_TooLarge` instead of laying out more nodes than that."""
        surgery = self.surgery
        view = self.view if self.can_diff else "program"
        module = self.drawn_program()
        shown = self._shown(view)
        overlay = self._overlay_values()
        user = None if self._open is None else frozenset(self._open)
        key = (view, id(module), user, shown, self.overlay)
        scene = self._pictures.get(key)
        if scene is None:
            options = dict(diff=None if view == "program" else view, show=shown, overlay=overlay)
            if self._open is None and self._budget is None:
                # as much detail as fits the width, as gs.draw chooses; the budget is chosen
                # once (draw tries several layouts to choose it), the next pictures of this
                # program are drawn with it, in one layout each
                self._busy("laying out the picture…")
                drawing = draw(surgery, **options)
                self._budget = drawing.max_nodes
                graph, svg = drawing.view, drawing.svg
            else:
                if self._open is None:
                    graph = graph_view(surgery, max_nodes=self._budget, **options)
                else:
                    graph = graph_view(surgery, collapse=self._collapse(shown), **options)
                if limit is not None and graph.drawn_nodes > limit:
                    raise _TooLarge(graph.drawn_nodes)
                self._busy(f"laying out the picture ({graph.drawn_nodes:,} nodes)…")
                svg = graph.laid_out("svg").decode()
            prefix = "after/" if view == "split" else ""
            scene = Scene(graph, display.inline_svg(svg), prefix, module)
            self._pictures[key] = scene
            while len(self._pictures) > _KEPT_PICTURES:
                self._pictures.popitem(last=False)
        self._pictures.move_to_end(key)
        self._ops_keys.update(scene.view.folded_ops)  # what the user's view keeps folded
        self.scene = scene
        self.view = view
        self._touch("picture")
        # the selection, the matches and the stepper's node are marked again in the new picture
        self._mark_selection()
        self._mark_current()

    def _show_open(self, opened: set[str] | None, what: str, force: bool = False) -> None:
        """Show the user's view with ``opened`` open (None: auto). A layout of more than
        :data:`LARGE_LAYOUT` nodes waits for :meth:`confirm_layout` unless ``force``."""
        before = self._open
        self._open = opened
        try:
            self._render(limit=None if force or opened is None else LARGE_LAYOUT)
        except _TooLarge as large:
            self._open = before
            self.pending = PendingLayout(what, large.drawn, frozenset(opened or ()))
            self._touch("warning")
            return
        if self.pending is not None:
            self.pending = None
            self._touch("warning")

    def confirm_layout(self) -> None:
        """Lay out the large picture that waits for a confirmation (see :attr:`pending`)."""
        pending = self.pending
        if pending is None:
            raise WidgetError("no layout waits for a confirmation")
        self._busy(f"laying out {pending.drawn:,} nodes…")
        self._show_open(set(pending.open), pending.what, force=True)

    def cancel_layout(self) -> None:
        """Keep the picture as it is: the large layout waiting for a confirmation is dropped."""
        self.pending = None
        self._touch("warning")

    def set_view(self, view: str) -> None:
        """Show ``"program"`` (the current program), or before/after: ``"merged"`` (one
        picture, removed nodes greyed) or ``"split"`` (side by side)."""
        if view not in VIEWS:
            raise WidgetError(f"view: expected one of {', '.join(VIEWS)}, got {view!r}")
        if view != "program" and not self.can_diff:
            raise WidgetError(
                "before/after: nothing is swapped yet (a fused call computes what it did); "
                "swap a module first"
            )
        self.view = view
        self._view_before_inside = None  # the user chose: stepping out leaves it so
        self._render()

    # -- overlays -------------------------------------------------------------------------

    def set_overlay(self, kind: str | None) -> None:
        """Paint the picture and the module tree with ``"error"``, ``"own error"`` or
        ``"latency"`` (see :func:`graphsurgeon.checks.overlay.overlay_values`); ``""`` or None: no
        overlay. The values are computed again after every edit; the overlay stays on across
        views."""
        kind = kind or ""
        if kind not in OVERLAYS:
            raise WidgetError(
                f"overlay: expected one of {', '.join(repr(k) for k in OVERLAYS)}, got {kind!r}"
            )
        if kind:
            self._inputs("overlay")
        before = self.overlay
        self.overlay = kind
        try:
            self._render()
        except Exception:
            self.overlay = before
            raise
        self._touch("tree")

    def overlay_values(self) -> Any:
        """The :class:`graphsurgeon.checks.overlay.OverlayValues` painted now, or None."""
        return self._overlay_values()

    def _overlay_values(self) -> Any:
        if not self.overlay:
            return None
        module = self.drawn_program()
        key = (self.overlay, id(module))
        kept = self._overlays.get(key)
        if kept is None:
            from ..checks.overlay import overlay_values  # runs the program: only when asked

            self._busy(f"computing the {self.overlay} overlay…")
            args, kwargs = self._inputs("overlay")
            values = overlay_values(self.surgery, args, kwargs, kind=self.overlay)
            kept = (module, values)  # the module keeps its id from being reused
            self._overlays[key] = kept
            while len(self._overlays) > 4:
                self._overlays.popitem(last=False)
        return kept[1]

    # -- names ----------------------------------------------------------------------------

    def calls_of(self, name: str) -> list[str]:
        """The calls a module or call name stands for, read as every entry point reads it
        (``"blk@0"`` is ``"blk"``); [] for a name the program does not have."""
        try:
            return list(program_index(self.surgery.program).resolve(name).calls)
        except UnknownModuleError:
            return []

    def _opened(self) -> set[str]:
        """The calls open in the user's view (in the default view: those the renderer chose,
        without what the stepper or the search opened on top of it)."""
        if self._open is None:
            if not self.revealed:
                return set(self.scene.view.clusters)
            base = self._pictures.get((self.view, id(self.drawn_program()), None, (), self.overlay))
            clusters = base.view.clusters if base is not None else self.scene.view.clusters
            return set(clusters)
        return set(self._open)

    def _ancestors(self, call: str) -> list[str]:
        """The calls around ``call``, outermost first (from the program's one call index)."""
        part = self.partitions.get(call)
        if part is None or not part.nodes:
            return []
        chain = call_index(self.surgery.program).chains.get(part.nodes[0], ())
        return list(chain[: chain.index(call)]) if call in chain else list(chain)

    def _inside_call(self, name: str, call: str) -> bool:
        """Whether ``name`` (a call, or an own-ops id) is ``call`` or one of its inner calls."""
        owner = name[len("ops:") :] if name.startswith("ops:") else name
        return owner == call or call in self._ancestors(owner)

    # -- opening and collapsing -----------------------------------------------------------

    def expand(self, name: str | None = None, force: bool = False) -> None:
        """Open module (or call) ``name`` (default: the selection), and the modules around
        it, in the picture."""
        target = self._target(name, "expand")
        calls = self._calls_or_raise(target)
        opened = self._opened()
        for call in calls:
            opened.update(self._ancestors(call))
            opened.add(call)
        self._show_open(opened, f"open {target}", force)

    def collapse(self, name: str | None = None) -> None:
        """Draw module (or call) ``name`` (default: the selection) as one box again."""
        calls = self._calls_or_raise(self._target(name, "collapse"))
        opened = self._opened()
        for call in calls:  # the call and everything inside it
            opened = {c for c in opened if not self._inside_call(c, call)}
            for source, names in list(self._reveal.items()):  # the user's choice wins
                kept = frozenset(n for n in names if not self._inside_call(n, call))
                self._reveal[source] = kept
        self._open = opened
        self.pending = None
        self._touch("warning")
        self._render()

    def expand_all(self, force: bool = False) -> None:
        """Open every module. A picture of more than :data:`LARGE_LAYOUT` nodes waits for
        :meth:`confirm_layout` (``force``: lay it out at once)."""
        self._show_open(set(self.partitions), "open every module", force)

    def expand_to_depth(self, depth: int | str, force: bool = False) -> None:
        """Open every module down to ``depth`` levels (1: the top-level modules are boxes,
        as ``collapse=1`` draws them); ``"all"``: every module; ``"auto"``: the default
        view. A picture of more than :data:`LARGE_LAYOUT` nodes waits for
        :meth:`confirm_layout` (``force``: lay it out at once)."""
        if depth == "auto":
            self.auto()
            return
        if depth == "all":
            self.expand_all(force)
            return
        try:
            level = int(depth)
        except (TypeError, ValueError):
            level = 0
        if isinstance(depth, bool) or level < 1:
            raise WidgetError(f"depth: expected 1, 2, 3..., 'all' or 'auto', got {depth!r}")
        # a top-level module is at level 1: at depth 1 it is a box, at depth 2 it is open
        opened = {c for c in self.partitions if len(self._ancestors(c)) + 1 < level}
        self._show_open(opened, f"open {level} level{'s' if level != 1 else ''}", force)

    def auto(self) -> None:
        """Back to the view the renderer chooses: as much detail as fits."""
        self._show_open(None, "the default view")

    def toggle(self, element_or_name: str) -> None:
        """Open a collapsed box (a run of boxes becomes one box per call), or collapse an open
        cluster: what a double-click in the picture does. Takes an element id or a name."""
        picture = self.scene.picture
        if element_or_name in picture:
            element = picture[element_or_name]
            kind = getattr(element, "kind", None)
            if kind == "box":
                opened = self._opened()
                # a run of boxes opens into one box per call (nothing opened); a box, its call
                if len(element.calls) <= 1:
                    for call in element.calls:
                        opened.update(self._ancestors(call))
                        opened.add(call)
                elif self._open is None:  # a run in the default view: every call a box
                    opened |= {a for call in element.calls for a in self._ancestors(call)}
                self._show_open(opened, f"open {element.label.splitlines()[0]}")
                return
            call = getattr(element, "call", None)
            if call is None and kind != "ops":
                calls = getattr(element, "calls", ())
                call = calls[0] if calls else None
            if call is None and kind != "ops":
                node = getattr(element, "node", None)
                chain = self.chain_of_node(node) if node else ()
                call = chain[-1] if chain else None
            if kind == "ops":  # the ops a module runs in its own forward: open them
                self._show_open(self._opened() | {element_or_name}, f"open {element_or_name}")
                return
            if call is None:
                raise WidgetError(f"{element_or_name!r} is not in a module: nothing to collapse")
            self.collapse(call)
            return
        calls = self._calls_or_raise(element_or_name)
        if any(c in self._opened() for c in calls):
            self.collapse(element_or_name)
        else:
            self.expand(element_or_name)

    def _calls_or_raise(self, name: str) -> list[str]:
        resolved = program_index(self.surgery.program).resolve(name)  # unknown: raises
        if not resolved.calls:
            raise WidgetError(
                f"module {resolved.fqn!r} is never called (a container such as nn.ModuleList): "
                "open or collapse its children"
            )
        return list(resolved.calls)

    def chain_of_node(self, node: str) -> tuple[str, ...]:
        """The calls around fx node ``node``, outermost first: in the program drawn, else (a
        node a swap removed) in the original program."""
        chains = call_index(self.drawn_program()).chains
        if node in chains:
            return chains[node]
        return call_index(self.surgery.program).chains.get(node, ())

    def drawn_program(self) -> Any:
        """The program the picture draws: the Surgery's current module once something is
        swapped or fused, else its ExportedProgram."""
        s = self.surgery
        return s.module if (s.replacements or s.fused) else s.program

    # -- selection ------------------------------------------------------------------------

    def click(self, element_id: str) -> None:
        """Select what a click in the picture hit: a cluster or box selects its module call,
        a node selects that node (and the call it belongs to)."""
        picture = self.scene.picture
        if element_id not in picture:
            raise WidgetError(f"the picture has no element {element_id!r}")
        element = picture[element_id]
        call = getattr(element, "call", None)
        calls = getattr(element, "calls", ())
        if call:
            self._select_call(call, [element_id])
        elif calls:
            self._select_call(calls[0], [element_id])
        elif getattr(element, "node", None):
            self._select_node(element.node, element_id)
        else:
            raise WidgetError(f"{element_id!r} is not a module or a node")

    def click_inside(self, element_id: str) -> None:
        """Select a node of the swapped call's picture the stepper is inside
        (:attr:`inside`): it is then ``"call/node"``, which run to selection and the
        breakpoint button reach."""
        inside = self.inside
        frames = self.stepper.frames if self.stepper is not None else ()
        if inside is None or not frames:
            raise WidgetError("no call is entered: step into a swapped call first")
        picture = inside.picture
        if element_id not in picture:
            raise WidgetError(f"the call's picture has no element {element_id!r}")
        node = getattr(picture[element_id], "node", None)
        if not node:
            raise WidgetError(f"{element_id!r} is not a node of the call")
        self._selection_is(frames[0], f"{frames[0]}/{node}", [])

    def select(self, name: str | None) -> None:
        """Select a module or call (``"layers.1"``, ``"shared@1"``), an fx node (of the
        current program, or one a swap removed), ``"call/node"`` (a node inside a swapped
        call, as the stepper names it), or nothing (None). A module inside a collapsed box
        stays in its box; :meth:`search` opens it. Selecting another module clears the
        replacement chosen for the previous one. A name the program does not have raises,
        and the selection stays what it was."""
        if name is None or name == "":
            self._selection_is(None, None, [])
            return
        if not isinstance(name, str):
            raise WidgetError(f"select: expected a module or node name, got {name!r}")
        if name in self.tree or self.calls_of(name):
            if name not in self.tree:  # a call: as every view names it ("blk@0" is "blk")
                name = program_index(self.surgery.program).resolve(name).name
            self._select_call(name, None)
        elif name in self._node_names():
            self._select_node(name, None)
        elif name in self._program_calls():  # a region made one call: drawn as one node
            self._selection_is(name, None, self._call_elements(name))
        elif self.inner_call(name) is not None:
            self._selection_is(self.inner_call(name), name, [])
        else:
            choices = dict.fromkeys([*self.tree.keys(), *self.partitions])
            raise UnknownNameError(unknown_name(name, choices, kind="module or node"))

    def _program_calls(self) -> set[str]:
        """The swapped and fused calls of the current program (regions included)."""
        return set(self._call_nodes())

    def _call_nodes(self) -> Mapping[str, str]:
        """Each swapped or fused call of the current program (regions included) -> the node
        that calls it; empty while nothing is swapped or fused."""
        info = swap_info(self.surgery.module) if self.can_diff or self.surgery.fused else None
        return info.call_nodes if info is not None else {}

    def inner_call(self, name: str) -> str | None:
        """The swapped or fused call of ``"call/node"`` (a node inside it, as the stepper
        names it), or None."""
        call, slash, node = name.partition("/")
        info = swap_info(self.surgery.module) if self.can_diff or self.surgery.fused else None
        if slash and node and info is not None and call in info.call_nodes:
            return call
        return None

    def escape(self) -> None:
        """What Esc does: close the search if one is open, else clear the selection."""
        if self.search_text:
            self.close_search()
        else:
            self.select(None)

    def _node_names(self) -> dict[str, None]:
        """The fx nodes a selection can name: the program drawn's, then those only the
        original has (a swap removed them; the before/after pictures draw them)."""
        names = {n.name: None for n in self.drawn_program().graph.nodes}
        if self.surgery.replacements:
            names.update((n.name, None) for n in self.surgery.program.graph.nodes)
        return names

    def node(self, name: str) -> torch.fx.Node | None:
        """The fx node ``name``: of the program drawn, else of the original program (a node a
        swap removed), else of the swapped call the stepper is inside (``"call/node"``)."""
        for graph in (self.drawn_program().graph, self.surgery.program.graph):
            for node in graph.nodes:
                if node.name == name:
                    return node
        call = self.inner_call(name)
        stepper = self.stepper
        if call is not None and stepper is not None and stepper.frames[:1] == (call,):
            inner = name[len(call) + 1 :]
            for node in stepper.call_graph.graph.nodes:
                if node.name == inner:
                    return node
        return None

    def removed_by(self, node: str) -> str | None:
        """The swapped call that removed fx node ``node`` of the original program, or None."""
        info = swap_info(self.surgery.module) if self.can_diff else None
        if info is None:
            return None
        for call, part in info.partitions.items():
            if node in part.nodes and call not in info.fused:
                return call
        return None

    def _select_call(self, name: str, elements: list[str] | None) -> None:
        self._selection_is(name, None, elements or [])

    def _select_node(self, node: str, element: str | None) -> None:
        chain = self.chain_of_node(node)
        self._selection_is(chain[-1] if chain else None, node, [element] if element else [])

    def _selection_is(self, name: str | None, node: str | None, elements: list[str]) -> None:
        """The one place the selection changes: a replacement chosen for another module is
        dropped, then the selection, the picker and the preview change together."""
        self.selected, self.selected_node = name, node
        self._selected_elements = elements
        if self.replacement_for != name and not (self.replacement_for == REGION and self.region):
            self._choose(None, "", "")
        self._touch("selection", "choice")
        self._mark_selection()

    def _ids_of(self, name: str) -> list[str]:
        """The ids drawing a module, a call or an fx node (the box holding it when it is
        collapsed); [] when the picture does not show it."""
        scene = self.scene
        calls = self.calls_of(name) if name in self.tree or name in self.partitions else []
        if calls:
            return scene.elements(calls) or self._box_holding(name)
        element = scene.node_element(name)
        return [element.id] if element is not None else []

    def _mark_selection(self) -> None:
        scene = self.scene
        if self.selected_node is not None:
            node = self.selected_node
            if self.inner_call(node) is not None and node not in self._node_names():
                ids = self._ids_of(self.inner_call(node))  # inside a call: the call
            else:
                element = scene.node_element(node)
                ids = [element.id] if element is not None else []
        elif self.selected is not None:
            ids = [e for e in self._selected_elements if e in scene.picture]
            ids = (
                ids
                or scene.elements(self.calls_of(self.selected))
                or self._box_holding(self.selected)
                or self._call_elements(self.selected)
            )
        else:
            ids = []
        # "module": the tree row to mark, as its data-gs-module attribute carries the name
        module = (
            display.id_text(split_call_name(self.selected)[0]) if self.selected is not None else ""
        )
        matches = [e for m in self.matches for e in self._ids_of(m.name)]
        culprits = self.bisection.culprits if self.bisection is not None else ()
        culprit_ids = [e for c in culprits for e in (self._ids_of(c) or self._call_elements(c))]
        self.marks = {
            "selected": ids,
            **scene.flow(ids),
            "module": module,
            "matches": list(dict.fromkeys(matches)),
            "culprits": list(dict.fromkeys(culprit_ids)),
            "culprit_modules": [display.id_text(split_call_name(c)[0]) for c in culprits],
            "match_modules": [display.id_text(m.name) for m in self.matches if m.kind == "module"],
            "region": self._node_ids(self.region),
            "similar": self._node_ids(
                n for m in (self.similar.matches if self.similar else ()) for n in m.nodes
            ),
            "near": self._node_ids(
                n for m in (self.similar.near_misses if self.similar else ()) for n in m.nodes
            ),
        }
        self._touch("marks")

    def _node_ids(self, nodes: Iterable[str]) -> list[str]:
        """The ids drawing fx nodes (a box holding one, once), in order."""
        found = []
        for node in nodes:
            element = self.scene.node_element(node)
            if element is not None:
                found.append(element.id)
        return list(dict.fromkeys(found))

    def _call_elements(self, call: str) -> list[str]:
        """The element drawing swapped or fused ``call`` as one node of the program drawn."""
        node = self._call_node(call)
        element = self.scene.node_element(node) if node is not None else None
        return [element.id] if element is not None else []

    def _box_holding(self, name: str) -> list[str]:
        """The box a collapsed call is drawn in (a parent's box, or a run of boxes)."""
        scene = self.scene
        for call in self.calls_of(name):
            for node in self.partitions[call].nodes:
                element = scene.picture.element_of_node(node, scene.prefix)
                if element is not None:
                    return [element.id]
        return []

    # -- search ---------------------------------------------------------------------------

    def search(self, text: str) -> None:
        """Find modules and nodes by name, module type (``LayerNorm``), op (``aten.gelu``),
        initials (``sdpa`` for scaled_dot_product_attention, ``bn`` for BatchNorm2d) or a
        regular expression (``layers\\.\\d+\\.mlp``): every match is listed and marked in
        the picture, and the first is selected, with the modules around it opened (an exact
        name comes first). :meth:`next_match` and :meth:`previous_match` go through them."""
        text = (text or "").strip()
        if not text:
            raise WidgetError("search: type a name, a module type, an op or a regex")
        matches = self._search(text)
        if not matches:
            # the last search's matches, marks and count go: they would read as this one's
            self.close_search()
            names = dict.fromkeys([*self.tree.keys(), *self.partitions])
            raise WidgetError(
                f"search: no module or node matches {text!r} (by name, type such as LayerNorm, "
                f"op such as aten.gelu, initials such as sdpa, or regex).{did_you_mean(text, names)}"
            )
        self.search_text, self.matches, self.match_index = text, matches, 0
        self._touch("search")
        self._go_to_match()

    def next_match(self) -> None:
        """Select the next match of the search (after the last: the first)."""
        self._step_match(1)

    def previous_match(self) -> None:
        """Select the previous match of the search (before the first: the last)."""
        self._step_match(-1)

    def go_to_match(self, index: int) -> None:
        """Select match ``index`` of the search (a click on its row)."""
        if not self.matches:
            raise WidgetError("search: nothing found yet; type a search first")
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(self.matches)
        ):
            raise WidgetError(f"search: no match {index!r} (there are {len(self.matches)})")
        self.match_index = index
        self._touch("search")
        self._go_to_match()

    def _step_match(self, by: int) -> None:
        if not self.matches:
            raise WidgetError("search: nothing found yet; type a search first")
        self.match_index = (self.match_index + by) % len(self.matches)
        self._touch("search")
        self._go_to_match()

    def close_search(self) -> None:
        """Forget the search: its marks go, and what it opened closes."""
        self.search_text, self.matches, self.match_index = "", [], -1
        self._touch("search")
        if self._reveal.pop("search", None):
            self._render()
        else:
            self._mark_selection()

    def _go_to_match(self) -> None:
        match = self.matches[self.match_index]
        if match.kind == "module":
            wanted = {a for c in self.calls_of(match.name) for a in self._ancestors(c)}
        else:
            wanted = set(self.chain_of_node(match.name)[-1:])
        if frozenset(wanted) != self._reveal.get("search", frozenset()):
            self._reveal["search"] = frozenset(wanted)
            self._render()
        self.select(match.name)
        element = None
        if match.kind == "node":
            element = self.scene.node_element(match.name)
        if element is not None and element.kind == "ops":  # its module's own ops: open them
            self._reveal["search"] = frozenset(wanted | {element.id})
            self._render()
        self.scroll += 1
        self._touch("scroll")

    def _search(self, text: str) -> list[Match]:
        lowered = text.lower()
        regex = None
        if _REGEX & set(text):
            try:
                regex = re.compile(text, re.IGNORECASE)
            except re.error:
                regex = None

        def hit(fields: Iterable[str], short: Iterable[str] = ()) -> bool:
            for text_ in fields:
                if text_ and (lowered in text_.lower() or (regex and regex.search(text_))):
                    return True
            return any(lowered == _initials(word) for word in short if word)

        exact: list[Match] = []
        modules: list[Match] = []
        for fqn, info in self.tree.items():
            if not fqn:
                continue
            types = (info.type_name, info.qualified_type or "")
            if hit((fqn, *types), (info.type_name,)):
                found = Match(fqn, "module", info.type_name)
                (exact if fqn == text else modules).append(found)
        nodes: list[Match] = []
        found_modules = {m.name for m in exact + modules if m.kind == "module"}
        call_of_node = {node: call for call, node in self._call_nodes().items()}
        for node in self.drawn_program().graph.nodes:
            if not _meta.computes(node):
                continue
            call = call_of_node.get(node.name)
            if call is not None and split_call_name(call)[0] in found_modules:
                continue  # a swapped or fused module's call: listed once, as the module
            short, full = _meta.op_text(node, "short"), _meta.op_text(node, "full")
            if hit((node.name, short, full), (short.rpartition(".")[2],)):
                found = Match(node.name, "node", short)
                (exact if node.name == text else nodes).append(found)
        return (exact + modules + nodes)[:_MATCHES]

    # -- what the panels read about the selection ------------------------------------------

    def module_info(self, name: str) -> ModuleInfo | None:
        """The module tree's row of the module that ``name`` (a module or a call) names."""
        return self.tree.get(split_call_name(name)[0])

    def call_text(self, call: str, replacement: torch.nn.Module | None = None) -> str:
        """How the program makes ``call``: ``(x: f32[1, 16, 64]) → f32[1, 16, 64]``, the
        arguments named as ``replacement``'s forward names them (default: the original's);
        '' when the call's signature was not preserved."""
        if self.partitions[call].signature is None:
            return ""
        return program_index(self.surgery.program).call_text(call, module=replacement, wrap=48)

    def source_of(self, call: str) -> str:
        """Where the first op of ``call`` comes from (``model.py:12``), or ''."""
        by_name = program_index(self.surgery.program).by_name
        for name in self.partitions[call].nodes:
            node = by_name.get(name)
            if node is not None and node.op == "call_function":
                text = _meta.source_text(node)
                if text:
                    return text
        return ""

    # -- replacements ---------------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """What the picker offers for the selection: a copy of the original, identity, then
        the ``nn.Module`` instances of the user's namespace (not the model or one of its own
        submodules) and the classes that can be built (not the model's own classes): with no
        arguments, or from the original module (``FusedAttention(original)``, made from
        ``s.original(name)``)."""
        found = [
            Candidate("copy", "a copy of the original"),
            Candidate("identity", "identity (nn.Identity)"),
        ]
        try:
            namespace = dict(self._namespace())
        except Exception:  # a namespace that cannot be read offers nothing, it is not an error
            namespace = {}
        model = self.surgery.model
        own = {id(m) for m in model.modules()} if model is not None else set()
        # the model's own classes: a fresh one is no replacement ("a copy of the original" is)
        own_types = {type(m) for m in model.modules()} if model is not None else set()
        for key, value in namespace.items():
            if key.startswith("_"):
                continue
            if isinstance(value, torch.nn.Module):
                if isinstance(value, torch.fx.GraphModule) or id(value) in own:
                    continue  # a program, or the model (or part of it) being operated on
                found.append(Candidate(f"ns:{key}", f"{key}: {type(value).__name__} (instance)"))
            elif (
                isinstance(value, type)
                and issubclass(value, torch.nn.Module)
                and not _library_class(value)
                and value not in own_types
            ):
                needed = _required_arguments(value)
                if needed == 0:
                    found.append(Candidate(f"ns:{key}", f"{key}: class, built as {key}()"))
                elif needed == 1:
                    found.append(Candidate(f"ns:{key}", f"{key}: class, built as {key}(original)"))
        return found

    @property
    def can_swap(self) -> bool:
        """Whether Swap has what it needs: a selection and a replacement chosen for it."""
        return (
            self.selected is not None
            and self.replacement is not None
            and self.replacement_for == self.selected
        )

    @property
    def can_swap_region(self) -> bool:
        """Whether Swap region has what it needs: nodes that can be one call, and a
        replacement chosen for them."""
        return self.region_plan is not None and self.replacement_for == REGION

    @property
    def replacement_module(self) -> torch.nn.Module | None:
        """The module chosen, as the preview names its arguments (None: a copy of the
        original, or nothing chosen)."""
        return None if self.replacement is _COPY else self.replacement

    def _choose(self, replacement: Any, label: str, key: str) -> None:
        self.replacement, self.replacement_label, self.replacement_key = replacement, label, key
        if replacement is None:
            self.replacement_for = None
        else:  # while a region is chosen, a replacement is chosen for it
            self.replacement_for = REGION if self.region else self.selected
        self._touch("choice")

    def _for_selection(self, verb: str) -> str:
        if self.region:
            return REGION
        if self.selected is None:
            raise WidgetError(
                f"{verb}: select a module first (click it, or w.select(name)); a replacement "
                "is chosen for the module it replaces"
            )
        return self.selected

    def refresh_candidates(self) -> None:
        """Read the namespace again (the picker got the focus: a class defined in a new cell
        is offered at once)."""
        self._touch("choice")

    def choose(self, key: str | None) -> None:
        """Pick the replacement the next :meth:`swap` of the selection uses: ``"copy"`` (a
        deep copy of the original module), ``"identity"``, or ``"ns:<name>"`` from the
        namespace (a class is built with no arguments, or from the original module); ``""``
        (the picker's first line) or None chooses nothing. It belongs to the selection:
        selecting another module clears it."""
        if key is None or key == "":
            self._choose(None, "", "")
            return
        selected = self._for_selection("choose")
        if key == "copy":
            self._choose(_COPY, "a copy of the original", key)
        elif key == "identity":
            self._choose(torch.nn.Identity(), "identity", key)
        elif isinstance(key, str) and key.startswith("ns:"):
            name = key[3:]
            namespace = dict(self._namespace())
            if name not in namespace:
                raise WidgetError(f"the namespace has no {name!r} (any more): pick again")
            original = None if selected == REGION else (lambda: self._original(selected))
            module = _module_from(namespace[name], name, original)
            self._choose(module, name, key)
        else:
            raise WidgetError(f"choose: unknown replacement {key!r}")

    def choose_expression(self, text: str) -> None:
        """Evaluate ``text`` (``MyAttn(dim=64)``) in the user's namespace: the module (or
        class, then built with no arguments or from the original module) is the replacement
        the next swap of the selection uses."""
        selected = self._for_selection("expression")
        text = (text or "").strip()
        if not text:
            raise WidgetError("expression: type one, such as MyAttn(dim=64)")
        namespace = dict(self._namespace())
        try:
            value = eval(text, namespace)  # the user's own expression, in their own kernel
        except Exception as error:
            raise WidgetError(
                f"the expression {text!r} failed: {type(error).__name__}: {error}"
            ) from error
        original = None if selected == REGION else (lambda: self._original(selected))
        self._choose(_module_from(value, text, original), text, "expression")

    def use(self, module: torch.nn.Module, label: str | None = None) -> None:
        """Make ``module`` the replacement the next swap of the selection uses."""
        self._for_selection("use")
        label = label or type(module).__name__
        self._choose(_module_from(module, label), label, "module")

    def _resolved_replacement(self, name: str) -> torch.nn.Module:
        if self.replacement is None:
            raise WidgetError(
                f"swap {name!r}: pick a replacement first (the picker, or w.swap(module))"
            )
        if self.replacement_for != name:  # chosen for the selection; swapping another name
            raise WidgetError(
                f"swap {name!r}: the replacement {self.replacement_label!r} was chosen for "
                f"{self.replacement_for!r}, not for {name!r}; select {name!r} and pick one "
                f"for it, or pass it: w.swap(module, name={name!r})"
            )
        if self.replacement is _COPY:
            return self._original(name)
        return self.replacement

    def _original(self, name: str) -> torch.nn.Module:
        if self.surgery.model is None:
            self._busy("rebuilding the program's modules…")  # once: the Surgery keeps them
        return self.surgery.original(name)

    # -- operations -----------------------------------------------------------------------

    def _target(self, name: str | None, verb: str) -> str:
        name = name if name is not None else self.selected
        if name is None:
            raise WidgetError(f"{verb}: select a module first (click it, or w.select(name))")
        return name

    def swap(self, module: torch.nn.Module | None = None, name: str | None = None) -> None:
        """Swap the selected module (or ``name``) for ``module``, or for the replacement
        chosen in the picker for it; the before/after picture is shown."""
        name = self._target(name, "swap")
        if module is not None:
            replacement = _module_from(module, type(module).__name__)
        else:
            replacement = self._resolved_replacement(name)
        self._busy(f"swapping {name}…")
        self.surgery.swap(name, replacement)
        if module is not None and name == self.selected:  # the picker shows what it swapped in
            self._choose(replacement, type(replacement).__name__, "module")
        self._after_change(show="merged")

    def fuse(self, name: str | None = None) -> None:
        """Fuse the selected module (or ``name``): its nodes become one call."""
        name = self._target(name, "fuse")
        self._busy(f"fusing {name}…")
        self.surgery.fuse(name)
        self._after_change()

    def undo(self) -> None:
        """Go back one step of the Surgery."""
        self.surgery.undo()
        self._after_change()

    def redo(self) -> None:
        """Go forward again over an undone step."""
        self.surgery.redo()
        self._after_change()

    def reset(self) -> None:
        """The Surgery back to the original program (the history is kept: redo still
        works). The stepper's restart is :meth:`reset_stepper`."""
        self.surgery.reset()
        self._after_change()

    def _diff_drawable(self) -> bool:
        """Whether the before/after pictures can be drawn: the renderer cannot yet draw a
        swapped region in them (it can in the program's own picture)."""
        regions = self.surgery.regions
        return not any(name in regions for name in self.surgery.replacements)

    def _after_change(self, show: str | None = None) -> None:
        self._seen = self.surgery.version
        self._leave_inside(render=False)  # the stepper goes: so does the call it was inside
        if show is not None and self.view == "program" and self._diff_drawable():
            self.view = show
        if not self.can_diff:
            self.view = "program"
        self.comparison = None
        self.bisection = None
        self.report = self.surgery.last_verify
        self.stepper = None
        self._original_stepper = None
        self.last_step = None
        self._reveal.pop("stepper", None)
        self.pending = None
        self.region, self.region_plan, self.region_problem, self.similar = [], None, "", None
        if self.replacement_for == REGION:
            self._choose(None, "", "")
        if self.search_text:  # the same search, in the new program
            self.matches = self._search(self.search_text)
            self.match_index = min(self.match_index, len(self.matches) - 1)
            if not self.matches:
                self.search_text = ""
                self._reveal.pop("search", None)
        self._touch(*PARTS)
        self._render()

    # -- regions --------------------------------------------------------------------------

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
        picture = self.scene.picture
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
        by_name = program_index(self.surgery.program).by_name
        return [n for n in nodes if n in by_name and _meta.computes(by_name[n])]

    def set_region(self, nodes: Iterable[str]) -> None:
        """Make ``nodes`` (fx node names of the program, as the picture names them) the
        region: what it would take and return as one call is worked out at once
        (:attr:`region_plan`), or why it cannot be one call (:attr:`region_problem`)."""
        nodes = list(dict.fromkeys(nodes or ()))
        self.region, self.region_plan, self.region_problem, self.similar = nodes, None, "", None
        if nodes:
            try:
                self.region_plan = self.surgery.region_signature(nodes)
            except GraphSurgeonError as problem:
                self.region_problem = str(problem)
        if self.replacement_for == REGION and not nodes:
            self._choose(None, "", "")
        self._touch("region", "choice")
        self._mark_selection()

    def clear_region(self) -> None:
        """Forget the region (and what Find similar found)."""
        self.set_region([])

    def _region_plan(self, verb: str) -> Any:
        if not self.region:
            raise WidgetError(f"{verb}: shift-click the nodes of a region first")
        if self.region_plan is None:
            raise WidgetError(f"{verb}: {self.region_problem}")
        return self.region_plan

    def fuse_region(self) -> None:
        """Make the region one call of the program's own nodes (drawn as one box)."""
        plan = self._region_plan("fuse region")
        self._busy(f"fusing {plan.region.name}…")
        self.surgery.fuse_region(list(self.region))
        self._after_change()

    def swap_region(self, module: torch.nn.Module | None = None) -> None:
        """Replace the region by one call of ``module`` (default: the replacement chosen in
        the picker for it), which takes the region's inputs and returns its results (the
        preview shows the call)."""
        plan = self._region_plan("swap region")
        if module is not None:
            replacement = _module_from(module, type(module).__name__)
        elif self.replacement_for != REGION or self.replacement is None:
            raise WidgetError(
                f"swap region: pick the replacement first (the picker); it is called as "
                f"{plan.call_text}"
            )
        else:
            replacement = self.replacement
            if replacement is _COPY:
                raise WidgetError(
                    "swap region: a region has no module to copy: pick a module, or fuse it"
                )
        self._busy(f"swapping {plan.region.name}…")
        self.surgery.swap_region(list(self.region), replacement)
        self._after_change(show="merged")

    def find_similar(self) -> Any:
        """Where else the program computes what the region computes: the matches are marked
        in the picture and listed, the near-misses with what differs. Only places the current
        program still has are listed: a match whose nodes an earlier swap removed is not."""
        self._region_plan("find similar")
        self._busy("looking for the region elsewhere…")
        found = self.surgery.find_similar(list(self.region))
        self.similar = self._still_in_program(found)
        self._touch("region")
        self._mark_selection()
        return self.similar

    def _still_in_program(self, found: Any) -> Any:
        """``found`` (:class:`graphsurgeon.patterns.find.Matches`, looked for in the original program)
        without the places the current program no longer has: a match or near-miss with a
        node an earlier swap removed is left out, and a note says how many were. A fused
        call still computes its nodes: what it holds stays. Each match kept is the Match
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
        info = swap_info(self.surgery.module) if self.can_diff else None
        if info is None:
            return frozenset()
        fused = {n for call in info.fused for n in info.partitions[call].nodes}
        return frozenset(info.diff.removed).difference(fused)

    # -- checks ---------------------------------------------------------------------------

    def _inputs(self, verb: str) -> tuple[tuple, dict]:
        s = self.surgery
        if s.args is None:
            raise WidgetError(
                f"{verb}: the widget has no example inputs: pass them, as in "
                "gs.SurgeryWidget(program, args=(x,))"
            )
        return s.args, dict(s.kwargs)

    def verify(self) -> VerifyReport:
        """Verify the current program against its eager reference on the example inputs
        (faithful), and against the original model (equal to the original)."""
        self._inputs("verify")
        self._busy("verifying against the eager reference…")
        self.report = self.surgery.verify()
        self._touch("checks")
        return self.report

    def compare(self) -> Comparison:
        """Compare each swapped call with the original on the same captured inputs; inside
        the first that diverges, find the first op of the replacement that differs."""
        args, kwargs = self._inputs("compare")
        s = self.surgery
        if not s.replacements:
            raise WidgetError("compare: nothing is swapped; swap a module first")
        self._busy("comparing each swapped call with the original…")
        self.comparison = s.compare(args, kwargs)
        if self.comparison.first_divergence:
            self._busy("finding the first op that differs…")
            self.comparison.locate()  # computed once; the panel reads it
        self._touch("checks")
        return self.comparison

    def find_culprits(self) -> Any:
        """Find the smallest set of the Surgery's swaps that explains its mismatch against
        the original (:meth:`graphsurgeon.Surgery.bisect`): marked in the tree and the
        picture, with the number of program runs it took."""
        self._inputs("find culprits")
        if not self.surgery.replacements:
            raise WidgetError("find culprits: nothing is swapped; swap a module first")
        self._busy("bisecting the swaps…")
        self.bisection = self.surgery.bisect()
        self._touch("checks", "tree")
        self._mark_selection()
        return self.bisection

    # -- stepping -------------------------------------------------------------------------

    def _ensure_stepper(self) -> Stepper:
        module = self.drawn_program()
        if self.stepper is None or self._stepper_module is not module:
            args, kwargs = self._inputs("step")
            self._busy("preparing the stepper…")
            self.stepper = Stepper(self.surgery.module, *args, **kwargs)
            self._stepper_module = module
            self._original_stepper = None
            self.last_step = None
            self._sync_breakpoints()
        return self.stepper

    def _drawn(self) -> Callable[[Any], bool]:
        scene = self.scene

        def drawn(node: Any) -> bool:
            return scene.picture.element_of_node(node.name, scene.prefix) is not None

        return drawn

    def _move(self, move: Callable[[Stepper], StepResult], verb: str) -> StepResult:
        stepper = self._ensure_stepper()
        if stepper.done:
            raise WidgetError(
                f"{verb}: the program has finished; press Restart run to run it again"
            )
        self._busy(f"{verb}…")
        try:
            result = move(stepper)
        except AlreadyRanError as error:  # the stepper's advice is code; here it is a button
            raise WidgetError(f"{verb}: {error.what}; press Restart run {error.again}") from None
        if (
            result.reason in ("step", "target")
            and not stepper.done
            and not stepper.frames
            and not self._drawn()(stepper.current)
        ):
            # what the picture does not draw at all: run on to the next node that it does
            rest = stepper.run_to(self._drawn())
            result = StepResult(
                ran=result.ran + rest.ran,
                position=rest.position,
                reason=rest.reason if rest.reason != "target" else result.reason,
                breakpoints=rest.breakpoints,
                trigger=rest.trigger,
                note=result.note or rest.note,
            )
        self.last_step = result
        self._update_inside()
        self._reveal_current()
        self._touch("stepper")
        if self.selected_node is not None and self.inner_call(self.selected_node):
            self._touch("selection")  # a node inside a call: drawn once the call is entered
        return result

    def step(self) -> StepResult:
        """Run the next node the picture shows (and the glue before it)."""
        return self._move(lambda st: st.step(), "step")

    def step_over(self) -> StepResult:
        """Run the next node, or the whole module call it starts."""
        return self._move(lambda st: st.step_over(), "step over")

    def step_into(self) -> StepResult:
        """Enter the fused or swapped call about to run: a swapped call's replacement is
        drawn beside the program, its node about to run marked."""
        return self._move(lambda st: st.step_into(), "step into")

    def step_out(self) -> StepResult:
        """Run to the end of the current module call."""
        return self._move(lambda st: st.step_out(), "step out")

    def continue_(self) -> StepResult:
        """Run to the next breakpoint or the end."""
        return self._move(lambda st: st.continue_(), "continue")

    def run_to_selection(self) -> StepResult:
        """Run until the selected node or module is next (a breakpoint may stop it first); a
        node inside a swapped call (``"call/node"``) is reached by entering the call."""
        if self.selected_node is not None:
            node = self.selected_node
            return self._move(lambda st: st.run_to(node=node), f"run to {node}")
        name = self._target(None, "run to")
        if not self.calls_of(name) and self._call_node(name) is not None:
            node = self._call_node(name)  # a region made one call: its node
            return self._move(lambda st: st.run_to(node=node), f"run to {name}")
        return self._move(lambda st: st.run_to(module=name), f"run to {name}")

    def reset_stepper(self) -> None:
        """Restart the run from the first node (the Surgery's reset is :meth:`reset`)."""
        stepper = self._ensure_stepper()
        stepper.reset()
        self._original_stepper = None
        self.last_step = None
        self._update_inside()
        self._reveal_current()
        self._touch("stepper")

    def toggle_breakpoint(self) -> None:
        """Stop before the selected node (``"call/node"``: inside a swapped call), or at the
        first op of the selected module; again: remove."""
        if self.selected_node is not None:
            wanted = ("node", self.selected_node)
        else:
            wanted = ("enter", self._target(None, "breakpoint"))
        if wanted in self.breakpoints:
            self.breakpoints.remove(wanted)
        else:
            self.breakpoints.append(wanted)
        if self.stepper is not None:
            try:
                self._sync_breakpoints()
            except GraphSurgeonError:
                self.breakpoints.remove(wanted)
                self._sync_breakpoints()
                raise
        self._touch("stepper")

    def set_break_on_nan(self, on: bool) -> None:
        """Stop after any node whose value holds a NaN or an Inf (inside swapped calls too)."""
        self.break_on_nan = bool(on)
        if self.stepper is not None:
            self._sync_breakpoints()
        self._touch("stepper")

    def _sync_breakpoints(self) -> None:
        breakpoints = self.stepper.breakpoints
        breakpoints.clear()
        for kind, name in self.breakpoints:
            if kind == "node":
                breakpoints.node(name)
            else:
                breakpoints.enter(name)
        if self.break_on_nan:
            breakpoints.nan_or_inf()

    # -- where the stepper is, in the pictures ----------------------------------------------

    def _outer_node(self) -> str | None:
        """The node of the program drawn that the stepper is at: ``current``, or inside a
        call entered with step into, the call's node."""
        stepper = self.stepper
        if stepper is None or stepper.done:
            return None
        if stepper.frames:
            return self._call_node(stepper.frames[0])
        return stepper.current.name

    def _fused_inside(self) -> str | None:
        """Inside a fused call: its node about to run (the program's own node, drawn when
        the call is open), else None."""
        stepper = self.stepper
        if stepper is None or stepper.done or len(stepper.frames) != 1:
            return None
        if stepper.frames[0] not in self.surgery.fused:
            return None
        return stepper.current.name

    def _current_element(self) -> str:
        node = self._outer_node()
        if node is None:
            return ""
        scene = self.scene
        inner = self._fused_inside()
        if inner is not None and scene.shows_node(inner):
            return scene.node_element(inner).id
        element = scene.picture.element_of_node(node, scene.prefix)
        if element is None and self.stepper.frames:
            ids = scene.elements([self.stepper.frames[0]])
            return ids[0] if ids else ""
        return element.id if element is not None else ""

    def _call_node(self, call: str) -> str | None:
        """The node of the current program that runs swapped or fused ``call``, or None."""
        info = swap_info(self.surgery.module)
        if info is not None and call in info.call_nodes:
            return info.call_nodes[call]
        return None

    def _reveal_current(self) -> None:
        """The stepper's node hidden in a box: open its layer whole (one layout as the run
        enters it), or outside a layer the call it is in; close again what was opened for
        calls the stepper has left. The user's own view is kept as it is."""
        node = self._outer_node()
        before = self._reveal.get("stepper", frozenset())
        if node is None:
            wanted: frozenset[str] = frozenset()
        else:
            stack = self.chain_of_node(node)
            layer = _layer_of(stack)
            scope = layer or (stack[-1] if stack else None)
            wanted = frozenset(
                n for n in before if scope is not None and self._inside_call(n, scope)
            )
            fused = self.stepper.frames[0] if self._fused_inside() is not None else None
            if fused is not None:  # a fused call's own nodes: open it
                wanted |= {fused}
        for _ in range(4):  # open until the node shows (an own-ops box may be inside)
            if wanted != self._reveal.get("stepper", frozenset()):
                self._reveal["stepper"] = wanted
                self._render()
            if node is None:
                break
            target = self._fused_inside() or node
            element = self.scene.node_element(target)
            if element is None or element.kind not in ("box", "ops"):
                break
            more = {element.id} if element.kind == "ops" else set()
            if element.kind == "box":
                # the whole layer at once: one layout as the run enters it, none as it goes
                # from the layer's norm into its attention and on into its MLP
                more |= self._calls_within(layer) if layer else set()
                more |= {stack[-1]} if stack else set()
                if len(element.calls) == 1 and not stack:
                    more.add(element.calls[0])
            if more <= wanted:
                break
            wanted = wanted | more
        if not wanted:
            self._reveal.pop("stepper", None)
        self._mark_current()

    def _calls_within(self, call: str) -> set[str]:
        """``call`` and every call inside it, in the program drawn."""
        calls = call_index(self.drawn_program()).calls
        within = set()
        for name, info in calls.items():
            parent = info.parent
            while name != call and parent and parent != call:
                parent = calls[parent].parent if parent in calls else ""
            if name == call or parent == call:
                within.add(name)
        return within

    def _mark_current(self) -> None:
        current = self._current_element()
        if current != self.current:
            self.current = current
            self.scroll_current += 1
            self._touch("current")
        inside = self._inside_current_element()
        if inside != self.inside_current:
            self.inside_current = inside
            self._touch("inside")

    def _inside_current_element(self) -> str:
        stepper = self.stepper
        if self.inside is None or stepper is None or stepper.done or not stepper.frames:
            return ""
        element = self.inside.picture.element_of_node(stepper.current.name)
        return element.id if element is not None else ""

    # -- inside a swapped call --------------------------------------------------------------

    def _update_inside(self) -> None:
        """Inside a swapped call: its replacement's graph, drawn (once per graph), and the
        before/after picture, where the nodes it replaced are; outside, neither."""
        stepper = self.stepper
        frames = stepper.frames if stepper is not None else ()
        if not frames or frames[0] in self.surgery.fused:
            self._leave_inside()
            return
        graph = stepper.call_graph
        if graph is None:
            self._leave_inside()
            return
        scene = self._inside_pictures.get(id(graph))
        if scene is None:
            self._busy(f"drawing the replacement of {frames[0]}…")
            try:
                view = graph_view(graph, collapse=None)
            except GraphSurgeonError:
                self._leave_inside()  # a graph the renderer cannot read: the call stays marked
                return
            svg = view.laid_out("svg").decode()
            scene = Scene(view, display.inline_svg(svg), "", graph)
            self._inside_pictures[id(graph)] = scene
            while len(self._inside_pictures) > 4:
                self._inside_pictures.popitem(last=False)
        if self.inside is not scene:
            self.inside = scene
            self._touch("inside")
        if self.view == "program" and self._view_before_inside is None and self._diff_drawable():
            # the original call's nodes beside the replacement's: before/after, merged
            self._view_before_inside = self.view
            self.view = "merged"
            self._render()

    def _leave_inside(self, render: bool = True) -> None:
        if self.inside is None:
            return
        self.inside = None
        self.inside_current = ""
        self._touch("inside")
        if self._view_before_inside is not None:
            self.view, self._view_before_inside = self._view_before_inside, None
            if render and self.scene is not None:
                self._render()

    def counterpart(self, node: str) -> str | None:
        """The node of the original call that node ``node`` of the swapped call's graph (the
        stepper is inside) stands for: the same op, the same time in order (the k-th
        ``aten.linear`` of the replacement and of the original call), or None."""
        stepper = self.stepper
        if stepper is None or not stepper.frames or stepper.call_graph is None:
            return None
        call = stepper.frames[0]
        if call not in self.partitions:
            return None
        inner = [n for n in stepper.call_graph.graph.nodes if _meta.computes(n)]
        target = next((n for n in inner if n.name == node), None)
        if target is None:
            return None
        op = _meta.op_text(target, "full")
        k = [n for n in inner if _meta.op_text(n, "full") == op].index(target)
        by_name = program_index(self.surgery.program).by_name
        original = [
            by_name[n]
            for n in self.partitions[call].nodes
            if n in by_name and _meta.computes(by_name[n])
        ]
        same = [n for n in original if _meta.op_text(n, "full") == op]
        return same[k].name if k < len(same) else None

    def counterpart_summary(self, node: str) -> Summary | None:
        """The value of the original program's node ``node`` on the example inputs (a second
        stepper runs the original program up to it), or None when it cannot be had."""
        if self.surgery.args is None:
            return None
        try:
            original = self._original_stepper
            if original is None:
                args, kwargs = self._inputs("step")
                original = self._original_stepper = Stepper(self.surgery.program, *args, **kwargs)
            if node not in original.env:
                if original.done or original.position > _position_of(original, node):
                    original.reset()
                original.run_to(node=node)
                original.step()
            return original.summary(node)
        except GraphSurgeonError:
            return None

    def summaries(self) -> list[Summary]:
        """The values the next node reads, then the last value computed (what the stepper
        panel shows; a value the stepper no longer keeps is left out)."""
        stepper = self.stepper
        if stepper is None:
            return []
        names: list[str] = []
        if not stepper.done:
            names += [n.name for n in stepper.current.all_input_nodes]
        if self.last_step is not None and self.last_step.ran:
            names.append(self.last_step.ran[-1])
        summaries = []
        for name in dict.fromkeys(names):
            try:
                summaries.append(stepper.summary(name))
            except GraphSurgeonError:
                continue  # a value not kept (or of another frame): nothing to show
        return summaries[:_SUMMARIES]

    # -- saving ---------------------------------------------------------------------------

    def picture_text(self, format_: str) -> tuple[str, str]:
        """The current picture as ``(file name, text)``: ``"svg"`` or ``"dot"``."""
        scene = self.scene
        stem = f"{scene.picture.name}-{self.view}"
        if format_ == "svg":
            return f"{stem}.svg", scene.svg
        if format_ == "dot":
            return f"{stem}.dot", scene.view.dot
        raise WidgetError(f"save: expected 'svg' or 'dot', got {format_!r}")


class _CopyMarker:
    def __repr__(self) -> str:
        return "<a copy of the original>"


_COPY = _CopyMarker()


def _layer_of(stack: tuple[str, ...]) -> str | None:
    """The layer a stack of calls is in: its outermost call that is an item of a list of
    modules (``model.layers.5``, ``transformer.h.0``), or None."""
    for call in stack:
        if split_call_name(call)[0].rpartition(".")[2].isdigit():
            return call
    return None


def _initials(word: str) -> str:
    """``scaled_dot_product_attention`` -> ``sdpa``, ``BatchNorm2d`` -> ``bn``: what a search
    for an abbreviation matches."""
    if "_" in word:
        return "".join(part[0] for part in word.lower().split("_") if part)
    parts = re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z]+", word)
    return "".join(part[0] for part in parts).lower() if len(parts) > 1 else ""


def _single_node_calls(program: Any, partitions: Mapping[str, Partition]) -> set[str]:
    """The calls the picture draws as their one node: they are never collapsed into a box."""
    by_name = program_index(program).by_name
    single = set()
    for call, part in partitions.items():
        ops = sum(1 for n in part.nodes if n in by_name and _meta.computes(by_name[n]))
        if ops <= 1:
            single.add(call)
    return single


# Where the building blocks of models come from: their classes are not replacements to offer
# (an nn.Linear, a LlamaForCausalLM built from "the original" would be nonsense).
_LIBRARIES = ("torch", "transformers", "torchvision", "timm", "graphsurgeon")


def _library_class(cls: type) -> bool:
    """Whether ``cls`` is a library's own building block rather than a user's replacement
    (graphsurgeon's examples are replacements)."""
    module = cls.__module__ or ""
    if module.startswith("graphsurgeon.examples"):
        return False
    return module.split(".")[0] in _LIBRARIES


def _position_of(stepper: Stepper, node: str) -> int:
    """Where node ``node`` is in the order the stepper runs its graph."""
    for i, candidate in enumerate(stepper.graph_module.graph.nodes):
        if candidate.name == node:
            return i
    return -1


def _required_arguments(factory: Any) -> int | None:
    """How many positional arguments ``factory`` needs (None: it needs keyword-only ones)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no readable signature: built bare
        return 0
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [
        p
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if any(p.kind == inspect.Parameter.KEYWORD_ONLY for p in required):
        return None
    return sum(1 for p in required if p.kind in positional)


def _module_from(
    value: Any, label: str, original: Callable[[], torch.nn.Module] | None = None
) -> torch.nn.Module:
    """The replacement ``value`` stands for: a module as it is; a class built with no
    arguments or, when it takes one, from the original module (``original()``)."""
    if isinstance(value, type) and issubclass(value, torch.nn.Module):
        needed = _required_arguments(value)
        if needed == 1 and original is not None:
            built = f"{label}(original)"
            try:
                return value(original())
            except Exception as error:
                raise WidgetError(
                    f"{built} failed ({type(error).__name__}: {error}); type the call in the "
                    f"expression box, such as {value.__name__}(...)"
                ) from error
        try:
            return value()
        except TypeError as error:
            raise WidgetError(
                f"{label}() needs arguments ({error}); type the call in the expression box, "
                f"such as {value.__name__}(...)"
            ) from error
    if isinstance(value, torch.nn.Module):
        return value
    raise WidgetError(
        f"{label} is {type(value).__name__}, not an nn.Module: a replacement is a module "
        "(an instance, or a class built with no arguments or from the original module)"
    )
