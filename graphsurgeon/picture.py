r"""Picture: what a drawing of a program shows, as data, before it becomes DOT text.

:func:`graphsurgeon.to_dot` works in two steps, so that nothing about a picture has to be read
back out of its text: the renderer decides everything (what is drawn, where, how it is marked)
and builds a frozen :class:`Picture`; :meth:`Picture.to_dot` lowers it to graphviz DOT, and
nothing else. The same Picture is the map from an id in the SVG (``node:linear``,
``cluster:layers.0``, ``module:layers.1``, ``edge:x->linear``) to what it stands for (the fx
node, the module call), so a click in the page is resolved from data, never by parsing ids.

Names are user text: a module may be called ``"a\x00b"``, ``"line\nbreak"`` or 10,000 characters
long. Two rules, decided here and used by the renderer, these lookups and the widget:

* in ids (and DOT names), :func:`id_text` keeps an ordinary name as it is and writes ``%`` and the
  characters an id cannot carry (NUL and other control characters, newlines, tabs, lone
  surrogates) as ``%XX`` (UTF-8 bytes, as in a URL): ``module:a%00b``. :func:`name_of_id_text`
  reverses it;
* in labels and tooltips, :func:`shown` makes those characters visible (``␀``, ``␊``) and
  shortens a long name in the middle with an ellipsis.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.render import graph_view
    >>> model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    >>> picture = graph_view(gs.export(model, (torch.randn(1, 2),))).picture
    >>> picture["cluster:0"].call, picture["node:linear"].node, picture["node:linear"].cluster
    ('0', 'linear', 'cluster:0')
    >>> picture.to_dot() == graph_view(gs.export(model, (torch.randn(1, 2),))).dot
    True
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

__all__ = [
    "Picture",
    "PictureCluster",
    "PictureEdge",
    "PictureNode",
    "id_text",
    "name_of_id_text",
    "shown",
]

# One statement's attributes, in order, values already DOT-quoted where they need it.
Attributes = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class PictureNode:
    """A drawn node: one fx node, or one or more module calls collapsed into a box.

    Attributes:
        id: the element id, also in the SVG (``node:linear``, ``module:layers.1``,
            ``modules:layers.0..layers.3``; prefixed ``before/`` or ``after/`` in a split diff).
        kind: ``"op"``, ``"input"``, ``"output"``, ``"buffer"``, ``"constant"``, ``"parameter"``,
            ``"swapped"`` (a replacement's call), ``"glue"``, ``"check"``; ``"box"`` for a
            collapsed module call.
        node: the fx node it draws (None for a box).
        calls: the module calls it stands for: a box's calls, or the module a single-node
            call is drawn as; else empty.
        classes: the classes it carries in the SVG (``op module highlighted``).
        label: its text, lines separated by newlines.
        tooltip: its tooltip text.
        cluster: the id of the cluster it is drawn in, or None at the top.
        members: for a box, the fx nodes collapsed into it (in graph order); else empty.
        dot_name: its name in the DOT text (what edges connect).
        statement: its DOT statement, ``"linear" [id="node:linear", ...];``.
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
    dot_name: str = field(repr=False)
    statement: str = field(repr=False)


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
        dot_name: its subgraph name in the DOT text.
        attributes: every attribute of the subgraph, in order.
    """

    id: str
    call: str | None
    classes: tuple[str, ...]
    label: str
    tooltip: str
    cluster: str | None
    members: tuple[str, ...]
    dot_name: str = field(repr=False)
    attributes: Attributes = field(repr=False)


@dataclass(frozen=True, slots=True)
class PictureEdge:
    """A drawn edge: a value going from one drawn node (or box) to another.

    Attributes:
        id: ``edge:<tail>-><head>`` (``:2``, ``:3``... for a repeated pair).
        tail: the id of the node it comes from.
        head: the id of the node it goes to.
        path: the index taken from the tail's value (``[0]``), or ``""``.
        mark: ``"removed"`` or ``"added"`` in a diff, else ``""``.
        statement: its DOT statement, ``"x" -> "linear" [id="edge:x->linear"];``.
        cluster: the side of a split diff it is written in (``diff:before``), else None.
    """

    id: str
    tail: str
    head: str
    path: str
    mark: str
    statement: str = field(repr=False)
    cluster: str | None = None


Element = PictureNode | PictureCluster | PictureEdge


@dataclass(frozen=True)
class Picture:
    """A whole drawing: its clusters, nodes and edges by id, and how they nest.

    ``picture[id]`` is the element with that id (a :class:`PictureNode`,
    :class:`PictureCluster` or :class:`PictureEdge`); iterating gives every id in drawing order.
    A picture of a large program holds thousands of elements: each is kept as a plain row of
    its fields and becomes an object when asked for, so drawing costs no more than writing.

    Attributes:
        name: the graph's name (the model's type).
        header: the DOT lines of default attributes, drawn first.
        top: the ids drawn at the top level, in order.
        rank_same: pairs of DOT node names drawn level with each other (a split diff).
        split: whether it is a side-by-side diff (two top-level clusters).
    """

    name: str
    header: str = field(repr=False)
    top: tuple[str, ...] = field(repr=False)
    # id -> the fields of a PictureNode (9 + 2) or a PictureCluster (9), in field order
    rows: Mapping[str, tuple] = field(repr=False)
    # the fields of each PictureEdge, in drawing order
    edge_rows: tuple[tuple, ...] = field(repr=False)
    rank_same: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    split: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "_edge_index", {row[0]: row for row in self.edge_rows})
        object.__setattr__(self, "_made", {})
        boxes: dict[str, str] = {}
        for element_id, row in self.rows.items():
            if len(row) == _NODE_FIELDS and row[_MEMBERS]:  # a box: its fx nodes
                prefix = element_id[: element_id.index("module")]
                for member in row[_MEMBERS]:
                    boxes[prefix + member] = element_id
        object.__setattr__(self, "_box_of", boxes)

    def __getitem__(self, element_id: str) -> Element:
        made = self._made.get(element_id)
        if made is not None:
            return made
        row = self.rows.get(element_id)
        if row is not None:
            made = (PictureNode if len(row) == _NODE_FIELDS else PictureCluster)(*row)
        elif element_id in self._edge_index:
            made = PictureEdge(*self._edge_index[element_id])
        else:
            from .errors import RenderError, did_you_mean

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
        return tuple(self[i] for i, row in self.rows.items() if len(row) == _NODE_FIELDS)

    @property
    def clusters(self) -> tuple[PictureCluster, ...]:
        """Every cluster, in drawing order."""
        return tuple(self[i] for i, row in self.rows.items() if len(row) != _NODE_FIELDS)

    @property
    def edges(self) -> tuple[PictureEdge, ...]:
        """Every edge, in drawing order."""
        return tuple(self[row[0]] for row in self.edge_rows)

    def element_of_node(self, node: str, prefix: str = "") -> PictureNode | None:
        """Where fx node ``node`` is drawn: its own node, else the box it was collapsed into
        (None when it is not drawn: glue, a check, a node of another program)."""
        own = f"{prefix}node:{id_text(node)}"
        if own in self.rows:
            return self[own]
        box = self._box_of.get(prefix + node)
        return self[box] if box is not None else None

    def to_dot(self) -> str:
        """The DOT text: the clusters nested as drawn, then the edges, then the alignment."""
        lines = [f"digraph {quote(self.name)} {{", self.header]
        if self.split:
            lines.append("  newrank=true;")  # lets nodes of the two sides share a rank
        edges: dict[str | None, list[str]] = {}
        for row in self.edge_rows:
            edges.setdefault(row[_EDGE_CLUSTER], []).append(row[_EDGE_STATEMENT])
        for element_id in self.top:
            self._lower(element_id, "  ", lines, edges)
        lines += ["  " + statement for statement in edges.get(None, ())]
        lines += [f"  {{rank=same; {quote(a)}; {quote(b)};}}" for a, b in self.rank_same]
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _lower(
        self, element_id: str, indent: str, lines: list[str], edges: Mapping[str | None, list]
    ) -> None:
        row = self.rows[element_id]
        if len(row) == _NODE_FIELDS:
            lines.append(indent + row[_STATEMENT])
            return
        cluster = PictureCluster(*row)
        lines.append(f"{indent}subgraph {quote(cluster.dot_name)} {{")
        if cluster.call is None:  # a side of a split diff: its attributes on one line
            lines.append(f"{indent}  " + " ".join(f"{k}={v};" for k, v in cluster.attributes))
        else:
            lines += [f"{indent}  {key}={value};" for key, value in cluster.attributes]
        for member in cluster.members:
            self._lower(member, indent + "  ", lines, edges)
        lines += [indent + "  " + statement for statement in edges.get(element_id, ())]
        lines.append(f"{indent}}}")


# Positions in the rows a Picture keeps (the fields of PictureNode and PictureEdge, in order).
_NODE_FIELDS, _MEMBERS, _STATEMENT = 11, 8, 10
_EDGE_STATEMENT, _EDGE_CLUSTER = 5, 6


def quote(text: str) -> str:
    r"""A DOT string. Backslashes are doubled so that graphviz does not read ``\N``, ``\G``,
    ``\l`` ... in user text as its own escapes; newlines become line breaks. Characters dot or
    SVG cannot carry (NUL ends dot's input; XML has no control characters) are shown as
    :func:`shown` shows them: a name reaches here already made visible, this is the last guard
    for any other text (a type's name, a dict key in an index path)."""
    # str.isprintable() is the quick test that nearly every text passes; it is stricter than
    # the pattern (False for U+2028, say), so the pattern decides when it fails
    if (
        not text.isprintable()
        and not text.replace("\n", " ").isprintable()
        and _NOT_IN_LABELS.search(text) is not None
    ):
        text = _NOT_IN_LABELS.sub(_visible_character, text)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# -- names in ids and in text ----------------------------------------------------------------

# What an id cannot carry as it is: NUL (dot reads C strings), the other C0 and C1 control
# characters (not XML; tab, newline and carriage return are rewritten by XML and HTML parsers in
# attribute values), lone surrogates and U+FFFE/U+FFFF (not encodable, not XML); and "%", the
# escape character itself, so that the escaping is reversible.
_NOT_IN_IDS = re.compile("[\x00-\x1f\x7f-\x9f%\ud800-\udfff\ufffe\uffff]")
# What a name shows visibly in text: the same, except "%".
_NOT_IN_NAMES = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
# What any label or tooltip text cannot carry: the same, except the newline (a line break).
_NOT_IN_LABELS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_ESCAPED = re.compile("(?:%[0-9A-F]{2})+")
#: How many characters of a name a label shows, and a tooltip (the middle gives way to "…").
LABEL_NAME_LIMIT, TOOLTIP_NAME_LIMIT = 60, 400


def _percent(match: re.Match) -> str:
    return "".join(f"%{byte:02X}" for byte in match.group().encode("utf-8", "surrogatepass"))


def id_text(name: str) -> str:
    r"""``name`` as it is written in element ids and DOT names: itself when it is an ordinary
    name, else with ``%`` and each character an id cannot carry as ``%XX`` (its UTF-8 bytes).
    Deterministic, and reversed by :func:`name_of_id_text`.

    Example:
        >>> id_text("layers.0.attn"), id_text("a\x00b"), id_text("line\nbreak"), id_text("50%")
        ('layers.0.attn', 'a%00b', 'line%0Abreak', '50%25')
        >>> name_of_id_text("a%00b")
        'a\x00b'
    """
    if ("%" not in name and name.isprintable()) or _NOT_IN_IDS.search(name) is None:
        return name
    return _NOT_IN_IDS.sub(_percent, name)


def name_of_id_text(text: str) -> str:
    r"""The name that :func:`id_text` wrote as ``text`` (``"a%00b"`` -> ``"a\x00b"``)."""
    if "%" not in text:
        return text

    def decode(match: re.Match) -> str:
        try:
            return bytes.fromhex(match.group().replace("%", "")).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:  # not written by id_text: left as it is
            return match.group()

    return _ESCAPED.sub(decode, text)


def _visible_character(match: re.Match) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # the Control Pictures block: ␀, ␉, ␊, ␍, ␛ ...
    if code == 0x7F:
        return "\u2421"  # ␡
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def shown(name: str, limit: int = LABEL_NAME_LIMIT) -> str:
    r"""``name`` as labels and panels show it: control characters and newlines visible (``␀``,
    ``␊``, ``␉``; others as ``\x85``), and past ``limit`` characters shortened in the middle
    with an ellipsis, so a 10,000-character name does not make a 10,000-pixel-wide box.

    Example:
        >>> shown("a\x00b\nc"), shown("x" * 100, 11)
        ('a␀b␊c', 'xxxxx…xxxxx')
    """
    if not name.isprintable() and _NOT_IN_NAMES.search(name) is not None:
        name = _NOT_IN_NAMES.sub(_visible_character, name)
    if len(name) > limit:
        head = (limit - 1) // 2 + (limit - 1) % 2
        name = name[:head] + "…" + name[len(name) - (limit - 1 - head) :]
    return name


def attribute_text(pairs: Attributes) -> str:
    """``id="x", label="y"``: a statement's attributes as DOT writes them."""
    return ", ".join(f"{key}={value}" for key, value in pairs)
