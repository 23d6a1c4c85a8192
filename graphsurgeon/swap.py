"""swap(): replace module calls of an exported program with eager modules, in one pass.

How it works. The exported graph is copied node by node, in its own order, into a new graph
that is already "unlifted" (parameters and buffers become attributes, user inputs become the
model's own arguments). When the copy reaches the first node of a call that is being swapped,
it emits one ``call_module`` of the replacement, with the arguments rebuilt from the preserved
call signature (constants passed as their values), skips the call's own nodes, and binds each of
the call's output nodes, by name, to the matching leaf of the replacement's output. Nodes that
used those outputs now use the replacement's. Nothing is legalized or reordered, no node is
copied twice, the graph is compiled once.

The same pass fuses (:func:`graphsurgeon.fuse`): a fused call is replaced by a GraphModule cut
from the call's own nodes (:func:`cut_call`), so it computes bit for bit what the program did.

Pytree glue is only emitted where a value is really taken apart: a leaf is a ``getitem`` chain
made on first use, and a structure that is exactly another call's output (or an argument of the
model) is passed through whole instead of being flattened and rebuilt.

What the result refuses: the program's first node checks the inputs as ``ep.module()`` does
(structure, static and dynamic sizes, constant inputs: :mod:`graphsurgeon._guards`), and what
each replacement returns is checked at its call (structure, dtype, static sizes).
"""

from __future__ import annotations

import functools
import gc
import inspect
import keyword
import linecache
import operator
import types
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from . import _meta, _runtime
from ._codegen import FastCodeGen
from ._guards import InputGuard
from .errors import (
    ConflictError,
    InputStructureError,
    ModeError,
    NotPreservedError,
    NotSwappableError,
    ReplacementError,
    SwapError,
    UnknownModuleError,
    a_type,
    did_you_mean,
)
from .partition import (
    Partition,
    ProgramIndex,
    call_name,
    op_argument,
    program_index,
    returned_object,
    split_call_name,
)

__all__ = ["Diff", "SwapInfo", "cut_call", "swap", "swap_info"]


@dataclass(frozen=True)
class SwapInfo:
    """What a swapped or fused program was made from; kept in ``gm.meta["graphsurgeon"]``.

    Attributes:
        program: the ExportedProgram it was made from (not modified).
        requests: the request as given, ``{name: replacement}`` (fused names map to the
            GraphModule cut for their first call).
        calls: call name -> the module now running it (a replacement, or for a fused call the
            GraphModule of its own nodes), in graph order.
        fused: the calls that are fused rather than swapped, in graph order.
        installed_at: call name -> attribute path of that module in the result.
        call_nodes: call name -> name of its ``call_module`` node in the result.
        partitions: call name -> the original :class:`Partition` that was replaced.
        node_map: node name in the program -> name of the node holding its value in the
            result. Names are kept where possible; they differ for an argument named after a
            Python builtin (``input`` -> ``input_1``) and for a swapped call's outputs (now
            taken from the call). Nodes of swapped calls that are not outputs are absent.
        copies: node name in the result -> the program node it is a copy of.
        result_nodes: the computation nodes of the result, in graph order.
        diff: what the swap removed, added and kept (:class:`Diff`).
    """

    # the program, or a weak reference to it: the runnable original graphsurgeon caches for a
    # program (verify, compare, the stepper) must not keep that program alive
    _program: ExportedProgram | weakref.ref = field(repr=False)
    requests: Mapping[str, torch.nn.Module] = field(repr=False)
    calls: Mapping[str, torch.nn.Module] = field(repr=False)
    installed_at: Mapping[str, str]
    call_nodes: Mapping[str, str]
    partitions: Mapping[str, Partition] = field(repr=False)
    node_map: Mapping[str, str] = field(default_factory=dict, repr=False)
    copies: Mapping[str, str] = field(default_factory=dict, repr=False)
    result_nodes: tuple[str, ...] = field(default=(), repr=False)
    fused: tuple[str, ...] = ()

    @property
    def program(self) -> ExportedProgram:
        """The ExportedProgram it was made from."""
        program = self._program
        if isinstance(program, weakref.ref):
            program = program()
            if program is None:
                raise SwapError("the program this GraphModule was made from no longer exists")
        return program

    @functools.cached_property
    def diff(self) -> Diff:
        """What the swap changed in the graph, as a :class:`Diff` (computed once)."""
        return _diff(self)

    @property
    def swapped(self) -> tuple[str, ...]:
        """The calls replaced by eager modules (not fused), in graph order."""
        return tuple(c for c in self.calls if c not in self.fused)

    def __str__(self) -> str:
        parts = [f"{len(self.swapped)} swapped"]
        if self.fused:
            parts.append(f"{len(self.fused)} fused")
        return f"SwapInfo: {', '.join(parts)} ({', '.join(self.calls)}); {self.diff}"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from . import display as d

        rows = []
        for call, module in self.calls.items():
            kind = "fused" if call in self.fused else "swapped"
            part = self.partitions.get(call)
            replaced = f"{len(part.nodes)} nodes of {part.type_name}" if part else ""
            runs = "its own nodes" if kind == "fused" else type(module).__name__
            rows.append(
                [d.badge(kind, "info"), call, runs, replaced, self.call_nodes.get(call, "")]
            )
        table = d.table(
            ["", "call", "runs", "in place of", "call node"],
            [[r[0], *(d.escape(c) for c in r[1:])] for r in rows],
            raw=range(5),
        )
        body = f'<div class="gs-title">{d.escape(str(self))}</div>{table}'
        return d.bundle(body, str(self), include, exclude)


_COMPUTATION = ("call_function", "call_module", "call_method")


@dataclass(frozen=True)
class Diff:
    """Graph nodes removed, added and kept by a swap, compared with its program.

    Only computation nodes count (calls of ops, functions and modules); names are in graph
    order. This is the one definition of what a swap changed: ``Surgery.diff()`` returns it and
    the before/after pictures draw it.

    Attributes:
        removed: nodes of the program that the result no longer computes.
        added: nodes of the result that are not copies of program nodes (the calls of the
            replacements, the checks of what they return, glue that takes outputs apart).
        kept: nodes of the program that the result still computes.
        removed_by_call: swapped call -> its removed nodes; under ``""`` the nodes outside
            every swapped call that the swap left unused and dropped (size arithmetic).
        renamed: program node -> its name in the result, where the two differ (an argument
            named after a Python builtin: ``input`` -> ``input_1``).
    """

    removed: tuple[str, ...]
    added: tuple[str, ...]
    kept: tuple[str, ...]
    removed_by_call: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    renamed: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __str__(self) -> str:
        return f"{len(self.removed)} removed, {len(self.added)} added, {len(self.kept)} kept"

    def __repr__(self) -> str:
        return f"<Diff: {self}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from . import display as d

        head = (
            f'<div class="gs-title">{d.badge(f"{len(self.removed)} removed", "bad")} '
            f"{d.badge(f'{len(self.added)} added', 'ok')} "
            f"{d.badge(f'{len(self.kept)} kept', 'info')} "
            '<span class="gs-muted">computation nodes, against the original program</span></div>'
        )
        folds = []
        for call, nodes in self.removed_by_call.items():
            where = f"removed by {call}" if call else "removed outside any call (size arithmetic)"
            folds.append(d.details(f"{d.escape(where)}: {len(nodes)}", d.names(nodes)))
        folds.append(d.details(f"added: {len(self.added)}", d.names(self.added)))
        folds.append(d.details(f"kept: {len(self.kept)}", d.names(self.kept)))
        if self.renamed:
            pairs = [f"{old} → {new}" for old, new in self.renamed.items()]
            folds.append(d.details(f"renamed: {len(pairs)}", d.names(pairs)))
        return d.bundle(head + "".join(folds), repr(self), include, exclude)


