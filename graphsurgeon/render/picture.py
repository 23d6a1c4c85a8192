r"""Picture: what a drawing of a program shows, as data, and its lowering to graphviz DOT.

:func:`graphsurgeon.to_dot` works in two steps, so that nothing about a picture has to be read
back out of its text: the renderer decides what is drawn, where, what each element stands for
and how it is marked, and builds a frozen :class:`Picture` of semantic records (kind, classes,
label, tooltip, style tokens such as ``"highlighted"`` or the module whose colour fills it);
:meth:`Picture.to_dot` lowers it to DOT, and it alone knows DOT: the colours, shapes, line
styles, the default attributes, quoting and the escaping of tooltips. Another output (another
layout engine, an overlay) reads the same records.

The same Picture is the map from an id in the SVG (``node:linear``, ``cluster:layers.0``,
``module:layers.1``, ``edge:x->linear``) to what it stands for (the fx node, the module call),
so a click in the page is resolved from data, never by parsing ids: ``picture[id]``,
:meth:`~Picture.element_of_node`, :meth:`~Picture.elements_of_call`, :meth:`~Picture.inside`,
:meth:`~Picture.edges_in` and :meth:`~Picture.edges_out`. Names in ids and labels are written
as :func:`graphsurgeon.display.id_text` and :func:`graphsurgeon.display.shown` write them.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.render import graph_view
    >>> model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    >>> picture = graph_view(gs.export(model, (torch.randn(1, 2),))).picture
    >>> picture["cluster:0"].call, picture["node:linear"].node, picture["node:linear"].cluster
    ('0', 'linear', 'cluster:0')
    >>> picture.elements_of_call("0"), picture.inside("cluster:0")
    (('cluster:0',), ('node:linear', 'node:relu'))
    >>> [edge.tail for edge in picture.edges_in("node:relu")]
    ['node:linear']
    >>> picture.to_dot() == graph_view(gs.export(model, (torch.randn(1, 2),))).dot
    True
"""

from __future__ import annotations

import colorsys
import functools
import hashlib
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ..display import id_text, label_text
from ..errors import RenderError, did_you_mean

__all__ = [
    "ADDED",
    "FUSED",
    "HIGHLIGHTED",
    "ClusterRow",
    "EXIT",
    "EdgeRow",
    "HIDDEN",
    "Heat",
    "NodeRow",
    "REMOVED",
    "SIDE",
    "SWAPPED_BOUNDARY",
    "Picture",
    "PictureCluster",
    "PictureEdge",
    "PictureNode",
    "quote",
]

# -- style tokens: how an element is marked, decided by the renderer, drawn by to_dot ---------

#: The element is one the user asked to see (``highlight=``).
HIGHLIGHTED = "highlighted"
#: In a before/after picture: what the swap removed (greyed, dashed) or added (green).
REMOVED, ADDED = "removed", "added"
#: A fused call (its cluster, or its box).
FUSED = "fused"
#: The cluster of a swapped module call in a before/after picture.
SWAPPED_BOUNDARY = "swapped-boundary"
#: One side (before or after) of a side-by-side diff.
SIDE = "side"

# -- the parts of a large picture laid out one at a time (graphsurgeon.render._stack) --------
#
# A part is a Picture too, written by the same to_dot: its own elements, plus a ``"port"`` node
# (an invisible point) where an edge enters it, or leaves it (style :data:`EXIT`: on its last
# rank, the edge without an arrowhead), and a ``"placeholder"`` node (an invisible box of the
# size :class:`Placed` gives it) standing for a part laid out on its own: edges into it end at
# its top, edges out of it start at its bottom.

#: A port where an edge leaves a part.
EXIT = "exit"
#: An edge that is not drawn: it only holds its ends in order (``style=invis``).
HIDDEN = "hidden"


@dataclass(frozen=True, slots=True)
class PictureNode:
    """A drawn node: one fx node, or one or more module calls collapsed into a box.

    Attributes:
        id: the element id, also in the SVG (``node:linear``, ``module:layers.1``,
            ``modules:layers.0..layers.3``; prefixed ``before/`` or ``after/`` in a split diff).
        kind: ``"op"``, ``"input"``, ``"output"``, ``"buffer"``, ``"constant"``, ``"parameter"``,
            ``"swapped"`` (a replacement's call), ``"glue"``, ``"check"``; ``"box"`` for a
            collapsed module call; ``"ops"`` for the ops a module call runs in its own forward
            from the program's inputs alone (mask and position building), folded into one
            box (``ops:<call>``, ``ops:`` for the top level). The kind says its shape.
        node: the fx node it draws (None for a box).
        calls: the module calls it stands for: a box's calls, the module a single-node call is
            drawn as, or the call whose own ops an ``"ops"`` box folds; else empty.
        classes: the classes it carries in the SVG (``op module highlighted``).
        label: its text, lines separated by newlines.
        tooltip: its tooltip text.
        cluster: the id of the cluster it is drawn in, or None at the top.
        members: for a box, the fx nodes collapsed into it (in graph order); else empty.
        color: the module type whose colour fills it (the name of its type, so that identical
            layers look alike: a box's first call's, the module a single-node call is drawn
            as), or None for the colour of its kind.
        style: its style tokens (:data:`HIGHLIGHTED`, :data:`REMOVED`, :data:`ADDED`,
            :data:`FUSED`).
    """

    id: str
    kind: str
    node: str | None
    calls: tuple[str, ...]
    classes: tuple[str, ...]
    label: str
    tooltip: str
    cluster: str | None
    members: tuple[str, ...] = field(repr=False)
    color: str | None = field(default=None, repr=False)
    style: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True, slots=True)
