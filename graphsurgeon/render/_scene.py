"""What a picture shows, before anything is written: the graph's analysis, the scene and the
collapse plan.

* the analysis of one graph (:class:`_Analysis`, cached per graph): its vertices (the fx nodes
  that may be drawn, with their kinds and where their inputs come from, getitem glue looked
  through), and its module calls, from the program's one node -> call index;
* a program as drawn (:func:`_drawn`): a swap or fuse result drawn from its own graph, each
  fused call (a ``call_module`` node tagged ``_meta.FUSED``) as the original nodes it runs;
  the rewrite never runs here;
* the merge of a program and its swap result for a before/after picture (:func:`_pictures`);
* the scene (:class:`_Scene`: the vertices of one picture and the calls they sit in) and the
  collapse plan (:func:`_plan`: which calls are open, which runs of siblings are one box).

The names a caller gives (``highlight=``, ``collapse=``) are read by the assembly
(:mod:`graphsurgeon.render._assemble`), as every entry point reads them.

Only names are kept (never fx nodes): the cache of analyses must not keep programs alive.
"""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import Graph, GraphModule, Node

from .. import _meta
from .._derived import cached
from .._program import Program
from ..partition import call_index, program_index, split_call_name
from ..rewrite import pause_point
from ..swap import SwapInfo
from . import _segments

# Vertex kinds. _THROUGH and _HIDDEN nodes are never drawn; _PARAMETER ones only when asked.
_OP, _INPUT, _OUTPUT, _PARAMETER, _BUFFER, _CONSTANT, _SWAPPED, _GLUE, _CHECK = (
    "op", "input", "output", "parameter", "buffer", "constant", "swapped", "glue", "check",
)  # fmt: skip
_THROUGH, _HIDDEN = "through", "hidden"
_STATE = (_PARAMETER, _BUFFER, _CONSTANT)
_STATE_KINDS = {
    "PARAMETER": _PARAMETER,
    "BUFFER": _BUFFER,
    "CONSTANT_TENSOR": _CONSTANT,
    "CUSTOM_OBJ": _CONSTANT,
    "TOKEN": _HIDDEN,
}


# -- what to draw: the program ---------------------------------------------------------------


@dataclass(frozen=True)
class _Program:
    """The original program, and the swap or fuse result when there is one.

    ``swapped`` maps each swapped call to its ``call_module`` node in ``module``; ``fused``
    lists the fused calls (drawn as the original nodes they run, so they have no before/after).
    """

    ep: ExportedProgram
    module: GraphModule | None = None
    info: SwapInfo | None = None
    swapped: Mapping[str, str] = field(default_factory=dict)
    fused: tuple[str, ...] = ()

    @property
    def comparable(self) -> bool:
        """Whether a before/after picture has something to compare: a swap result (a result
        with fused calls only computes what the program does)."""
        return self.module is not None and (bool(self.swapped) or not self.fused)


def _program(source: Program) -> _Program:
    """What to draw, for a program as the one door (:func:`graphsurgeon._program.as_program`)
    read it."""
    if source.module is None:
        return _Program(source.ep)
    info = source.info
    fused = tuple(info.fused)
    swapped = {call: node for call, node in info.call_nodes.items() if call not in fused}
    return _Program(source.ep, source.module, info, swapped, fused)


# -- what to draw: one pass over a graph -----------------------------------------------------


class _Vertex:
    """An fx node that may be drawn, with where it goes and where its inputs come from.

    Only names: the cache of analyses must not keep programs alive through their nodes.
    """

    __slots__ = (
        "buffers",
        "chain",
        "folded",
        "fused_call",
        "inputs",
        "kind",
        "name",
        "params",
        "swap_call",
    )

    def __init__(
        self,
        name: str,
        kind: str,
        chain: tuple[str, ...],
        meta: Mapping[str, Any],
        inputs: Iterable[tuple[str, str]],
        params: tuple[str, ...] = (),
        buffers: tuple[str, ...] = (),
        folded: bool = False,
    ):
        self.name = name
        self.kind = kind
        self.swap_call: str | None = meta.get(_meta.SWAPPED)  # swapped call name
        self.fused_call: str | None = meta.get(_meta.FUSED)  # fused call name
        self.chain = chain  # module calls it is drawn in, outermost first
        # (producer vertex name, index path "[0]"): a tuple of strings, which the collector
        # stops tracking, where a list is one more object per node its every full pass visits
        self.inputs = tuple(inputs)
        self.params = params  # names of the parameter vertices folded into it
        self.buffers = buffers  # names of the buffer vertices folded into it
        self.folded = folded  # a buffer read by this one node only: drawn inside its reader

    def but(self, **changes: Any) -> _Vertex:
        """A copy of this vertex with some fields changed (the vertices of an analysis are
        shared by every picture of its graph: never changed)."""
        copy = object.__new__(_Vertex)
        for name in _Vertex.__slots__:
            setattr(copy, name, changes[name] if name in changes else getattr(self, name))
        return copy


class _Call:
    """One module call seen in a graph."""

    __slots__ = ("children", "depth", "fqn", "name", "nodes", "params", "parent", "type")

    def __init__(self, name: str, parent: str, depth: int, type_: str):
        self.name = name
        self.fqn = split_call_name(name)[0]
        self.parent = parent  # the enclosing call, "" for the root
        self.depth = depth  # 1 for a top-level module call
        self.type = type_  # qualified type name
        self.nodes = 0  # fx nodes of the call, nested calls and glue included
        self.params: set[str] = set()  # parameter vertices used inside it
        self.children: list[str] = []