def _diff(info: SwapInfo) -> Diff:
    before = [n.name for n in info.program.graph.nodes if n.op in _COMPUTATION]
    copied = set(info.copies.values())
    kept = tuple(n for n in before if n in copied)
    removed = tuple(n for n in before if n not in copied)
    removed_set = set(removed)
    by_call: dict[str, tuple[str, ...]] = {}
    in_calls: set[str] = set()
    for call, part in info.partitions.items():
        by_call[call] = tuple(n for n in part.nodes if n in removed_set)
        in_calls.update(by_call[call])
    dropped = tuple(n for n in removed if n not in in_calls)
    if dropped:
        by_call[""] = dropped
    added = tuple(new for new in info.result_nodes if new not in info.copies)
    renamed = {
        old: new for old, new in info.node_map.items() if old != new and old not in removed_set
    }
    return Diff(removed, added, kept, by_call, renamed)


def swap_info(gm: torch.nn.Module) -> SwapInfo | None:
    """The :class:`SwapInfo` of a program made by :func:`swap` or :func:`graphsurgeon.fuse`,
    or None for any other module."""
    meta = getattr(gm, "meta", None)
    return meta.get(_meta.INFO) if isinstance(meta, dict) else None


# -- planning -----------------------------------------------------------------------------


class _Fuse:
    """Stands for "fuse this call" where a replacement module would stand in a request."""

    def __repr__(self) -> str:
        return "FUSE"


#: In a request ``{name: FUSE}``: cut the call's own nodes into a GraphModule of their own.
FUSE = _Fuse()


@dataclass
class _Request:
    call_name: str
    fqn: str
    replacement: torch.nn.Module | _Fuse
    install_path: str
    partition: Partition
    nodes: list[Node]
    # filled while building
    emitted: bool = False
    outputs: dict[str, Any] = field(default_factory=dict)
    call_node: Node | None = None
    module: torch.nn.Module | None = None  # what runs the call (the cut, for a fused call)

    @property
    def fused(self) -> bool:
        return self.replacement is FUSE


def _type_name(module: Any) -> str:
    return type(module).__name__


def _plan(index: ProgramIndex, modules: Mapping[str, Any], verb: str = "swap") -> list[_Request]:
    if not isinstance(modules, Mapping):
        raise SwapError(
            f"{verb}: expected a mapping {{module name: replacement}}, got {type(modules).__name__}"
        )
    parts = index.partitions()
    requests: list[_Request] = []
    for name, replacement in modules.items():
        if not isinstance(name, str):
            raise SwapError(f"{verb}: module names are strings such as 'blocks.0', got {name!r}")
        if replacement is not FUSE:
            check_module(name, replacement)
        resolved = index.resolve(name)
        fqn = resolved.fqn
        if fqn == "":
            raise SwapError(
                f"{verb}: the root module cannot be {verb}ped; call the replacement model directly"
                if verb == "swap"
                else "fuse: the root module is the whole program; name a submodule"
            )
        if not resolved.calls:
            raise NotSwappableError(
                f"cannot {verb} {fqn!r}: {index.why_no_calls(fqn)}. Its submodules may be "
                f"{verb}pable: gs.module_tree(ep) lists them."
                if verb == "swap"
                else f"cannot fuse {fqn!r}: {index.why_no_calls(fqn)}."
            )
        # one call is installed under its own name ("blk@1", also "blk@0" as given)
        chosen, install = resolved.calls, (name if resolved.one_call else fqn)
        for cname in chosen:
            part = parts[cname]
            if not part.preserved:
                raise NotPreservedError(
                    f"cannot {verb} {cname!r}: its call signature was {part.reason}."
                )
            if not part.swappable:
                raise NotSwappableError(f"cannot {verb} {cname!r}: {part.reason}.")
            request = _Request(
                call_name=cname,
                fqn=fqn,
                replacement=replacement,
                install_path=install,
                partition=part,
                nodes=index.call_nodes.get(cname, []),
            )
            if not request.fused:
                _check_call(index, request)
            requests.append(request)
    _check_conflicts(requests)
    # an empty partition is never swappable (refused above), so every request has nodes[0]
    requests.sort(key=lambda r: index.order[r.nodes[0]])
    return requests


def check_module(name: str, replacement: Any) -> None:
    """A replacement must be a working nn.Module."""
    if not isinstance(replacement, torch.nn.Module):
        raise ReplacementError(
            f"the replacement for {name!r} is {a_type(replacement)}, not a torch.nn.Module. "
            "Wrap a function in an nn.Module whose forward calls it."
        )
    if "_modules" not in vars(replacement) or "_parameters" not in vars(replacement):
        raise ReplacementError(
            f"the replacement for {name!r} ({_type_name(replacement)}) is not initialized as a "
            "module: its __init__ does not call super().__init__() (it must, before setting "
            "any attribute)."
        )


def _check_call(index: ProgramIndex, request: _Request) -> None:
    """The replacement's forward must take the arguments the program calls the module with."""
    module = request.replacement
    signature = request.partition.signature
    try:
        parameters = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return  # a forward whose signature Python cannot read: it will tell at run time
    args_spec, kwargs_spec = signature.in_spec.children()
    try:
        parameters.bind(*range(args_spec.num_children), **dict.fromkeys(kwargs_spec.context))
    except TypeError as problem:
        raise ReplacementError(
            f"the replacement for {request.call_name!r} ({_type_name(module)}) cannot take the "
            f"arguments the program calls it with: the program calls "
            f"{request.call_name}{index.call_text(request.call_name)}, but its forward is "
            f"forward{parameters} ({problem}). Make forward accept those arguments (add the "
            "missing parameters, or **kwargs for the keywords it ignores)."
        ) from None


def _check_conflicts(requests: list[_Request]) -> None:
    owner: dict[Node, _Request] = {}
    for request in requests:
        for node in request.nodes:
            other = owner.get(node)
            if other is None:
                owner[node] = request
                continue
            a, b = sorted((other, request), key=lambda r: len(r.fqn))
            if a.call_name == b.call_name:
                raise ConflictError(f"call {a.call_name!r} is requested twice; request it once.")
            if b.fqn.startswith(a.fqn + "."):
                raise ConflictError(
                    f"both {a.call_name!r} and its submodule {b.call_name!r} are requested. "
                    f"Swap only {a.call_name!r}, and put the replacement for {b.call_name!r} "
                    f"inside the replacement for {a.call_name!r}."
                )
            raise ConflictError(
                f"{a.call_name!r} and {b.call_name!r} share nodes (e.g. {node.name!r}); "
                "request only one of them."
            )


# -- attribute paths the generated code can write --------------------------------------------


def _safe_component(part: str) -> str:
    """An attribute name fx's generated code can spell: ``self.layers.0`` becomes
    ``getattr(self.layers, "0")``, which fx writes itself; a keyword (``in``), or a name with a
    quote, a backslash or a line break, fx would write as code that does not compile."""
    if keyword.iskeyword(part):
        return part + "_"
    if part.isprintable() and not any(c in part for c in "\"\\'"):
        return part
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in part)
    return cleaned or "_"


def safe_path(target: str) -> str:
    """``layers.in.weight`` -> ``layers.in_.weight``: the path with every component spellable."""
    return ".".join(_safe_component(p) for p in target.split("."))


# -- building -----------------------------------------------------------------------------

_STATIC_GET = (tuple, list, dict)
_STATIC_BUILD = (tuple, list, dict, type(None))