class PictureCluster:
    """An open module call (``cluster:<call>``), or one side of a split diff (``diff:before``).

    Attributes:
        id: the element id, also in the SVG.
        call: the module call it draws, or None for a side of a split diff.
        classes: its classes (``module``, ``highlighted``, ``swapped-boundary``, ``fused``).
        label: its title.
        tooltip: its tooltip text.
        cluster: the id of the cluster it is drawn in, or None at the top.
        members: the ids of what is drawn directly inside it, in drawing order.
        color: the module type whose colour fills it (the name of its type), or None (a side
            of a split diff).
        style: its style tokens (:data:`HIGHLIGHTED`, :data:`SWAPPED_BOUNDARY`,
            :data:`FUSED`; :data:`SIDE` for a side of a split diff).
    """

    id: str
    call: str | None
    classes: tuple[str, ...]
    label: str
    tooltip: str
    cluster: str | None
    members: tuple[str, ...]
    color: str | None = field(default=None, repr=False)
    style: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True, slots=True)
class PictureEdge:
    """A drawn edge: a value going from one drawn node (or box) to another.

    Attributes:
        id: ``edge:<tail>-><head>`` (``:2``, ``:3``... for a repeated pair).
        tail: the id of the node it comes from.
        head: the id of the node it goes to.
        path: the index taken from the tail's value (``[0]``), or ``""``.
        mark: its style token in a diff: :data:`REMOVED` or :data:`ADDED`, else ``""``
            (:data:`HIDDEN` in a part of a picture laid out one part at a time).
        cluster: the side of a split diff it is written in (``diff:before``), else None.
    """

    id: str
    tail: str
    head: str
    path: str
    mark: str
    cluster: str | None = None


Element = PictureNode | PictureCluster | PictureEdge


# -- the rows a Picture keeps: each record's fields, by name -----------------------------------
#
# A picture of a large program holds thousands of elements, most never looked up: each is kept
# as a named tuple of its record's fields (as cheap to make as a plain tuple) and becomes its
# record when asked for. The fields are the records', in the same order (a test checks).


class NodeRow(NamedTuple):
    """The fields of a :class:`PictureNode`, as a :class:`Picture` keeps them."""

    id: str
    kind: str
    node: str | None
    calls: tuple[str, ...]
    classes: tuple[str, ...]
    label: str
    tooltip: str
    cluster: str | None
    members: tuple[str, ...]
    color: str | None = None
    style: tuple[str, ...] = ()


class ClusterRow(NamedTuple):
    """The fields of a :class:`PictureCluster`, as a :class:`Picture` keeps them."""

    id: str
    call: str | None
    classes: tuple[str, ...]
    label: str
    tooltip: str
    cluster: str | None
    members: tuple[str, ...]
    color: str | None = None
    style: tuple[str, ...] = ()


class EdgeRow(NamedTuple):
    """The fields of a :class:`PictureEdge`, as a :class:`Picture` keeps them."""

    id: str
    tail: str
    head: str
    path: str
    mark: str
    cluster: str | None = None


def _named(row: tuple) -> NodeRow | ClusterRow:
    """A row as given to :class:`Picture`: a named row, or a plain tuple of a node's fields
    (11) or a cluster's (9), read as the row it spells."""
    if type(row) is NodeRow or type(row) is ClusterRow:
        return row
    return NodeRow._make(row) if len(row) == len(NodeRow._fields) else ClusterRow._make(row)


