"""to_dot() and to_svg(): a program drawn with its module partitions, before and after a swap.

What a picture shows:

* one nested cluster per module call, from ``nn_module_stack``, labelled ``fqn: TypeName`` and
  filled with a pale color derived from the fqn (the same color on every run and machine);
  a module call that holds a single node is drawn as that node, filled with the module's color;
* one node per fx node, labelled by op (``aten.linear``) and its output (``f32[1, 16, 64]``);
  user inputs, buffers and constants have their own shapes, parameters are folded into the
  node that uses them (``+ weight, bias``); pytree glue (``getitem`` chains, the swap's checks)
  is not drawn: its edges go straight from the value's producer, labelled with the index path;
* a swapped module call as one orange double-bordered box: the replacement's type and its call;
* a collapsed module call as one box with its node and parameter counts, its edges aggregated;
* a value used by more than 8 drawn nodes or boxes (rotary tables, masks fed to every layer)
  without its edges: it says ``→ 80 users`` and each user names it (``shared: slice_1``).

Every node, cluster and edge carries a stable ``id`` that graphviz copies into the SVG:
``node:<fx node name>``, ``cluster:<call name>`` (an open module call), ``module:<call name>``
(a collapsed one), ``modules:<first>..<last>`` (a run of collapsed siblings) and
``edge:<tail>-><head>`` (tail and head are DOT node names: the fx node name, or the ``module:``
id of a box; a repeated pair gets ``:2``, ``:3`` ...). The two pictures of a side-by-side diff
prefix all of these with ``before/`` and ``after/``. A name that an id cannot carry as it is (NUL,
a newline, a control character) is written as :func:`graphsurgeon.picture.id_text` writes it
(``module:a%00b``); labels show such characters visibly (``a␀b``) and shorten long names in the
middle (``…``). Tooltips carry the fx node name, the full op and the source line from
``stack_trace``.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.render import graph_view
    >>> from torch.nn import Linear, ReLU, Sequential
    >>> model = Sequential(Sequential(Linear(4, 4), ReLU()), Linear(4, 2))
    >>> ep = gs.export(model, (torch.randn(2, 4),))
    >>> view = graph_view(ep)  # "0" holds two nodes: a cluster; "1" one node: drawn as it
    >>> view.drawn_nodes, view.clusters, view.collapsed
    (5, ('0',), ())
    >>> graph_view(ep, collapse=1).collapsed
    ('0', '1')
"""

from __future__ import annotations

import colorsys
import contextlib
import functools
import gc
import hashlib
import inspect
import math
import operator
import os
import re
import shutil
import subprocess
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import Graph, GraphModule, Node

from . import _meta
from ._program import as_program
from .errors import (
    GraphSurgeonError,
    MissingDependencyError,
    RenderError,
    UnknownModuleError,
)
from .partition import Partition, call_index, program_index, split_call_name
from .picture import TOOLTIP_NAME_LIMIT, Picture, attribute_text, id_text, name_of_id_text, quote
from .picture import shown as _shown
from .swap import SwapInfo, swap, swap_info

__all__ = ["GraphView", "RenderError", "graph_view", "to_dot", "to_svg"]

#: How many nodes ``collapse="auto"`` draws at most (boxes included), unless told otherwise.
AUTO_MAX_NODES = 300


@dataclass(frozen=True)
class GraphView:
    """One picture of a program: its DOT text and what it shows.

    Attributes:
        dot: the graphviz DOT text (what :func:`to_dot` returns).
        picture: the same drawing as data (:class:`graphsurgeon.picture.Picture`): every
            node, cluster and edge by its id, with the fx node or module call it stands for.
        graph_nodes: fx nodes of the program drawn (of both programs, for a diff).
        drawn_nodes: node statements in the DOT: fx nodes drawn, plus one per collapsed box.
        clusters: module calls drawn as clusters, in model order (a call holding a single
            node is drawn as that node, and is in neither this nor ``collapsed``).
        collapsed: module calls drawn as one box (each member of a run box is listed).
        highlighted: module calls drawn highlighted.
        swapped: the swapped calls of the program (empty for an ExportedProgram).
        fused: the fused calls of the program (:func:`graphsurgeon.fuse`): each is drawn as
            the program's own nodes, one box marked "fused" unless opened.
    """

    dot: str = field(repr=False)
    picture: Picture = field(repr=False)
    graph_nodes: int
    drawn_nodes: int
    clusters: tuple[str, ...]
    collapsed: tuple[str, ...]
    highlighted: tuple[str, ...]
    swapped: tuple[str, ...]
    fused: tuple[str, ...] = ()

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        """Shown as its picture, laid out (see :func:`graphsurgeon.draw`)."""
        from .drawing import Drawing

        drawing = Drawing(self, _layout(self.dot, "svg").decode(), self.picture.name, None)
        return drawing._repr_mimebundle_(include, exclude)


# -- what to draw: the program -----------------------------------------------------------

# Vertex kinds. _THROUGH and _HIDDEN nodes are never drawn; _PARAMETER ones only when asked.
_OP, _INPUT, _OUTPUT, _PARAMETER, _BUFFER, _CONSTANT, _SWAPPED, _GLUE, _CHECK = (
    "op", "input", "output", "parameter", "buffer", "constant", "swapped", "glue", "check",
)  # fmt: skip
_THROUGH, _HIDDEN = "through", "hidden"
_STATE_KINDS = {
    "PARAMETER": _PARAMETER,
    "BUFFER": _BUFFER,
    "CONSTANT_TENSOR": _CONSTANT,
    "CUSTOM_OBJ": _CONSTANT,
    "TOKEN": _HIDDEN,
}


@dataclass(frozen=True)
class _Program:
    """The original program, and the swapped one when there is one; the fused calls."""

    ep: ExportedProgram
    swapped: GraphModule | None
    info: SwapInfo | None
    fused: tuple[str, ...] = ()


def _program(program: Any) -> _Program:
    """What to draw, for anything :func:`graphsurgeon._program.as_program` reads as a program."""
    source = as_program(program)
    if source.module is None:
        return _Program(source.ep, None, None)
    info = source.info
    if info.fused:
        return _with_fused(source.module, info)
    return _Program(source.ep, source.module, info)


# A fused program drawn as the program with only its swaps (see _with_fused), per program.
_UNFUSED: weakref.WeakKeyDictionary[GraphModule, GraphModule | None] = weakref.WeakKeyDictionary()


def _with_fused(program: GraphModule, info: SwapInfo) -> _Program:
    """A fused call computes exactly its own nodes, so it is drawn as them: the picture is the
    program with only the swapped calls replaced, and the fused calls marked (one box each,
    which opens into the program's nodes). The swap of the swapped calls alone is made once."""
    if program not in _UNFUSED:
        fused_modules = {split_call_name(c)[0] for c in info.fused}
        swaps = {
            name: module
            for name, module in info.requests.items()
            if name not in info.fused and name not in fused_modules
        }
        _UNFUSED[program] = swap(info.program, swaps) if swaps else None
    unfused = _UNFUSED[program]
    if unfused is None:
        return _Program(info.program, None, None, info.fused)
    return _Program(info.program, unfused, swap_info(unfused), info.fused)