def _indexable(spec: pytree.TreeSpec) -> bool:
    """Whether every leaf of ``spec`` can be reached with plain ``[key]`` lookups."""
    if spec.is_leaf():
        return True
    kind = spec.type
    if not (kind in _STATIC_GET or kind is type(None) or _is_namedtuple(kind)):
        return False
    return all(_indexable(c) for c in spec.children())


def _is_namedtuple(kind: type) -> bool:
    return isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields")


def _subtrees(spec, start=0, path=(), out=None):
    """``{(first leaf, number of leaves): [(path, subspec), ...]}`` of every indexable subtree."""
    if out is None:
        out = {}
    out.setdefault((start, spec.num_leaves), []).append((path, spec))
    if spec.is_leaf() or spec.type is type(None):
        return out
    offset = start
    for key, child in zip(_meta.children_keys(spec), spec.children()):
        _subtrees(child, offset, (*path, key), out)
        offset += child.num_leaves
    return out


class _Source:
    """A value in the new graph with a known pytree structure, whose leaves are made lazily."""

    def __init__(
        self, writer: _GraphWriter, node: Node, spec: pytree.TreeSpec, flatten=None, stack=None
    ):
        self.writer = writer
        self.node = node
        self.spec = spec
        # nn_module_stack of the glue nodes taking the value apart (those of its consumer)
        self.stack = stack
        self.indexable = _indexable(spec)
        if self.indexable:
            self.paths = _meta.leaf_paths(spec)
            self.subtrees = _subtrees(spec)
        else:
            self.paths = None
            self.subtrees = {(0, spec.num_leaves): [((), spec)]}
        self._at: dict[tuple, Node] = {(): node}
        self._flatten = flatten  # (function, extra args) making the leaf list at run time
        self._flat: Node | None = None

    def at(self, path: tuple, name: str | None = None, meta: dict | None = None) -> Node:
        node = self._at.get(path)
        if node is None:
            parent = self.at(path[:-1])
            node = self.writer.emit_getitem(parent, path[-1], name, self._meta(meta))
            self._at[path] = node
        return node

    def _meta(self, meta: dict | None) -> dict | None:
        if self.stack is None:
            return meta
        return {**(meta or {}), "nn_module_stack": dict(self.stack)}

    def leaf(self, i: int, name: str | None = None, meta: dict | None = None) -> Node:
        if self.indexable:
            return self.at(self.paths[i], name, meta)
        if self._flat is None:
            function, extra = self._flatten
            self._flat = self.writer.emit_call(function, (self.node, *extra), "flat")
            if self.stack is not None:
                self._flat.meta["nn_module_stack"] = dict(self.stack)
        return self.writer.emit_getitem(self._flat, i, name, self._meta(meta))


class _Leaf:
    """Leaf ``index`` of a :class:`_Source`, made into a node on first use."""

    __slots__ = ("index", "meta", "name", "node", "source")

    def __init__(self, source: _Source, index: int, name=None, meta=None):
        self.source, self.index, self.name, self.meta, self.node = source, index, name, meta, None

    def get(self) -> Node:
        if self.node is None:
            self.node = self.source.leaf(self.index, self.name, self.meta)
        return self.node


class _Attr:
    """A parameter, buffer or constant, made into a ``get_attr`` node on first use."""

    __slots__ = ("meta", "name", "node", "target", "value")

    def __init__(self, target: str, name: str, value: Any, meta: dict):
        self.target, self.name, self.value, self.node, self.meta = target, name, value, None, meta


class _Removed:
    """A node of a swapped call that is not one of its outputs: nothing outside may use it."""

    __slots__ = ("node", "request")

    def __init__(self, request: _Request, node: Node):
        self.request, self.node = request, node


class _GraphWriter:
    """A new fx graph being written: fresh names, glue, constants held as attributes, and
    structures rebuilt from leaves with as little glue as possible."""

    def __init__(self, taken: set[str]):
        self.graph = torch.fx.Graph()
        self.attrs: dict[str, Any] = {}
        self.taken = taken  # names the new graph must not reuse (those of the program)
        self.used_names: set[str] = set()
        self._constants: dict[int, tuple[str, Any]] = {}

    def fresh(self, base: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base).strip("_") or "v"
        if base[0].isdigit() or keyword.iskeyword(base):
            base = "_" + base
        name, k = base, 0
        while name in self.taken or name in self.used_names:
            k += 1
            name = f"{base}_{k}"
        self.used_names.add(name)
        return name

    def emit_getitem(self, parent: Node, key, name=None, meta=None) -> Node:
        if name is None:
            name = self.fresh(f"{parent.name}_{key}")
        node = self.graph.create_node("call_function", operator.getitem, (parent, key), name=name)
        node.meta = {**(meta or {}), _meta.GLUE: "through"}
        return node

    def emit_call(self, function, args, suffix: str) -> Node:
        """A call that passes its first argument on (flattens it, checks it): glue."""
        name = self.fresh(f"{args[0].name}_{suffix}" if isinstance(args[0], Node) else suffix)
        node = self.graph.create_node("call_function", function, tuple(args), name=name)
        node.meta[_meta.GLUE] = "through"
        return node

    def constant_node(self, value: Any, base: str) -> Node:
        """A ``get_attr`` of a Python object the generated code needs (a spec, a guard)."""
        key = id(value)
        if key not in self._constants:
            target = f"_{base}_{len(self._constants)}"
            self._constants[key] = (target, value)
            self.attrs[target] = value
        target, _ = self._constants[key]
        node = self.graph.create_node("get_attr", target, name=self.fresh(target))
        node.meta[_meta.GLUE] = "constant"
        return node

    def spec_node(self, spec: pytree.TreeSpec) -> Node:
        return self.constant_node(spec, "spec")

    def materialize(self, x: Any) -> Any:
        """Make a lazy value (leaf, attribute) into a node of the new graph."""
        if isinstance(x, _Leaf):
            return x.get()
        if isinstance(x, _Attr):
            if x.node is None:
                target = self.attribute_target(x.target)
                self.attrs.setdefault(target, x.value)
                x.node = self.graph.create_node("get_attr", target, name=x.name)
                x.node.meta = x.meta
            return x.node
        if isinstance(x, _Removed):
            raise SwapError(
                f"cannot swap {x.request.call_name!r}: node {x.node.name!r} of it is used outside "
                "it but is not one of its outputs"
            )
        return x

    def attribute_target(self, target: str) -> str:
        return safe_path(target)

    def rebuild(self, spec: pytree.TreeSpec, values: list) -> Any:
        """A structure ``spec`` over ``values`` (new-graph leaves, possibly lazy), with as
        little glue as possible."""
        if spec.is_leaf():
            return self.materialize(values[0])
        n = spec.num_leaves
        first = values[0] if values else None
        if isinstance(first, _Leaf) and all(
            isinstance(v, _Leaf) and v.source is first.source and v.index == first.index + i
            for i, v in enumerate(values)
        ):
            for path, sub in first.source.subtrees.get((first.index, n), []):
                if sub == spec:
                    return first.source.at(path)
        kind = spec.type
        if kind in _STATIC_BUILD:
            children, offset = [], 0
            for child in spec.children():
                k = child.num_leaves
                children.append(self.rebuild(child, values[offset : offset + k]))
                offset += k
            if kind is tuple:
                return tuple(children)
            if kind is list:
                return children
            if kind is dict:
                return dict(zip(spec.context, children))
            return None
        leaves = [self.materialize(v) for v in values]
        node = self.graph.create_node(
            "call_function",
            _runtime.unflatten,
            (leaves, self.spec_node(spec)),
            name=self.fresh(f"unflatten_{getattr(kind, '__name__', 'tree')}"),
        )
        node.meta[_meta.GLUE] = "build"
        return node

    def module(self, class_name: str) -> GraphModule:
        self.graph.set_codegen(FastCodeGen())
        return _ProgramModule(self.attrs, self.graph, class_name=class_name)