@dataclass(frozen=True)
class Heat:
    """How an overlay's values are coloured: decided with the picture, drawn by
    :meth:`Picture.to_dot` (and by a legend, :meth:`legend`).

    Attributes:
        kind: ``"error"``, ``"own error"``, ``"grad error"``, ``"own grad error"``,
            ``"latency"`` or ``"values"`` (the user's own).
        unit: the values' unit (``"x tolerance"``, ``"share of the forward"``, or ``""``).
        threshold: for errors, the value from which something is wrong (1.0: the tolerance);
            else None.
        low, high: the smallest and largest value drawn (latency and values are coloured
            from ``low`` to ``high``; errors on a log scale around ``threshold``).
    """

    kind: str
    unit: str
    threshold: float | None
    low: float
    high: float

    def level(self, value: float) -> float:
        """Where ``value`` lies on the colour scale.

        Args:
            value: an element's value, in :attr:`unit`.

        Returns:
            From 0 (coolest) to 1 (hottest). Errors: 0 at or below 1/1000 of the threshold,
            0.5 just below it, 1 at 1000 times it; other values from :attr:`low` to
            :attr:`high`.
        """
        if self.threshold is not None:
            ratio = value / self.threshold if self.threshold > 0 else math.inf
            if not ratio > 0:
                return 0.0
            if math.isinf(ratio):
                return 1.0
            decades = math.log10(ratio)
            if ratio < 1:
                return min(0.499, max(0.0, (decades + 3) / 6))
            return 0.5 + min(0.5, decades / 6)
        span = self.high - self.low
        if not span > 0:
            return 1.0 if value > self.low else 0.0
        return min(1.0, max(0.0, (value - self.low) / span))

    def color(self, value: float) -> str:
        """The fill colour of an element valued ``value``.

        Args:
            value: the element's value, in :attr:`unit`.

        Returns:
            A ``#rrggbb`` colour, the same for the same value and scale on every run.
        """
        return _heat_color(self.level(value), self.threshold is not None)

    def legend(self) -> tuple[tuple[str, str], ...]:
        """``((text, colour), ...)``: the scale's stops, coolest first, for a legend."""
        if self.threshold is not None:  # in multiples of the threshold (the tolerance)
            t = self.threshold
            stops = [(0.0, "0"), (t * 0.01, "0.01x"), (t * 0.999, "< 1x")]
            stops += [(t, "1x: beyond"), (t * 30, "30x"), (t * 1e3, "≥ 1000x")]
            return tuple((text, self.color(v)) for v, text in stops)
        steps = [self.low + (self.high - self.low) * f for f in (0, 0.25, 0.5, 0.75, 1)]
        latency = self.unit == "share of the forward"
        return tuple((f"{v:.1%}" if latency else f"{v:.4g}", self.color(v)) for v in steps)


