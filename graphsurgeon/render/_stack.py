"""A large picture laid out in parts: a stack of layers, one layer at a time.

graphviz's ``dot`` lays a graph out as a whole, and its time grows faster than the graph: an
80-layer decoder drawn fully open (3,700 nodes) takes seconds, and its layers drift apart on the
page. Model viewers lay such a model out per layer instead. So does :func:`stacked`, for a
picture whose clusters include a long run of open layers of one type that feed each other:

1. each layer with a structure of its own is laid out once (by ``dot``, as DOT text whose names
   are the layer's own positions, so that identical layers give identical text): usually the
   first layer (it reads the inputs) and the rest, or a few groups where the number of digits in
   the names changes the labels' widths;
2. the picture around the stack is laid out with the stack as one placeholder of its size
   (the skeleton);
3. the layers are placed one under the other inside the placeholder, the edges that cross
   between parts joined up, and the whole drawn by ``neato -n2`` at those positions, as one
   picture with every id, class, tooltip and label that ``dot`` would give it.

Identical layers look alike, and the stack is a straight column. Anything else is laid out by
``dot`` as usual (:func:`graphsurgeon.render.graphviz.layout` decides).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .picture import (
    _HEADER,
    ClusterRow,
    EdgeRow,
    NodeRow,
    Picture,
    Placed,
    _cluster_attributes,
    _dot_name,
    _edge_statement,
    _node_statement,
    _overlay_title,
    quote,
)

__all__ = ["stacked"]

# graphviz's runner: (texts, arguments, program) -> the outputs
Runner = Callable[[Sequence[str], Sequence[str], str], list[bytes]]

#: The fewest layers a stack has to be laid out in parts.
MIN_LAYERS = 8
#: The fewest drawn nodes a picture has to be laid out in parts (smaller ones are fast whole).
MIN_NODES = 1200
# Points between two layers of the stack, and around the stack in its placeholder.
_GAP = 18.0
_DIGITS = re.compile(r"[0-9]")


def stacked(picture: Picture, format: str, run: Runner) -> bytes | None:
    """``picture`` laid out in parts and drawn in ``format``, or None when it has no stack of
    layers worth it (then ``dot`` lays it out whole). ``run``: graphviz's runner
    (:func:`graphsurgeon.render.graphviz.run`)."""
    found = _stack(picture)
    if found is None:
        return None
    return _Stacked(picture, found[1], run).draw(format)


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

    def __init__(self, picture: Picture, layers: list[str], run: Runner):
        self.run = run
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

    def _layer_text(self, i: int, labels: bool = True) -> tuple[str, list[str]]:
        """Layer ``i`` as DOT text named by position (``e0``, ``e1``... ; ports ``in0``,
        ``out0``...), and the id of the crossing edge each of its port edges (``p1``, ``p2``
        ...) is a piece of. Without ``labels`` the digits of its labels are 0s: equal texts lay
        out alike."""
        rows = self.picture.rows
        local = {element: f"e{j}" for j, element in enumerate(self.elements[i])}
        lines = ["digraph layer {", _HEADER]

        def text(value: str) -> str:
            return value if labels else _DIGITS.sub("0", value)

        def lower(element: str, indent: str) -> None:
            row = rows[element]
            name = local[element]
            if type(row) is NodeRow:
                made = row._replace(id=name, label=text(row.label), tooltip="")
                lines.append(indent + _node_statement(made))
                return
            lines.append(f"{indent}subgraph {quote('cluster:' + name)} {{")
            made = row._replace(id=name, label=text(row.label), tooltip="")
            lines.extend(f"{indent}  {k}={v};" for k, v in _cluster_attributes(made))
            for member in row.members:
                lower(member, indent + "  ")
            lines.append(f"{indent}}}")

        lower(self.layers[i], "  ")
        for j, row in enumerate(self.inner[i]):
            edge = EdgeRow(f"x{j}", local[row.tail], local[row.head], row.path, row.mark)
            lines.append("  " + _edge_statement(edge))
        # ports: where an edge from outside comes in (one per element it comes from), and
        # where one leaves (one per element it leaves from; the outgoing ones at the bottom)
        ports: dict[tuple[str, str], str] = {}
        port_edges: list[str] = []
        ins, outs = [], []
        for edge in self.crossing:
            edge_id, tail, head, path, mark = edge.id, edge.tail, edge.head, edge.path, edge.mark
            if self.layer_of.get(head) == i:
                port = ports.setdefault(("in", tail), f"in{len(ins)}")
                if port == f"in{len(ins)}":
                    ins.append(port)
                port_edges.append(edge_id)
                statement = _edge_statement(
                    EdgeRow(f"p{len(port_edges)}", port, local[head], "", mark)
                )
                lines.append("  " + statement)
            if self.layer_of.get(tail) == i:
                port = ports.setdefault(("out", tail), f"out{len(outs)}")
                if port == f"out{len(outs)}":
                    outs.append(port)
                port_edges.append(edge_id)
                statement = _edge_statement(
                    EdgeRow(f"p{len(port_edges)}", local[tail], port, path, mark)
                )
                lines.append("  " + statement[:-2] + ", arrowhead=none];")
        point = ' [shape=point, width=0.02, height=0.02, style=invis, label=""];'
        lines += [f"  {quote(p)}{point}" for p in ins + outs]
        if outs:
            lines.append("  {rank=max; " + " ".join(f"{quote(p)};" for p in outs) + "}")
        lines.append("}")
        return "\n".join(lines) + "\n", port_edges

    # -- the skeleton ------------------------------------------------------------------------

    def _skeleton_text(self, width: float, height: float) -> str:
        """The picture with the stack as one placeholder of its size; the edges into and out of
        the stack go to and from the placeholder, one per element outside (ids ``stack:in:`` /
        ``stack:out:`` and the element's id)."""
        picture = self.picture
        rows = picture.rows
        lines = [f"digraph {quote(picture.name)} {{", _HEADER]
        if picture.heat is not None:
            lines.append(f"  label={quote(_overlay_title(picture.heat))}; labelloc=t; fontsize=11;")
        first = self.layers[0]
        placeholder = (
            f'  "stack:" [shape=box, fixedsize=true, width={width / 72:.4f}, '
            f'height={height / 72:.4f}, label="", style=invis];'
        )

        order: list[str] = []  # the nodes outside the stack, in drawing order

        def lower(element: str, indent: str) -> None:
            if element in self.layer_of:
                if element == first:
                    lines.append(indent + placeholder.strip())
                    order.append("stack:")
                return
            row = rows[element]
            if type(row) is NodeRow:
                lines.append(indent + _node_statement(row, picture._fill(element)))
                order.append(element)
                return
            lines.append(f"{indent}subgraph {quote('cluster:' + element)} {{")
            attributes = _cluster_attributes(row, neutral=picture.heat is not None)
            lines.extend(f"{indent}  {k}={v};" for k, v in attributes)
            for member in row.members:
                lower(member, indent + "  ")
            lines.append(f"{indent}}}")

        for element in picture.top:
            lower(element, "  ")
        lines += ["  " + _edge_statement(row) for row in self.outside]
        # What neither feeds the stack nor reads it (a value the layers share without edges,
        # the rotary tables; an unused input) is drawn above it, not beside it.
        heads: dict[str, list[str]] = {}
        tails: dict[str, list[str]] = {}
        for edge in self.outside:
            heads.setdefault(edge.tail, []).append(edge.head)
            tails.setdefault(edge.head, []).append(edge.tail)
        for edge in self.crossing:
            tail, head = edge.tail, edge.head
            if tail not in self.layer_of:
                heads.setdefault(tail, []).append("stack:")
                tails.setdefault("stack:", []).append(tail)
            if head not in self.layer_of:
                tails.setdefault(head, []).append("stack:")
                heads.setdefault("stack:", []).append(head)
        linked = _reached("stack:", heads) | _reached("stack:", tails)
        for element in order:
            if element not in linked and not heads.get(element):
                lines.append(f'  {quote(_dot_name(element))} -> "stack:" [style=invis];')
        seen = set()
        for edge in self.crossing:
            tail, head, path, mark = edge.tail, edge.head, edge.path, edge.mark
            if tail not in self.layer_of:
                key = ("stack:in:" + tail, tail, "stack:", path)
            elif head not in self.layer_of:
                key = ("stack:out:" + head, "stack:", head, "")
            else:
                continue
            if key[0] in seen:
                continue
            seen.add(key[0])
            statement = _edge_statement(EdgeRow(*key, mark))
            if key[1] != "stack:":  # into the stack: at the top of the placeholder
                statement = statement[:-2] + ", arrowhead=none, headport=n];"
            else:  # out of it: from its bottom
                statement = statement[:-2] + ", tailport=s];"
            lines.append("  " + statement)
        lines.append("}")
        return "\n".join(lines) + "\n"

    # -- putting it together -----------------------------------------------------------------

    def draw(self, format: str) -> bytes | None:
        # one layout per distinct layer (its text with the digits of its labels as 0s)
        groups: dict[str, list[int]] = {}
        port_edges: list[list[str]] = []
        for i in range(len(self.layers)):
            text, edges = self._layer_text(i, labels=False)
            groups.setdefault(text, []).append(i)
            port_edges.append(edges)
        representatives = [members[-1] for members in groups.values()]
        texts = [self._layer_text(i)[0] for i in representatives]
        laid_layers = [_read(out) for out in self.run(texts, ["-Tjson0"])]
        layout_of: dict[int, dict] = {}
        for members, laid in zip(groups.values(), laid_layers):
            layout_of.update(dict.fromkeys(members, laid))
        sizes = [_size(layout_of[i]["bb"]) for i in range(len(self.layers))]
        # room for each layer centred on its own box, ports and all
        width = 2 * max(_half_width(layout_of[i]) for i in range(len(self.layers))) + 2 * _GAP
        height = sum(h for _, h in sizes) + _GAP * (len(sizes) + 1)
        skeleton_text = self._skeleton_text(width, height)
        (skeleton,) = [_read(out) for out in self.run([skeleton_text], ["-Tjson0"])]
        placed = self._place(skeleton, layout_of, port_edges)
        if placed is None:
            return None
        (output,) = self.run([self.picture._dot(placed)], ["-n2", f"-T{format}"], "neato")
        return output

    def _place(
        self, skeleton: dict, layout_of: Mapping[int, dict], port_edges: list[list[str]]
    ) -> Placed | None:
        placed = Placed()
        placed.bb = skeleton["bb"]
        placed.lp = skeleton.get("lp")
        holder = skeleton["objects_by_name"].get("stack:")
        if holder is None:
            return None
        cx, cy = _point(holder["pos"])
        top = cy + float(holder["height"]) * 36 - _GAP
        for element, obj in skeleton["objects_by_id"].items():
            if "bb" in obj:
                placed.clusters[element] = (obj["bb"], obj.get("lp"))
            elif "pos" in obj:
                placed.nodes[element] = obj["pos"]
        for edge in skeleton["edges"]:
            edge_id = edge.get("id", "")
            if edge_id and not edge_id.startswith("stack:"):  # (invisible ones have none)
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
        for edge in self.crossing:
            edge_id, tail, head = edge.id, edge.tail, edge.head
            tail_layer, head_layer = self.layer_of.get(tail), self.layer_of.get(head)
            if tail_layer is None:  # from outside: the skeleton's piece, then the layer's
                first = skeleton_edges.get("stack:in:" + tail)
                second = pieces.get((edge_id, head_layer))
                if first is None or second is None:
                    return None
                placed.edges[edge_id] = (_joined(first["pos"], second[0]), first.get("tail_lp"))
            elif head_layer is None:  # to outside: the layer's piece, then the skeleton's
                first = pieces.get((edge_id, tail_layer))
                second = skeleton_edges.get("stack:out:" + head)
                if first is None or second is None:
                    return None
                placed.edges[edge_id] = (_joined(first[0], second["pos"]), first[1])
            else:  # from one layer to another
                first, second = pieces.get((edge_id, tail_layer)), pieces.get((edge_id, head_layer))
                if first is None or second is None:
                    return None
                placed.edges[edge_id] = (_joined(first[0], second[0]), first[1])
        return placed


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


def _reached(start: str, links: Mapping[str, list[str]]) -> set[str]:
    """Every name reached from ``start`` along ``links``, ``start`` included."""
    seen, todo = {start}, [start]
    while todo:
        for name in links.get(todo.pop(), ()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


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