class _ProgramModule(GraphModule):
    """A GraphModule that says so when it is called with arguments its forward cannot take,
    as it says when the arguments have another structure or size (InputStructureError),
    instead of Python's bare ``TypeError: forward() takes 2 positional arguments``.

    A swapped or fused program keeps the mode its nodes were exported in (batch norm's
    statistics, dropout): ``train()`` / ``eval()`` asking for that mode set it on every
    replacement too; asking for the other raises :class:`~graphsurgeon.errors.ModeError`, as
    ``ep.module()`` refuses both, rather than make a program half in one mode and half in the
    other."""

    def train(self, mode: bool = True) -> _ProgramModule:
        exported = self.__dict__.get("_exported_mode")
        if exported is None or not isinstance(mode, bool) or exported.training is mode:
            return super().train(mode)
        raise ModeError(exported.refusal(mode))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except TypeError as error:
            # Only now, on the failure path: does the forward take these arguments at all?
            try:
                inspect.signature(self.forward).bind(*args, **kwargs)
            except TypeError as problem:
                raise InputStructureError(
                    f"the program takes forward{inspect.signature(self.forward)} but was given "
                    f"{len(args)} positional argument(s) and keyword(s) {sorted(kwargs)}: "
                    f"{problem}. Call it with the arguments the model was exported with."
                ) from None
            raise error