@dataclass(frozen=True)
class Picture:
    """A whole drawing: its clusters, nodes and edges by id, and how they nest.

    ``picture[id]`` is the element with that id (a :class:`PictureNode`,
    :class:`PictureCluster` or :class:`PictureEdge`); iterating gives every id in drawing order.
    A picture of a large program holds thousands of elements: each is kept as a row of its
    fields (:class:`NodeRow`, :class:`ClusterRow`, :class:`EdgeRow`) and becomes its record
    when asked for, so drawing costs no more than writing.

    Attributes:
        name: the graph's name (the model's type).
        top: the ids drawn at the top level, in order.
        rows: id -> the :class:`NodeRow` or :class:`ClusterRow` of each node, box and
            cluster, in drawing order (a plain tuple of a node's fields, or a cluster's, is
            read as the row it spells).
        edge_rows: the :class:`EdgeRow` of each edge, in drawing order (plain tuples too).
        rank_same: pairs of node ids drawn level with each other (a split diff).
        split: whether it is a side-by-side diff (two top-level clusters).
        overlay: with an overlay (``gs.draw(s, overlay="error")``), each drawn node's and
            box's value by element id (a box: the worst, or the sum, of its members); empty
            without one. Clusters have none (their tooltips say their members' aggregate).
        heat: how the overlay's values are coloured (:class:`Heat`), or None.
    """

    name: str
    top: tuple[str, ...] = field(repr=False)
    rows: Mapping[str, NodeRow | ClusterRow] = field(repr=False)
    edge_rows: tuple[EdgeRow, ...] = field(repr=False)
    rank_same: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    split: bool = False
    # an overlay: element id -> value (its nodes and boxes), and how values are coloured
    overlay: Mapping[str, float] = field(default_factory=dict, repr=False)
    heat: Heat | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if any(type(row) is not EdgeRow for row in self.edge_rows):
            object.__setattr__(self, "edge_rows", tuple(EdgeRow._make(r) for r in self.edge_rows))
        if any(
            type(row) is not NodeRow and type(row) is not ClusterRow for row in self.rows.values()
        ):
            object.__setattr__(self, "rows", {i: _named(row) for i, row in self.rows.items()})
        object.__setattr__(self, "_edge_index", {row.id: row for row in self.edge_rows})
        object.__setattr__(self, "_made", {})
        object.__setattr__(self, "_lookups", None)
        boxes: dict[str, str] = {}
        exits: list[str] = []  # a part's ports where edges leave it
        part = False  # whether it is a part of a picture laid out in parts (see EXIT)
        for element_id, row in self.rows.items():
            if type(row) is NodeRow:
                if row.members:  # a box: its fx nodes
                    prefix = _side_prefix(element_id)
                    for member in row.members:
                        boxes[prefix + member] = element_id
                elif row.kind in _PART_KINDS:
                    part = True
                    if EXIT in row.style:
                        exits.append(element_id)
        object.__setattr__(self, "_box_of", boxes)
        object.__setattr__(self, "_exits", tuple(exits))
        object.__setattr__(self, "_part", part)

    def __getitem__(self, element_id: str) -> Element:
        made = self._made.get(element_id)
        if made is not None:
            return made
        row = self.rows.get(element_id)
        if row is not None:
            made = (PictureNode if type(row) is NodeRow else PictureCluster)(*row)
        elif element_id in self._edge_index:
            made = PictureEdge(*self._edge_index[element_id])
        else:
            raise RenderError(
                f"the picture has no element {element_id!r}.{did_you_mean(element_id, self)}"
            )
        self._made[element_id] = made
        return made

    def __contains__(self, element_id: object) -> bool:
        return element_id in self.rows or element_id in self._edge_index

    def __iter__(self) -> Iterator[str]:
        yield from self.rows
        yield from self._edge_index

    def __len__(self) -> int:
        return len(self.rows) + len(self.edge_rows)

    @property
    def nodes(self) -> tuple[PictureNode, ...]:
        """Every drawn node and box, in drawing order."""
        return tuple(self[i] for i, row in self.rows.items() if type(row) is NodeRow)

    @property
    def clusters(self) -> tuple[PictureCluster, ...]:
        """Every cluster, in drawing order."""
        return tuple(self[i] for i, row in self.rows.items() if type(row) is ClusterRow)

    @property
    def edges(self) -> tuple[PictureEdge, ...]:
        """Every edge, in drawing order."""
        return tuple(self[row.id] for row in self.edge_rows)

    # -- lookups -----------------------------------------------------------------------------

    def element_of_node(self, node: str, prefix: str = "") -> PictureNode | None:
        """Where fx node ``node`` is drawn.

        Args:
            node: the fx node's name (``"linear"``).
            prefix: which picture of a split diff (``"before/"``, ``"after/"``); ``""``
                otherwise.

        Returns:
            Its own node, else the box it was collapsed into; None when it is not drawn (glue,
            a check, a node of another program).
        """
        own = f"{prefix}node:{id_text(node)}"
        if own in self.rows:
            return self[own]
        box = self._box_of.get(prefix + node)
        return self[box] if box is not None else None

    def elements_of_call(self, call: str) -> tuple[str, ...]:
        """The ids of every element drawing module call ``call``.

        Args:
            call: a call name (``"layers.0"``, ``"shared@1"``).

        Returns:
            Its cluster, the box it is collapsed into (a run's box draws each of its calls), or
            the node a call of one node is drawn as; in both pictures of a split diff. Empty
            when no element draws it alone (it is inside a box, or not in the picture).
        """
        return tuple(self._index()[0].get(call, ()))

    def inside(self, element_id: str) -> tuple[str, ...]:
        """The ids of the nodes and boxes drawn inside cluster ``element_id``, at any depth.

        Args:
            element_id: a cluster's id (``"cluster:layers.0"``).

        Returns:
            The ids, in drawing order (empty for a node or a box).

        Raises:
            RenderError: the picture has no element ``element_id`` (naming the ids it may
                have meant).
        """
        self[element_id]  # an unknown id is refused, with the ids it may have meant
        return tuple(self._index()[1].get(element_id, ()))

    def edges_in(self, element_id: str) -> tuple[PictureEdge, ...]:
        """The edges that feed node or box ``element_id``: what it reads.

        Args:
            element_id: a node's or a box's id.

        Returns:
            The edges, in drawing order.

        Raises:
            RenderError: the picture has no element ``element_id``.
        """
        self[element_id]
        return tuple(self[edge] for edge in self._index()[2].get(element_id, ()))

    def edges_out(self, element_id: str) -> tuple[PictureEdge, ...]:
        """The edges that leave node or box ``element_id``: what reads it.

        Args:
            element_id: a node's or a box's id.

        Returns:
            The edges, in drawing order.

        Raises:
            RenderError: the picture has no element ``element_id``.
        """
        self[element_id]
        return tuple(self[edge] for edge in self._index()[3].get(element_id, ()))

    def _index(self) -> tuple[dict, dict, dict, dict]:
        """(call -> ids, cluster -> nodes inside, node -> edges in, node -> edges out), built
        once, on the first lookup: drawing a picture does not pay for them."""
        if self._lookups is not None:
            return self._lookups
        of_call: dict[str, list[str]] = {}
        inside: dict[str, list[str]] = {}
        rows = self.rows
        for element_id, row in rows.items():
            if type(row) is NodeRow:
                calls = row.calls
                parent = row.cluster
                while parent is not None:
                    inside.setdefault(parent, []).append(element_id)
                    parent = rows[parent].cluster
            else:
                calls = (row.call,) if row.call is not None else ()
            for call in calls:
                of_call.setdefault(call, []).append(element_id)
        incoming: dict[str, list[str]] = {}
        outgoing: dict[str, list[str]] = {}
        for edge in self.edge_rows:
            outgoing.setdefault(edge.tail, []).append(edge.id)
            incoming.setdefault(edge.head, []).append(edge.id)
        lookups = (of_call, inside, incoming, outgoing)
        object.__setattr__(self, "_lookups", lookups)
        return lookups

    # -- the lowering to DOT -----------------------------------------------------------------

    def to_dot(self, placed: Placed | None = None) -> str:
        """The DOT text: the clusters nested as drawn, then the edges, then the alignment.

        Every DOT style (colours, shapes, line styles, default attributes) is decided here:
        this is the one writer of DOT, for a whole picture and for the parts
        :mod:`graphsurgeon.render._stack` lays out one at a time.

        Args:
            placed: where each element was laid out, or None. With it, elements also carry
                their positions (the form ``neato -n2`` draws as it is) and sizes.

        Returns:
            The DOT text: the same picture gives the same text.
        """
        lines = [f"digraph {quote(self.name)} {{", _HEADER]
        if self.split:
            lines.append("  newrank=true;")  # lets nodes of the two sides share a rank
        if self.heat is not None:
            text = _overlay_title(self.heat)
            lines.append(f"  label={quote(text)}; labelloc=t; fontsize=11;")
        if placed is not None and placed.bb is not None:
            lines.append(f'  bb="{placed.bb}";')
            if placed.lp is not None:
                lines.append(f"  lp={quote(placed.lp)};")
        edges: dict[str | None, list[str]] = {}
        names: dict[str, str] = {}
        for row in self.edge_rows:
            extra = placed.edge_attributes(row.id) if placed is not None else ()
            ends = self._ends(row) if self._part else ""
            edges.setdefault(row.cluster, []).append(_edge_statement(row, extra, names, ends))
        for element_id in self.top:
            self._lower(element_id, "  ", lines, edges, placed)
        lines += ["  " + statement for statement in edges.get(None, ())]
        lines += [
            f"  {{rank=same; {quote(_dot_name(a))}; {quote(_dot_name(b))};}}"
            for a, b in self.rank_same
        ]
        if self._exits:
            lines.append("  {rank=max; " + " ".join(f"{quote(p)};" for p in self._exits) + "}")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _ends(self, row: EdgeRow) -> str:
        """The attributes an edge of a part takes from its ends (see :data:`EXIT`)."""
        if row.mark == HIDDEN:
            return ""
        head, tail = self.rows.get(row.head), self.rows.get(row.tail)
        if head is not None and head.kind == "port" and EXIT in head.style:
            return ", arrowhead=none"
        if head is not None and head.kind == "placeholder":
            return ", arrowhead=none, headport=n"
        if tail is not None and tail.kind == "placeholder":
            return ", tailport=s"
        return ""

    def _lower(
        self,
        element_id: str,
        indent: str,
        lines: list[str],
        edges: Mapping[str | None, list],
        placed: Placed | None = None,
    ) -> None:
        row = self.rows[element_id]
        if type(row) is NodeRow:
            extra = placed.node_attributes(element_id) if placed is not None else ()
            lines.append(indent + _node_statement(row, self._fill(element_id), extra))
            return
        if SIDE in row.style:  # a side of a split diff: its attributes on one line
            lines.append(f"{indent}subgraph {quote('cluster:' + element_id[5:])} {{")
            attributes = (
                ("id", quote(element_id)),
                ("label", quote(row.label)),
                ("fontsize", "12"),
                ("color", '"#d1d5db"'),
            )
            lines.append(f"{indent}  " + " ".join(f"{k}={v};" for k, v in attributes))
        else:
            # graphviz draws a subgraph as a cluster only when its name starts with "cluster"
            at = element_id.index("cluster:")
            name = "cluster:" + element_id[:at] + element_id[at + 8 :]
            lines.append(f"{indent}subgraph {quote(name)} {{")
            attributes = _cluster_attributes(row, neutral=self.heat is not None)
            if placed is not None:
                attributes += placed.cluster_attributes(element_id)
            lines += [f"{indent}  {key}={value};" for key, value in attributes]
        for member in row.members:
            self._lower(member, indent + "  ", lines, edges, placed)
        lines += [indent + "  " + statement for statement in edges.get(element_id, ())]
        lines.append(f"{indent}}}")

    def _fill(self, element_id: str) -> str | None:
        """An element's fill in an overlay: its value's heat colour, or white (no value: the
        module colours would read as values); None without an overlay."""
        if self.heat is None:
            return None
        value = self.overlay.get(element_id)
        return _NO_VALUE if value is None else self.heat.color(value)