# -- what to draw: one pass over a graph ---------------------------------------------------


class _Vertex:
    """An fx node that may be drawn, with where it goes and where its inputs come from.

    Only names: the cache of analyses must not keep programs alive through their nodes.
    """

    __slots__ = ("buffers", "chain", "folded", "inputs", "kind", "name", "params", "swap_call")

    def __init__(self, node: Node, kind: str, chain: tuple[str, ...]):
        self.name = node.name
        self.kind = kind
        self.swap_call: str | None = node.meta.get(_meta.SWAPPED)  # swapped call name
        self.chain = chain  # module calls it is drawn in, outermost first
        self.inputs: list[tuple[str, str]] = []  # (producer vertex name, index path "[0]")
        self.params: list[str] = []  # names of the parameter vertices folded into it
        self.buffers: list[str] = []  # names of the buffer vertices folded into it
        self.folded = False  # a buffer read by this one node only: drawn inside its reader


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
    (:func:`graphsurgeon.partition.call_index`), which the stepper reads too.
    """

    def __init__(self, graph: Graph, state: Mapping[str, tuple[str, str]], root: Any, index):
        self.size = len(graph.nodes)
        self.root_type = index.root_type  # the model's qualified type
        self.vertices: list[_Vertex] = []
        self.by_name: dict[str, _Vertex] = {}
        self.calls: dict[str, _Call] = {}
        for info in index.calls.values():
            self.calls[info.name] = _Call(info.name, info.parent, info.depth, info.type)
            if info.parent:
                self.calls[info.parent].children.append(info.name)
        kinds: dict[str, str] = {}
        through: dict[str, tuple[str, str]] = {}  # glue node -> (producer, index path)
        chains = index.chains
        for node in graph.nodes:
            kind = _kind(node, state, root)
            kinds[node.name] = kind
            chain = chains[node.name]
            if node.op not in ("placeholder", "output", "get_attr"):
                for name in chain:
                    self.calls[name].nodes += 1
            if kind == _THROUGH:
                source, path = node.args[0].name, _index_path(node)
                while source in through:
                    source, inner = through[source]
                    path = inner + path
                through[node.name] = (source, path)
                continue
            if kind == _BUFFER and len(node.users) == 0:
                kinds[node.name] = _HIDDEN  # a buffer nothing reads (num_batches_tracked in eval)
                continue
            if kind == _HIDDEN:
                continue
            if kind == _SWAPPED and chain and chain[-1] == node.meta[_meta.SWAPPED]:
                chain = chain[:-1]  # the box is drawn where its module was, not inside it
            vertex = _Vertex(node, kind, chain)
            # a buffer read by one node only is drawn inside it, as its parameters are
            vertex.folded = kind == _BUFFER and len(node.users) == 1
            for argument in node.all_input_nodes:
                source, path = through.get(argument.name, (argument.name, ""))
                source_kind = kinds.get(source)
                if source_kind == _HIDDEN:
                    continue
                if source_kind == _PARAMETER:
                    if source not in vertex.params:
                        vertex.params.append(source)
                    for name in chain:
                        self.calls[name].params.add(source)
                    continue
                if source in self.by_name and self.by_name[source].folded:
                    if source not in vertex.buffers:
                        vertex.buffers.append(source)
                    continue
                vertex.inputs.append((source, path))
            self.vertices.append(vertex)
            self.by_name[vertex.name] = vertex


def _kind(node: Node, state: Mapping[str, tuple[str, str]], root: Any) -> str:
    op = node.op
    if op == "placeholder":
        return state[node.name][0] if node.name in state else _INPUT
    if op == "output":
        return _OUTPUT
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
    if op == "call_function":
        if _meta.GUARD in node.meta:
            return _HIDDEN  # the program's input checks: no value, nothing to draw
        target = node.target
        if target is operator.getitem and bool(node.args) and isinstance(node.args[0], Node):
            return _THROUGH  # a program's own getitem (the parts of a split): its edge
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


# Analyses of graphs drawn in this process, without keeping the graphs alive.
_ANALYSES: weakref.WeakKeyDictionary[Graph, _Analysis] = weakref.WeakKeyDictionary()


def _analysis(program: ExportedProgram | GraphModule, state: Mapping[str, tuple[str, str]]):
    graph = program.graph
    cached = _ANALYSES.get(graph)
    if cached is not None and cached.size == len(graph.nodes):
        return cached
    root = program.graph_module if isinstance(program, ExportedProgram) else program
    analysis = _Analysis(graph, state, root, call_index(program))
    _ANALYSES[graph] = analysis
    return analysis


def _state(ep: ExportedProgram) -> dict[str, tuple[str, str]]:
    """Placeholder name -> (vertex kind, fqn) of every parameter, buffer and constant."""
    state = {}
    for spec in ep.graph_signature.input_specs:
        kind = _STATE_KINDS.get(spec.kind.name)
        name = getattr(spec.arg, "name", None)
        if kind is not None and name:
            state[name] = (kind, spec.target or name)
    return state


# -- labels ------------------------------------------------------------------------------

def _value(node: Node, dims: Mapping[str, str] | None = None) -> str:
    """What a node computes, as every view writes it (``f32[batch, 16]``)."""
    return _meta.node_value_text(node, dims)


def _numel(node: Node) -> int:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return 0
    try:
        return math.prod(int(d) for d in value.shape)
    except (TypeError, ValueError):  # a symbolic size
        return 0


# A frame of a stack trace; the code line is missing for code without a file (<stdin>, eval).
_FRAME = re.compile(
    r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)'
    r'(?:\n(?!\s*File ")(?P<code>[^\n]*))?'
)
_TORCH_DIR = os.path.dirname(torch.__file__)
_TORCH_PATH = re.compile(r"[\\/]site-packages[\\/]torch[\\/]")


def _source(node: Node) -> str:
    """The user's source lines behind a node: innermost frame with its code, then callers."""
    trace = node.meta.get("stack_trace")
    return _source_of_trace(trace) if isinstance(trace, str) and trace else ""


@functools.lru_cache(maxsize=4096)  # the nodes of one source line share their stack trace
def _source_of_trace(trace: str) -> str:
    frames = []
    for match in _FRAME.finditer(trace):
        path = match.group("path")
        if path.startswith(_TORCH_DIR) or _TORCH_PATH.search(path):
            continue  # torch's own frames (nn.Linear.forward...) say nothing about the model
        where = f"{os.path.basename(path.replace(chr(92), '/'))}:{match.group('line')}"
        frames.append((where, match.group("function"), (match.group("code") or "").strip()))
    if not frames:
        return ""
    where, function, code = frames[-1]
    text = f"{where} in {function}" + (f"\n  {_meta.shorten(code, 80)}" if code else "")
    callers = [f for f, _, _ in frames[-4:-1]]
    if callers:
        text += "\ncalled from " + ", ".join(reversed(callers))
    return text


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def _relative(target: str, chain: tuple[str, ...]) -> str:
    """``layers.0.attn.q.weight`` seen from inside ``layers.0.attn.q``: ``weight``."""
    fqn = split_call_name(chain[-1])[0] if chain else ""
    if fqn and target.startswith(fqn + "."):
        return target[len(fqn) + 1 :]
    return target


