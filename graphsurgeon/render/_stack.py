"""A large picture laid out in parts: a stack of layers, one layer at a time.

graphviz's ``dot`` lays a graph out as a whole, and its time grows faster than the graph: an
80-layer decoder drawn fully open (3,700 nodes) takes seconds, and its layers drift apart on the
page. Model viewers lay such a model out per layer instead. So does :func:`layout`, for a
picture whose clusters include a long run of open layers of one type that feed each other:

1. each layer with a structure of its own is laid out once (by ``dot``, as a picture of its own
   whose names are the layer's own positions, so that identical layers give identical text):
   usually the first layer (it reads the inputs) and the rest, or a few groups where the number
   of digits in the names changes the labels' widths;
2. the picture around the stack is laid out with the stack as one placeholder of its size
   (the skeleton);
3. the layers are placed one under the other inside the placeholder, the edges that cross
   between parts joined up, and the whole drawn by ``neato -n2`` at those positions, as one
   picture with every id, class, tooltip and label that ``dot`` would give it.

Identical layers look alike, and the stack is a straight column. Anything else is laid out by
``dot`` whole (:func:`graphsurgeon.render.graphviz.layout`). Each part is a
:class:`~graphsurgeon.render.picture.Picture` (with the ports and the placeholder that picture
knows how to draw), written by its ``to_dot``: nothing here writes DOT. A layout that cannot be
joined up raises :class:`~graphsurgeon.errors.RenderError` naming the step that failed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..errors import RenderError
from . import graphviz
from ._scene import reached
from .picture import EXIT, HIDDEN, ClusterRow, EdgeRow, NodeRow, Picture, Placed

__all__ = ["layout"]

#: The fewest layers a stack has to be laid out in parts.
MIN_LAYERS = 8
#: The fewest drawn nodes a picture has to be laid out in parts (smaller ones are fast whole).
MIN_NODES = 1200
# Points between two layers of the stack, and around the stack in its placeholder.
_GAP = 18.0
_DIGITS = re.compile(r"[0-9]")
# The placeholder of the stack in the skeleton, and the ids of the edges that reach it
_HOLDER = "stack:"


def layout(picture: Picture, dot: str, format: str = "svg") -> bytes:
    """``picture`` (whose DOT text is ``dot``) laid out and drawn in ``format``: in parts when
    it has a stack of layers worth it, else by ``dot`` whole. Cached by the text (the layout in
    parts apart from the whole one: :func:`graphsurgeon.render.graphviz.layout` of ``dot``
    stays what ``dot`` makes of it)."""
    found = _stack(picture)
    if found is None:
        return graphviz.layout(dot, format)
    return graphviz.cached("stacked", format, dot, lambda: _Stacked(picture, found[1]).draw(format))


def layer_calls(calls: Mapping[str, Any], at_least: int = MIN_LAYERS) -> frozenset[str]:
    """The module calls that repeat as layers, by the rule a stack is made by.

    Args:
        calls: each call's name -> what the call index knows of it (its ``parent`` and
            ``type``), in graph order (``call_index(program).calls``).
        at_least: the shortest run that counts (:data:`MIN_LAYERS`: a stack laid out in parts;
            2: any repeated block, such as the two blocks of a vision model's stage).

    Returns:
        The calls in a run of at least ``at_least`` calls of one module type, one after the
        other under one parent (``model.layers.0``, ``model.layers.1``...).
    """
    layers: set[str] = set()
    runs: dict[str, tuple[str, list[str]]] = {}  # parent -> (type, its current run)
    for name, call in calls.items():
        kind, run = runs.get(call.parent, ("", []))
        if call.type and call.type == kind:
            run.append(name)
            continue
        if len(run) >= at_least:
            layers.update(run)
        runs[call.parent] = (call.type, [name])
    layers.update(name for _, run in runs.values() if len(run) >= at_least for name in run)
    return frozenset(layers)


def _stack(picture: Picture) -> tuple[str | None, list[str]] | None:
    """The longest run of open clusters of one module type in one container: (container id or
    None for the top level, the clusters' ids)."""
    if picture.split or picture.rank_same:
        return None
    rows = picture.rows
    if sum(1 for row in rows.values() if type(row) is NodeRow) < MIN_NODES:
        return None
    containers = [(None, picture.top)]
    containers += [(i, row.members) for i, row in rows.items() if type(row) is ClusterRow]
    best: tuple[str | None, list[str]] | None = None
    for container, members in containers:
        run_: list[str] = []
        for member in [*members, None]:
            row = rows.get(member) if member is not None else None
            cluster = type(row) is ClusterRow and row.call is not None
            same = cluster and run_ and row.color == rows[run_[0]].color
            if run_ and not same:
                if len(run_) >= MIN_LAYERS and (best is None or len(run_) > len(best[1])):
                    best = (container, run_)
                run_ = []
            if cluster:
                run_.append(member)
    return best


class _Stacked:
    """One picture laid out as a stack of layers and the skeleton around it."""

    def __init__(self, picture: Picture, layers: list[str]):
        self.picture = picture
        self.layers = layers
        rows = picture.rows
        # element id -> its layer's index, for every element inside a layer
        self.layer_of: dict[str, int] = {}
        self.elements: list[list[str]] = []  # each layer's elements, in drawing order
        for i, layer in enumerate(layers):
            inside: list[str] = []
            todo = [layer]
            while todo:  # depth first, in drawing order
                element = todo.pop()
                inside.append(element)
                row = rows[element]
                if type(row) is ClusterRow:
                    todo += reversed(row.members)
            self.elements.append(inside)
            self.layer_of.update(dict.fromkeys(inside, i))
        # each layer's edges inside it, and the edges that cross into or out of the stack
        self.inner: list[list[EdgeRow]] = [[] for _ in layers]
        self.crossing: list[EdgeRow] = []
        self.outside: list[EdgeRow] = []
        for row in picture.edge_rows:
            tail, head = self.layer_of.get(row.tail), self.layer_of.get(row.head)
            if tail is not None and tail == head:
                self.inner[tail].append(row)
            elif tail is None and head is None:
                self.outside.append(row)
            else:
                self.crossing.append(row)

    # -- one layer ---------------------------------------------------------------------------

    def _layer(self, i: int, labels: bool = True) -> tuple[Picture, list[str]]:
        """Layer ``i`` as a picture of its own named by position (nodes ``e0``, ``e1``...,
        clusters ``cluster:e0``...; ports ``in0``, ``out0``...), and the id of the crossing
        edge each of its port edges (``p1``, ``p2``...) is a piece of. Without ``labels`` the
        digits of its labels are 0s: equal texts lay out alike."""
        rows = self.picture.rows
        local: dict[str, str] = {}
        for j, element in enumerate(self.elements[i]):
            cluster = type(rows[element]) is ClusterRow
            local[element] = f"cluster:e{j}" if cluster else f"e{j}"

        def text(value: str) -> str:
            return value if labels else _DIGITS.sub("0", value)

        made: dict[str, NodeRow | ClusterRow] = {}
        for element in self.elements[i]:
            row = rows[element]
            parent = local.get(row.cluster) if element != self.layers[i] else None
            label = text(row.label)
            if type(row) is NodeRow:
                made[local[element]] = row._replace(
                    id=local[element],
                    node=None,
                    calls=(),
                    label=label,
                    tooltip="",
                    cluster=parent,
                    members=(),
                )
            else:
                members = tuple(local[m] for m in row.members)
                made[local[element]] = row._replace(
                    id=local[element], label=label, tooltip="", cluster=parent, members=members
                )
        edges = [
            EdgeRow(f"x{j}", local[row.tail], local[row.head], row.path, row.mark)
            for j, row in enumerate(self.inner[i])
        ]
        # ports: where an edge from outside comes in (one per element it comes from), and
        # where one leaves (one per element it leaves from; at the bottom)
        ports: dict[tuple[str, str], str] = {}
        port_edges: list[str] = []
        ins, outs = 0, 0
        for edge in self.crossing:
            if self.layer_of.get(edge.head) == i:
                port = ports.get(("in", edge.tail))
                if port is None:
                    port = ports[("in", edge.tail)] = f"in{ins}"
                    ins += 1
                    made[port] = _port(port)
                port_edges.append(edge.id)
                edges.append(EdgeRow(f"p{len(port_edges)}", port, local[edge.head], "", edge.mark))
            if self.layer_of.get(edge.tail) == i:
                port = ports.get(("out", edge.tail))
                if port is None:
                    port = ports[("out", edge.tail)] = f"out{outs}"
                    outs += 1
                    made[port] = _port(port, EXIT)
                port_edges.append(edge.id)
                piece = EdgeRow(f"p{len(port_edges)}", local[edge.tail], port, edge.path, edge.mark)
                edges.append(piece)
        # the ports after the layer, in the order the edges meet them (dot's first order)
        top = (local[self.layers[i]], *ports.values())
        return Picture("layer", top, made, tuple(edges)), port_edges

    # -- the skeleton ------------------------------------------------------------------------

    def _skeleton(self) -> Picture:
        """The picture with the stack as one placeholder (sized by :class:`Placed`); the edges
        into and out of the stack go to and from the placeholder, one per element outside (ids
        ``stack:in:`` / ``stack:out:`` and the element's id)."""
        picture = self.picture
        rows = picture.rows
        first = self.layers[0]
        container = rows[first].cluster

        def without_stack(members: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(
                _HOLDER if m == first else m
                for m in members
                if m == first or m not in self.layer_of
            )

        made: dict[str, NodeRow | ClusterRow] = {}
        order: list[str] = []  # the nodes outside the stack, in drawing order

        def place(element: str) -> None:
            if element == _HOLDER:
                made[_HOLDER] = NodeRow(_HOLDER, "placeholder", None, (), (), "", "", container, ())
                order.append(_HOLDER)
                return
            row = rows[element]
            if type(row) is NodeRow:
                made[element] = row
                order.append(element)
                return
            made[element] = (
                row if element != container else row._replace(members=without_stack(row.members))
            )
            for member in made[element].members:
                place(member)

        top = picture.top if container is not None else without_stack(picture.top)
        for element in top:
            place(element)
        edges = list(self.outside)
        # What neither feeds the stack nor reads it (a value the layers share without edges,
        # the rotary tables; an unused input) is drawn above it, not beside it.
        heads: dict[str, list[str]] = {}
        tails: dict[str, list[str]] = {}
        for edge in self.outside:
            heads.setdefault(edge.tail, []).append(edge.head)
            tails.setdefault(edge.head, []).append(edge.tail)
        for edge in self.crossing:
            if edge.tail not in self.layer_of:
                heads.setdefault(edge.tail, []).append(_HOLDER)
                tails.setdefault(_HOLDER, []).append(edge.tail)
            if edge.head not in self.layer_of:
                tails.setdefault(edge.head, []).append(_HOLDER)
                heads.setdefault(_HOLDER, []).append(edge.head)
        linked = reached([_HOLDER], heads) | reached([_HOLDER], tails)
        edges += [
            EdgeRow(f"stack:above:{element}", element, _HOLDER, "", HIDDEN)
            for element in order
            if element not in linked and not heads.get(element)
        ]
        seen = set()
        for edge in self.crossing:
            if edge.tail not in self.layer_of:  # into the stack: at the top of the placeholder
                piece = EdgeRow("stack:in:" + edge.tail, edge.tail, _HOLDER, edge.path, edge.mark)
            elif edge.head not in self.layer_of:  # out of it: from its bottom
                piece = EdgeRow("stack:out:" + edge.head, _HOLDER, edge.head, "", edge.mark)
            else:
                continue
            if piece.id not in seen:
                seen.add(piece.id)
                edges.append(piece)
        return Picture(
            picture.name, tuple(top), made, tuple(edges), overlay=picture.overlay, heat=picture.heat
        )

    # -- putting it together -----------------------------------------------------------------

    def draw(self, format: str) -> bytes:
        layers = self.layers
        rows = self.picture.rows
        step = "laying out the layers"
        try:
            # one layout per distinct layer (its text with the digits of its labels as 0s)
            groups: dict[str, list[int]] = {}
            port_edges: list[list[str]] = []
            for i in range(len(layers)):
                part, edges = self._layer(i, labels=False)
                groups.setdefault(part.to_dot(), []).append(i)
                port_edges.append(edges)
            representatives = [members[-1] for members in groups.values()]
            texts = [self._layer(i)[0].to_dot() for i in representatives]
            laid_layers = graphviz.run(texts, ["-Tjson0"])
            layout_of: dict[int, dict] = {}
            for members, out in zip(groups.values(), laid_layers):
                step = f"reading the layout of layer {rows[layers[members[-1]]].call}"
                layout_of.update(dict.fromkeys(members, _read(out)))
            step = "sizing the stack"
            sizes = [_size(layout_of[i]["bb"]) for i in range(len(layers))]
            # room for each layer centred on its own box, ports and all
            width = 2 * max(_half_width(layout_of[i]) for i in range(len(layers))) + 2 * _GAP
            height = sum(h for _, h in sizes) + _GAP * (len(sizes) + 1)
            step = "laying out the picture around the stack"
            skeleton_text = self._skeleton().to_dot(Placed({_HOLDER: (width, height)}))
            (skeleton,) = [_read(out) for out in graphviz.run([skeleton_text], ["-Tjson0"])]
            step = "placing the layers and joining the edges between them"
            placed = self._place(skeleton, layout_of, port_edges)
        except (KeyError, IndexError, ValueError) as error:
            first, last = rows[layers[0]].call, rows[layers[-1]].call
            raise RenderError(
                f"drawing {self.picture.name!r} with its {len(layers)} layers {first} … {last} "
                f"laid out one at a time failed while {step} ({type(error).__name__}: {error}). "
                "Draw fewer of them open (collapse=), or lay out the text of gs.to_dot(...) "
                "with `dot -Tsvg`."
            ) from error
        (output,) = graphviz.run([self.picture.to_dot(placed)], ["-n2", f"-T{format}"], "neato")
        return output

    def _place(
        self, skeleton: dict, layout_of: Mapping[int, dict], port_edges: list[list[str]]
    ) -> Placed:
        """Where every element of the picture goes: the skeleton's layout, each layer's moved
        into the placeholder, the edges that cross between parts joined up. Raises KeyError
        or ValueError on a layout it cannot read."""
        placed = Placed()
        placed.bb = skeleton["bb"]
        placed.lp = skeleton.get("lp")
        holder = skeleton["objects_by_name"][_HOLDER]
        cx, cy = _point(holder["pos"])
        top = cy + float(holder["height"]) * 36 - _GAP
        for element, obj in skeleton["objects_by_id"].items():
            if "bb" in obj:
                placed.clusters[element] = (obj["bb"], obj.get("lp"))
            elif "pos" in obj:
                placed.nodes[element] = obj["pos"]
        for edge in skeleton["edges"]:
            edge_id = edge.get("id", "")
            if edge_id and not edge_id.startswith(_HOLDER):  # (pieces reaching the stack)
                placed.edges[edge_id] = (edge["pos"], edge.get("tail_lp"))
        # the layers, one under the other, centred in the placeholder
        pieces: dict[tuple[str, int], list[str]] = {}  # (edge id, layer) -> its spline there
        for i in range(len(self.layers)):
            laid = layout_of[i]
            _, y0, _, y1 = (float(v) for v in laid["bb"].split(","))
            # the layers' own boxes in one column (their ports stick out to either side)
            left, _, right, _ = (
                float(v) for v in laid["objects_by_name"]["cluster:e0"]["bb"].split(",")
            )
            dx, dy = cx - (left + right) / 2, top - y1
            top -= (y1 - y0) + _GAP
            local = {f"e{j}": element for j, element in enumerate(self.elements[i])}
            for name, obj in laid["objects_by_name"].items():
                if name.startswith("cluster:"):
                    element = local.get(name[8:])
                    if element is not None:
                        placed.clusters[element] = (
                            _moved_box(obj["bb"], dx, dy),
                            _moved(obj["lp"], dx, dy) if "lp" in obj else None,
                        )
                elif name in local:
                    placed.nodes[local[name]] = _moved(obj["pos"], dx, dy)
            for edge in laid["edges"]:
                edge_id = edge.get("id", "")
                pos = _moved(edge["pos"], dx, dy)
                tail_lp = _moved(edge["tail_lp"], dx, dy) if "tail_lp" in edge else None
                if edge_id.startswith("x"):
                    placed.edges[self.inner[i][int(edge_id[1:])].id] = (pos, tail_lp)
                elif edge_id.startswith("p"):
                    real = port_edges[i][int(edge_id[1:]) - 1]
                    pieces[(real, i)] = [pos, tail_lp]
        skeleton_edges = {e.get("id", ""): e for e in skeleton["edges"]}

        def piece(edge_id: str, layer: int | None, around: str) -> list:
            """The spline of one piece of a crossing edge: in a layer, or around the stack."""
            found = pieces.get((edge_id, layer)) if layer is not None else None
            if found is None and layer is None:
                laid = skeleton_edges.get(around)
                found = [laid["pos"], laid.get("tail_lp")] if laid is not None else None
            if found is None:
                where = f"layer {self.layers[layer]}" if layer is not None else "the skeleton"
                raise ValueError(f"no piece of edge {edge_id!r} in the layout of {where}")
            return found

        for edge in self.crossing:
            edge_id, tail, head = edge.id, edge.tail, edge.head
            tail_layer, head_layer = self.layer_of.get(tail), self.layer_of.get(head)
            # from outside (the skeleton's piece, then the layer's), to outside, or between two
            first = piece(edge_id, tail_layer, "stack:in:" + tail)
            second = piece(edge_id, head_layer, "stack:out:" + head)
            placed.edges[edge_id] = (_joined(first[0], second[0]), first[1])
        return placed


def _port(name: str, *style: str) -> NodeRow:
    """A port of a layer laid out on its own: where an edge enters it (or leaves it: EXIT)."""
    return NodeRow(name, "port", None, (), (), "", "", None, (), None, style)


# -- graphviz's numbers ------------------------------------------------------------------------


def _read(output: bytes) -> dict[str, Any]:
    """dot's ``-Tjson0`` output, with its objects by name and by id."""
    laid = json.loads(output)
    objects = laid.get("objects", [])
    laid["objects_by_name"] = {o["name"]: o for o in objects}
    laid["objects_by_id"] = {o["id"]: o for o in objects if "id" in o}
    laid.setdefault("edges", [])
    return laid


def _size(bb: str) -> tuple[float, float]:
    x0, y0, x1, y1 = (float(v) for v in bb.split(","))
    return x1 - x0, y1 - y0


def _half_width(laid: dict) -> float:
    """How far a layer's layout reaches to either side of the centre of its own box."""
    x0, _, x1, _ = (float(v) for v in laid["bb"].split(","))
    left, _, right, _ = (float(v) for v in laid["objects_by_name"]["cluster:e0"]["bb"].split(","))
    middle = (left + right) / 2
    return max(middle - x0, x1 - middle)


def _point(text: str) -> tuple[float, float]:
    x, y = text.split(",")[-2:]
    return float(x), float(y)


def _moved(pos: str, dx: float, dy: float) -> str:
    """A ``pos`` (a point, or a spline ``e,x,y x,y ...``) moved by (dx, dy)."""
    moved = []
    for token in pos.split():
        parts = token.split(",")
        prefix = parts[:-2]
        x, y = float(parts[-2]) + dx, float(parts[-1]) + dy
        moved.append(",".join([*prefix, f"{x:.2f}", f"{y:.2f}"]))
    return " ".join(moved)


def _moved_box(bb: str, dx: float, dy: float) -> str:
    x0, y0, x1, y1 = (float(v) for v in bb.split(","))
    return f"{x0 + dx:.2f},{y0 + dy:.2f},{x1 + dx:.2f},{y1 + dy:.2f}"


def _spline(pos: str) -> tuple[list[str], str | None]:
    """A spline's points, and its arrowhead's end (``e,x,y``) if it has one."""
    points, end = [], None
    for token in pos.split():
        if token.startswith("e,"):
            end = token
        elif not token.startswith("s,"):
            points.append(token)
    return points, end


def _joined(first: str, second: str) -> str:
    """Two splines joined by a curve from the end of the first to the start of the second;
    the arrowhead of the second."""
    a, _ = _spline(first)
    b, end = _spline(second)
    (x0, y0), (x1, y1) = _point(a[-1]), _point(b[0])
    bend = (y0 - y1) / 2
    joint = [f"{x0:.2f},{y0 - bend:.2f}", f"{x1:.2f},{y1 + bend:.2f}", b[0]]
    points = [*a, *joint, *b[1:]]
    return " ".join(([end] if end else []) + points)