class Placed:
    """Where every element of a picture was laid out (graphviz's ``pos``, ``bb``, ``lp`` in
    points), and the size of a placeholder, for :meth:`Picture.to_dot`: made by
    :mod:`graphsurgeon.render._stack`."""

    def __init__(self, sizes: Mapping[str, tuple[float, float]] | None = None) -> None:
        self.bb: str | None = None  # the picture's bounding box
        self.lp: str | None = None  # the graph's label
        self.nodes: dict[str, str] = {}  # element id -> "x,y"
        self.clusters: dict[str, tuple[str, str | None]] = {}  # id -> (bb, lp)
        self.edges: dict[str, tuple[str, str | None]] = {}  # id -> (pos, tail_lp)
        # element id -> (width, height) in points: drawn at that size (a placeholder)
        self.sizes: Mapping[str, tuple[float, float]] = sizes or {}

    def node_attributes(self, element_id: str) -> tuple[tuple[str, str], ...]:
        size = self.sizes.get(element_id)
        if size is not None:
            width, height = size
            return (
                ("fixedsize", "true"),
                ("width", f"{width / 72:.4f}"),
                ("height", f"{height / 72:.4f}"),
            )
        pos = self.nodes.get(element_id)
        return (("pos", quote(pos)),) if pos is not None else ()

    def cluster_attributes(self, element_id: str) -> list[tuple[str, str]]:
        bb, lp = self.clusters.get(element_id, (None, None))
        found = [("bb", quote(bb))] if bb is not None else []
        return found + ([("lp", quote(lp))] if lp is not None else [])

    def edge_attributes(self, edge_id: str) -> tuple[tuple[str, str], ...]:
        pos, tail_lp = self.edges.get(edge_id, (None, None))
        found = (("pos", quote(pos)),) if pos is not None else ()
        return found + ((("tail_lp", quote(tail_lp)),) if tail_lp is not None else ())