class _Builder(_GraphWriter):
    def __init__(self, index: ProgramIndex, requests: list[_Request]):
        super().__init__(set(index.by_name))
        self.index = index
        self.ep = index.ep
        self.requests = requests
        self.env: dict[Node, Any] = {}
        self.non_persistent: set[str] = set()
        self.owner: dict[Node, _Request] = {n: r for r in requests for n in r.nodes}
        self.swapped_paths = sorted({r.install_path for r in requests})
        self.copied_from: dict[Node, Node] = {}
        # functional graphs: mutated value's node name -> the placeholder it writes
        placeholders = [n for n in index.nodes if n.op == "placeholder"]
        by_target = {
            spec.target: node
            for node, spec in zip(placeholders, self.ep.graph_signature.input_specs)
            if spec.target is not None
        }
        self.mutation_targets: dict[str, Node] = {}
        for spec in self.ep.graph_signature.output_specs:
            kind = spec.kind.name
            if kind == "USER_INPUT_MUTATION":
                self.mutation_targets[spec.arg.name] = index.by_name[spec.target]
            elif kind in ("BUFFER_MUTATION", "PARAMETER_MUTATION"):
                self.mutation_targets[spec.arg.name] = by_target[spec.target]

    def value(self, old: Any) -> Any:
        """The new-graph value of a value of the old graph (an old node, or a constant)."""
        if isinstance(old, Node):
            try:
                old = self.env[old]
            except KeyError:
                raise SwapError(
                    f"internal: node {old.name!r} is used before it is defined in the swapped graph"
                ) from None
        return self.materialize(old)

    def attribute_target(self, target: str) -> str:
        # A parameter still used outside a swapped module (tied weights) must not resolve into
        # the replacement now installed at that path: keep it under a name of its own.
        for path in self.swapped_paths:
            if target == path or target.startswith(path + "."):
                return "_retained_" + _flat_name(target)
        return safe_path(target)

    # -- the pass -------------------------------------------------------------------------

    def build(self) -> GraphModule:
        ep = self.ep
        specs = ep.graph_signature.input_specs
        placeholders = [n for n in self.index.nodes if n.op == "placeholder"]
        if len(specs) != len(placeholders):
            raise SwapError("internal: the program's graph signature does not match its graph")
        user_leaves: list[Node] = []
        for node, spec in zip(placeholders, specs):
            kind = spec.kind.name
            if kind == "USER_INPUT":
                user_leaves.append(node)
            elif kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR", "CUSTOM_OBJ"):
                self.env[node] = _Attr(spec.target, node.name, self._state(spec), dict(node.meta))
            else:
                raise SwapError(
                    f"programs with {kind} inputs (input {node.name!r}) are not supported; "
                    "export without effect tokens"
                )
        self._inputs(user_leaves)
        for node in self.index.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                self._outputs(node)
                continue
            request = self.owner.get(node)
            if request is not None:
                if not request.emitted:
                    self._emit_call(request)
                self._bind_swapped_node(node, request)
                continue
            self._copy(node)
        self._remove_dead_code()
        self.node_map = self._node_map()
        alive = set(self.graph.nodes)
        self.copies = {new.name: old.name for new, old in self.copied_from.items() if new in alive}
        gm = self.module("SwappedProgram")
        for target in self.non_persistent:
            owner_path, _, leaf = target.rpartition(".")
            owner = gm.get_submodule(owner_path) if owner_path else gm
            owner._non_persistent_buffers_set.add(leaf)
        return gm

    def _state(self, spec) -> Any:
        ep, target = self.ep, spec.target
        if spec.kind.name == "PARAMETER":
            return ep.state_dict[target]
        if spec.kind.name == "BUFFER":
            if spec.persistent is False:
                self.non_persistent.add(self.attribute_target(target))
                value = ep.constants[target]
            else:
                value = ep.state_dict[target]
            # Buffers are written by forward (BatchNorm statistics): run on our own copy, so
            # running the swapped program never changes the ExportedProgram it came from.
            return value.clone()
        return ep.constants[target]

    def _inputs(self, user_leaves: list[Node]) -> None:
        ep = self.ep
        in_spec = ep.call_spec.in_spec
        root = next((e.signature for e in ep.module_call_graph if e.fqn == ""), None)
        if in_spec is None:
            for node in user_leaves:
                self.env[node] = self.graph.placeholder(node.name)
            return
        args_spec, kwargs_spec = in_spec.children()
        names = list(root.forward_arg_names) if root and root.forward_arg_names else []
        arguments: list[tuple[str, pytree.TreeSpec]] = []
        for i, spec in enumerate(args_spec.children()):
            arguments.append((names[i] if i < len(names) else f"arg_{i}", spec))
        for key, spec in zip(kwargs_spec.context, kwargs_spec.children()):
            arguments.append((str(key), spec))
        if sum(s.num_leaves for _, s in arguments) != len(user_leaves):
            raise SwapError("internal: the program's input structure does not match its inputs")
        offset = 0
        # what the guard checks; it finds each leaf in torch's own guards (ep._guards_code) by
        # every name torch's tracers give it (L['x'], L['d']['a'], L['flat_args'][3]), from the
        # argument names and structures described here (_guards.tracer_sources)
        described: list[tuple[str, Any, list[tuple[str, Any]]]] = []
        placeholders: list[Node] = []
        for argument, spec in arguments:
            leaves = user_leaves[offset : offset + spec.num_leaves]
            offset += spec.num_leaves
            node = self.graph.placeholder(argument)
            self.used_names.add(node.name)
            placeholders.append(node)
            checked = []
            for leaf, keys in zip(leaves, _meta.leaf_keystrs(spec)):
                checked.append((f"{argument}{keys}", leaf.meta.get("val")))
            described.append((argument, spec, checked))
            if spec.is_leaf():
                node.meta = dict(leaves[0].meta)
                self.env[leaves[0]] = node
                continue
            source = _Source(
                self, node, spec, (_runtime.flatten_input, (self.spec_node(spec), argument))
            )
            for i, leaf in enumerate(leaves):
                self.env[leaf] = _Leaf(source, i, name=leaf.name, meta=dict(leaf.meta))
        if placeholders:
            guard = InputGuard(
                described, dict(ep.range_constraints), getattr(ep, "_guards_code", ())
            )
            args = (self.constant_node(guard, "input_guard"), *placeholders)
            node = self.graph.create_node(
                "call_function", _runtime.check_inputs, args, name=self.fresh("check_inputs")
            )
            node.meta = {_meta.GUARD: True}

    def _copy(self, node: Node) -> None:
        if node.op == "get_attr":
            # a subgraph of a higher-order op (torch.cond branches) or a constant module
            self.attrs.setdefault(
                safe_path(node.target), _get_path(self.ep.graph_module, node.target)
            )
        args = map_arg(node.args, self.value)
        kwargs = map_arg(node.kwargs, self.value)
        target = safe_path(node.target) if node.op == "get_attr" else node.target
        new = self.graph.create_node(
            node.op, target, args, kwargs, name=node.name, type_expr=node.type
        )
        new.meta = dict(node.meta)
        self.env[node] = new
        self.copied_from[new] = node

    def _call_arguments(self, request: _Request) -> tuple[tuple, dict]:
        signature = request.partition.signature
        flat: list[Any] = []
        for argument in signature.inputs:
            if _meta.is_constant(argument):
                flat.append(getattr(argument, "value", None))
                continue
            node = self.index.by_name.get(argument.name)
            if node is None or node not in self.env:
                # The value was optimized away because nothing used it: the original module
                # ignored this argument. Pass None, as the graph has nothing better.
                flat.append(None)
                continue
            flat.append(self.env[node])
        args, kwargs = [], {}
        for key, child, offset in _meta.split_arguments(signature.in_spec):
            value = self.rebuild(child, flat[offset : offset + child.num_leaves])
            if isinstance(key, int):
                args.append(value)
            else:
                kwargs[key] = value
        return tuple(args), kwargs

    def _emit_call(self, request: _Request) -> None:
        signature = request.partition.signature
        args, kwargs = self._call_arguments(request)
        if request.fused:
            request.module = cut_call(
                self.index,
                request.call_name,
                state=self._state_value,
                mutations=self.mutation_targets,
            )
        else:
            request.module = request.replacement
        base = request.call_name.replace("@", "_call")
        install = safe_path(request.install_path)
        call = self.graph.create_node(
            "call_module",
            install,
            args,
            kwargs,
            name=self.fresh(f"{'fused' if request.fused else 'swapped'}_{base}"),
        )
        call.meta = {
            "nn_module_stack": _outer_stack(request.nodes[0], request.fqn),
            _meta.FUSED if request.fused else _meta.SWAPPED: request.call_name,
        }
        self.attrs[install] = request.module
        request.call_node = call
        request.emitted = True
        out_spec = signature.out_spec
        caller_stack = dict(list(call.meta["nn_module_stack"].items())[:-1])
        if request.fused:
            checked = call  # its own nodes, cut from the program: nothing to check
        else:
            checked = self._emit_output_check(request, call)
        # the outputs are taken apart in the caller: the call's stack without its own entry
        source = _Source(
            self,
            checked,
            out_spec,
            (
                _runtime.flatten_output,
                (self.spec_node(out_spec), request.call_name, _type_name(request.module)),
            ),
            stack=caller_stack,
        )
        members = set(request.nodes)
        for i, argument in enumerate(signature.outputs):
            if _meta.is_constant(argument):
                continue
            old = self.index.by_name.get(argument.name)
            if old is None or old not in members:
                # an output nobody used (export removed its node), or an input returned
                # unchanged that nothing after the call reads (partition checked): no binding
                continue
            if argument.name not in request.outputs:
                request.outputs[argument.name] = _Leaf(source, i, meta=_output_meta(old))

    def _emit_output_check(self, request: _Request, call: Node) -> Node:
        signature = request.partition.signature
        out_spec = signature.out_spec
        type_name = _type_name(request.replacement)
        sizes, arguments = self._dynamic_sizes(request)
        expected = [self._expected(argument, sizes) for argument in signature.outputs]
        used = sorted({i for e in expected if e is not None for _, i, _ in e.links})
        if used != list(range(len(used))):  # pass only the arguments some size is read off
            renumber = {old: new for new, old in enumerate(used)}
            for e in expected:
                if e is not None:
                    e.links = tuple((d, renumber[i], j) for d, i, j in e.links)
        arguments = tuple(arguments[i] for i in used)
        tensor_out = (
            out_spec.is_leaf()
            and len(signature.outputs) == 1
            and type(signature.outputs[0]).__name__ == "TensorArgument"
        )
        if tensor_out:
            want = self.constant_node(expected[0], "expected") if expected[0] is not None else None
            args = (call, want, request.call_name, type_name, *arguments)
            checked = self.emit_call(_runtime.check_tensor, args, "checked")
        else:
            args = (
                call,
                self.spec_node(out_spec),
                self.constant_node(tuple(expected), "expected"),
                request.call_name,
                type_name,
                *arguments,
            )
            checked = self.emit_call(_runtime.check_structure, args, "checked")
        checked.meta = {
            "nn_module_stack": dict(call.meta["nn_module_stack"]),
            _meta.CHECK: request.call_name,
            _meta.GLUE: "through",
        }
        return checked

    def _dynamic_sizes(self, request: _Request) -> tuple[dict, list[Node]]:
        """Where each dynamic size among the call's tensor arguments can be read at run time:
        ``{symbol: (argument, dim)}`` and those arguments' nodes in the result."""
        sizes: dict[Any, tuple[int, int]] = {}
        arguments: list[Node] = []
        for argument in request.partition.signature.inputs:
            if _meta.is_constant(argument):
                continue
            node = self.index.by_name.get(argument.name)
            value = node.meta.get("val") if node is not None else None
            if not isinstance(value, torch.Tensor) or node not in self.env:
                continue
            dynamic = [
                (d, s.node.expr) for d, s in enumerate(value.shape) if isinstance(s, torch.SymInt)
            ]
            if not dynamic:
                continue
            for d, symbol in dynamic:
                sizes.setdefault(symbol, (len(arguments), d))
            arguments.append(self.materialize(self.env[node]))
        return sizes, arguments

    def _expected(
        self, argument: Any, sizes: Mapping | None = None
    ) -> _runtime.ExpectedTensor | _runtime.ExpectedConstant | None:
        if _meta.is_constant(argument):
            # baked into the nodes that read it: a replacement must return the same value
            return _runtime.ExpectedConstant(getattr(argument, "value", None))
        node = self.index.by_name.get(argument.name)
        value = node.meta.get("val") if node is not None else None
        if not isinstance(value, torch.Tensor):
            return None
        links = [
            (d, *sizes[s.node.expr])
            for d, s in enumerate(value.shape)
            if isinstance(s, torch.SymInt) and sizes and s.node.expr in sizes
        ]
        return _runtime.ExpectedTensor(value, links)

    def _state_value(self, placeholder: Node) -> Any:
        """The value a cut call reads for one of the program's lifted state placeholders: the
        very object this program holds, so the call and the program share their state."""
        value = self.env.get(placeholder)
        return value.value if isinstance(value, _Attr) else None

    def _bind_swapped_node(self, node: Node, request: _Request) -> None:
        leaf = request.outputs.get(node.name)
        if leaf is not None:
            self.env[node] = leaf
            return
        alias = returned_object(node)
        if alias is not None and alias in self.env:
            # At run time this node is a tensor from before the call (the call's input written
            # in place, or converted to the dtype it already has): eager code reading it after
            # the call reads that tensor as the replacement leaves it.
            self.env[node] = self.env[alias]
            return
        target = self.mutation_targets.get(node.name)
        if target is not None:
            # The same in a functional graph: the node is the new value of an input or a
            # buffer that the original wrote; the eager replacement writes it in place.
            self.env[node] = self.env[target]
            return
        self.env[node] = _Removed(request, node)

    def _outputs(self, node: Node) -> None:
        ep = self.ep
        flat = list(node.args[0]) if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
        specs = ep.graph_signature.output_specs
        user: list[Any] = []
        for value, spec in zip(flat, specs):
            kind = spec.kind.name
            if kind in ("USER_OUTPUT", "LOSS_OUTPUT"):
                user.append(self.env.get(value, value) if isinstance(value, Node) else value)
            elif kind in ("BUFFER_MUTATION", "USER_INPUT_MUTATION", "PARAMETER_MUTATION"):
                self._write_back(value, spec)
            else:
                raise SwapError(f"programs with {kind} outputs are not supported")
        out_spec = ep.call_spec.out_spec
        if out_spec is None:
            result = tuple(self.materialize(v) for v in user)
        else:
            result = self.rebuild(out_spec, user)
        self.graph.output(result)

    def _write_back(self, value: Node, spec) -> None:
        new_value = self.env.get(value)
        if isinstance(new_value, _Removed):
            # The mutation happened inside a swapped or fused call: the module, running
            # eagerly, updates its own state in place. Nothing to copy.
            return
        destination = self.env[self.mutation_targets[value.name]]
        if new_value is destination:
            return  # bound to the written object itself (an eager replacement wrote it)
        self.graph.create_node(
            "call_function",
            torch.ops.aten.copy_.default,
            (self.materialize(destination), self.value(value)),
            name=self.fresh(f"write_back_{spec.target}"),
        )

    def _node_map(self) -> dict[str, str]:
        """Old node name -> the name of the node holding its value in the new graph."""
        mapping = {}
        alive = set(self.graph.nodes)
        for old, value in self.env.items():
            if isinstance(value, (_Leaf, _Attr)):
                value = value.node
            if isinstance(value, Node) and value in alive:
                mapping[old.name] = value.name
        return mapping

    def _remove_dead_code(self) -> None:
        """Remove what the swap alone made dead: nodes that were used in the program and whose
        every user was inside a swapped call. Nodes the program itself left unused stay, so
        an unswapped program keeps all of its nodes."""
        removed_attrs: set[str] = set()
        for node in reversed(list(self.graph.nodes)):
            if node.users or node.op in ("placeholder", "output", "call_module"):
                continue
            old = self.copied_from.get(node)
            if node.op == "get_attr":
                removed_attrs.add(node.target)
            elif node.op != "call_function" or old is None or not old.users or not _droppable(node):
                continue
            self.graph.erase_node(node)
        still = {n.target for n in self.graph.nodes if n.op == "get_attr"}
        for target in removed_attrs - still:
            self.attrs.pop(target, None)