# -- colors ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def _color(fqn: str, strong: bool = False) -> str:
    """A pale color derived from the module's name (sha1, so it is the same in every process)."""
    digest = hashlib.sha1(fqn.encode("utf-8", "surrogatepass")).digest()  # any str is a name
    hue = int.from_bytes(digest[:4], "big") / 2**32
    lightness, saturation = (0.80, 0.85) if strong else (0.92, 0.60)
    red, green, blue = colorsys.hls_to_rgb(hue, lightness, saturation)
    return f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"


_HIGHLIGHT = "#c026d3"
_SWAP_FILL, _SWAP_LINE = "#fed7aa", "#c2410c"
_FUSED_LINE = "#1d4ed8"
_ADDED, _REMOVED = "#15803d", "#9ca3af"


# -- DOT text ----------------------------------------------------------------------------


_quote = quote  # the one DOT quoting, in graphsurgeon.picture


def _tooltip(text: str) -> str:
    # graphviz 2.43 unescapes tooltips twice, so a doubled backslash would still expand
    # (``\\N`` shows the node name): show user backslashes as the look-alike U+29F5 instead.
    return _quote(text.replace("\\", "\u29f5"))


_HEADER = (
    '  graph [rankdir=TB, fontname="Helvetica", fontsize=10, labeljust=l, nodesep=0.18, '
    "ranksep=0.28, outputorder=edgesfirst];\n"
    '  node [shape=box, style="rounded,filled", fillcolor="#ffffff", color="#6b7280", '
    'fontname="Helvetica", fontsize=9, height=0.3, margin="0.08,0.03"];\n'
    '  edge [color="#6b7280", arrowsize=0.5, penwidth=0.8, fontname="Helvetica", fontsize=7];'
)


# -- which modules are open ----------------------------------------------------------------


class _Scene:
    """The vertices of one picture (a program, or the merged before/after of a diff) and the
    module calls they sit in: everything the collapse planner and the writer need."""

    def __init__(
        self,
        vertices: list[_Vertex],
        calls: Mapping[str, _Call],
        chains: Mapping[str, tuple[str, ...]] | None = None,
        show_parameters: bool = False,
        aliases: Mapping[str, str] | None = None,
    ):
        self.chains = dict(chains or {})
        # original name -> name in the swapped program, for the original's edges in a diff
        self.aliases = dict(aliases or {})
        self.vertices = [
            v for v in vertices if (v.kind != _PARAMETER and not v.folded) or show_parameters
        ]
        self.show_parameters = show_parameters
        self.calls = calls
        # Vertices directly in each call ("" is the root), and the calls that hold any.
        self.direct: dict[str, int] = {"": 0}
        present: set[str] = set()
        for vertex in self.vertices:
            chain = self.chain(vertex)
            self.direct[chain[-1] if chain else ""] = (
                self.direct.get(chain[-1] if chain else "", 0) + 1
            )
            present.update(chain)
        self.present = [name for name in calls if name in present]  # model order
        self.children = {
            name: [c for c in calls[name].children if c in present] for name in self.present
        }
        self.top = [name for name in self.present if calls[name].parent == ""]

    def chain(self, vertex: _Vertex) -> tuple[str, ...]:
        return self.chains.get(vertex.name, vertex.chain)

    def ancestors(self, names: Iterable[str]) -> set[str]:
        closed = set()
        for name in names:
            while name and name not in closed:
                closed.add(name)
                name = self.calls[name].parent
        return closed

    def count(self, open_: set[str]) -> int:
        """Nodes drawn when exactly the calls in ``open_`` are open (each other one is a box)."""

        def cost(name: str) -> int:
            if name not in open_:
                return 1
            return self.direct.get(name, 0) + sum(cost(c) for c in self.children[name])

        return self.direct[""] + sum(cost(name) for name in self.top)

    def opening_cost(self, name: str) -> int:
        return self.direct.get(name, 0) + len(self.children[name]) - 1


def _plan(
    scene: _Scene, collapse: Any, collapsed: set[str], forced: set[str], budget: int
) -> tuple[set[str], dict[str, list[str]]]:
    """The open calls, and the runs of sibling boxes drawn as one ``{first call: members}``."""
    present = scene.present
    if collapse is None:
        return set(present), {}
    if isinstance(collapse, int):
        return {n for n in present if scene.calls[n].depth < collapse} | forced, {}
    if collapse != "auto":
        return {n for n in present if n not in collapsed or n in forced}, {}
    open_ = set(forced)
    drawn = scene.count(open_)
    runs: dict[str, list[str]] = {}
    if drawn > budget:  # even the outermost boxes are too many
        runs, drawn = _runs(scene, open_, drawn, budget, forced)
    in_runs = {name for members in runs.values() for name in members}
    order = {name: i for i, name in enumerate(present)}
    while True:
        # Open whole groups of modules of one type at a time, cheapest first: pictures stay
        # regular (every attention open, or none) and the budget buys the most detail.
        groups: dict[str, list[str]] = {}
        for name in present:
            parent = scene.calls[name].parent
            closed = name not in open_ and name not in in_runs
            if closed and (parent == "" or parent in open_):
                groups.setdefault(scene.calls[name].type, []).append(name)
        best = None
        for members in groups.values():
            cost = sum(scene.opening_cost(n) for n in members)
            if cost > 0 and drawn + cost > budget:
                continue
            key = (cost, min(scene.calls[n].depth for n in members), order[members[0]])
            if best is None or key < best[0]:
                best = (key, members)
        if best is None:
            break
        open_.update(best[1])
        drawn += best[0][0]
    return open_, runs


def _runs(
    scene: _Scene, open_: set[str], drawn: int, budget: int, keep: set[str]
) -> tuple[dict[str, list[str]], int]:
    """When even the outermost boxes are too many: runs of sibling boxes of one type
    (``layers.0 … layers.999``) become one box each, longest runs first, until the picture
    fits. Returns the runs ``{first call: members}`` and the nodes then drawn."""
    candidates = []
    for parent in [""] + [n for n in scene.present if n in open_]:
        siblings = scene.top if parent == "" else scene.children[parent]
        run: list[str] = []
        for name in [*siblings, None]:
            boxed = name is not None and name not in open_ and name not in keep
            if run and (not boxed or scene.calls[name].type != scene.calls[run[0]].type):
                if len(run) > 1:
                    candidates.append(run)
                run = []
            if boxed:
                run.append(name)
    candidates.sort(key=lambda r: -len(r))  # stable: equal lengths stay in model order
    runs = {}
    for run in candidates:
        if drawn <= budget:
            break
        runs[run[0]] = run
        drawn -= len(run) - 1
    return runs, drawn


# -- the writer ----------------------------------------------------------------------------


@dataclass
class _Style:
    """How the special parts of a picture look: highlights and diff markings."""

    highlighted: set[str] = field(default_factory=set)  # call names
    highlighted_vertices: set[str] = field(default_factory=set)  # swapped boxes
    fused: set[str] = field(default_factory=set)  # fused calls
    status: dict[str, str] = field(default_factory=dict)  # vertex name -> removed / added
    boundaries: set[str] = field(default_factory=set)  # swapped calls drawn as clusters