def _overlay_title(heat: Heat) -> str:
    """The picture's title when it carries an overlay: ``error overlay (x tolerance)``."""
    return f"{heat.kind} overlay" + (f" ({heat.unit})" if heat.unit else "")


def _side_prefix(element_id: str) -> str:
    """``"before/"`` or ``"after/"`` for an element of one side of a split diff, else ``""``."""
    for prefix in ("before/", "after/"):
        if element_id.startswith(prefix):
            return prefix
    return ""


# -- DOT styles ------------------------------------------------------------------------------

_HEADER = (
    '  graph [rankdir=TB, fontname="Helvetica", fontsize=10, labeljust=l, nodesep=0.18, '
    "ranksep=0.28, outputorder=edgesfirst];\n"
    '  node [shape=box, style="rounded,filled", fillcolor="#ffffff", color="#6b7280", '
    'fontname="Helvetica", fontsize=9, height=0.3, margin="0.08,0.03"];\n'
    '  edge [color="#6b7280", arrowsize=0.5, penwidth=0.8, fontname="Helvetica", fontsize=7];'
)
_HIGHLIGHT = "#c026d3"
_SWAP_FILL, _SWAP_LINE = "#fed7aa", "#c2410c"
_FUSED_LINE = "#1d4ed8"
_ADDED, _REMOVED = "#15803d", "#9ca3af"
_CLUSTER_LINE = "#9ca3af"
# An overlay: what has no value, and the clusters around what has
_NO_VALUE, _NEUTRAL = "#ffffff", "#f9fafb"
# heat colours, coolest first: errors (within the tolerance, then beyond it), other values
_ERROR_STOPS = ((0.0, "#dcfce7"), (0.499, "#fef9c3"), (0.5, "#fed7aa"), (1.0, "#f87171"))
_VALUE_STOPS = ((0.0, "#fefce8"), (0.5, "#fdba74"), (1.0, "#ef4444"))


def _heat_color(level: float, errors: bool) -> str:
    """The colour at ``level`` (0 to 1) of the heat scale, interpolated between its stops."""
    stops = _ERROR_STOPS if errors else _VALUE_STOPS
    for (a, low), (b, high) in itertools.pairwise(stops):
        if level <= b:
            t = 0.0 if b == a else (level - a) / (b - a)
            channels = [
                round(int(low[i : i + 2], 16) * (1 - t) + int(high[i : i + 2], 16) * t)
                for i in (1, 3, 5)
            ]
            return "#" + "".join(f"{c:02x}" for c in channels)
    return stops[-1][1]


@functools.lru_cache(maxsize=8192)
def _color(name: str, strong: bool = False) -> str:
    """A pale color derived from a module type's name (sha1, so it is the same in every
    process)."""
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).digest()  # any str is a name
    hue = int.from_bytes(digest[:4], "big") / 2**32
    lightness, saturation = (0.80, 0.85) if strong else (0.92, 0.60)
    red, green, blue = colorsys.hls_to_rgb(hue, lightness, saturation)
    return f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"