class _Analysis:
    """Vertices and module calls of one graph, in graph order. Cached per graph.

    Which call each node sits in comes from the program's one node -> call index
    (:func:`graphsurgeon.partition.call_index`), which the stepper reads too. ``more_users``
    counts readers of a parameter or buffer that are not in this graph (the original nodes a
    fused call runs), so that a buffer is folded into its reader only when it has one.
    """

    def __init__(
        self,
        graph: Graph,
        state: Mapping[str, tuple[str, str]],
        root: Any,
        index,
        more_users: Mapping[str, int] | None = None,
    ):
        self.root_type = index.root_type  # the model's qualified type
        self.vertices: list[_Vertex] = []
        self.by_name: dict[str, _Vertex] = {}
        self.calls: dict[str, _Call] = {}
        calls = self.calls
        self.drawn: Any = None  # this graph drawn with its fused calls opened (see _drawn)
        # what a picture of these vertices finds out about them, by the scene's options
        self.scenes: dict[tuple, dict[str, Any]] = {}
        more_users = more_users or {}
        for info in index.calls.values():
            self.calls[info.name] = _Call(info.name, info.parent, info.depth, info.type)
            if info.parent:
                self.calls[info.parent].children.append(info.name)
        kinds: dict[str, str] = {}
        # glue node -> (producer, index path): a value taken apart is drawn from its producer
        self.through: dict[str, tuple[str, str]] = {}
        through = self.through
        chains = index.chains
        # nodes per chain (the index shares one tuple among a chain's nodes), then per call
        counted: dict[int, list] = {}
        folded: set[str] = set()  # the buffers drawn inside their one reader
        # the parameters read in each chain, then in each call
        used: dict[int, tuple[tuple[str, ...], set[str]]] = {}
        for count, node in enumerate(graph.nodes):
            if not count & 255:
                pause_point()  # made ahead, on a warm-up's thread: it waits while a click runs
            kind = _kind(node, state, root)
            kinds[node.name] = kind
            chain = chains[node.name]
            if node.op not in ("placeholder", "output", "get_attr"):
                count = counted.get(id(chain))
                if count is None:
                    counted[id(chain)] = [chain, 1]
                else:
                    count[1] += 1
            if kind == _THROUGH:
                source, path = node.args[0].name, _index_path(node)
                while source in through:
                    source, inner = through[source]
                    path = inner + path
                through[node.name] = (source, path)
                continue
            users = len(node.users) + more_users.get(node.name, 0)
            if kind == _BUFFER and users == 0:
                kinds[node.name] = _HIDDEN  # a buffer nothing reads (num_batches_tracked in eval)
                continue
            if kind == _HIDDEN:
                continue
            if kind == _SWAPPED and chain and chain[-1] == node.meta[_meta.SWAPPED]:
                chain = chain[:-1]  # the box is drawn where its module was, not inside it
            # (the vertex is made once its inputs are known: its fields are never changed)
            inputs: list[tuple[str, str]] = []
            params: tuple[str, ...] = ()
            buffers: tuple[str, ...] = ()
            # (``_input_nodes``: what ``all_input_nodes`` copies into a new list for each call)
            for argument in node._input_nodes:
                source = argument.name
                found = through.get(source)
                if found is None:
                    path = ""
                else:
                    source, path = found
                source_kind = kinds.get(source)
                if source_kind == _HIDDEN:
                    continue
                if source_kind == _PARAMETER:
                    if source not in params:
                        params += (source,)
                    continue
                if source in folded:
                    if source not in buffers:
                        buffers += (source,)
                    continue
                inputs.append((source, path))
            # a buffer read by one node only is drawn inside it, as its parameters are
            alone = kind == _BUFFER and users == 1
            if alone:
                folded.add(node.name)
            vertex = _Vertex(node.name, kind, chain, node.meta, inputs, params, buffers, alone)
            if params and chain:
                found = used.get(id(chain))
                if found is None:
                    used[id(chain)] = (chain, set(params))
                else:
                    found[1].update(params)
            self.vertices.append(vertex)
            self.by_name[vertex.name] = vertex
        for chain, count in counted.values():
            for name in chain:
                calls[name].nodes += count
        for chain, names in used.values():
            for name in chain:
                calls[name].params.update(names)

    def resolve(self, name: str) -> tuple[str, str]:
        """The vertex a value is drawn from, and the index path taken from it."""
        return self.through.get(name, (name, ""))


def _kind(node: Node, state: Mapping[str, tuple[str, str]], root: Any) -> str:
    op = node.op
    if op == "call_function":  # most nodes: asked first
        glue = node.meta.get(_meta.GLUE)
        if glue is None:
            if _meta.GUARD in node.meta:
                return _HIDDEN  # the program's input checks: no value, nothing to draw
            target = node.target
            if target is operator.getitem and bool(node.args) and isinstance(node.args[0], Node):
                return _THROUGH  # a program's own getitem (the parts of a split): its edge
            try:
                return _target_kind(target)
            except TypeError:  # an unhashable callable
                return _target_kind.__wrapped__(target)
    elif op == "placeholder":
        return state[node.name][0] if node.name in state else _INPUT
    elif op == "output":
        return _OUTPUT
    else:
        glue = node.meta.get(_meta.GLUE)
    if glue is not None:  # what the rewrite added around a call (see _meta.GLUE)
        if glue == "through" and node.args and isinstance(node.args[0], Node):
            return _THROUGH
        return _GLUE if glue == "build" else _HIDDEN
    if op == "get_attr":
        if node.name in state:
            return state[node.name][0]
        value = _attribute(root, node.target)
        if isinstance(value, torch.Tensor):
            return _CONSTANT
        return _HIDDEN  # pytree specs of the swapped program, subgraphs of torch.cond
    if op == "call_module":
        return _SWAPPED if _meta.SWAPPED in node.meta else _OP
    return _OP


# decided once per function: a graph calls few of them, each many times
@functools.lru_cache(maxsize=1024)
def _target_kind(target: Any) -> str:
    """What a called function is drawn as: pytree glue, a run-time check, or an op."""
    if getattr(target, "__module__", "").startswith("torch.utils._pytree"):
        return _GLUE
    if isinstance(target, torch._ops.OpOverload) and _is_check(target):
        return _CHECK
    return _OP


def _is_check(op: torch._ops.OpOverload) -> bool:
    """Run-time assertions torch.export records (dtype, device, range checks): no result."""
    name = op._opname
    return name.startswith("_assert") or name.startswith("sym_constrain_range")