class _Context:
    """What the writer looks up about the program: targets, parameters, partitions."""

    def __init__(self, program: _Program, state: Mapping[str, tuple[str, str]]):
        self.program = program
        self.info = program.info
        self.targets = {name: target for name, (_, target) in state.items()}
        # fx nodes by name, of both programs: the swapped program's copies have the same meta
        self.nodes = {n.name: n for n in program.ep.graph.nodes}
        self.placeholders = {n: self.nodes[n] for n in state if n in self.nodes}
        if program.swapped is not None:
            self.nodes.update((n.name, n) for n in program.swapped.graph.nodes)
        self._partitions: Mapping[str, Partition] | None = None
        self._numel: dict[str, int] = {}
        try:  # dynamic sizes by the user's Dim names, where export recorded them
            self.dims: Mapping[str, str] = program_index(program.ep).dims
        except GraphSurgeonError:
            self.dims = {}

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


class _Writer:
    """Decides one picture's elements: nested clusters, nodes, boxes and edges, each with its
    id, what it stands for, its classes, label, tooltip and DOT attributes (a Picture's parts;
    :meth:`graphsurgeon.picture.Picture.to_dot` lowers them to text)."""

    def __init__(
        self,
        scene: _Scene,
        open_: set[str],
        runs: dict[str, list[str]],
        style: _Style,
        context: _Context,
        prefix: str = "",
        extra_edges: Iterable[tuple[str, str, str]] = (),
    ):
        self.scene = scene
        self.calls = scene.calls
        self.open = open_
        self.runs = runs
        self.run_of = {member: first for first, members in runs.items() for member in members}
        self.style = style
        self.context = context
        self.prefix = prefix
        self.extra_edges = list(extra_edges)
        self.vertices = {v.name: v for v in scene.vertices}
        self.nodes = context.nodes
        # the picture's parts as rows of PictureNode / PictureCluster / PictureEdge fields
        self.rows: dict[str, tuple] = {}
        self.top: list[str] = []  # ids at this picture's top level, in order
        self.edges: list[tuple] = []
        self.box_nodes: dict[str, list[str]] = {}  # box -> the fx nodes collapsed into it
        self._tooltips: dict[str, str] = {}
        self.refs: dict[str, str] = {}  # vertex name -> the DOT node it is drawn as
        self.boxes: list[str] = []  # calls drawn as boxes
        self.clusters: list[str] = []  # calls drawn as clusters
        self.removed_boxes: set[str] = set()  # boxes holding only removed nodes
        self.fanout: dict[str, int] = {}  # DOT node -> users, for values shared by many
        self.shared: dict[str, list[str]] = {}  # DOT node -> the shared values it uses
        self.drawn = 0

    # -- clusters ----------------------------------------------------------------------

    def write(self) -> None:
        """Decide every element; they are then in ``elements``, ``top`` and ``edges``."""
        members: dict[str, list[tuple[str, str]]] = {"": []}  # container -> what is in it
        seen: set[str] = set()
        box_status: dict[str, bool] = {}  # box -> every node in it removed
        removed = self.style.status
        for vertex in self.scene.vertices:
            container, ref = "", None
            for name in self.scene.chain(vertex):
                if name not in self.open:
                    box = self.run_of.get(name, name)
                    ref = self._box_ref(box)
                    if box not in seen:
                        seen.add(box)
                        members[container].append(("box", box))
                    is_removed = removed.get(vertex.name) == "removed"
                    box_status[box] = box_status.get(box, True) and is_removed
                    self.box_nodes.setdefault(box, []).append(vertex.name)
                    break
                if name not in seen:
                    seen.add(name)
                    members[container].append(("cluster", name))
                    members[name] = []
                container = name
            if ref is None:
                ref = self.prefix + id_text(vertex.name)
                members[container].append(("vertex", vertex.name))
            self.refs[vertex.name] = ref
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
            and name not in self.style.boundaries
            and name not in self.style.fused  # its cluster says it is fused
        )

    def _cluster(self, name: str, members: dict, parent: str | None) -> str:
        call = self.calls[name]
        highlighted = name in self.style.highlighted
        boundary = name in self.style.boundaries
        title = self._module_title(name)
        classes = "module"
        style, line, width = "filled", "#9ca3af", "0.8"
        if boundary:
            replacement = self.context.replacement(name)
            title += f" → {_shown(type(replacement).__name__)}"
            classes += " swapped-boundary"
            style, line, width = "filled,dashed", _SWAP_LINE, "1.5"
        if name in self.style.fused:
            title += " (fused)"
            classes += " fused"
            style, line, width = "filled,bold", _FUSED_LINE, "1.5"
        if highlighted:
            classes += " highlighted"
            line, width = _HIGHLIGHT, "2.5"
        cluster_id = f"{self.prefix}cluster:{id_text(name)}"
        # graphviz draws a subgraph as a cluster only when its name starts with "cluster"
        subgraph = f"cluster:{self.prefix}{id_text(name)}"
        attributes = [
            ("id", _quote(cluster_id)),
            ("class", _quote(classes)),
            ("label", _quote(title)),
            ("tooltip", _tooltip(self._module_tooltip(name))),
            ("style", _quote(style)),
            ("fillcolor", _quote(_color(call.fqn, highlighted))),
            ("color", _quote(line)),
            ("penwidth", width),
        ]
        self.clusters.append(name)
        self.rows[cluster_id] = ()  # its place in drawing order: before its members
        inside = self._container(name, members, cluster_id)
        self.rows[cluster_id] = (  # PictureCluster's fields
            cluster_id,
            name,
            tuple(classes.split()),
            title,
            self._module_tooltip(name),
            parent,
            tuple(inside),
            subgraph,
            tuple(attributes),
        )
        return cluster_id

    # -- nodes -------------------------------------------------------------------------

    def _vertex(self, vertex: _Vertex, parent: str | None, module: str | None = None) -> str:
        self.drawn += 1
        kind = vertex.kind
        status = self.style.status.get(vertex.name, "")
        highlighted = (module is not None and module in self.style.highlighted) or (
            vertex.name in self.style.highlighted_vertices
        )
        local = id_text(vertex.name)  # an fx name: itself
        dot_name = self.prefix + local
        label, tooltip = self._text(vertex)
        label = _lines(label, self._sharing(dot_name))
        classes = [kind]
        attributes: list[tuple[str, str]] = []
        if module is not None:
            classes.append("module")
            label = f"{self._module_title(module)}\n{label}"
            tooltip = f"{self._module_tooltip(module)}\n\n{tooltip}"
            color = _color(self.calls[module].fqn, highlighted)
            attributes.append(("fillcolor", _quote(color)))
        attributes += _KIND_STYLE.get(kind, [])
        if highlighted:
            classes.append("highlighted")
            attributes += [("color", _quote(_HIGHLIGHT)), ("penwidth", "2.5")]
        if status == "removed":
            classes.append("removed")
            attributes += _REMOVED_STYLE
        elif status == "added":
            classes.append("added")
            label = "+ " + label
            attributes += [("color", _quote(_ADDED)), ("penwidth", "2")]
        node_id = f"{self.prefix}node:{local}"
        head = [
            ("id", _quote(node_id)),
            ("class", _quote(" ".join(classes))),
            ("label", _quote(label)),
            ("tooltip", _tooltip(tooltip)),
        ]
        statement = f"{_quote(dot_name)} [{attribute_text(_merge(head + attributes))}];"
        calls = (module,) if module is not None else ()
        self.rows[node_id] = (  # PictureNode's fields
            node_id,
            kind,
            vertex.name,
            calls,
            tuple(classes),
            label,
            tooltip,
            parent,
            (),
            dot_name,
            statement,
        )
        return node_id

    def _text(self, vertex: _Vertex) -> tuple[str, str]:
        """(label, tooltip) of a node."""
        node, kind = self.nodes[vertex.name], vertex.kind
        if kind == _SWAPPED:
            return self._swapped_text(vertex)
        value = _value(node, self.context.dims)
        if kind == _INPUT:
            return _lines(node.name, value), _lines(f"{node.name}: input of the program", value)
        if kind == _OUTPUT:
            return "output", "output of the program"
        if kind in (_BUFFER, _CONSTANT, _PARAMETER):
            target = self.context.targets.get(vertex.name, vertex.name)
            label = _lines(_shown(target), value)
            return label, _lines(f"{node.name}: {kind} {_shown(target, TOOLTIP_NAME_LIMIT)}", value)
        label = _lines(_meta.op_text(node), value)
        # the op, and the arguments the picture's edges cannot show (scale, dims, a mask)
        arguments = _meta.arguments_text(node, state=self.context.targets)
        tooltip = _lines(f"{node.name} = {_meta.op_text(node, 'full')}", arguments, value)
        folded = vertex.params + vertex.buffers
        if folded and not self.scene.show_parameters:
            targets = [self.context.targets.get(p, p) for p in folded]
            names = [_shown(_relative(t, vertex.chain)) for t in targets]
            label += "\n+ " + _meta.shorten(", ".join(names), 40)
            for i, (name, target) in enumerate(zip(folded, targets)):
                state = self.context.placeholders.get(name)
                described = _value(state, self.context.dims) if state is not None else ""
                what = "parameter" if i < len(vertex.params) else "buffer"
                tooltip += f"\n{what} {_shown(target, TOOLTIP_NAME_LIMIT)} {described}".rstrip()
        return label, _lines(tooltip, _source(node))

    def _swapped_text(self, vertex: _Vertex) -> tuple[str, str]:
        call = vertex.swap_call
        replacement = self.context.replacement(call)
        info = self.context.info
        part = info.partitions.get(call) if info is not None else None
        kind = type(replacement)
        signature = _call_signature(part, replacement, self.context.program.ep) if part else ""
        label = _lines(f"{_shown(call)}: swapped", _shown(kind.__name__), signature)
        shown_call = _shown(call, TOOLTIP_NAME_LIMIT)
        tooltip = f"{vertex.name}: {shown_call} runs {kind.__module__}.{kind.__qualname__}"
        if part is not None:
            tooltip += f"\nin place of {len(part.nodes)} nodes of {part.type_name}"
        return label, tooltip

    def _box(self, first: str, parent: str | None) -> str:
        self.drawn += 1
        members = self.runs.get(first, [first])
        self.boxes += members
        calls = [self.calls[m] for m in members]
        highlighted = any(m in self.style.highlighted for m in members)
        nodes = sum(c.nodes for c in calls)
        numel = self.context.numel(set().union(*(c.params for c in calls)))
        counts = _plural(nodes, "node") + (f" · {_meta.count_text(numel)} params" if numel else "")
        if len(members) > 1:
            first_name, last_name = _shown(members[0]), _shown(members[-1])
            title = f"{first_name} … {last_name}: {self._type_name(first)} × {len(members)}"
            tooltip = f"{len(members)} calls of {calls[0].type}, collapsed\n{counts}"
        else:
            title = self._module_title(first)
            tooltip = f"{self._module_tooltip(first)}\ncollapsed"
        ref = self._box_ref(first)
        removed = first in self.removed_boxes
        fused = len(members) == 1 and first in self.style.fused
        if fused:
            title += " (fused)"
            tooltip += "\nfused: one call of a GraphModule of these nodes; opens into them"
        label = _lines(title, counts, self._sharing(ref))
        classes = "module collapsed" + " fused" * fused
        classes += " highlighted" * highlighted + " removed" * removed
        attributes = [
            ("id", _quote(ref)),
            ("class", _quote(classes)),
            ("label", _quote(label)),
            ("tooltip", _tooltip(tooltip)),
            ("shape", "box3d"),
            ("margin", '"0.1,0.06"'),
            ("style", "filled"),
            ("fillcolor", _quote(_color(calls[0].fqn, highlighted))),
        ]
        if fused:
            attributes += [("color", _quote(_FUSED_LINE)), ("penwidth", "1.5")]
        if highlighted:
            attributes += [("color", _quote(_HIGHLIGHT)), ("penwidth", "2.5")]
        if removed:
            attributes += [(k, v) for k, v in _REMOVED_STYLE if k != "style"]
            attributes.append(("style", _quote("filled,dashed")))
        self.rows[ref] = (  # PictureNode's fields
            ref,
            "box",
            None,
            tuple(members),
            tuple(classes.split()),
            label,
            tooltip,
            parent,
            tuple(self.box_nodes.get(first, ())),
            ref,
            f"{_quote(ref)} [{attribute_text(_merge(attributes))}];",
        )
        return ref

    def _box_ref(self, first: str) -> str:
        members = self.runs.get(first)
        if members:
            return f"{self.prefix}modules:{id_text(members[0])}..{id_text(members[-1])}"
        return f"{self.prefix}module:{id_text(first)}"

    # -- module text -------------------------------------------------------------------

    def _type_name(self, name: str) -> str:
        return _shown(self.calls[name].type.rsplit(".", 1)[-1] or "?")

    def _module_title(self, name: str) -> str:
        return f"{_shown(name)}: {self._type_name(name)}"

    def _module_tooltip(self, name: str) -> str:
        # asked once per drawn node of a module: computed once per module call
        cached = self._tooltips.get(name)
        if cached is None:
            cached = self._tooltips[name] = self._describe_module(name)
        return cached

    def _describe_module(self, name: str) -> str:
        call = self.calls[name]
        numel = self.context.numel(call.params)
        text = f"{_shown(name, TOOLTIP_NAME_LIMIT)}: {call.type}\n{_plural(call.nodes, 'node')}"
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
        status = self.style.status
        plain = {self.prefix + id_text(name) for name in self.vertices}
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

        for vertex in self.scene.vertices:
            for source, path in vertex.inputs:
                add(source, vertex.name, path, status.get(source) or status.get(vertex.name, ""))
            if self.scene.show_parameters:
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

    def _local(self, ref: str) -> str:
        """A DOT node name without the picture's prefix (``before/module:x`` -> ``module:x``)."""
        return ref[len(self.prefix) :]

    def _sharing(self, ref: str) -> str:
        """The label line of a node or box that uses, or is, a value shared by many."""
        lines = []
        if ref in self.fanout:
            lines.append(f"{self._name_of_ref(ref)} → {self.fanout[ref]} users")
        if ref in self.shared:
            names = [self._name_of_ref(tail) for tail in self.shared[ref]]
            lines.append("shared: " + _meta.shorten(", ".join(names), 40))
        return "\n".join(lines)

    def _name_of_ref(self, ref: str) -> str:
        """What a label calls a DOT node: its fx node or module name, as labels show names."""
        return _shown(name_of_id_text(self._local(ref).removeprefix("module:")))

    def _element_id(self, ref: str) -> str:
        """The element id of a DOT node name: ``before/linear`` -> ``before/node:linear``."""
        if ref in self.rows:
            return ref  # a box: its name is its id
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
            attributes = [("id", _quote(edge_id))]
            if path:
                attributes.append(("taillabel", _quote(path)))
            if mark == "removed":
                attributes += [("style", "dashed"), ("color", _quote(_REMOVED))]
            elif mark == "added":
                attributes += [("color", _quote(_ADDED)), ("penwidth", "1.5")]
            statement = f"{_quote(tail)} -> {_quote(head)} [{attribute_text(attributes)}];"
            self.edges.append(  # PictureEdge's fields
                (
                    edge_id,
                    self._element_id(tail),
                    self._element_id(head),
                    path,
                    mark,
                    statement,
                    None,
                )
            )