_SYMBOLIC = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _droppable(node: Node) -> bool:
    """Whether an unused call can go. A swapped call's inputs stay in use (they are its
    arguments) and a call reading anything else is refused, so what a swap leaves dead is
    glue (``getitem``) and size arithmetic the original module did on the side; tensor ops
    are never dropped, whatever their schema says (batch_norm writes its running
    statistics without declaring it)."""
    if node.target is operator.getitem:
        return True
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
        return False
    return isinstance(node.meta.get("val"), _SYMBOLIC)


def _get_path(root: torch.nn.Module, target: str) -> Any:
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _flat_name(target: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in target.replace("@", "_at_"))


def _outer_stack(node: Node, fqn: str) -> dict:
    """The nn_module_stack of a swapped call: its parents' entries, then its own."""
    stack = node.meta.get("nn_module_stack") or {}
    outer = {}
    for key, value in stack.items():
        outer[key] = value
        if value[0] == fqn:
            break
    return outer


def _output_meta(old: Node) -> dict:
    meta = {}
    for key in ("val", "tensor_meta"):
        if key in old.meta:
            meta[key] = old.meta[key]
    return meta


# -- one call, cut out ----------------------------------------------------------------------


class _CallCut(_GraphWriter):
    """The nodes of one module call, copied into a GraphModule that takes and returns what the
    module did (its arguments as the program passed them, its output structure)."""

    def __init__(self, index: ProgramIndex, name: str, state, mutations):
        super().__init__(set())
        self.index = index
        self.name = name
        self.part = index.partitions()[name]
        self.members = set(index.call_nodes.get(name, []))
        self.state = state
        self.mutations = mutations
        self.env: dict[Node, Any] = {}
        self.inputs: dict[str, Any] = {}  # graph value name -> its leaf among the arguments
        self.lifted = {
            spec.arg.name: spec.target
            for spec in index.ep.graph_signature.input_specs
            if spec.kind.name != "USER_INPUT" and getattr(spec.arg, "name", None)
        }

    def build(self) -> GraphModule:
        signature = self.part.signature
        fqn = self.part.fqn
        args_spec, _ = signature.in_spec.children()
        names = self.index.parameter_names(fqn, args_spec.num_children)
        leaves: list[Any] = []
        where: list[str] = []
        for key, spec, _ in _meta.split_arguments(signature.in_spec):
            argument = names[key] if isinstance(key, int) else key
            node = self.graph.placeholder(self.fresh(argument))
            inner = _meta.leaf_keystrs(spec)
            where += [f"{argument}{keys}" for keys in inner]
            if spec.is_leaf():
                leaves.append(node)
                continue
            source = _Source(
                self, node, spec, (_runtime.flatten_input, (self.spec_node(spec), argument))
            )
            leaves += [_Leaf(source, i) for i in range(spec.num_leaves)]
        first_of: dict[str, int] = {}
        for i, (argument, leaf) in enumerate(zip(signature.inputs, leaves)):
            if _meta.is_constant(argument):
                self._emit_check(
                    _runtime.check_constant, (leaf, argument.value, self.name, where[i])
                )
                continue
            node = self.index.by_name.get(argument.name)
            if node is None:
                continue  # an argument the module ignored: export dropped its value
            if argument.name in first_of:
                j = first_of[argument.name]
                self._emit_check(
                    _runtime.check_same, (leaves[j], leaf, self.name, where[j], where[i])
                )
                continue
            first_of[argument.name] = i
            self.env[node] = leaf
        written = []
        for node in self.index.call_nodes.get(self.name, []):
            self._copy(node)
            if node.name in self.mutations:
                written.append(node)
        for node in written:  # a functional graph's writes to buffers and inputs, done here
            target = self.value(self.mutations[node.name])
            self.graph.create_node(
                "call_function",
                torch.ops.aten.copy_.default,
                (target, self.value(node)),
                name=self.fresh(f"write_{node.name}"),
            )
        outputs = []
        for argument in signature.outputs:
            if _meta.is_constant(argument):
                outputs.append(getattr(argument, "value", None))
                continue
            node = self.index.by_name.get(argument.name)
            outputs.append(self.env.get(node) if node is not None else None)
        self.graph.output(self.rebuild(signature.out_spec, outputs))
        type_name = self.part.type_name or "Module"
        return self.module(f"Fused{type_name}")

    def _emit_check(self, function, args) -> None:
        node = self.graph.create_node(
            "call_function",
            function,
            tuple(self.materialize(a) for a in args),
            name=self.fresh(function.__name__),
        )
        node.meta = {_meta.GUARD: True}

    def value(self, old: Any) -> Any:
        if not isinstance(old, Node):
            return old
        if old not in self.env:
            self.env[old] = self._outside(old)
        return self.materialize(self.env[old])

    def _outside(self, old: Node) -> Any:
        """A value the call's nodes read from outside the call without it being an argument:
        the program's parameters and buffers, subgraphs of torch.cond, and size arithmetic."""
        if old.op == "placeholder" and old.name in self.lifted:
            target = self.lifted[old.name]
            value = self.state(old)
            if value is None:
                raise SwapError(f"internal: no value for {target!r} of {self.name!r}")
            return _Attr(self._relative(target), old.name, value, dict(old.meta))
        if old.op == "get_attr":
            value = _get_path(self.index.ep.graph_module, old.target)
            return _Attr(self._relative(old.target), old.name, value, dict(old.meta))
        if old.op == "call_function" and isinstance(old.meta.get("val"), _SYMBOLIC):
            # size arithmetic done outside the call on its inputs: do it again here
            self._copy(old)
            return self.env[old]
        raise SwapError(
            f"cannot cut {self.name!r}: node {old.name!r} outside it feeds it without being one "
            "of its arguments"
        )

    def _reads_outside_size(self, node: Node) -> bool:
        """A dynamic size the call reads off a model input it was not given (torch.export
        reads a symbolic size off the first tensor that carries it: often the model's input,
        not the module's own argument)."""
        if node.target is not torch.ops.aten.sym_size.int:
            return False
        source = node.args[0]
        return isinstance(source, Node) and source not in self.env and source.op == "placeholder"

    def _size_from_arguments(self, node: Node) -> Node:
        """The same size, read off an argument of the call that has it."""
        wanted = node.meta.get("val")
        expression = getattr(getattr(wanted, "node", None), "expr", None)
        for argument in self.part.signature.inputs:
            original = (
                None if _meta.is_constant(argument) else self.index.by_name.get(argument.name)
            )
            value = getattr(original, "meta", {}).get("val") if original is not None else None
            if original not in self.env or not isinstance(value, torch.Tensor):
                continue
            for dim, size in enumerate(value.shape):
                if (
                    expression is not None
                    and getattr(getattr(size, "node", None), "expr", None) == expression
                ):
                    new = self.graph.create_node(
                        "call_function",
                        torch.ops.aten.sym_size.int,
                        (self.materialize(self.env[original]), dim),
                        name=self.fresh(node.name),
                    )
                    new.meta = dict(node.meta)
                    return new
        raise SwapError(
            f"cannot cut {self.name!r}: its node {node.name!r} reads the dynamic size {wanted} "
            f"of the model input {node.args[0].name!r}, and none of the call's arguments has "
            "that size. Swap the module instead, or export with that size static."
        )

    def _relative(self, target: str) -> str:
        prefix = self.part.fqn + "."
        if target.startswith(prefix):
            return safe_path(target[len(prefix) :])
        return "_outer_" + _flat_name(target)

    def _copy(self, node: Node) -> None:
        if node.op == "get_attr":
            self.env[node] = self._outside(node)
            return
        if self._reads_outside_size(node):
            self.env[node] = self._size_from_arguments(node)
            return
        args = map_arg(node.args, self.value)
        kwargs = map_arg(node.kwargs, self.value)
        new = self.graph.create_node(
            node.op, node.target, args, kwargs, name=self.fresh(node.name), type_expr=node.type
        )
        new.meta = dict(node.meta)
        self.env[node] = new