def _attribute(root: Any, target: str) -> Any:
    value = root
    for part in str(target).split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _index_path(node: Node) -> str:
    if node.target is not operator.getitem:
        return ""
    key = node.args[1]
    return f"[{key!r}]" if isinstance(key, str) else f"[{key}]"


#: The key of a picture's analysis in its program's record (see :mod:`graphsurgeon._derived`).
ANALYSIS_KEY = "render analysis"


def _analysis(
    program: ExportedProgram | GraphModule,
    state: Mapping[str, tuple[str, str]],
    more_users: Mapping[str, int] | None = None,
) -> _Analysis:
    """The analysis of ``program``'s graph, kept in the program's one record
    (:mod:`graphsurgeon._derived`: ``gs.forget`` drops it with everything else)."""

    def make() -> _Analysis:
        root = program.graph_module if isinstance(program, ExportedProgram) else program
        return _Analysis(program.graph, state, root, call_index(program), more_users)

    return cached(program, ANALYSIS_KEY, make)


def _state(ep: ExportedProgram) -> Mapping[str, tuple[str, str]]:
    """Placeholder name -> (vertex kind, fqn) of every parameter, buffer and constant (read
    by every picture: made once per program, read only)."""

    def make() -> Mapping[str, tuple[str, str]]:
        state = {}
        for spec in ep.graph_signature.input_specs:
            kind = _STATE_KINDS.get(spec.kind.name)
            name = getattr(spec.arg, "name", None)
            if kind is not None and name:
                state[name] = (kind, spec.target or name)
        return state

    return cached(ep, "render state", make)


# -- a swap or fuse result, drawn from its own graph -----------------------------------------


class _Drawn:
    """The vertices of a program as drawn, in order, and by name."""

    __slots__ = ("by_name", "scenes", "vertices")

    def __init__(self, vertices: list[_Vertex]):
        self.vertices = vertices
        self.by_name = {vertex.name: vertex for vertex in vertices}
        self.scenes: dict[tuple, dict[str, Any]] = {}  # as _Analysis.scenes


def _drawn(
    source: _Program, before: _Analysis, state: Mapping[str, tuple[str, str]]
) -> _Analysis | _Drawn:
    """The vertices of ``source.module`` as drawn: its own graph, with each fused call (its
    ``call_module`` node, tagged ``_meta.FUSED``) drawn as the original nodes it runs
    (``info.partitions[call].nodes``, from ``before``, the original program's analysis). A
    fused call computes exactly those nodes, so the picture opens into them; its arguments and
    results are drawn as edges from and to the result's own nodes. Made once per result."""
    module, info = source.module, source.info
    if not source.fused:
        return _analysis(module, state)
    inner: dict[str, str] = {}  # original node drawn in place of a fused call -> the call
    for call in source.fused:
        inner.update(dict.fromkeys(info.partitions[call].nodes, call))
    after = _analysis(module, state, _users_inside(source.ep, inner, state))
    if after.drawn is None:
        after.drawn = _with_fused_calls(after, before, info, inner)
    return after.drawn


def _users_inside(
    ep: ExportedProgram, inner: Mapping[str, str], state: Mapping[str, tuple[str, str]]
) -> dict[str, int]:
    """Readers of each parameter or buffer among the original nodes fused calls run."""
    by_name = program_index(ep).by_name
    users: dict[str, int] = {}
    for name in inner:
        node = by_name.get(name)
        for argument in node.all_input_nodes if node is not None else ():
            if argument.name in state:
                users[argument.name] = users.get(argument.name, 0) + 1
    return users


def _with_fused_calls(
    after: _Analysis, before: _Analysis, info: SwapInfo, inner: Mapping[str, str]
) -> _Drawn:
    node_map = info.node_map
    fused_nodes = {v.name for v in after.vertices if v.fused_call in info.partitions}
    # Where the result reads each output of a fused call: (call node, index path) -> the
    # original node that computed it.
    outputs: dict[tuple[str, str], str] = {}
    for call in dict.fromkeys(inner.values()):
        for name in info.partitions[call].output_names:
            if name in inner and name in node_map:
                producer = after.resolve(node_map[name])
                if producer[0] in fused_nodes:
                    outputs.setdefault(producer, name)

    def from_result(source: str, path: str) -> tuple[str, str] | None:
        """An input read from the result's own graph, as the picture draws it."""
        if source not in fused_nodes:
            return source, path
        cut = path
        while True:
            name = outputs.get((source, cut))
            if name is not None:
                origin, inner_path = before.resolve(name)
                return origin, inner_path + path[len(cut) :]
            if not cut:
                return None  # a value the fused call does not return: no edge
            cut = cut[: cut.rindex("[")]

    drawn: list[_Vertex] = []
    names = {v.name for v in after.vertices if v.name not in fused_nodes}
    names.update(n for n in inner if n in before.by_name)
    missing: list[_Vertex] = []  # values only fused calls read: drawn from the original

    def from_original(vertex: _Vertex) -> _Vertex:
        inputs = []
        for source, path in vertex.inputs:
            if source not in inner and source in node_map:
                result, inner_path = after.resolve(node_map[source])
                mapped = from_result(result, inner_path + path)
                if mapped is not None and mapped[0] in names:
                    inputs.append(mapped)
                    continue
            if source not in names and source in before.by_name:
                names.add(source)
                missing.append(before.by_name[source])
            inputs.append((source, path))
        for source in vertex.params + vertex.buffers:  # drawn with show_parameters
            if source not in names and source in before.by_name:
                names.add(source)
                missing.append(before.by_name[source])
        return vertex.but(inputs=tuple(inputs))

    # build glue that only feeds fused calls is not drawn: their nodes read the values
    feeds = {name: set() for name in after.by_name}
    for vertex in after.vertices:
        for source, _ in vertex.inputs:
            if source in feeds:
                feeds[source].add(vertex.name)
    unused = set(fused_nodes)
    for vertex in reversed(after.vertices):
        if vertex.kind == _GLUE and feeds[vertex.name] and feeds[vertex.name] <= unused:
            unused.add(vertex.name)
    for vertex in after.vertices:
        if vertex.name in fused_nodes:
            nodes = info.partitions[vertex.fused_call].nodes
            drawn += [from_original(before.by_name[n]) for n in nodes if n in before.by_name]
        elif vertex.name not in unused:
            if any(source in fused_nodes for source, _ in vertex.inputs):
                inputs = [from_result(source, path) for source, path in vertex.inputs]
                vertex = vertex.but(inputs=tuple(i for i in inputs if i is not None))
            original = before.by_name.get(vertex.name)
            if vertex.kind in _STATE and original is not None and original.chain != vertex.chain:
                # a parameter or buffer sits with all its readers, the fused calls' ones too
                vertex = vertex.but(chain=original.chain)
            drawn.append(vertex)
    return _Drawn(missing + drawn)


