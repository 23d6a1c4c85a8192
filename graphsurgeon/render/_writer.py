"""The writer: a scene and its collapse plan -> a semantic :class:`~.picture.Picture`.

Each cluster, node, box and edge is decided here: its id, its kind, what it stands for (the fx
node, the module calls), its classes, label and tooltip, and its style tokens (the module whose
colour fills it, highlighted, removed, added, fused, a swapped module's boundary). Nothing here
is DOT: :meth:`~.picture.Picture.to_dot` lowers the records, and owns every DOT style.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from .. import _meta
from .._derived import cached
from ..display import TOOLTIP_NAME_LIMIT, id_text, name_of_id_text, shown
from ..errors import GraphSurgeonError
from ..partition import Partition, program_index, split_call_name
from ._scene import (
    _BUFFER,
    _CONSTANT,
    _INPUT,
    _OUTPUT,
    _PARAMETER,
    _SWAPPED,
    ALL_OPS,
    OPS_PREFIX,
    _Marks,
    _Program,
    _Scene,
    _Vertex,
    ops_key,
)
from .picture import (
    ADDED,
    FUSED,
    HIGHLIGHTED,
    REMOVED,
    SIDE,
    SWAPPED_BOUNDARY,
    ClusterRow,
    EdgeRow,
    NodeRow,
    Picture,
)

__all__ = ["call_signature"]


# -- labels ------------------------------------------------------------------------------


def _value(node: Node, dims: Mapping[str, str] | None = None) -> str:
    """What a node computes, as every view writes it (``f32[batch, 16]``)."""
    return _meta.node_value_text(node, dims)


def _numel(node: Node) -> int:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return 0
    count = value.numel()
    if type(count) is int:  # static sizes: one call
        return count
    try:
        return math.prod(int(d) for d in value.shape)
    except (TypeError, ValueError):  # a symbolic size
        return 0


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def _relative(target: str, chain: tuple[str, ...]) -> str:
    """``layers.0.attn.q.weight`` seen from inside ``layers.0.attn.q``: ``weight``."""
    fqn = split_call_name(chain[-1])[0] if chain else ""
    if fqn and _meta.inside(target, fqn, strictly=True):
        return target[len(fqn) + 1 :]
    return target


def _lines(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def call_signature(part: Partition, replacement: Any, ep: ExportedProgram) -> str:
    """``(x: f32[1, 16, 64]) → f32[1, 16, 64]``: the call as the program makes it, its
    positional arguments named as the replacement's forward names them ('' when the call's
    signature was not preserved)."""
    if part.signature is None:
        return ""
    index = program_index(ep)
    if part.call_name not in index.signatures:  # a region of ops: its call as its pattern's
        return part.call_text or ""
    return index.call_text(part.call_name, module=replacement, wrap=48)


# -- what the writer looks up ------------------------------------------------------------------


class _Context:
    """What the writer looks up about the program: targets, parameters, partitions.

    Made for every picture; what it reads is the program's, worked out once per program
    (:func:`_lookups`): a view that opens one layer does not read every node again."""

    def __init__(
        self, program: _Program, state: Mapping[str, tuple[str, str]], root_type: str = ""
    ):
        self.program = program
        self.info = program.info
        self.root_name = root_type.rsplit(".", 1)[-1] or "program"  # the model's type
        lookups = _lookups(program.ep, state)
        self.targets: Mapping[str, str] = lookups.targets
        self.nodes: Mapping[str, Node] = lookups.nodes  # (read only, here and in the writer)
        self.dims: Mapping[str, str] = lookups.dims
        self.placeholders: Mapping[str, Node] = lookups.placeholders
        # fx nodes by name, of both programs: the result's copies have the same meta (not
        # kept with the result: its nodes would keep it alive)
        if program.module is not None:
            originals = self.nodes
            self.nodes = {**originals, **{n.name: n for n in program.module.graph.nodes}}
            for call in program.fused:  # drawn as the original nodes it runs
                for name in self.info.partitions[call].nodes:
                    if name in originals:
                        self.nodes[name] = originals[name]
        self._partitions: Mapping[str, Partition] | None = None
        self._numel = lookups.numel

    def numel(self, parameters: Iterable[str]) -> int:
        """Elements in the named parameters (every module's tooltip counts its own)."""
        total = 0
        for name in parameters:
            count = self._numel.get(name)
            if count is None:
                node = self.placeholders.get(name)
                count = self._numel[name] = _numel(node) if node is not None else 0
            total += count
        return total

    def partitions(self) -> Mapping[str, Partition]:
        if self._partitions is None:
            try:
                self._partitions = program_index(self.program.ep).partitions()
            except GraphSurgeonError:  # a program whose structure the engine cannot read
                self._partitions = {}
        return self._partitions

    def replacement(self, call: str) -> Any:
        return self.info.calls.get(call) if self.info is not None else None


class _Lookups:
    """What a picture of a program looks up about it, kept with the program: parameter
    targets, fx nodes by name, the user's dynamic size names, the state placeholders, and
    parameters' element counts (filled as asked)."""

    def __init__(self, ep: ExportedProgram, state: Mapping[str, tuple[str, str]]):
        self.targets = {name: target for name, (_, target) in state.items()}
        try:  # the program's index: its nodes by name, its dynamic sizes by the user's Dims
            index = program_index(ep)
            self.nodes: dict[str, Node] = index.by_name
            self.dims: Mapping[str, str] = index.dims
        except GraphSurgeonError:
            self.nodes = {n.name: n for n in ep.graph.nodes}
            self.dims = {}
        self.placeholders = {n: self.nodes[n] for n in state if n in self.nodes}
        self.numel: dict[str, int] = {}


def _lookups(ep: ExportedProgram, state: Mapping[str, tuple[str, str]]) -> _Lookups:
    """The :class:`_Lookups` of ``ep``, made once: kept in its record
    (:mod:`graphsurgeon._derived`)."""
    return cached(ep, "render lookups", lambda: _Lookups(ep, state))


# -- the writer ----------------------------------------------------------------------------


class _Writer:
    """Decides one picture's elements: nested clusters, nodes, boxes and edges, each with its
    id, what it stands for, its classes, label, tooltip and style tokens (the rows of a
    :class:`~.picture.Picture`)."""

    def __init__(
        self,
        scene: _Scene,
        open_: set[str],
        runs: dict[str, list[str]],
        marks: _Marks,
        context: _Context,
        prefix: str = "",
        extra_edges: Iterable[tuple[str, str, str]] = (),
        values: Any = None,
    ):
        self.scene = scene
        # an overlay's values (graphsurgeon.checks.overlay.OverlayValues), or None
        self.values = values
        self.overlay: dict[str, float] = {}  # element id -> its value
        self.calls = scene.calls
        self.open = open_
        self.runs = runs
        self.run_of = {member: first for first, members in runs.items() for member in members}
        self.marks = marks
        self.context = context
        self.prefix = prefix
        self.extra_edges = list(extra_edges)
        self.vertices = scene.by_name
        self.nodes = context.nodes
        # the picture's parts, as the rows a Picture keeps
        self.rows: dict[str, NodeRow | ClusterRow | tuple] = {}
        self.top: list[str] = []  # ids at this picture's top level, in order
        self.edges: list[EdgeRow] = []
        self.box_nodes: dict[str, list[str]] = {}  # box -> the fx nodes collapsed into it
        # each call's tooltip and parameter count: the same in every picture of the scene
        self._tooltips: dict[str, str] = scene.memo("module tooltips")
        self._numels: dict[str, int] = scene.memo("call numels")
        # vertex name -> the node it is drawn as (its name: prefix + fx name, or a box's id)
        self.refs: dict[str, str] = {}
        self.plain: set[str] = set()  # the refs that are a node of its own (not a box)
        self.boxes: list[str] = []  # calls drawn as boxes
        self.clusters: list[str] = []  # calls drawn as clusters
        self.folded_ops: list[str] = []  # calls ("" the root) whose own ops are one box
        self.removed_boxes: set[str] = set()  # boxes holding only removed nodes
        self.fanout: dict[str, int] = {}  # drawn node -> users, for values shared by many
        self.shared: dict[str, list[str]] = {}  # drawn node -> the shared values it uses
        self.drawn = 0

    # -- clusters ----------------------------------------------------------------------

    def write(self) -> None:
        """Decide every element; they are then in ``rows``, ``top`` and ``edges``."""
        members: dict[str, list[tuple[str, str]]] = {"": []}  # container -> what is in it
        seen: set[str] = set()
        box_status: dict[str, bool] = {}  # box -> every node in it removed
        removed = self.marks.status
        ops_owner = {} if ALL_OPS in self.open else self.scene.ops_owner
        vertices = self.scene.vertices
        box_nodes, refs = self.box_nodes, self.refs
        # chain -> (the container its vertices are drawn in, the box they are in and its ref, or
        # None, and the depth of the box's call in the chain): the vertices of one chain (the
        # index shares one tuple among them) go to the same place
        placed: dict[int, tuple[str, str | None, str | None, int]] = {}
        # what the edges are read from, in vertex order: the inputs from outside a box, or a
        # (start, stop) of vertices drawn in no box (every input)
        self._inputs: list[Any] = []
        scene = self.scene
        segments, spans = scene.segments, scene.spans
        i = 0
        while i < len(segments):
            chain, start, stop = segments[i]
            found = placed.get(id(chain))
            if found is None:
                container, box, depth = "", None, 0
                for at, name in enumerate(chain):
                    if name not in self.open:
                        box, depth = self.run_of.get(name, name), at
                        if box not in seen:
                            seen.add(box)
                            members[container].append(("box", box))
                        break
                    if name not in seen:
                        seen.add(name)
                        members[container].append(("cluster", name))
                        members[name] = []
                    container = name
                ref = self._box_ref(box) if box is not None else None
                found = placed[id(chain)] = (container, box, ref, depth)
            container, box, ref, depth = found
            if box is not None:
                # in a box: the call's vertices placed at once (a layer is one stretch of
                # them), else this segment's
                call = chain[depth]
                if spans.get(call, (None,))[0] == i:
                    names, inputs = scene.span(call, depth)
                    i = spans[call][1]
                else:
                    names = [v.name for v in vertices[start:stop]]
                    inputs = scene.crossing(i, depth)
                    i += 1
                is_removed = all(removed.get(n) == "removed" for n in names) if removed else False
                box_status[box] = box_status.get(box, True) and is_removed
                box_nodes.setdefault(box, []).extend(names)
                refs.update(dict.fromkeys(names, ref))
                self._inputs.append(inputs)
                continue
            i += 1
            self._inputs.append((start, stop))
            for vertex in vertices[start:stop]:
                owner = ops_owner.get(vertex.name)
                if owner is not None and ops_key(owner) not in self.open:
                    ref = self._ops_ref(owner)
                    if ref not in box_nodes:
                        members[container].append(("ops", owner))
                    box_nodes.setdefault(ref, []).append(vertex.name)
                else:
                    ref = self.prefix + id_text(vertex.name)
                    members[container].append(("vertex", vertex.name))
                    self.plain.add(ref)
                refs[vertex.name] = ref
        self.removed_boxes = {box for box, all_removed in box_status.items() if all_removed}
        edges = self._collect_edges()
        self.top = self._container("", members, None)
        self._edge_elements(edges)

    def _container(self, name: str, members: dict, parent: str | None) -> list[str]:
        """The ids of what is drawn directly in container ``name``, each element made."""
        ids = []
        for what, key in members[name]:
            if what == "vertex":
                ids.append(self._vertex(self.vertices[key], parent))
            elif what == "box":
                ids.append(self._box(key, parent))
            elif what == "ops":
                ids.append(self._ops_box(key, parent))
            elif self._inline(key, members[key]):
                ids.append(self._vertex(self.vertices[members[key][0][1]], parent, module=key))
            else:
                ids.append(self._cluster(key, members, parent))
        return ids

    def _inline(self, name: str, inside: list[tuple[str, str]]) -> bool:
        """A module call holding one node and nothing else is drawn as that node."""
        return (
            len(inside) == 1
            and inside[0][0] == "vertex"
            and not self.calls[name].children
            and name not in self.marks.boundaries
            and name not in self.marks.fused  # its cluster says it is fused
        )

    def _cluster(self, name: str, members: dict, parent: str | None) -> str:
        title = self._module_title(name)
        classes = ["module"]
        style = []
        if name in self.marks.boundaries:
            replacement = self.context.replacement(name)
            title += f" → {shown(type(replacement).__name__)}"
            classes.append("swapped-boundary")
            style.append(SWAPPED_BOUNDARY)
        if name in self.marks.fused:
            title += " (fused)"
            classes.append("fused")
            style.append(FUSED)
        if name in self.marks.highlighted:
            classes.append("highlighted")
            style.append(HIGHLIGHTED)
        cluster_id = f"{self.prefix}cluster:{id_text(name)}"
        tooltip = self._module_tooltip(name)
        if self.values is not None:  # its members carry the values; it says theirs together
            value = self.values.calls.get(name)
            if value is not None:
                tooltip += "\n" + self.values.describe(value)
        self.clusters.append(name)
        self.rows[cluster_id] = ()  # its place in drawing order: before its members
        inside = self._container(name, members, cluster_id)
        self.rows[cluster_id] = ClusterRow(
            cluster_id,
            name,
            tuple(classes),
            title,
            tooltip,
            parent,
            tuple(inside),
            self._color_of(name),
            tuple(style),
        )
        return cluster_id

    # -- nodes -------------------------------------------------------------------------

    def _vertex(self, vertex: _Vertex, parent: str | None, module: str | None = None) -> str:
        self.drawn += 1
        kind = vertex.kind
        status = self.marks.status.get(vertex.name, "")
        highlighted = (module is not None and module in self.marks.highlighted) or (
            vertex.name in self.marks.highlighted_vertices
        )
        local = id_text(vertex.name)  # an fx name: itself
        label, tooltip = self._text(vertex)
        sharing = self._sharing(self.prefix + local)
        if sharing:
            label = f"{label}\n{sharing}"
        classes = [kind]
        style = []
        color = None
        if module is not None:
            classes.append("module")
            label = f"{self._module_title(module)}\n{label}"
            tooltip = f"{self._module_tooltip(module)}\n\n{tooltip}"
            color = self._color_of(module)
        if highlighted:
            classes.append("highlighted")
            style.append(HIGHLIGHTED)
        if status == "removed":
            classes.append("removed")
            style.append(REMOVED)
        elif status == "added":
            classes.append("added")
            style.append(ADDED)
            label = "+ " + label
        node_id = f"{self.prefix}node:{local}"
        calls = (module,) if module is not None else ()
        if self.values is not None:
            tooltip = self._valued(node_id, tooltip, [vertex.name], [])
        self.rows[node_id] = NodeRow(
            node_id,
            kind,
            vertex.name,
            calls,
            tuple(classes),
            label,
            tooltip,
            parent,
            (),
            color,
            tuple(style),
        )
        return node_id

    def _text(self, vertex: _Vertex) -> tuple[str, str]:
        """(label, tooltip) of a node; written once per graph and way of drawing it (the next
        picture of the graph, another view in the widget, reads them back)."""
        if vertex.kind == _SWAPPED:
            return self._swapped_text(vertex)
        texts = self.scene.memo("texts")
        key = (
            vertex.name,
            vertex.chain,
            tuple(vertex.params),
            tuple(vertex.buffers),
            self.scene.show_parameters,
        )
        found = texts.get(key)
        if found is None:
            found = texts[key] = self._written_text(vertex)
        return found

    def _written_text(self, vertex: _Vertex) -> tuple[str, str]:
        node, kind = self.nodes[vertex.name], vertex.kind
        value = _value(node, self.context.dims)
        if kind == _INPUT:
            return _lines(node.name, value), _lines(f"{node.name}: input of the program", value)
        if kind == _OUTPUT:
            return "output", "output of the program"
        if kind in (_BUFFER, _CONSTANT, _PARAMETER):
            target = self.context.targets.get(vertex.name, vertex.name)
            label = _lines(shown(target), value)
            return label, _lines(f"{node.name}: {kind} {shown(target, TOOLTIP_NAME_LIMIT)}", value)
        # (written out rather than by _lines: this runs for every node of a picture)
        label = _meta.op_text(node)
        tooltip = f"{node.name} = {_meta.op_text(node, 'full')}"
        # the op, and the arguments the picture's edges cannot show (scale, dims, a mask)
        arguments = _meta.arguments_text(node, state=self.context.targets)
        if arguments:
            tooltip += "\n" + arguments
        if value:
            label += "\n" + value
            tooltip += "\n" + value
        folded = vertex.params + vertex.buffers
        if folded and not self.scene.show_parameters:
            targets = [self.context.targets.get(p, p) for p in folded]
            names = [shown(_relative(t, vertex.chain)) for t in targets]
            label += "\n+ " + _meta.shorten(", ".join(names), 40)
            for i, (name, target) in enumerate(zip(folded, targets)):
                state = self.context.placeholders.get(name)
                described = _value(state, self.context.dims) if state is not None else ""
                what = "parameter" if i < len(vertex.params) else "buffer"
                tooltip += f"\n{what} {shown(target, TOOLTIP_NAME_LIMIT)} {described}".rstrip()
        source = _meta.source_text(node)
        return label, f"{tooltip}\n{source}" if source else tooltip

    def _swapped_text(self, vertex: _Vertex) -> tuple[str, str]:
        call = vertex.swap_call
        replacement = self.context.replacement(call)
        info = self.context.info
        part = info.partitions.get(call) if info is not None else None
        kind = type(replacement)
        signature = call_signature(part, replacement, self.context.program.ep) if part else ""
        label = _lines(f"{shown(call)}: swapped", shown(kind.__name__), signature)
        shown_call = shown(call, TOOLTIP_NAME_LIMIT)
        tooltip = f"{vertex.name}: {shown_call} runs {kind.__module__}.{kind.__qualname__}"
        if part is not None:
            tooltip += f"\nin place of {len(part.nodes)} nodes of {part.type_name}"
        return label, tooltip

    def _box(self, first: str, parent: str | None) -> str:
        self.drawn += 1
        members = self.runs.get(first, [first])
        self.boxes += members
        calls = [self.calls[m] for m in members]
        highlighted = any(m in self.marks.highlighted for m in members)
        nodes = sum(c.nodes for c in calls)
        if len(calls) == 1:
            numel = self._call_numel(first)
        else:
            numel = self.context.numel(set().union(*(c.params for c in calls)))
        counts = _plural(nodes, "node") + (f" · {_meta.count_text(numel)} params" if numel else "")
        if len(members) > 1:
            first_name, last_name = shown(members[0]), shown(members[-1])
            title = f"{first_name} … {last_name}: {self._type_name(first)} × {len(members)}"
            tooltip = f"{len(members)} calls of {calls[0].type}, collapsed\n{counts}"
        else:
            title = self._module_title(first)
            tooltip = f"{self._module_tooltip(first)}\ncollapsed"
        ref = self._box_ref(first)
        removed = first in self.removed_boxes
        fused = len(members) == 1 and first in self.marks.fused
        if fused:
            title += " (fused)"
            tooltip += "\nfused: one call of a GraphModule of these nodes; opens into them"
        # a box says what reads it in its label; what it reads of values shared by many, in
        # its tooltip: a stack of layers is one line shorter a layer
        label = _lines(title, counts, self._sharing(ref, reads=False))
        tooltip = _lines(tooltip, self._sharing(ref, users=False))
        if self.values is not None:
            tooltip = self._valued(ref, tooltip, self.box_nodes.get(first, ()), members)
        classes = ["module", "collapsed"]
        style = []
        for token, on in ((FUSED, fused), (HIGHLIGHTED, highlighted), (REMOVED, removed)):
            if on:
                classes.append(token)
                style.append(token)
        self.rows[ref] = NodeRow(
            ref,
            "box",
            None,
            tuple(members),
            tuple(classes),
            label,
            tooltip,
            parent,
            tuple(self.box_nodes.get(first, ())),
            self._color_of(first),
            tuple(style),
        )
        return ref

    def _valued(
        self, element_id: str, tooltip: str, nodes: Iterable[str], calls: Iterable[str]
    ) -> str:
        """Give an element its overlay value (its node's, or the aggregate of the calls it
        draws, else of the calls inside them, else of its fx nodes) and say it in its
        tooltip."""
        values = self.values
        calls = list(calls)
        given = [values.calls[c] for c in calls if c in values.calls]
        if not given and calls:  # values given for calls inside it only
            given = [v for c, v in values.calls.items() if self._inside(c, calls)]
        if not given and values.aggregate is not None:
            given = [values.nodes[n] for n in nodes if n in values.nodes]
        value = values.combine(given)
        if value is None:
            return tooltip
        self.overlay[element_id] = value
        return f"{tooltip}\n{values.describe(value)}"

    def _inside(self, call: str, outer: list[str]) -> bool:
        """Whether ``call`` is inside one of the calls ``outer``."""
        info = self.calls.get(call)
        parent = info.parent if info is not None else ""
        while parent:
            if parent in outer:
                return True
            parent = self.calls[parent].parent
        return False

    def _ops_ref(self, owner: str) -> str:
        return f"{self.prefix}{OPS_PREFIX}{id_text(owner)}"

    def _ops_box(self, owner: str, parent: str | None) -> str:
        """The box of the ops a module call runs in its own forward from the program's inputs
        alone (mask and position building): ``LlamaModel: 45 ops``."""
        self.drawn += 1
        self.folded_ops.append(owner)
        ref = self._ops_ref(owner)
        names = self.box_nodes[ref]
        counts: dict[str, int] = {}
        for name in names:
            op = _meta.op_text(self.nodes[name]).removeprefix("aten.")
            counts[op] = counts.get(op, 0) + 1
        common = sorted(counts, key=lambda op: -counts[op])  # stable: ties in graph order
        kind = self._type_name(owner) if owner else shown(self.context.root_name)
        where = f"{shown(owner, TOOLTIP_NAME_LIMIT)}: {kind}" if owner else f"(root): {kind}"
        label = _lines(
            f"{kind}: {_plural(len(names), 'op')}",
            _meta.shorten(", ".join(common[:3]) + (", …" if len(common) > 3 else ""), 40),
            self._sharing(ref),
        )
        summary = ", ".join(f"{op} × {counts[op]}" if counts[op] > 1 else op for op in common)
        tooltip = _lines(
            f"{where}\n{_plural(len(names), 'op')} of its own forward (in no submodule), "
            "computed from the program's inputs alone (masks, positions)",
            _meta.shorten(summary, TOOLTIP_NAME_LIMIT),
            "folded: opens like a module",
        )
        if self.values is not None:
            tooltip = self._valued(ref, tooltip, names, [])
        self.rows[ref] = NodeRow(
            ref,
            "ops",
            None,
            (owner,) if owner else (),
            ("ops", "collapsed"),
            label,
            tooltip,
            parent,
            tuple(names),
            None,
            (),
        )
        return ref

    def _box_ref(self, first: str) -> str:
        members = self.runs.get(first)
        if members:
            return f"{self.prefix}modules:{id_text(members[0])}..{id_text(members[-1])}"
        return f"{self.prefix}module:{id_text(first)}"

    # -- module text -------------------------------------------------------------------

    def _type_name(self, name: str) -> str:
        return shown(self.calls[name].type.rsplit(".", 1)[-1] or "?")

    def _color_of(self, name: str) -> str:
        """What a module's colour is made from: its type's name, so that identical layers
        look alike (and the same in every process: not its qualified name, which depends on
        where the class was imported from)."""
        return self.calls[name].type.rsplit(".", 1)[-1] or "?"

    def _module_title(self, name: str) -> str:
        return f"{shown(name)}: {self._type_name(name)}"

    def _module_tooltip(self, name: str) -> str:
        # asked once per drawn node of a module: computed once per module call
        cached = self._tooltips.get(name)
        if cached is None:
            cached = self._tooltips[name] = self._describe_module(name)
        return cached

    def _call_numel(self, name: str) -> int:
        found = self._numels.get(name)
        if found is None:
            found = self._numels[name] = self.context.numel(self.calls[name].params)
        return found

    def _describe_module(self, name: str) -> str:
        call = self.calls[name]
        numel = self._call_numel(name)
        text = f"{shown(name, TOOLTIP_NAME_LIMIT)}: {call.type}\n{_plural(call.nodes, 'node')}"
        if numel:
            text += f", {numel:,} parameters"
        part = self.context.partitions().get(name)
        if part is not None:
            text += "\nswappable" if part.swappable else f"\nnot swappable: {part.reason}"
        return text

    # -- edges -------------------------------------------------------------------------

    def _collect_edges(self) -> dict[tuple[str, str, str], list[str]]:
        """Edges between drawn nodes and boxes: ``(tail, head, index path) -> diff marks``.

        A value that goes to more than ``_MAX_FANOUT`` nodes or boxes (rotary tables, masks,
        positions fed to every layer) would tie the whole picture together with long edges:
        its edges are left out, it says how many users it has, and each user names it.
        """
        status = self.marks.status
        plain = self.plain
        edges: dict[tuple[str, str, str], list[str]] = {}

        aliases = self.scene.aliases

        def add(source: str, target: str, path: str, mark: str) -> None:
            source, target = aliases.get(source, source), aliases.get(target, target)
            tail, head = self.refs.get(source), self.refs.get(target)
            if tail is None or head is None or tail == head:
                return  # not in this picture, or inside one box
            if tail not in plain or head not in plain:
                path = ""  # edges of a box are aggregated: one per neighbour
            edges.setdefault((tail, head, path), []).append(mark)

        show_parameters = self.scene.show_parameters
        by_segment = not aliases and not show_parameters
        if by_segment:
            self._collect_by_segment(edges)
        elif not show_parameters:
            self._vertex_edges(self.scene.vertices, edges, aliases)
        else:  # each vertex's inputs, then its parameters (the order dot lays them out in)
            for vertex in self.scene.vertices:
                self._vertex_edges((vertex,), edges, aliases)
                for source in vertex.params + vertex.buffers:
                    add(source, vertex.name, "", status.get(vertex.name, ""))
        for source, target, path in self.extra_edges:
            add(source, target, path, "removed")
        users: dict[str, set[str]] = {}
        for tail, head, _ in edges:
            users.setdefault(tail, set()).add(head)
        self.fanout = {
            tail: len(heads) for tail, heads in users.items() if len(heads) > _MAX_FANOUT
        }
        for tail, head, _ in edges:
            if tail in self.fanout:
                shared = self.shared.setdefault(head, [])
                if tail not in shared:
                    shared.append(tail)
        return {key: marks for key, marks in edges.items() if key[0] not in self.fanout}

    def _vertex_edges(
        self, vertices: Iterable[Any], edges: dict[tuple[str, str, str], list[str]], aliases: dict
    ) -> None:
        """The edges into each of ``vertices`` from their inputs (names read through
        ``aliases``), added to ``edges``: ``add()`` of :meth:`_collect_edges` written out, as
        this loop reads every edge of the program."""
        status, plain, refs = self.marks.status, self.plain, self.refs
        for vertex in vertices:
            name = vertex.name
            head = refs.get(aliases.get(name, name) if aliases else name)
            if head is None:
                continue  # not in this picture
            head_plain = head in plain
            for source, path in vertex.inputs:
                tail = refs.get(aliases.get(source, source) if aliases else source)
                if tail is None or tail == head:
                    continue
                if not head_plain or tail not in plain:
                    path = ""
                mark = status.get(source) or status.get(name, "")
                edges.setdefault((tail, head, path), []).append(mark)

    def _collect_by_segment(self, edges: dict[tuple[str, str, str], list[str]]) -> None:
        """:meth:`_collect_edges` for a picture without aliases or parameter nodes: the edges
        of every vertex, in vertex order, where the vertices in a box read only their inputs
        from outside it (:meth:`~._scene._Scene.crossing`): opening one layer of many reads
        that layer's edges and what crosses the other layers' boxes."""
        status, plain, refs = self.marks.status, self.plain, self.refs
        vertices = self.scene.vertices
        for inputs in self._inputs:
            if type(inputs) is tuple:  # vertices in no box: every input
                start, stop = inputs
                self._vertex_edges(vertices[start:stop], edges, {})
                continue
            for name, source, path in inputs:
                head, tail = refs.get(name), refs.get(source)
                if head is None or tail is None or tail == head:
                    continue  # not in this picture, or inside one box
                if head not in plain or tail not in plain:
                    path = ""  # edges of a box are aggregated: one per neighbour
                mark = status.get(source) or status.get(name, "")
                edges.setdefault((tail, head, path), []).append(mark)

    def _local(self, ref: str) -> str:
        """A drawn node's name without the picture's prefix (``before/module:x`` ->
        ``module:x``)."""
        return ref[len(self.prefix) :]

    def _sharing(self, ref: str, users: bool = True, reads: bool = True) -> str:
        """The label lines of a node or box that is (``users``), or reads (``reads``), a
        value shared by many."""
        lines = []
        if users and ref in self.fanout:
            lines.append(f"{self._name_of_ref(ref)} → {self.fanout[ref]} users")
        if reads and ref in self.shared:
            names = [self._name_of_ref(tail) for tail in self.shared[ref]]
            lines.append("shared: " + _meta.shorten(", ".join(names), 40))
        return "\n".join(lines)

    def _name_of_ref(self, ref: str) -> str:
        """What a label calls a drawn node: its fx node or module name, as labels show names
        (an own-ops box: ``layers.0 ops``)."""
        local = self._local(ref)
        if local.startswith(OPS_PREFIX):
            owner = name_of_id_text(local[len(OPS_PREFIX) :])
            return f"{shown(owner)} ops" if owner else "top-level ops"
        return shown(name_of_id_text(local.removeprefix("module:")))

    def element_id(self, ref: str) -> str:
        """The element id of a drawn node: ``before/linear`` -> ``before/node:linear``; a box's
        name is its id."""
        if ref in self.rows:
            return ref
        return f"{self.prefix}node:{self._local(ref)}"

    def _edge_elements(self, edges: dict[tuple[str, str, str], list[str]]) -> None:
        repeats: dict[tuple[str, str], int] = {}
        for (tail, head, path), marks in edges.items():
            # An aggregated edge is marked removed or added only when all its parts are.
            mark = marks[0] if all(m == marks[0] for m in marks) else ""
            repeat = repeats[(tail, head)] = repeats.get((tail, head), 0) + 1
            edge_id = f"{self.prefix}edge:{self._local(tail)}->{self._local(head)}"
            if repeat > 1:
                edge_id += f":{repeat}"
            self.edges.append(
                EdgeRow(edge_id, self.element_id(tail), self.element_id(head), path, mark)
            )


# More users than this and a value's edges are left out (see _Writer._collect_edges).
_MAX_FANOUT = 8


# -- the picture -----------------------------------------------------------------------------


def _picture(
    name: str, writers: list[_Writer], aliases: Mapping[str, str], heat: Any = None
) -> Picture:
    """The Picture of one drawing, or of the two sides of a split diff; ``heat``: how an
    overlay's values are coloured (its values are the writers')."""
    overlay = {k: v for writer in writers for k, v in writer.overlay.items()}
    if len(writers) == 1:
        (writer,) = writers
        return Picture(
            name, tuple(writer.top), writer.rows, tuple(writer.edges), overlay=overlay, heat=heat
        )
    rows: dict[str, NodeRow | ClusterRow] = {}
    top, edges = [], []
    for writer, title in zip(writers, ("before", "after")):
        side = f"diff:{title}"
        # a side has no module call
        rows[side] = ClusterRow(
            side, None, ("diff",), title, "", None, tuple(writer.top), None, (SIDE,)
        )
        for element_id, row in writer.rows.items():
            if row.cluster is None:  # the side's own top level
                row = row._replace(cluster=side)
            rows[element_id] = row
        top.append(side)
        edges += [row._replace(cluster=side) for row in writer.edges]
    rank_same = _alignment(*writers, aliases)
    return Picture(
        name, tuple(top), rows, tuple(edges), rank_same, split=True, overlay=overlay, heat=heat
    )


def _alignment(
    before: _Writer, after: _Writer, aliases: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """Pairs of nodes drawn level: each node kept by the swap, in both pictures."""
    pairs = []
    seen = set()
    for name, ref in before.refs.items():
        other = after.refs.get(aliases.get(name, name))
        if other is None or (ref, other) in seen:
            continue
        seen.add((ref, other))
        pairs.append((before.element_id(ref), after.element_id(other)))
    return tuple(pairs)