# More users than this and a value's edges are left out (see _Writer._collect_edges).
_MAX_FANOUT = 8

_KIND_STYLE: dict[str, list[tuple[str, str]]] = {
    _INPUT: [("style", "filled"), ("fillcolor", '"#e5e7eb"')],
    _OUTPUT: [("style", "filled"), ("fillcolor", '"#e5e7eb"')],
    _BUFFER: [("shape", "cylinder"), ("style", "filled"), ("fillcolor", '"#fef9c3"')],
    _PARAMETER: [("shape", "cylinder"), ("style", "filled"), ("fillcolor", '"#f3f4f6"')],
    _CONSTANT: [("shape", "note"), ("style", "filled"), ("fillcolor", '"#f3f4f6"')],
    _GLUE: [("shape", "plain"), ("fontcolor", '"#6b7280"')],
    _CHECK: [("shape", "plain"), ("fontcolor", '"#9ca3af"'), ("fontsize", "7")],
    _SWAPPED: [
        ("style", _quote("filled,bold")),
        ("peripheries", "2"),
        ("fillcolor", _quote(_SWAP_FILL)),
        ("color", _quote(_SWAP_LINE)),
    ],
}
_REMOVED_STYLE = [
    ("style", _quote("rounded,filled,dashed")),
    ("color", _quote(_REMOVED)),
    ("fontcolor", '"#6b7280"'),
    ("fillcolor", '"#f3f4f6"'),
]