# -- which modules are open ----------------------------------------------------------------

#: The fewest ops a module's own forward must run, apart from its submodules and from inputs
#: alone, for them to be folded into one box (``ops:<call>``): fewer are drawn as they are.
MIN_OWN_OPS = 3
# the collapse plans (without what a view shows on top) kept per scene, by budget and forced
_KEPT_PLANS = 16


#: How names and ids call a module call's own-ops box: ``ops:layers.0``; ``ops:`` (the root's).
OPS_PREFIX = "ops:"


#: In a plan's open set: every own-ops box is open (a fully open picture need not find them).
ALL_OPS = ("ops", None)


def ops_key(call: str) -> tuple[str, str]:
    """The key of call ``call``'s own-ops box in the plan's open set (``""``: the root's)."""
    return ("ops", call)


class _Scene:
    """The vertices of one picture (a program, or the merged before/after of a diff) and the
    module calls they sit in: everything the collapse planner and the writer need.

    ``own_ops`` are, for each module call (``""`` for the root), the ops its own forward runs
    (not a submodule) that depend on the program's inputs, parameters and constants alone:
    the mask and position building of a decoder's forward. They can be folded into one box
    (``ops:<call>``) that opens like a module; they never depend on a submodule's result, so
    the box only feeds the picture and cannot close a cycle.
    """

    def __init__(
        self,
        vertices: list[_Vertex],
        calls: Mapping[str, _Call],
        chains: Mapping[str, tuple[str, ...]] | None = None,
        show_parameters: bool = False,
        aliases: Mapping[str, str] | None = None,
        show_checks: bool = False,
        cache: dict[str, Any] | None = None,
    ):
        # what is found out about these vertices, kept with them (by the caller) when they
        # are an analysis's own: the next picture of the graph does not find it out again
        self._cache = cache if cache is not None else {}
        self.chains = dict(chains or {})
        # original name -> name in the swapped program, for the original's edges in a diff
        self.aliases = dict(aliases or {})
        self.vertices = [
            v
            for v in vertices
            if ((v.kind != _PARAMETER and not v.folded) or show_parameters)
            and (v.kind != _CHECK or show_checks)
        ]
        self.show_parameters = show_parameters
        self.calls = calls
        # The calls each vertex is drawn in, outermost first: its own, unless the scene names
        # others (decided here, read by the planner and the writer).
        chains = self.chains
        self.vertex_chains: list[tuple[str, ...]] = (
            [chains.get(v.name, v.chain) for v in self.vertices]
            if chains
            else [v.chain for v in self.vertices]
        )
        # The vertices of each distinct chain (a few hundred, shared by the call index), by
        # position; then the vertices directly in each call ("" is the root), and the calls
        # that hold any.
        self._by_chain: dict[int, tuple[tuple[str, ...], list[int]]] = {}
        by_chain = self._by_chain
        last: tuple[str, ...] | None = None
        members: list[int] = []
        for i, chain in enumerate(self.vertex_chains):
            if chain is not last:  # a call's vertices mostly follow each other
                found = by_chain.get(id(chain))
                if found is None:
                    found = by_chain[id(chain)] = (chain, [])
                last, members = chain, found[1]
            members.append(i)
        self.direct: dict[str, int] = {"": 0}
        present: set[str] = set()
        for chain, members in by_chain.values():
            owner = chain[-1] if chain else ""
            self.direct[owner] = self.direct.get(owner, 0) + len(members)
            present.update(chain)
        self.present = [name for name in calls if name in present]  # model order
        self.children = {
            name: [c for c in calls[name].children if c in present] for name in self.present
        }
        self.top = [name for name in self.present if calls[name].parent == ""]
        self._positions: dict[str, int] | None = None
        self._inside: dict[str, list[int]] | None = None
        self._opening_costs: dict[Any, int] = {}
        self._users: list[list[int]] | None = None

    @property
    def by_name(self) -> dict[str, _Vertex]:
        """The vertices by name."""
        found = self._cache.get("by name")
        if found is None:
            found = self._cache["by name"] = {v.name: v for v in self.vertices}
        return found

    @property
    def segments(self) -> list[tuple[tuple[str, ...], int, int]]:
        """The vertices as runs of neighbours drawn in the same calls (:func:`._segments.
        segments`): a writer places a run at once."""
        if "segments" not in self._cache:
            self._cache["segments"] = _segments.segments(self.vertex_chains)
        return self._cache["segments"]

    def crossing(self, segment: int, depth: int) -> list[tuple[str, str, str]]:
        """The inputs of segment ``segment``'s vertices from outside its call at ``depth``
        (:func:`._segments.crossing`), in vertex order; worked out once per segment."""
        memo = self.memo("crossing")
        if segment not in memo:
            if "chain of" not in self._cache:
                names = [v.name for v in self.vertices]
                self._cache["chain of"] = dict(zip(names, self.vertex_chains))
            found = self.segments[segment]
            memo[segment] = _segments.crossing(self.vertices, found, self._cache["chain of"])
        return memo[segment][depth]

    @property
    def spans(self) -> dict[str, tuple[int, int]]:
        """The calls whose vertices are one stretch of :attr:`segments` (:func:`._segments.
        spans`): a call drawn as a box is placed at once."""
        if "spans" not in self._cache:
            self._cache["spans"] = _segments.spans(self.segments)
        return self._cache["spans"]

    def span(self, call: str, depth: int) -> tuple[list[str], list[tuple[str, str, str]]]:
        """The vertex names of a call of :attr:`spans` (at ``depth`` in its chains), and the
        inputs from outside it (:meth:`crossing`), in vertex order. Worked out once per call."""
        memo = self.memo("span")
        if call not in memo:
            first, stop = self.spans[call]
            start, end = self.segments[first][1], self.segments[stop - 1][2]
            names = [v.name for v in self.vertices[start:end]]
            inputs = [i for k in range(first, stop) for i in self.crossing(k, depth)]
            memo[call] = (names, inputs)
        return memo[call]

    def memo(self, what: str) -> dict:
        """A dict kept with these vertices (an analysis's own: the next picture of the graph
        reads it too) for what a writer works out about them, such as node texts."""
        return self._cache.setdefault(what, {})

    @property
    def own_ops(self) -> dict[str, list[str]]:
        """Each call's own ops that can be folded into its box (see the class docstring)."""
        if "own ops" not in self._cache:
            self._cache["own ops"] = self._own_ops()
        return self._cache["own ops"][0]

    @property
    def ops_owner(self) -> dict[str, str]:
        """The call each of :attr:`own_ops` belongs to, by vertex name."""
        self.own_ops  # noqa: B018  (made with them)
        return self._cache["own ops"][1]

    def _own_ops(self) -> tuple[dict[str, list[str]], dict[str, str]]:
        # ops that read only inputs, state and the ops of a box: never a submodule's result,
        # nor a value drawn outside a box (that would close a cycle)
        sources = {_INPUT, *_STATE}
        foldable: set[str] = {v.name for v in self.vertices if v.kind in sources}
        candidates: list[tuple[_Vertex, str]] = []  # (vertex, the call it sits in)
        kinds = (_OP, _GLUE)
        children = self.children
        for vertex, chain in zip(self.vertices, self.vertex_chains):
            if vertex.kind not in kinds:
                continue
            for source, _ in vertex.inputs:
                if source not in foldable:
                    break
            else:
                owner = chain[-1] if chain else ""
                # a module with no submodule drawn is its own box already (rotary tables): its
                # ops are never folded, and neither is what reads them (taken out here, not by
                # a round of the loop below for each call they pass through)
                if owner and not children[owner]:
                    continue
                foldable.add(vertex.name)
                candidates.append((vertex, owner))
        while True:
            by_owner: dict[str, list[str]] = {}
            for vertex, owner in candidates:
                by_owner.setdefault(owner, []).append(vertex.name)
            settled = {owner for owner, names in by_owner.items() if len(names) >= MIN_OWN_OPS}
            if settled == set(by_owner):
                break
            # the ops of the calls left out are drawn as they are: what reads them is not
            # foldable any more (only what was can be: a subset, in the same order)
            kept: list[tuple[_Vertex, str]] = []
            for vertex, owner in candidates:
                if owner in settled and all(s in foldable for s, _ in vertex.inputs):
                    kept.append((vertex, owner))
                else:
                    foldable.discard(vertex.name)
            candidates = kept
        owner_of = {name: owner for owner, names in by_owner.items() for name in names}
        return by_owner, owner_of

    @property
    def positions_of_calls(self) -> dict[str, int]:
        """Each call's place in model order among :attr:`present` (the root ``""``: -1)."""
        found = self._cache.get("positions of calls")
        if found is None:
            found = self._cache["positions of calls"] = {
                name: i for i, name in enumerate(self.present)
            }
            found[""] = -1
        return found

    def ancestors(self, names: Iterable[str]) -> set[str]:
        closed = set()
        for name in names:
            while name and name not in closed:
                closed.add(name)
                name = self.calls[name].parent
        return closed

    def depth(self, owner: str) -> int:
        return self.calls[owner].depth if owner else 0

    def own_cost(self, name: str, open_: set) -> int:
        """Nodes drawn directly in open call ``name`` (its own-ops box counts one if closed)."""
        drawn = self.direct.get(name, 0)
        folded = len(self.own_ops.get(name, ()))
        if folded and ops_key(name) not in open_:
            drawn -= folded - 1
        return drawn

    def count(self, open_: set) -> int:
        """Nodes drawn when exactly the calls in ``open_`` are open (each other one is a box)."""

        def cost(name: str) -> int:
            if name not in open_:
                return 1
            return self.own_cost(name, open_) + sum(cost(c) for c in self.children[name])

        return self.own_cost("", open_) + sum(cost(name) for name in self.top)

    def opening_cost(self, name: str | tuple[str, str]) -> int:
        """More nodes drawn once ``name`` (a closed call, or an own-ops key) is opened."""
        # asked for every group in every round of the plan: worked out once per name
        found = self._opening_costs.get(name)
        if found is None:
            if isinstance(name, tuple):
                found = len(self.own_ops[name[1]]) - 1
            else:
                found = self.own_cost(name, set()) + len(self.children[name]) - 1
            self._opening_costs[name] = found
        return found

    # -- runs of sibling calls: only chains --------------------------------------------------

    def _index(self) -> None:
        """Vertex positions, the vertices inside each call, and each vertex's readers."""
        if "index" in self._cache:
            self._positions, self._inside, self._users = self._cache["index"]
            return
        vertices = self.vertices
        positions = dict(zip([v.name for v in vertices], range(len(vertices))))
        users: list[list[int]] = [[] for _ in vertices]
        aliases = self.aliases
        for i, vertex in enumerate(vertices):
            for source, _ in vertex.inputs:
                j = positions.get(aliases.get(source, source) if aliases else source)
                if j is not None and j != i:
                    users[j].append(i)
        # the vertices of each call: its chains' (the order inside a call does not matter to
        # the readers)
        inside: dict[str, list[int]] = {}
        for chain, members in self._by_chain.values():
            for name in chain:
                found = inside.get(name)
                if found is None:
                    inside[name] = list(members)
                else:
                    found.extend(members)
        self._positions, self._inside, self._users = positions, inside, users
        self._cache["index"] = (positions, inside, users)

    def _feeds(self, first: str, second: str) -> bool:
        """Whether call ``second`` reads what call ``first`` computes (directly, or through
        ops that are in neither)."""
        inside, users = self._inside, self._users
        targets = set(inside[second])
        last = max(targets)
        frontier = list(inside[first])
        seen = set(frontier)
        while frontier:
            i = frontier.pop()
            for j in users[i]:
                if j in targets:
                    return True
                if j not in seen and j <= last:
                    seen.add(j)
                    frontier.append(j)
        return False

    def _contractible(self, members: list[str]) -> bool:
        """Whether drawing ``members`` as one box keeps the picture free of cycles: no path
        leaves them and comes back."""
        inside, users = self._inside, self._users
        within = {i for m in members for i in inside[m]}
        last = max(within)
        reached: set[int] = set()
        frontier = [j for i in within for j in users[i] if j not in within]
        while frontier:
            j = frontier.pop()
            if j in reached or j > last:
                continue
            reached.add(j)
            for k in users[j]:
                if k in within:
                    return False
                if k not in reached:
                    frontier.append(k)
        return True

    def chain_runs(self, siblings: list[str], allowed: Any = None) -> list[list[str]]:
        """The runs (2 or more) of consecutive ``siblings`` of one type where each feeds the
        next, and that can be drawn as one box without a cycle (``layers.0 … layers.31``; not
        the parallel ``q, k, v`` nor the projection after them). ``allowed``: which siblings
        may be in a run (all when None)."""
        if self._positions is None:
            self._index()
        runs: list[list[str]] = []
        run: list[str] = []
        calls = self.calls
        for name in [*siblings, None]:
            ok = name is not None and (allowed is None or allowed(name))
            if run and (
                not ok or calls[name].type != calls[run[0]].type or not self._feeds(run[-1], name)
            ):
                runs += self._contractible_parts(run)
                run = []
            if ok:
                run.append(name)
        return runs

    def _contractible_parts(self, run: list[str]) -> list[list[str]]:
        if len(run) < 2:
            return []
        if self._contractible(run):
            return [run]
        parts, part = [], [run[0]]
        for name in run[1:]:
            if self._contractible([*part, name]):
                part.append(name)
            else:
                if len(part) > 1:
                    parts.append(part)
                part = [name]
        return parts + ([part] if len(part) > 1 else [])

    def stacks(self) -> list[list[str]]:
        """The layer stacks: the outermost chains of sibling calls of one type (a decoder's
        layers, a ResNet's stages), each looked for from the top down."""
        if "stacks" in self._cache:
            return self._cache["stacks"]
        found: list[list[str]] = []

        def visit(siblings: list[str]) -> None:
            runs = self.chain_runs(siblings)
            found.extend(runs)
            in_runs = {name for run in runs for name in run}
            for name in siblings:
                if name not in in_runs:
                    visit(self.children[name])

        visit(self.top)
        self._cache["stacks"] = found
        return found