def quote(text: str) -> str:
    r"""A DOT string of ``text``.

    Backslashes are doubled so that graphviz does not read ``\N``, ``\G``, ``\l`` ... in user
    text as its own escapes; newlines become line breaks. Characters dot or SVG cannot carry
    (NUL ends dot's input; XML has no control characters) are shown as
    :func:`graphsurgeon.display.shown` shows them (:func:`graphsurgeon.display.label_text`).

    Args:
        text: any text (a label, a name, an id).

    Returns:
        The text in double quotes, escaped for DOT.

    Example:
        >>> print(quote('say "hi"\nto \\N'))
        "say \"hi\"\nto \\N"
    """
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    # str.isprintable() is the quick test that nearly every text passes (escaped, a text has
    # no line breaks left: one test); it is stricter than label_text's pattern (False for
    # U+2028, say), which decides when it fails
    if not escaped.isprintable():
        text = label_text(text)
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _tooltip(text: str) -> str:
    # graphviz 2.43 unescapes tooltips twice, so a doubled backslash would still expand
    # (``\\N`` shows the node name): show user backslashes as the look-alike U+29F5 instead.
    return quote(text.replace("\\", "\u29f5"))


_KIND_STYLE: dict[str, list[tuple[str, str]]] = {
    "input": [("style", "filled"), ("fillcolor", '"#e5e7eb"')],
    "output": [("style", "filled"), ("fillcolor", '"#e5e7eb"')],
    "buffer": [("shape", "cylinder"), ("style", "filled"), ("fillcolor", '"#fef9c3"')],
    "parameter": [("shape", "cylinder"), ("style", "filled"), ("fillcolor", '"#f3f4f6"')],
    "constant": [("shape", "note"), ("style", "filled"), ("fillcolor", '"#f3f4f6"')],
    "glue": [("shape", "plain"), ("fontcolor", '"#6b7280"')],
    "check": [("shape", "plain"), ("fontcolor", '"#9ca3af"'), ("fontsize", "7")],
    "ops": [
        ("shape", "folder"),
        ("style", "filled"),
        ("fillcolor", '"#f3f4f6"'),
        ("color", '"#9ca3af"'),
        ("fontcolor", '"#374151"'),
    ],
    # the parts of a picture laid out in parts (see EXIT)
    "port": [("shape", "point"), ("width", "0.02"), ("height", "0.02"), ("style", "invis")],
    "placeholder": [("shape", "box"), ("style", "invis")],
    "swapped": [
        ("style", quote("filled,bold")),
        ("peripheries", "2"),
        ("fillcolor", quote(_SWAP_FILL)),
        ("color", quote(_SWAP_LINE)),
    ],
}
_REMOVED_STYLE = [
    ("style", quote("rounded,filled,dashed")),
    ("color", quote(_REMOVED)),
    ("fontcolor", '"#6b7280"'),
    ("fillcolor", '"#f3f4f6"'),
]
_REMOVED_BOX_STYLE = [(k, v) for k, v in _REMOVED_STYLE if k != "style"] + [
    ("style", quote("filled,dashed"))
]
_HIGHLIGHT_STYLE = [("color", quote(_HIGHLIGHT)), ("penwidth", "2.5")]


def _dot_name(element_id: str) -> str:
    """A node's name in the DOT text: ``before/node:linear`` -> ``before/linear``; a box's id
    is its name."""
    for prefix, marker in _NODE_MARKERS:
        if element_id.startswith(marker):
            return prefix + element_id[len(marker) :]
    return element_id


_NODE_MARKERS = tuple((prefix, prefix + "node:") for prefix in ("", "before/", "after/"))
# The kinds of node only a part of a picture laid out in parts has (see EXIT)
_PART_KINDS = ("port", "placeholder")


def _merge(attributes: list[tuple[str, str]]) -> str:
    """``, shape=box, style="filled"``: later attributes win, the first position of each key
    is kept; '' for none."""
    merged: dict[str, str] = {}
    for key, value in attributes:
        merged[key] = value
    return "".join(f", {key}={value}" for key, value in merged.items())


def _node_statement(row: NodeRow, fill: str | None = None, extra: Iterable = ()) -> str:
    """A node's statement; ``fill``: an overlay's colour for it (a value's heat, or white),
    ``extra``: more attributes (its position)."""
    element_id, kind = row.id, row.kind
    name = quote(element_id) if kind == "box" else quote(_dot_name(element_id))
    head = (
        f"id={quote(element_id)}, class={_classes(row.classes)}, label={quote(row.label)}, "
        f"tooltip={_tooltip(row.tooltip)}"
    )
    tail = (
        _node_style(kind, row.color, row.style, fill)
        if not extra
        else _node_style_text(kind, row.color, row.style, fill, tuple(extra))
    )
    return f"{name} [{head}{tail}];"