def cut_call(
    index_or_program: ProgramIndex | ExportedProgram,
    name: str,
    *,
    state: Callable[[Node], Any] | None = None,
    mutations: Mapping[str, Node] | None = None,
) -> GraphModule:
    """The nodes of call ``name`` as a GraphModule of their own: the form a fused call takes.

    It takes the arguments the program passed the module (as the module's forward names them),
    checks the constants it was exported with and that arguments that were one value still are,
    runs the call's original nodes, and returns the module's output structure. ``state`` gives
    the value of each lifted parameter or buffer the nodes read (default: the program's
    parameters, and copies of its buffers, so running it never changes the program).
    """
    index = (
        program_index(index_or_program)
        if isinstance(index_or_program, ExportedProgram)
        else index_or_program
    )
    parts = index.partitions()
    part = parts.get(name)
    if part is None:
        raise UnknownModuleError(
            f"the program has no module call {name!r}.{did_you_mean(name, parts)} "
            "gs.partition(ep) lists every call."
        )
    if not part.swappable:
        raise NotSwappableError(f"cannot fuse {name!r}: {part.reason}.")
    if state is None:
        state = _standalone_state(index)
    if mutations is None:
        mutations = _Builder(index, []).mutation_targets
    return _CallCut(index, name, state, mutations).build()


def _standalone_state(index: ProgramIndex) -> Callable[[Node], Any]:
    ep = index.ep
    by_name = {
        spec.arg.name: spec
        for spec in ep.graph_signature.input_specs
        if getattr(spec.arg, "name", None)
    }
    copies: dict[str, Any] = {}

    def state(placeholder: Node) -> Any:
        spec = by_name[placeholder.name]
        if spec.kind.name == "PARAMETER":
            return ep.state_dict[spec.target]
        if spec.kind.name == "BUFFER":
            if spec.target not in copies:
                source = ep.state_dict if spec.persistent is not False else ep.constants
                copies[spec.target] = source[spec.target].clone()
            return copies[spec.target]
        return ep.constants[spec.target]

    return state


# -- the mode the program was exported in ---------------------------------------------------


def _op(path: str) -> Any:
    """An aten overload by its dotted path, or None where this torch has no such op."""
    value: Any = torch.ops.aten
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


# ops whose mode is an argument: op -> the argument's name
_MODE_ARGUMENTS = {
    op: argument
    for path, argument in (
        ("batch_norm.default", "training"),
        ("native_batch_norm.default", "training"),
        ("_native_batch_norm_legit.default", "training"),
        ("_native_batch_norm_legit_functional.default", "training"),
        ("dropout.default", "train"),
        ("feature_dropout.default", "train"),
        ("alpha_dropout.default", "train"),
        ("feature_alpha_dropout.default", "train"),
        ("native_dropout.default", "train"),
        ("rrelu.default", "training"),
        ("rrelu_with_noise.default", "training"),
        ("rrelu_with_noise_functional.default", "training"),
    )
    if (op := _op(path)) is not None
}
# ops that exist in one mode only: op -> True (training) or False (eval)
_MODE_OPS = {
    op: training
    for path, training in (
        ("_native_batch_norm_legit_no_training.default", False),
        ("_batch_norm_with_update.default", True),
        ("_batch_norm_with_update_functional.default", True),
        ("_batch_norm_no_update.default", False),
    )
    if (op := _op(path)) is not None
}


@dataclass(frozen=True)
class _ExportedMode:
    """The mode a program's nodes were exported in (None: not known) and how it is known."""

    training: bool | None
    evidence: str

    def refusal(self, asked: bool) -> str:
        verb = "train()" if asked else "eval()"
        wanted = "training" if asked else "eval"
        if self.training is None:
            return (
                f"{verb}: {self.evidence}, so whether its nodes run in {wanted} mode cannot be "
                "known, and a program whose nodes and replacements run in different modes "
                "computes neither model. Export the model in the mode you want (model."
                f"{'train' if asked else 'eval'}(); gs.export(model, args)) and swap again, or "
                "set a replacement's own mode on it (gm.get_submodule(name)."
                f"{'train' if asked else 'eval'}())."
            )
        have = "training" if self.training else "eval"
        return (
            f"{verb}: this program's nodes were exported in {have} mode ({self.evidence}) and "
            f"keep that mode (they were traced in it), so the program cannot run in {wanted} "
            f"mode: its replacements would, its other nodes would not. Export the model in "
            f"{wanted} mode (model.{'train' if asked else 'eval'}(); gs.export(model, args)) and "
            "swap again; a replacement's own mode can be set on it (gm.get_submodule(name)."
            f"{'train' if asked else 'eval'}())."
        )