@dataclass
class _Marks:
    """What stands out in a picture: highlights, fused calls and the diff's markings."""

    highlighted: set[str] = field(default_factory=set)  # call names
    highlighted_vertices: set[str] = field(default_factory=set)  # swapped boxes
    fused: set[str] = field(default_factory=set)  # fused calls
    status: dict[str, str] = field(default_factory=dict)  # vertex name -> removed / added
    boundaries: set[str] = field(default_factory=set)  # swapped calls drawn as clusters


def _plan(
    scene: _Scene,
    collapse: Any,
    collapsed: set,
    forced: set,
    budget: int,
    shown: set[str] = frozenset(),
    no_runs: set[str] = frozenset(),
) -> tuple[set, dict[str, list[str]]]:
    """The open calls (and own-ops keys, :func:`ops_key`), and the runs of sibling boxes drawn
    as one ``{first call: members}``.

    ``forced``: calls (and own-ops keys) drawn open whatever the budget. ``shown``: calls the
    caller asked to see (highlighted), opened with their parents on top of the view chosen
    without them, so that showing a layer's attention draws that layer more and nothing else.
    ``no_runs``: calls never drawn in a run box.
    """
    present = scene.present
    if collapse is None:
        return set(present) | {ALL_OPS}, {}
    all_ops = {ops_key(owner) for owner in scene.own_ops}
    if isinstance(collapse, int):
        open_ = {n for n in present if scene.calls[n].depth < collapse}
        open_ |= {ops_key(o) for o in scene.own_ops if scene.depth(o) + 1 < collapse}
        return open_ | forced | scene.ancestors(shown), {}
    if collapse != "auto":
        return {n for n in (*present, *all_ops) if n not in collapsed or n in forced}, {}
    # The layer stack is always visible: every layer a box (or a run box), never one box for
    # the whole model however wide the glue around it is.
    # The view without ``shown`` is the same for every search and step of a program drawn at
    # one budget: worked out once per scene (it reads every layer of a stack; what ``shown``
    # adds reads only what it opens).
    plans = scene.memo("plans")
    key = (frozenset(forced), budget, frozenset(no_runs))
    planned = plans.get(key)
    if planned is None:
        stacked = scene.stacks()
        keep = set(forced) | scene.ancestors(scene.calls[run[0]].parent for run in stacked)
        open_ = set(keep)
        drawn = scene.count(open_)
        runs: dict[str, list[str]] = {}
        if drawn > budget:  # even the outermost boxes are too many
            runs, drawn = _runs(scene, open_, drawn, budget, keep | set(no_runs))
        _open_groups(scene, open_, runs, drawn, budget)
        planned = plans[key] = (frozenset(open_), runs)
        while len(plans) > _KEPT_PLANS:
            del plans[next(iter(plans))]  # the oldest
    open_, runs = set(planned[0]), dict(planned[1])
    extra = scene.ancestors(shown) - open_
    if extra:
        open_ |= extra
        runs = _split_runs(runs, open_)
        # inside what was opened to show it: single-node calls as their node, and as much
        # more of it as fits
        _open_groups(scene, open_, runs, scene.count(open_), budget, within=extra)
    return open_, runs


