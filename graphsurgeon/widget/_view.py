"""The picture a SurgeryWidget shows: which program, which calls are open, laid out, painted.

:class:`View` owns the view's state: the picture shown (``program``, or before/after
``merged`` or ``split``), the calls the user opened (None: as much as fits), what the stepper
and the search open on top of that for as long as they need it, the pictures laid out before
(kept, so undo and switching views back cost no layout), a large layout waiting for a
confirmation, and the overlay painted. Every question about a laid-out picture is one of the
Picture's lookups (:class:`Scene`). It lays pictures out with
:meth:`graphsurgeon.types.GraphView.laid_out` and reads calls from the program's one call index.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _meta, display
from ..drawing import draw
from ..errors import UnknownModuleError, WidgetError
from ..partition import Partition, call_index, program_index
from ..render import GraphView, graph_view
from ..render.picture import Picture, PictureNode
from ..rewrite import swap_info
from ._tiles import tiled

__all__ = ["DEPTHS", "FOLD_RUNS", "OVERLAYS", "VIEWS", "PendingLayout", "Scene", "View"]

#: The pictures the graph panel can show: the current program, or before/after.
VIEWS = ("program", "merged", "split")
#: The depths the picture can be opened to (:meth:`View.expand_to_depth`).
DEPTHS = ("auto", "1", "2", "3", "4", "5", "all")
#: The overlays the picture can be painted with (``""``: none); see
#: :func:`graphsurgeon.checks.overlay.overlay_values`.
OVERLAYS = ("", "error", "own error", "grad error", "own grad error", "latency")
# Pictures kept laid out, so that undo/redo and switching views back cost no new layout.
_KEPT_PICTURES = 12
# Overlays kept computed (each ran the program).
_KEPT_OVERLAYS = 4
_OPS = "ops:"
#: The user's view draws the closed layers of a stack of at least this many (the stack the
#: renderer lays out in parts) a run to a box, split around the layers opened: opening one
#: layer of 384 draws three boxes, not 384 (:attr:`~graphsurgeon.render.DrawOptions.fold_runs`).
#: The calls the default view drew a box each stay so when the user leaves it (``_own_boxes``).
FOLD_RUNS = 8


@dataclass(frozen=True)
class PendingLayout:
    """A layout the user asked for that waits for a confirmation: ``what`` it shows, how many
    nodes it draws, the calls it opens, and the calls it draws a box each however long their
    run (:meth:`View.show_open`'s ``unfolded``)."""

    what: str
    drawn: int
    open: frozenset[str] = field(repr=False)
    unfolded: frozenset[str] = field(default=frozenset(), repr=False)


#: zlib's level for what the page gets packed (:func:`packed`): level 6 makes a picture 15% smaller
#: than level 1 in twice the time (5.1 against 2.3 ms at 384 layers)
PACKING_LEVEL = 1


def packed(text: str) -> tuple[str, bytes]:
    """``text`` as the page receives a large one: ``(key, deflated UTF-8)``. Deflated, a
    picture is about a tenth of its text (505 KB to 52 KB at 384 layers), and every hop to the
    page (JSON, Jupyter Server, the websocket) costs by the byte; the key, a digest of the
    text, lets the page tell a text it holds already without inflating it.

    Example:
        >>> import zlib
        >>> key, data = packed("<svg/>")
        >>> len(key), zlib.decompress(data).decode()
        (24, '<svg/>')
    """
    encoded = text.encode()
    return hashlib.blake2b(encoded, digest_size=12).hexdigest(), zlib.compress(
        encoded, PACKING_LEVEL
    )


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
        self._edges: tuple[dict, dict] | None = None  # see _adjacency
        self._packed: tuple[str, bytes] | None = None  # see packed

    @property
    def packed(self) -> tuple[str, bytes]:
        """The SVG as the page receives it: :func:`packed` of its text, a tall one in tiles
        the page draws as they come into view (:func:`._tiles.tiled`), made once per scene
        (13 ms at 384 layers, 10 of them tiling)."""
        if self._packed is None:
            self._packed = packed(tiled(self.svg))
        return self._packed

    @classmethod
    def laid_out(cls, view: GraphView, prefix: str, module: Any) -> Scene:
        """``view`` laid out by graphviz."""
        svg = view.laid_out("svg").decode()
        return cls(view, display.inline_svg(svg), prefix, module)

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
        incoming, outgoing = self._adjacency()
        nodes: set[str] = set()
        for element_id in selected:
            nodes.update(picture.inside(element_id) or (element_id,))
        producers, consumers, edges = set(), set(), set()
        for node in nodes:
            for edge, tail in incoming.get(node, ()):
                if tail not in nodes:
                    producers.add(tail)
                    edges.add(edge)
            for edge, head in outgoing.get(node, ()):
                if head not in nodes:
                    consumers.add(head)
                    edges.add(edge)
        return {
            "producers": sorted(producers),
            "consumers": sorted(consumers),
            "edges": sorted(edges),
        }

    def _adjacency(self) -> tuple[dict[str, list], dict[str, list]]:
        """(node -> [(edge, tail)] of the edges into it, node -> [(edge, head)] of those out
        of it), read once from the picture's edges: the flow of every element of a large
        picture (:meth:`Selection.click_marks`) then costs what its edges cost."""
        if self._edges is None:
            incoming: dict[str, list] = {}
            outgoing: dict[str, list] = {}
            for edge in self.picture.edges:
                outgoing.setdefault(edge.tail, []).append((edge.id, edge.head))
                incoming.setdefault(edge.head, []).append((edge.id, edge.tail))
            self._edges = (incoming, outgoing)
        return self._edges


class View:
    """The picture of a :class:`~graphsurgeon.widget.SurgerySession` and what is open in it.

    State: :attr:`view`, :attr:`scene` (the picture shown, laid out), :attr:`overlay`,
    :attr:`pending` (a large layout waiting for a confirmation), the calls the user opened
    (:attr:`opened_by_user`) and what is opened on top of them (:attr:`revealed`).
    """

    def __init__(self, session: Any):
        self.session = session
        self.view = "program"
        self.scene: Scene | None = None
        self.pending: PendingLayout | None = None
        self.overlay = ""
        self._open: set[str] | None = None  # None: the renderer chooses ("auto")
        # what the stepper and the search open on top of the user's view, by who asked
        self._reveal: dict[str, frozenset[str]] = {}
        # the calls of the runs the user opened into one box per call: never folded again
        self._unfolded: set[str] = set()
        self._pictures: OrderedDict[tuple, Scene] = OrderedDict()
        self._ops_keys: set[str] = set()  # the own-ops boxes seen (``ops:model``)
        self._overlays: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
        self._budget: int | None = None  # the node budget of the default view, once chosen
        self._before_inside: str | None = None  # the view to go back to out of a call
        surgery = session.surgery
        self._single = _single_node_calls(surgery.program, session.partitions)

    # -- the program drawn ----------------------------------------------------------------

    def drawn_program(self) -> Any:
        """The program the picture draws: the Surgery's current module once something is
        swapped or fused, else its ExportedProgram."""
        s = self.session.surgery
        return s.module if (s.replacements or s.fused) else s.program

    def in_drawn_program(self, node: str) -> bool:
        """Whether fx node ``node`` is one of the program drawn's (not one a swap removed),
        read off its call index, which every picture of it reads too."""
        return node in call_index(self.drawn_program()).chains

    @property
    def can_diff(self) -> bool:
        """Whether a before/after picture can be shown: something is swapped (a fused call
        computes the program's own nodes)."""
        return bool(self.session.surgery.replacements)

    def diff_drawable(self) -> bool:
        """Whether the before/after pictures can be drawn: the renderer cannot yet draw a
        swapped region in them (it can in the program's own picture)."""
        surgery = self.session.surgery
        return not any(name in surgery.regions for name in surgery.replacements)

    def calls_of(self, name: str) -> list[str]:
        """The calls a module or call name stands for, read as every entry point reads it
        (``"blk@0"`` is ``"blk"``); [] for a name the program does not have, or a container."""
        index = program_index(self.session.surgery.program)
        known = isinstance(name, str) and index.knows(name)
        return list(index.resolve(name).calls) if known else []

    def call_nodes(self) -> Mapping[str, str]:
        """Each swapped or fused call of the current program (regions included) -> the node
        that calls it; empty while nothing is swapped or fused."""
        s = self.session.surgery
        info = swap_info(s.module) if (s.replacements or s.fused) else None
        return info.call_nodes if info is not None else {}

    def call_node(self, call: str) -> str | None:
        """The node of the current program that runs swapped or fused ``call``, or None."""
        return self.call_nodes().get(call)

    def inner_call(self, name: str) -> str | None:
        """The swapped or fused call of ``"call/node"`` (a node inside it, as the stepper
        names it), or None."""
        call, slash, node = name.partition("/")
        return call if slash and node and call in self.call_nodes() else None

    def chain_of_node(self, node: str) -> tuple[str, ...]:
        """The calls around fx node ``node``, outermost first: in the program drawn, else (a
        node a swap removed) in the original program."""
        return self.chains_of_nodes()(node)

    def chains_of_nodes(self) -> Callable[[str], tuple[str, ...]]:
        """:meth:`chain_of_node` for many nodes: the call indexes read once."""
        drawn = call_index(self.drawn_program()).chains
        original = call_index(self.session.surgery.program).chains
        return lambda node: drawn[node] if node in drawn else original.get(node, ())

    def ancestors(self, call: str) -> list[str]:
        """The calls around ``call``, outermost first (from the program's one call index)."""
        part = self.session.partitions.get(call)
        if part is None or not part.nodes:
            return []
        chain = call_index(self.session.surgery.program).chains.get(part.nodes[0], ())
        return list(chain[: chain.index(call)]) if call in chain else list(chain)

    @staticmethod
    def inside_call(name: str, call: str) -> bool:
        """Whether ``name`` (a call, or an own-ops id) is ``call`` or inside it (by module
        path, :func:`graphsurgeon._meta.inside`: another call of the same module is not)."""
        owner = name.removeprefix(_OPS)
        return owner == call or _meta.inside(owner, call, strictly=True)

    def calls_within(self, call: str) -> set[str]:
        """``call`` and every call inside it, in the program drawn."""
        calls = call_index(self.drawn_program()).calls
        return {name for name in calls if self.inside_call(name, call)}

    # -- what is open ---------------------------------------------------------------------

    @property
    def opened_by_user(self) -> frozenset[str] | None:
        """The calls the user opened, or None for the default view (as much as fits)."""
        return None if self._open is None else frozenset(self._open)

    @property
    def revealed(self) -> frozenset[str]:
        """What is opened on top of the user's view: the call the stepper is in (at most its
        layer), the modules around the current search match, and those around what the last
        check found (Compare's first divergence, the first culprit)."""
        return frozenset().union(*self._reveal.values()) if self._reveal else frozenset()

    def revealed_by(self, source: str) -> frozenset[str]:
        """What ``source`` (``"stepper"``, ``"search"``, ``"check"``) opens on top of the
        user's view."""
        return self._reveal.get(source, frozenset())

    def reveal(self, source: str, names: Iterable[str], render: bool = True) -> None:
        """Make ``names`` what ``source`` opens on top of the user's view (none: nothing);
        the picture is drawn again when that changes it (and ``render``)."""
        names = frozenset(names)
        if names == self.revealed_by(source):
            return
        if names:
            self._reveal[source] = names
        else:
            self._reveal.pop(source, None)
        if render:
            self.render()

    def opened(self) -> set[str]:
        """The calls open in the user's view (in the default view: those the renderer chose,
        without what the stepper or the search opened on top of it)."""
        if self._open is None:
            if not self.revealed:
                return set(self.scene.view.clusters)
            key = (self.view, id(self.drawn_program()), None, (), self.overlay)
            base = self._pictures.get(key)
            clusters = base.view.clusters if base is not None else self.scene.view.clusters
            return set(clusters)
        return set(self._open)

    def _shown(self, view: str) -> tuple[str, ...]:
        """The names the picture opens (unmarked: show=) on top of the view: those of
        :attr:`revealed` that the picture of ``view`` has."""
        drawn = call_index(self.drawn_program()).calls
        original = call_index(self.session.surgery.program).calls
        return tuple(
            sorted(
                name
                for name in self.revealed
                if name.startswith(_OPS)
                or name in drawn
                or (view != "program" and name in original)
            )
        )

    def _collapse(self, shown: Iterable[str] = ()) -> Any:
        """The collapse set of the user's view: every call not opened by the user or shown on
        top of it (calls drawn as their one node are never boxes), and the own-ops boxes
        (``ops:<call>``) not opened either."""
        partitions = self.session.partitions
        opened = set(self._open)
        for name in shown:
            owner = name.removeprefix(_OPS)
            if owner in partitions:
                opened.update(self.ancestors(owner))
                opened.add(owner)
            opened.add(name)
        calls = {c for c in partitions if c not in opened and c not in self._single}
        return calls | {key for key in self._ops_keys if key not in opened}

    # -- drawing ----------------------------------------------------------------------------

    def render(self, limit: int | None = None) -> None:
        """Show the picture of the current state (a cached one when it was laid out before).
        ``limit``: raise :class:`_TooLarge` instead of laying out more nodes than that. The
        selection and the stepper's node are marked again in the new picture."""
        session = self.session
        surgery = session.surgery
        view = self.view if self.can_diff else "program"
        module = self.drawn_program()
        shown = self._shown(view)
        overlay = self.overlay_values()
        key = (view, id(module), self.opened_by_user, shown, self.overlay)
        if self._open is not None:
            key += (frozenset(self._unfolded),)
        scene = self._pictures.get(key)
        if scene is None:
            options = dict(diff=None if view == "program" else view, show=shown, overlay=overlay)
            prefix = "after/" if view == "split" else ""
            if self._open is None and self._budget is None:
                # as much detail as fits the width, as gs.draw chooses; the budget is chosen
                # once (draw tries several layouts to choose it), the next pictures of this
                # program are drawn with it, in one layout each
                session.busy("laying out the picture…")
                drawing = draw(surgery, **options)
                self._budget = drawing.max_nodes
                scene = Scene(drawing.view, display.inline_svg(drawing.svg), prefix, module)
            else:
                if self._open is None:
                    graph = graph_view(surgery, max_nodes=self._budget, **options)
                else:
                    graph = graph_view(
                        surgery,
                        collapse=self._collapse(shown),
                        fold_runs=FOLD_RUNS,
                        unfolded=sorted(self._unfolded),
                        **options,
                    )
                if limit is not None and graph.drawn_nodes > limit:
                    raise _TooLarge(graph.drawn_nodes)
                session.busy(f"laying out the picture ({graph.drawn_nodes:,} nodes)…")
                scene = Scene.laid_out(graph, prefix, module)
            self._pictures[key] = scene
            while len(self._pictures) > _KEPT_PICTURES:
                self._pictures.popitem(last=False)
        self._pictures.move_to_end(key)
        self._ops_keys.update(scene.view.folded_ops)  # what the user's view keeps folded
        self.scene = scene
        self.view = view
        session.touch("picture")
        session.selection.mark()
        session.stepping.mark_current()

    def show_open(
        self,
        opened: set[str] | None,
        what: str,
        force: bool = False,
        unfolded: Iterable[str] | None = None,
    ) -> None:
        """Show the user's view with ``opened`` open (None: auto). ``unfolded``: the calls
        drawn a box each from now on however long their run (None: those drawn so before). A
        layout of more than ``LARGE_LAYOUT`` nodes waits for :meth:`confirm_layout` unless
        ``force``."""
        before, unfolded_before = self._open, self._unfolded
        self._open = opened
        if unfolded is not None:
            self._unfolded = set(unfolded)
        if before is None and opened is not None and self.scene is not None:
            # leaving the default view: what it drew a box each stays so (a stack it showed
            # layer by layer is not folded away by opening one of them); only the runs it
            # folded fold around what is opened
            self._unfolded = self._unfolded | self._own_boxes()
        try:
            large = None if force or opened is None else self.session.large_layout
            self.render(limit=large)
        except _TooLarge as too_large:
            asked = frozenset(self._unfolded)
            self._open, self._unfolded = before, unfolded_before
            self.pending = PendingLayout(what, too_large.drawn, frozenset(opened or ()), asked)
            self.session.touch("warning")
            return
        if self.pending is not None:
            self.pending = None
            self.session.touch("warning")

    def _own_boxes(self) -> set[str]:
        """The calls the picture shown draws as a box of their own (a run box holds several)."""
        return {
            element.calls[0]
            for element in self.scene.picture.nodes
            if getattr(element, "kind", None) == "box" and len(element.calls) == 1
        }

    def confirm_layout(self) -> None:
        """Lay out the large picture that waits for a confirmation (see :attr:`pending`)."""
        pending = self.pending
        if pending is None:
            raise WidgetError("no layout waits for a confirmation")
        self.session.busy(f"laying out {pending.drawn:,} nodes…")
        self.show_open(set(pending.open), pending.what, True, pending.unfolded)

    def cancel_layout(self) -> None:
        """Keep the picture as it is: the large layout waiting for a confirmation is dropped."""
        self.pending = None
        self.session.touch("warning")

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
        self._before_inside = None  # the user chose: stepping out leaves it so
        self.render()

    def show_beside_call(self) -> None:
        """The stepper entered a swapped call: the original call's nodes are shown beside the
        replacement's (before/after, merged), until :meth:`back_from_call`."""
        if self.view == "program" and self._before_inside is None and self.diff_drawable():
            self._before_inside = self.view
            self.view = "merged"
            self.render()

    def back_from_call(self, render: bool = True) -> None:
        """The stepper left the swapped call: the view it was shown in before, again."""
        if self._before_inside is not None:
            self.view, self._before_inside = self._before_inside, None
            if render and self.scene is not None:
                self.render()

    def after_change(self, show: str | None = None) -> None:
        """The Surgery changed: before/after is ``show``n if the program was shown (and can
        be); the program when nothing is swapped; a large layout waiting is dropped."""
        if show is not None and self.view == "program" and self.diff_drawable():
            self.view = show
        if not self.can_diff:
            self.view = "program"
        self.pending = None
        self._reveal.pop("check", None)  # what a check found belongs to the program it ran on

    def picture_text(self, format_: str) -> tuple[str, str]:
        """The current picture as ``(file name, text)``: ``"svg"`` or ``"dot"``."""
        scene = self.scene
        stem = f"{scene.picture.name}-{self.view}"
        if format_ == "svg":
            return f"{stem}.svg", scene.svg
        if format_ == "dot":
            return f"{stem}.dot", scene.view.dot
        raise WidgetError(f"save: expected 'svg' or 'dot', got {format_!r}")

    # -- overlays -------------------------------------------------------------------------

    def set_overlay(self, kind: str | None) -> None:
        """Paint the picture and the module tree with ``"error"``, ``"own error"``,
        ``"grad error"``, ``"own grad error"`` or ``"latency"`` (see :func:`graphsurgeon.checks.overlay.overlay_values`); ``""`` or
        None: no overlay. The values are computed again after every edit; the overlay stays on
        across views."""
        kind = kind or ""
        if kind not in OVERLAYS:
            raise WidgetError(
                f"overlay: expected one of {', '.join(repr(k) for k in OVERLAYS)}, got {kind!r}"
            )
        if kind:
            self.session.inputs()
        before = self.overlay
        self.overlay = kind
        try:
            self.render()
        except Exception:
            self.overlay = before
            raise
        self.session.touch("tree")

    def overlay_values(self) -> Any:
        """The :class:`graphsurgeon.checks.overlay.OverlayValues` painted now, or None."""
        if not self.overlay:
            return None
        module = self.drawn_program()
        key = (self.overlay, id(module))
        kept = self._overlays.get(key)
        if kept is None:
            from ..checks.overlay import overlay_values  # runs the program: only when asked

            session = self.session
            session.busy(f"computing the {self.overlay} overlay…")
            args, kwargs = session.inputs()
            values = overlay_values(session.surgery, args, kwargs, kind=self.overlay)
            kept = (module, values)  # the module keeps its id from being reused
            self._overlays[key] = kept
            while len(self._overlays) > _KEPT_OVERLAYS:
                self._overlays.popitem(last=False)
        return kept[1]

    # -- opening and collapsing -----------------------------------------------------------

    def calls_covered(self, name: str) -> list[str]:
        """The calls module, call or container ``name`` stands for, read as a highlight and
        running to it read it (:meth:`~graphsurgeon.partition.ProgramIndex.calls_covered`:
        a container such as nn.ModuleList covers the outermost calls of its submodules).
        An unknown name raises; a name that covers no call raises, saying why."""
        index = program_index(self.session.surgery.program)
        calls = index.calls_covered(name)  # unknown: raises
        if not calls:
            fqn = index.resolve(name).fqn
            raise UnknownModuleError(
                f"module {fqn!r} covers no call to open or collapse: {index.why_no_calls(fqn)}"
            )
        return list(calls)

    def expand(self, name: str | None = None, force: bool = False) -> None:
        """Open module (or call) ``name`` (default: the selection), and the modules around
        it, in the picture; a container (``"layers"``) opens each call it covers."""
        target = self.session.selection.target(name, "expand")
        opened = self.opened()
        for call in self.calls_covered(target):
            opened.update(self.ancestors(call))
            opened.add(call)
        self.show_open(opened, f"open {target}", force)

    def collapse(self, name: str | None = None) -> None:
        """Draw module (or call) ``name`` (default: the selection) as one box again; a
        container (``"layers"``) each call it covers."""
        calls = self.calls_covered(self.session.selection.target(name, "collapse"))
        opened = self.opened()
        for call in calls:  # the call and everything inside it
            opened = {c for c in opened if not self.inside_call(c, call)}
            for source, names in list(self._reveal.items()):  # the user's choice wins
                kept = frozenset(n for n in names if not self.inside_call(n, call))
                self._reveal[source] = kept
        self._open = opened
        self.pending = None
        self.session.touch("warning")
        self.render()

    def expand_all(self, force: bool = False) -> None:
        """Open every module. A picture of more than ``LARGE_LAYOUT`` nodes waits for
        :meth:`confirm_layout` (``force``: lay it out at once)."""
        self.show_open(set(self.session.partitions), "open every module", force)

    def expand_to_depth(self, depth: int | str, force: bool = False) -> None:
        """Open every module down to ``depth`` levels (1: the top-level modules are boxes,
        as ``collapse=1`` draws them); ``"all"``: every module; ``"auto"``: the default
        view. A picture of more than ``LARGE_LAYOUT`` nodes waits for :meth:`confirm_layout`
        (``force``: lay it out at once)."""
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
        opened = {c for c in self.session.partitions if len(self.ancestors(c)) + 1 < level}
        # a depth asked for draws every call at it a box (the layers too, however many)
        every = set(self.session.partitions)
        self.show_open(opened, f"open {level} level{'s' if level != 1 else ''}", force, every)

    def auto(self) -> None:
        """Back to the view the renderer chooses: as much detail as fits (the runs the user
        opened into boxes are folded again in the next view the user opens)."""
        self.show_open(None, "the default view", unfolded=())

    def toggle(self, element_or_name: str) -> None:
        """Open a collapsed box (a run of boxes becomes one box per call), or collapse an open
        cluster: what a double-click in the picture does. Takes an element id or a name."""
        picture = self.scene.picture
        if element_or_name not in picture:
            calls = self.calls_covered(element_or_name)
            if any(c in self.opened() for c in calls):
                self.collapse(element_or_name)
            else:
                self.expand(element_or_name)
            return
        element = picture[element_or_name]
        kind = getattr(element, "kind", None)
        if kind == "box":
            opened, unfolded = self.opened(), None
            # a run of boxes opens into one box per call (nothing opened), kept so in the next
            # views (the user's view folds runs: FOLD_RUNS); a box, its call
            if len(element.calls) <= 1:
                for call in element.calls:
                    opened.update(self.ancestors(call))
                    opened.add(call)
            else:
                unfolded = self._unfolded | set(element.calls)
                if self._open is None:
                    opened |= {a for call in element.calls for a in self.ancestors(call)}
            self.show_open(opened, f"open {element.label.splitlines()[0]}", unfolded=unfolded)
            return
        if kind == "ops":  # the ops a module runs in its own forward: open them
            self.show_open(self.opened() | {element_or_name}, f"open {element_or_name}")
            return
        call = getattr(element, "call", None)
        if call is None:
            calls = getattr(element, "calls", ())
            call = calls[0] if calls else None
        if call is None:
            node = getattr(element, "node", None)
            chain = self.chain_of_node(node) if node else ()
            call = chain[-1] if chain else None
        if call is None:
            raise WidgetError(f"{element_or_name!r} is not in a module: nothing to collapse")
        self.collapse(call)


def _single_node_calls(program: Any, partitions: Mapping[str, Partition]) -> set[str]:
    """The calls the picture draws as their one node: they are never collapsed into a box."""
    by_name = program_index(program).by_name
    single = set()
    for call, part in partitions.items():
        ops = sum(1 for n in part.nodes if n in by_name and _meta.computes(by_name[n]))
        if ops <= 1:
            single.add(call)
    return single