def _merge(attributes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Later attributes win; the first position of each key is kept."""
    merged: dict[str, str] = {}
    for key, value in attributes:
        merged[key] = value
    return list(merged.items())


def _lines(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def _call_signature(part: Partition, replacement: Any, ep: ExportedProgram) -> str:
    """``(x: f32[1, 16, 64]) → f32[1, 16, 64]``: the call as the program makes it, its
    positional arguments named as the replacement's forward names them."""
    if part.signature is None:
        return ""
    args_spec, _ = part.signature.in_spec.children()
    names = _parameter_names(replacement, args_spec.num_children) if replacement else None
    return program_index(ep).call_text(part.call_name, names, wrap=48)


def _parameter_names(module: Any, count: int) -> list[str]:
    names: list[str] = []
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        parameters = []
    for parameter in parameters:
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            names.append(parameter.name)
        elif parameter.kind == parameter.VAR_POSITIONAL:
            names += [f"{parameter.name}[{i}]" for i in range(count - len(names))]
    return (names + [f"arg{i}" for i in range(len(names), count)])[:count]


# -- arguments -------------------------------------------------------------------------------


def _names(value: Any, argument: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, Mapping):
        names = list(value)
        for name in names:
            if not isinstance(name, str):
                raise RenderError(f"{argument}: expected module names (str), got {name!r}")
        return sorted(set(names)) if isinstance(value, (set, frozenset)) else names
    raise RenderError(
        f"{argument}: expected a module name or a collection of them, got {type(value).__name__}"
    )


def _resolve(names: list[str], scene: _Scene, program: _Program, argument: str) -> list[str]:
    """Module or call names -> the calls of the picture they stand for, in model order.

    Names are read as every entry point reads them (:meth:`ProgramIndex.resolve`: ``"blk@0"``
    is ``"blk"``). A module stands for each of its calls; a module without calls of its own (a
    container such as nn.ModuleList) for the outermost calls of its submodules.
    """
    calls = scene.calls
    index = program_index(program.ep)
    by_fqn: dict[str, list[str]] = {}
    for call in calls.values():
        by_fqn.setdefault(call.fqn, []).append(call.name)
    wanted: set[str] = set()
    for name in names:
        if name == "":
            raise RenderError(
                f"{argument}: the root module '' is the whole picture; name a submodule"
            )
        try:
            resolved = index.resolve(name)
        except UnknownModuleError as error:
            raise UnknownModuleError(f"{argument}: {error}") from None
        if resolved.one_call:
            wanted.add(resolved.name)
            continue
        fqn = resolved.fqn
        if fqn in by_fqn:
            # a module with calls of its own stands for them (its submodules' calls are
            # inside them): no need to look through every call of the picture
            wanted.update(by_fqn[fqn])
            continue
        for call in calls.values():
            if call.fqn.startswith(fqn + ".") and _outermost(call, fqn, calls):
                wanted.add(call.name)
    return [name for name in calls if name in wanted]


def _outermost(call: _Call, prefix: str, calls: Mapping[str, _Call]) -> bool:
    parent = call.parent
    while parent:
        if calls[parent].fqn == prefix or calls[parent].fqn.startswith(prefix + "."):
            return False
        parent = calls[parent].parent
    return True


def _check_collapse(collapse: Any) -> None:
    if collapse is None or collapse == "auto":
        return
    expected = "collapse: expected 'auto', None, a depth (1, 2, ...) or a set of module names"
    if isinstance(collapse, str):
        raise RenderError(
            f"{expected}, got {collapse!r}; to collapse one module pass {{{collapse!r}}}"
        )
    if isinstance(collapse, bool):
        raise RenderError(f"{expected}, got {collapse!r}")
    if isinstance(collapse, int) and collapse < 1:
        raise RenderError(
            f"collapse: a depth is 1 or more (1 draws every top-level module as a box), got "
            f"{collapse}; use collapse=None to collapse nothing"
        )


def _diff_mode(diff: Any, program: _Program) -> str | None:
    if diff is None or diff is False:
        return None
    mode = "merged" if diff is True else diff
    if mode not in ("merged", "split"):
        raise RenderError(f"diff: expected None, True, 'merged' or 'split', got {diff!r}")
    if program.info is None:
        raise RenderError(
            "diff: this program has no swaps to compare; draw a gs.swap result (or a Surgery "
            "with swaps), and the picture compares it with the program it was made from"
        )
    return mode


# -- putting it together ---------------------------------------------------------------------


def graph_view(
    program: Any,
    *,
    highlight: str | Iterable[str] = (),
    collapse: Any = "auto",
    diff: Any = None,
    max_nodes: int = AUTO_MAX_NODES,
    show_parameters: bool = False,
) -> GraphView:
    """Draw ``program`` as DOT text and say what the picture shows. See :func:`to_dot`.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.render import graph_view
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> view = graph_view(gs.export(model, (torch.randn(2, 4),)), collapse=1)
        >>> view.collapsed, view.drawn_nodes
        (('0', '1'), 4)
    """
    source = _program(program)
    mode = _diff_mode(diff, source)
    _check_collapse(collapse)
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise RenderError(f"max_nodes: expected a positive int, got {max_nodes!r}")
    with _without_cyclic_gc():
        return _view(source, mode, highlight, collapse, max_nodes, show_parameters)


@contextlib.contextmanager
def _without_cyclic_gc():
    """Drawing allocates many small objects and no cycles: without this, the cyclic garbage
    collector walks the whole heap (the program, torch) several times per picture."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _view(
    source: _Program,
    mode: str | None,
    highlight: Any,
    collapse: Any,
    max_nodes: int,
    show_parameters: bool,
) -> GraphView:
    ep, info = source.ep, source.info
    state = _state(ep)
    before = _analysis(ep, state)
    after = None
    if source.swapped is not None:
        after = _analysis(source.swapped, state)
    swapped = tuple(info.call_nodes) if info is not None else ()
    style = _Style()
    scene, pictures = _pictures(mode, before, after, info, style, show_parameters)

    highlight_names = _names(highlight, "highlight")
    style.highlighted = set(_resolve(highlight_names, scene, source, "highlight"))
    chosen_swaps = _swaps_named(highlight_names, info)
    if mode is None:  # the swapped module has no cluster here: its box stands out instead
        style.highlighted_vertices = {info.call_nodes[c] for c in chosen_swaps}
    collapsed: set[str] = set()
    if collapse is not None and not isinstance(collapse, (int, str)):
        collapsed = set(_resolve(_names(collapse, "collapse"), scene, source, "collapse"))
    forced = scene.ancestors(n for n in swapped if mode is not None)
    if collapse == "auto" or isinstance(collapse, int):
        forced |= scene.ancestors(style.highlighted)
    open_, runs = _plan(scene, collapse, collapsed, forced, max_nodes)
    style.fused = set(source.fused)
    if collapse == "auto" or isinstance(collapse, int):
        # a fused call is one call now: one box, unless highlighted (or opened by name)
        open_ -= style.fused - forced

    context = _Context(source, state)
    writers = [_Writer(s, open_, runs, style, context, p, e) for s, p, e in pictures]
    for writer in writers:
        writer.write()
    picture = _picture(before.root_type.rsplit(".", 1)[-1] or "program", writers, scene)

    graph_nodes = len((source.swapped or ep).graph.nodes)
    if mode is not None:
        graph_nodes = len(ep.graph.nodes) + len(source.swapped.graph.nodes)
    present = set(scene.present)
    boxes = {b for w in writers for b in w.boxes}
    clusters = {c for w in writers for c in w.clusters}
    return GraphView(
        dot=picture.to_dot(),
        picture=picture,
        graph_nodes=graph_nodes,
        drawn_nodes=sum(w.drawn for w in writers),
        clusters=tuple(n for n in scene.present if n in clusters),
        collapsed=tuple(n for n in scene.present if n in boxes),
        highlighted=tuple(
            n
            for n in before.calls
            if (n in style.highlighted and n in present) or n in chosen_swaps
        ),
        swapped=swapped,
        fused=tuple(source.fused),
    )


def _pictures(
    mode: str | None,
    before: _Analysis,
    after: _Analysis | None,
    info: SwapInfo | None,
    style: _Style,
    show_parameters: bool,
) -> tuple[_Scene, list[tuple[_Scene, str, list[tuple[str, str, str]]]]]:
    """The scene the collapse plan is made on, and the pictures drawn with that plan, as
    ``(scene, id prefix, extra edges)``. Sets the diff markings of ``style``."""
    if mode is None:
        scene = _Scene((after or before).vertices, before.calls, {}, show_parameters)
        return scene, [(scene, "", [])]
    # In a diff the swapped box is drawn inside its module's boundary, in both pictures.
    boundary_chains = {
        v.name: (*v.chain, v.swap_call) for v in after.vertices if v.kind == _SWAPPED
    }
    vertices, removed, removed_edges, aliases = _merge_programs(before, after, info)
    merged = _Scene(vertices, before.calls, boundary_chains, show_parameters, aliases)
    style.boundaries = set(info.call_nodes)
    style.status = dict.fromkeys(removed, "removed")
    style.status.update(
        (v.name, "added")
        for v in after.vertices
        if v.kind in (_SWAPPED, _GLUE) and v.name not in before.by_name
    )
    if mode == "merged":
        return merged, [(merged, "", removed_edges)]
    return merged, [
        (_Scene(before.vertices, before.calls, {}, show_parameters), "before/", []),
        (_Scene(after.vertices, before.calls, boundary_chains, show_parameters), "after/", []),
    ]


def _swaps_named(names: list[str], info: SwapInfo | None) -> list[str]:
    """The swapped calls that ``names`` point at (by call name, fqn, or a parent's fqn)."""
    if info is None:
        return []
    names = [fqn if k == 0 else name for name in names for fqn, k in [split_call_name(name)]]
    chosen = []
    for call in info.call_nodes:
        fqn = split_call_name(call)[0]
        if any(name in (call, fqn) or fqn.startswith(name + ".") for name in names):
            chosen.append(call)
    return chosen


def _merge_programs(
    before: _Analysis, after: _Analysis, info: SwapInfo
) -> tuple[list[_Vertex], list[str], list[tuple[str, str, str]], dict[str, str]]:
    """Both programs as one list of vertices, in the original order.

    Returns the vertices of the swapped program with the removed ones of the original put
    back just before the box that replaced them; the names of the removed vertices; the
    original edges from removed vertices to vertices that were kept; and the new names of
    kept values that the swap renamed (an argument named ``input`` becomes ``input_1``).
    """
    removed_by_call = {
        call: [name for name in part.nodes if name in before.by_name]
        for call, part in info.partitions.items()
    }
    removed = [name for names in removed_by_call.values() for name in names]
    removed_set = set(removed)
    aliases = {
        old: new
        for old, new in getattr(info, "node_map", {}).items()
        if old != new and old not in removed_set and new in after.by_name
    }
    merged: list[_Vertex] = []
    for vertex in after.vertices:
        if vertex.kind == _SWAPPED:
            call = vertex.swap_call
            merged += [before.by_name[name] for name in removed_by_call.get(call, [])]
        merged.append(vertex)
    # A value that only the removed nodes used (an input leaf only the swapped call read)
    # is gone from the swapped program: draw it from the original.
    names = {vertex.name for vertex in merged}
    missing = []
    for name in removed:
        for source, _ in before.by_name[name].inputs:
            if source not in names and source not in aliases:
                names.add(source)
                missing.append(before.by_name[source])
    removed_edges = [
        (source, aliases.get(vertex.name, vertex.name), path)
        for vertex in before.vertices
        if vertex.name not in removed_set and aliases.get(vertex.name, vertex.name) in names
        for source, path in vertex.inputs
        if source in removed_set
    ]
    return missing + merged, removed, removed_edges, aliases


def _picture(name: str, writers: list[_Writer], scene: _Scene) -> Picture:
    """The Picture of one drawing, or of the two sides of a split diff."""
    if len(writers) == 1:
        (writer,) = writers
        return Picture(name, _HEADER, tuple(writer.top), writer.rows, tuple(writer.edges))
    rows: dict[str, tuple] = {}
    top, edges = [], []
    for writer, title in zip(writers, ("before", "after")):
        side = f"diff:{title}"
        attributes = (
            ("id", _quote(side)),
            ("label", _quote(title)),
            ("fontsize", "12"),
            ("color", '"#d1d5db"'),
        )
        # PictureCluster's fields: a side has no module call
        rows[side] = (
            side,
            None,
            ("diff",),
            title,
            "",
            None,
            tuple(writer.top),
            f"cluster:{title}",
            attributes,
        )
        for element_id, row in writer.rows.items():
            parent = _PARENT_FIELD[len(row)]
            if row[parent] is None:  # the side's own top level
                row = (*row[:parent], side, *row[parent + 1 :])
            rows[element_id] = row
        top.append(side)
        edges += [(*row[:-1], side) for row in writer.edges]
    rank_same = _alignment(*writers, scene.aliases)
    return Picture(name, _HEADER, tuple(top), rows, tuple(edges), rank_same, split=True)


# Where a row keeps the id of the cluster it is in: PictureNode rows have 11 fields, PictureCluster 9.
_PARENT_FIELD = {11: 7, 9: 5}


def _alignment(
    before: _Writer, after: _Writer, aliases: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """Pairs of DOT nodes drawn level: each node kept by the swap, in both pictures."""
    pairs = []
    seen = set()
    for name, ref in before.refs.items():
        other = after.refs.get(aliases.get(name, name))
        if other is None or (ref, other) in seen:
            continue
        seen.add((ref, other))
        pairs.append((ref, other))
    return tuple(pairs)


def to_dot(
    program: Any,
    *,
    highlight: str | Iterable[str] = (),
    collapse: Any = "auto",
    diff: Any = None,
    max_nodes: int = AUTO_MAX_NODES,
    show_parameters: bool = False,
) -> str:
    """The DOT text of ``program`` drawn with its module partitions. Pure: no binary needed.

    Args:
        program: an ExportedProgram, a :func:`graphsurgeon.swap` or :func:`graphsurgeon.fuse`
            result, or a Surgery (its ``.module`` when something is swapped or fused, else its
            ``.program``). A fused call is drawn as what it runs, the program's own nodes: one
            box marked "fused" (blue border) that opens into them when asked (``collapse=None``,
            a set of names without it, or a highlight).
        highlight: module fqns or call names (``"layers.1"``, ``"shared@1"``) to make stand out:
            bold border, stronger fill. A container (``"layers"``) highlights its submodules;
            a swapped module highlights its box. Unknown names raise
            :class:`~graphsurgeon.UnknownModuleError`.
        collapse: which module calls are drawn as one box (node count, edges aggregated):

            * ``"auto"`` (default): as much detail as fits in ``max_nodes`` drawn nodes. Starts
              with every top-level module collapsed, then opens whole groups of modules of one
              type at a time (every ``Block``, then every ``MLP``...), cheapest first, while the
              picture stays within budget. Highlighted modules (and their parents) stay open.
              If the top-level boxes alone are too many, runs of sibling modules of one type
              become one box. Nodes that belong to no module are always drawn.
            * ``None``: nothing collapsed.
            * a depth ``d >= 1``: calls ``d`` levels deep are boxes (``1``: every top-level
              module); highlighted modules stay open.
            * a set of fqns or call names: exactly those are boxes.

        diff: compare a swapped program with the program it was made from:
            ``"merged"`` (or ``True``) draws one picture: the removed nodes greyed and dashed
            inside the swapped module's boundary (a dashed orange cluster), next to the added
            box marked ``+`` in green. ``"split"`` draws two pictures side by side, ``before``
            and ``after``, each node level with itself in the other, ids prefixed ``before/``
            and ``after/``. Both keep the original node order. Swapped modules stay open.
        max_nodes: the budget of ``collapse="auto"`` (per picture).
        show_parameters: draw parameters as nodes of their own instead of folding them into
            the node that uses them.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.render import to_dot
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> ep = gs.export(model, (torch.randn(2, 4),))
        >>> dot = to_dot(ep, highlight="1")
        >>> [line.strip()[:61] for line in dot.splitlines() if "highlighted" in line]
        ['"relu" [id="node:relu", class="op module highlighted", label=']
        >>> to_dot(ep) == to_dot(ep)
        True
    """
    return graph_view(
        program,
        highlight=highlight,
        collapse=collapse,
        diff=diff,
        max_nodes=max_nodes,
        show_parameters=show_parameters,
    ).dot


# -- layouts -------------------------------------------------------------------------------

_LAYOUTS: OrderedDict[str, bytes] = OrderedDict()
_LAYOUTS_LOCK = threading.Lock()
_LAYOUTS_MAX = 64


def _layout(dot: str, format_: str = "svg") -> bytes:
    """Run graphviz's ``dot`` on ``dot``; results are cached by (format, DOT text)."""
    binary = shutil.which("dot")
    if binary is None:
        raise MissingDependencyError(
            "drawing needs graphviz's `dot` program, which is not on PATH. Install graphviz: "
            "`apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS) or "
            "`conda install graphviz`; to_dot() works without it."
        )
    key = hashlib.sha256(f"{format_}\0{dot}".encode()).hexdigest()
    with _LAYOUTS_LOCK:
        cached = _LAYOUTS.get(key)
        if cached is not None:
            _LAYOUTS.move_to_end(key)
            return cached
    result = subprocess.run(
        [binary, f"-T{format_}"], input=dot.encode(), capture_output=True, check=False
    )
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip()
        raise RenderError(f"graphviz's dot failed (exit {result.returncode}): {message}")
    with _LAYOUTS_LOCK:
        _LAYOUTS[key] = result.stdout
        while len(_LAYOUTS) > _LAYOUTS_MAX:
            _LAYOUTS.popitem(last=False)
    return result.stdout


def to_svg(
    program: Any,
    *,
    highlight: str | Iterable[str] = (),
    collapse: Any = "auto",
    diff: Any = None,
    max_nodes: int = AUTO_MAX_NODES,
    show_parameters: bool = False,
) -> str:
    """The SVG of :func:`to_dot`'s picture, laid out by graphviz's ``dot`` (cached by DOT text).

    Raises :class:`~graphsurgeon.MissingDependencyError` when ``dot`` is not installed.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.render import to_svg
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> svg = to_svg(gs.export(model, (torch.randn(2, 4),)))
        >>> 'id="node:linear"' in svg and svg.rstrip().endswith("</svg>")
        True
    """
    dot = to_dot(
        program,
        highlight=highlight,
        collapse=collapse,
        diff=diff,
        max_nodes=max_nodes,
        show_parameters=show_parameters,
    )
    return _layout(dot, "svg").decode()