def _open_groups(
    scene: _Scene,
    open_: set,
    runs: dict[str, list[str]],
    drawn: int,
    budget: int,
    within: set[str] | None = None,
) -> None:
    """Open whole groups of modules of one type at a time, cheapest first, while the picture
    stays within budget: pictures stay regular (every attention open, or none) and the budget
    buys the most detail. A call's own-ops box is a group with the other boxes of its type's
    own ops, opened only when no group of modules fits any more: a decoder's mask building is
    the last thing a reader wants to see, its attentions the first. ``within``: only calls
    inside these (and their own ops)."""
    in_runs = {name for members in runs.values() for name in members}
    order = scene.positions_of_calls
    calls = scene.calls
    # the calls that may open, (name, parent, type) in model order, read once for every
    # round; ``within``: only those inside it (the rest of a 384-layer stack is never read)
    if within is None:
        names: Iterable[str] = scene.present
        owners: Iterable[str] = scene.own_ops
    else:
        inside = reached(within, scene.children)
        names = sorted((n for n in inside if n in order), key=order.__getitem__)  # present
        owners = [o for o in scene.own_ops if o in inside]
    candidates = [(n, calls[n].parent, calls[n].type) for n in names if n not in in_runs]
    while True:
        groups: dict[Any, list] = {}
        for name, parent, type_ in candidates:
            if name not in open_ and (parent == "" or parent in open_):
                groups.setdefault(type_, []).append(name)
        for owner in owners:
            key = ops_key(owner)
            if key not in open_ and (owner == "" or owner in open_):
                owner_type = calls[owner].type if owner else ""
                groups.setdefault(("ops", owner_type), []).append(key)
        best = None
        for members in groups.values():
            cost = sum(scene.opening_cost(n) for n in members)
            if cost > 0 and drawn + cost > budget:
                continue
            first = members[0]
            if isinstance(first, tuple):
                depth, position = scene.depth(first[1]) + 1, order[first[1]]
            else:
                depth, position = min(calls[n].depth for n in members), order[first]
            key = (isinstance(first, tuple), cost, depth, position)
            if best is None or key < best[0]:
                best = (key, members)
        if best is None:
            return
        open_.update(best[1])
        drawn += best[0][1]