@functools.lru_cache(maxsize=256)
def _classes(classes: tuple[str, ...]) -> str:
    return quote(" ".join(classes))


@functools.lru_cache(maxsize=4096)
def _node_style(kind: str, color: str | None, style: tuple[str, ...], fill: str | None) -> str:
    """The attributes after a node's id, class, label and tooltip (``, shape=box3d, ...``):
    the same for every node of one kind, colour and style, so written once for them all."""
    return _node_style_text(kind, color, style, fill, ())


def _node_style_text(
    kind: str, color: str | None, style: tuple[str, ...], fill: str | None, extra: tuple
) -> str:
    # no attribute here is id, class, label or tooltip: they come first in every statement
    highlighted = HIGHLIGHTED in style
    attributes: list[tuple[str, str]] = []
    if kind == "box":
        attributes += [
            ("shape", "box3d"),
            ("margin", '"0.1,0.06"'),
            ("style", "filled"),
            ("fillcolor", quote(_color(color, highlighted))),
        ]
        if FUSED in style:
            attributes += [("color", quote(_FUSED_LINE)), ("penwidth", "1.5")]
        if highlighted:
            attributes += _HIGHLIGHT_STYLE
        if REMOVED in style:
            attributes += _REMOVED_BOX_STYLE
        if fill is not None:
            attributes.append(("fillcolor", quote(fill)))
        attributes += extra
        return _merge(attributes)
    if color is not None:  # drawn as its module: the module's colour
        attributes.append(("fillcolor", quote(_color(color, highlighted))))
    attributes += _KIND_STYLE.get(kind, ())
    if highlighted:
        attributes += _HIGHLIGHT_STYLE
    if REMOVED in style:
        attributes += _REMOVED_STYLE
    elif ADDED in style:
        attributes += [("color", quote(_ADDED)), ("penwidth", "2")]
    if fill is not None and (fill != _NO_VALUE or color is not None):
        attributes.append(("fillcolor", quote(fill)))
        if kind in ("glue", "check"):  # drawn as plain text: a fill needs a shape
            attributes += [("shape", "box"), ("style", quote("rounded,filled"))]
    attributes += extra
    return _merge(attributes)


def _cluster_attributes(row: ClusterRow, neutral: bool = False) -> list[tuple[str, str]]:
    """A cluster's attributes; ``neutral``: a pale grey fill (an overlay's colours are the
    values, the modules' would compete with them)."""
    style = row.style
    highlighted = HIGHLIGHTED in style
    line_style, line, width = "filled", _CLUSTER_LINE, "0.8"
    if SWAPPED_BOUNDARY in style:
        line_style, line, width = "filled,dashed", _SWAP_LINE, "1.5"
    if FUSED in style:
        line_style, line, width = "filled,bold", _FUSED_LINE, "1.5"
    if highlighted:
        line, width = _HIGHLIGHT, "2.5"
    return [
        ("id", quote(row.id)),
        ("class", quote(" ".join(row.classes))),
        ("label", quote(row.label)),
        ("tooltip", _tooltip(row.tooltip)),
        ("style", quote(line_style)),
        ("fillcolor", quote(_NEUTRAL if neutral else _color(row.color, highlighted))),
        ("color", quote(line)),
        ("penwidth", width),
    ]


def _edge_statement(
    row: EdgeRow, extra: Iterable = (), names: dict[str, str] | None = None, ends: str = ""
) -> str:
    """An edge's statement; ``names``: the DOT names of the picture's elements written so far
    (element id -> quoted name), shared by the statements of one picture: a node has several
    edges; ``ends``: what it takes from its ends in a part (:meth:`Picture._ends`)."""
    tail, head, path, mark = row.tail, row.head, row.path, row.mark
    text = f"id={quote(row.id)}"
    if path:
        text += f", taillabel={quote(path)}"
    if mark == REMOVED:
        text += _REMOVED_EDGE
    elif mark == ADDED:
        text += _ADDED_EDGE
    elif mark == HIDDEN:
        text += ", style=invis"
    text += ends
    if extra:
        text += "".join(f", {key}={value}" for key, value in extra)
    if names is None:
        return f"{quote(_dot_name(tail))} -> {quote(_dot_name(head))} [{text}];"
    tail_name = names.get(tail)
    if tail_name is None:
        tail_name = names[tail] = quote(_dot_name(tail))
    head_name = names.get(head)
    if head_name is None:
        head_name = names[head] = quote(_dot_name(head))
    return f"{tail_name} -> {head_name} [{text}];"


_REMOVED_EDGE = f", style=dashed, color={quote(_REMOVED)}"
_ADDED_EDGE = f", color={quote(_ADDED)}, penwidth=1.5"