def _exported_mode(index: ProgramIndex) -> _ExportedMode:
    """What the program records of its mode: gs.export's notes, else the nodes whose op says
    (batch norm, dropout)."""
    notes = index.notes
    if notes is not None and notes.training:
        modes = set(notes.training.values())
        if len(modes) == 1:
            training = modes.pop()
            return _ExportedMode(
                training,
                f"the model was in {'training' if training else 'eval'} mode when gs.export "
                "exported it",
            )
        first = {mode: fqn or "(the root)" for fqn, mode in notes.training.items()}
        return _ExportedMode(
            None,
            f"its modules were exported in different modes ({first[True]!r} in training "
            f"mode, {first[False]!r} in eval mode)",
        )
    seen: dict[bool, Node] = {}
    for node in index.nodes:
        if node.op != "call_function":
            continue
        if node.target in _MODE_OPS:
            seen.setdefault(_MODE_OPS[node.target], node)
        elif node.target in _MODE_ARGUMENTS:
            flag = op_argument(node, _MODE_ARGUMENTS[node.target], True)
            if isinstance(flag, bool):
                seen.setdefault(flag, node)
    if len(seen) == 1:
        training, node = next(iter(seen.items()))
        return _ExportedMode(
            training,
            f"node {node.name!r} ({node.target}) runs in {'training' if training else 'eval'} mode",
        )
    if len(seen) == 2:
        return _ExportedMode(
            None,
            f"its nodes were exported in different modes (node {seen[True].name!r} in training "
            f"mode, {seen[False].name!r} in eval mode)",
        )
    return _ExportedMode(
        None,
        "this program does not record the mode it was exported in (it was not exported by "
        "gs.export in this session, and none of its nodes shows a mode)",
    )


# -- the verbs ----------------------------------------------------------------------------------


def _forget_source_with(module: GraphModule) -> None:
    """When ``module`` is collected, drop its generated code from torch.fx's cache of sources.

    torch.fx keeps the source of every GraphModule it ever compiled (for tracebacks), never
    freed: ~0.4 MB for a 4,000-node program, so a session that swaps again and again (a Surgery
    rebuilding its states) would grow without bound. Only the program's own forward is dropped
    (not the replacements', which belong to the user), and only once nothing can run it."""
    loader = getattr(torch.fx.graph_module, "_loader", None)
    sources = getattr(loader, "eval_cache", None)
    key = getattr(getattr(type(module).forward, "__code__", None), "co_filename", None)
    if isinstance(sources, dict) and key in sources:
        weakref.finalize(module, _forget_source, sources, key)


def _forget_source(sources: dict, key: str) -> None:
    sources.pop(key, None)
    linecache.cache.pop(key, None)


def _interpreted_forward(gm: GraphModule):
    # Parameters are named as the model's arguments (placeholder targets), not as the
    # placeholder nodes, which fx renames when they shadow a builtin ("input" -> "input_1").
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    parameter = inspect.Parameter.POSITIONAL_OR_KEYWORD
    arguments = inspect.Signature([inspect.Parameter(n, parameter) for n in names])

    def forward(self, *args, **kwargs):
        bound = arguments.bind(*args, **kwargs)
        return torch.fx.Interpreter(self).run(*bound.args)

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter("self", parameter), *arguments.parameters.values()]
    )
    return types.MethodType(forward, gm)


def rewrite(
    ep: ExportedProgram,
    modules: Mapping[str, Any],
    *,
    interpret: bool = False,
    verb: str = "swap",
    weak: bool = False,
) -> GraphModule:
    """The one pass behind :func:`swap` and :func:`graphsurgeon.fuse`: ``modules`` maps names to
    replacements, or to :data:`FUSE` for calls to fuse. ``weak``: the result refers to ``ep``
    without keeping it alive (for a cache of ``ep``'s own)."""
    index = program_index(ep)
    requests = _plan(index, modules, verb)
    was_enabled = gc.isenabled()
    # The pass allocates many small objects and no cycles that matter; the cyclic collector
    # would otherwise run dozens of times over the whole heap while it does.
    gc.disable()
    try:
        builder = _Builder(index, requests)
        gm = builder.build()
    finally:
        if was_enabled:
            gc.enable()
    calls = {r.call_name: r.module for r in requests}
    given = {}
    for name, module in modules.items():
        given[name] = module
        if module is FUSE:
            fqn, k = split_call_name(name)
            given[name] = calls[call_name(fqn, k or 0)] if k is not None else calls.get(name)
    gm.meta[_meta.INFO] = SwapInfo(
        _program=weakref.ref(ep) if weak else ep,
        requests=given,
        calls=calls,
        fused=tuple(r.call_name for r in requests if r.fused),
        installed_at={r.call_name: safe_path(r.install_path) for r in requests},
        call_nodes={r.call_name: r.call_node.name for r in requests},
        partitions={r.call_name: r.partition for r in requests},
        node_map=builder.node_map,
        copies=builder.copies,
        result_nodes=tuple(
            n.name
            for n in gm.graph.nodes
            if n.op in _COMPUTATION and _meta.GUARD not in n.meta  # input checks change nothing
        ),
    )
    _forget_source_with(gm)
    mode = _exported_mode(index)
    gm._exported_mode = mode
    if mode.training is not None:
        gm.training = mode.training  # the root's own flag only: replacements keep theirs
    if interpret:
        gm.forward = _interpreted_forward(gm)
    return gm


def swap(
    ep: ExportedProgram,
    modules: Mapping[str, torch.nn.Module],
    *,
    interpret: bool = False,
) -> GraphModule:
    """Replace module calls of ``ep`` with eager modules; return a runnable GraphModule.

    Args:
        ep: any ExportedProgram whose swapped modules had their call signatures preserved
            (:func:`graphsurgeon.export` preserves every module). It is never modified.
        modules: ``{name: replacement}``. ``"blocks.0"`` swaps every call of that module
            (one replacement serves them all); ``"shared@1"`` swaps only the second call,
            ``"shared@0"`` only the first. Replacements are used as given (not copied).
            Each replacement's ``forward`` must accept the arguments the program calls the
            module with: checked here, with the expected call in the error.
        interpret: run the graph under ``torch.fx.Interpreter`` instead of generated code
            (slower; easier to debug).

    Returns:
        A GraphModule taking and returning exactly what the original model does, and
        refusing what the program refuses (:class:`~graphsurgeon.GuardError` for a size
        outside the exported range or another constant, :class:`~graphsurgeon.InputStructureError`
        for another structure). What a replacement returns is checked at its call: another
        structure, dtype or static size is a :class:`~graphsurgeon.ReplacementError` naming
        the call. ``gm.meta["graphsurgeon"]`` holds a :class:`SwapInfo`. The result shares
        parameters with ``ep`` (as ``ep.module()`` does) and holds copies of its buffers;
        ``copy.deepcopy(gm)`` gives a fully independent program.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> x = torch.randn(2, 4)
        >>> gm = gs.swap(gs.export(model, (x,)), {"1": torch.nn.GELU()})
        >>> torch.allclose(gm(x), torch.nn.functional.gelu(model[0](x)))
        True
    """
    for name, module in modules.items() if isinstance(modules, Mapping) else ():
        if module is FUSE:
            raise SwapError(f"swap: {name!r} asks for a fused call; use gs.fuse(ep, [{name!r}])")
    return rewrite(ep, modules, interpret=interpret, verb="swap")