def reached(starts: Iterable[str], links: Mapping[str, Iterable[str]]) -> set[str]:
    """Every name reached from ``starts`` along ``links``, ``starts`` included (a call's
    descendants along :attr:`_Scene.children`; what feeds a stack along its edges)."""
    found = set(starts)
    frontier = list(found)
    while frontier:
        for name in links.get(frontier.pop(), ()):
            if name not in found:
                found.add(name)
                frontier.append(name)
    return found


def _split_runs(runs: dict[str, list[str]], open_: set) -> dict[str, list[str]]:
    """The runs without their open members: what is left of each, in pieces of 2 or more."""
    kept: dict[str, list[str]] = {}
    for members in runs.values():
        piece: list[str] = []
        for name in [*members, None]:
            if name is None or name in open_:
                if len(piece) > 1:
                    kept[piece[0]] = piece
                piece = []
            else:
                piece.append(name)
    return kept


def _runs(
    scene: _Scene, open_: set, drawn: int, budget: int, keep: set
) -> tuple[dict[str, list[str]], int]:
    """When even the outermost boxes are too many: runs of sibling boxes of one type that
    form a chain (``layers.0 … layers.999``, each feeding the next) become one box each,
    longest runs first, until the picture fits. Returns the runs ``{first call: members}`` and
    the nodes then drawn."""
    candidates = []
    for parent in ["", *(n for n in scene.present if n in open_)]:
        siblings = scene.top if parent == "" else scene.children[parent]
        candidates += scene.chain_runs(siblings, lambda n: n not in open_ and n not in keep)
    candidates.sort(key=lambda r: -len(r))  # stable: equal lengths stay in model order
    runs = {}
    for run in candidates:
        if drawn <= budget:
            break
        runs[run[0]] = run
        drawn -= len(run) - 1
    return runs, drawn


# -- before and after ------------------------------------------------------------------------


def _pictures(
    mode: str | None,
    before: _Analysis,
    after: _Analysis | _Drawn | None,
    source: _Program,
    marks: _Marks,
    show_parameters: bool,
    show_checks: bool = False,
) -> tuple[_Scene, list[tuple[_Scene, str, list[tuple[str, str, str]]]]]:
    """The scene the collapse plan is made on, and the pictures drawn with that plan, as
    ``(scene, id prefix, extra edges)``. Sets the diff markings of ``marks``."""
    if mode is None:
        drawn = after or before
        cache = drawn.scenes.setdefault((show_parameters, show_checks), {})
        # the scene of a graph is the same for every view of it (what a view opens is the
        # plan's, not the scene's): made once, as the analysis is
        scene = cache.get("scene")
        if scene is None:
            scene = cache["scene"] = _Scene(
                drawn.vertices, before.calls, {}, show_parameters, None, show_checks, cache
            )
        if after is not None and not _has_regions(source):
            _stacks_of_original(scene, before, show_parameters, show_checks)
        return scene, [(scene, "", [])]
    # In a diff the swapped box is drawn inside its module's boundary, in both pictures.
    boundary_chains = {
        v.name: (*v.chain, v.swap_call) for v in after.vertices if v.kind == _SWAPPED
    }
    # a region of ops replaced as one call (Surgery.replace) is no module call of the original:
    # it gets a call of its own in the call that holds it, and its removed nodes are drawn in it
    regions = source.info.regions if source.info is not None else {}
    calls = {**before.calls, **_region_calls(before.calls, regions, source.swapped)}
    merged_chains = dict(boundary_chains)
    for name in source.swapped:
        if name in regions:
            for node in regions[name].nodes:
                if node in before.by_name:
                    merged_chains[node] = (*before.by_name[node].chain, name)
    vertices, removed, removed_edges, aliases = _merge_programs(before, after, source)
    merged = _Scene(vertices, calls, merged_chains, show_parameters, aliases, show_checks)
    if not regions:
        _stacks_of_original(merged, before, show_parameters, show_checks)
    marks.boundaries = set(source.swapped)
    marks.status = dict.fromkeys(removed, "removed")
    marks.status.update((name, "added") for name in source.info.diff.added if name in after.by_name)
    if mode == "merged":
        return merged, [(merged, "", removed_edges)]
    return merged, [
        (
            _Scene(before.vertices, before.calls, {}, show_parameters, None, show_checks),
            "before/",
            [],
        ),
        (
            _Scene(after.vertices, calls, boundary_chains, show_parameters, None, show_checks),
            "after/",
            [],
        ),
    ]


def _has_regions(source: _Program) -> bool:
    return bool(source.info is not None and source.info.regions)


def _stacks_of_original(
    scene: _Scene, before: _Analysis, show_parameters: bool, show_checks: bool
) -> None:
    """Give ``scene``, a picture of a swap or fuse result of the program ``before`` analyses,
    the original's layer stacks (made once per original, with its pictures), when every call
    in them is drawn in ``scene``.

    Why they hold: a swap or a fuse replaces what happens inside one call and keeps what the
    call reads and what reads its results, so which sibling calls feed the next, and which
    runs of them are drawn as one box without a cycle, is the original's. A call the result no
    longer draws (inside a swapped module, or a swapped layer drawn as its box) makes the
    scene find its own. Regions of ops (``Surgery.replace``) add calls: they are not given."""
    if "stacks" in scene._cache:
        return
    cache = before.scenes.setdefault((show_parameters, show_checks), {})
    if "stacks" not in cache:
        original = _Scene(
            before.vertices, before.calls, {}, show_parameters, None, show_checks, cache
        )
        original.stacks()
    stacks = cache["stacks"]
    present = set(scene.present)
    if all(name in present for run in stacks for name in run):
        scene._cache["stacks"] = stacks


def _region_calls(
    calls: Mapping[str, _Call], regions: Mapping[str, Any], swapped: Iterable[str]
) -> dict[str, _Call]:
    """A call for each replaced region of ops, a child of the call that holds it (that call
    copied with the new child: the analysis's own calls are not changed)."""
    made: dict[str, _Call] = {}
    for name in swapped:
        region = regions.get(name)
        if region is None:
            continue
        parent = region.call if region.call in calls else ""
        depth = calls[parent].depth + 1 if parent else 1
        call = _Call(name, parent, depth, f"pattern {region.type_name}")
        call.nodes = len(region.nodes)
        made[name] = call
        if parent:
            holder = made.get(parent) or copy.copy(calls[parent])
            holder.children = [*holder.children, name]
            made[parent] = holder
    return made


def _merge_programs(
    before: _Analysis, after: _Analysis | _Drawn, source: _Program
) -> tuple[list[_Vertex], list[str], list[tuple[str, str, str]], dict[str, str]]:
    """Both programs as one list of vertices, in the original order.

    What the swap removed, added and kept is the swap's own answer (its
    :class:`~graphsurgeon.rewrite.info.Diff`), never worked out again here. Returns the
    vertices of the swapped program with the removed ones of the original put back: a swapped
    call's just before the box that replaced them, the nodes the swap dropped outside every
    call (size arithmetic only a swapped call read) where they were; the names of the removed
    vertices; the original edges from removed vertices to vertices that were kept; and the new
    names of kept values that the swap renamed (an argument named ``input`` becomes
    ``input_1``).
    """
    diff = source.info.diff
    removed_by_call = {
        call: [name for name in diff.removed_by_call.get(call, ()) if name in before.by_name]
        for call in source.swapped
    }
    dropped = {name for name in diff.removed_by_call.get("", ()) if name in before.by_name}
    removed = [name for names in removed_by_call.values() for name in names]
    removed_set = set(removed) | dropped
    aliases = {old: new for old, new in diff.renamed.items() if new in after.by_name}
    # each dropped vertex is put back before the next vertex of the original that is drawn
    put_back: dict[str, list[_Vertex]] = {}
    pending: list[_Vertex] = []
    for vertex in before.vertices:
        if vertex.name in dropped:
            pending.append(vertex)
        elif pending and (
            vertex.name in removed_set or aliases.get(vertex.name, vertex.name) in after.by_name
        ):
            put_back[aliases.get(vertex.name, vertex.name)] = pending
            pending = []
    merged: list[_Vertex] = []
    for vertex in after.vertices:
        if vertex.kind == _SWAPPED:
            for name in removed_by_call.get(vertex.swap_call, []):
                merged += put_back.get(name, [])
                merged.append(before.by_name[name])
        merged += put_back.get(vertex.name, [])
        merged.append(vertex)
    merged += pending
    removed += [vertex.name for vertex in before.vertices if vertex.name in dropped]
    # A value that only the removed nodes used (an input leaf only the swapped call read)
    # is gone from the swapped program: draw it from the original.
    names = {vertex.name for vertex in merged}
    missing = []
    for name in removed:
        for source_name, _ in before.by_name[name].inputs:
            if source_name not in names and source_name not in aliases:
                names.add(source_name)
                missing.append(before.by_name[source_name])
    removed_edges = [
        (source_name, aliases.get(vertex.name, vertex.name), path)
        for vertex in before.vertices
        if vertex.name not in removed_set and aliases.get(vertex.name, vertex.name) in names
        for source_name, path in vertex.inputs
        if source_name in removed_set
    ]
    return missing + merged, removed, removed_edges, aliases
