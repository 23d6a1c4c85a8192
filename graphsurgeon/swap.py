"""swap(): replace module calls of an exported program with eager modules, in one pass.

How it works. The exported graph is copied node by node, in its own order, into a new graph
that is already "unlifted" (parameters and buffers become attributes, user inputs become the
model's own arguments). When the copy reaches the first node of a call that is being swapped,
it emits one ``call_module`` of the replacement, with the arguments rebuilt from the preserved
call signature (constants passed as their values), skips the call's own nodes, and binds each of
the call's output nodes, by name, to the matching leaf of the replacement's output. Nodes that
used those outputs now use the replacement's. Nothing is legalized or reordered, no node is
copied twice, the graph is compiled once.

Pytree glue is only emitted where a value is really taken apart: a leaf is a ``getitem`` chain
made on first use, and a structure that is exactly another call's output (or an argument of the
model) is passed through whole instead of being flattened and rebuilt.
"""

from __future__ import annotations

import functools
import gc
import inspect
import operator
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from . import _runtime
from ._codegen import FastCodeGen
from .errors import (
    ConflictError,
    NotPreservedError,
    NotSwappableError,
    ReplacementError,
    SwapError,
    UnknownModuleError,
    did_you_mean,
)
from .partition import (
    Partition,
    ProgramIndex,
    call_name,
    in_place_alias,
    program_index,
    split_call_name,
)

__all__ = ["Diff", "SwapInfo", "swap", "swap_info"]


@dataclass(frozen=True)
class SwapInfo:
    """What a swapped program was made from; kept in ``gm.meta["graphsurgeon"]``.

    Attributes:
        program: the ExportedProgram it was made from (not modified).
        requests: the request as given, ``{name: replacement}``.
        calls: call name -> the replacement now running it, in graph order.
        installed_at: call name -> attribute path of the replacement in the result.
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

    program: ExportedProgram = field(repr=False)
    requests: Mapping[str, torch.nn.Module] = field(repr=False)
    calls: Mapping[str, torch.nn.Module] = field(repr=False)
    installed_at: Mapping[str, str]
    call_nodes: Mapping[str, str]
    partitions: Mapping[str, Partition] = field(repr=False)
    node_map: Mapping[str, str] = field(default_factory=dict, repr=False)
    copies: Mapping[str, str] = field(default_factory=dict, repr=False)
    result_nodes: tuple[str, ...] = field(default=(), repr=False)

    @functools.cached_property
    def diff(self) -> Diff:
        """What the swap changed in the graph, as a :class:`Diff` (computed once)."""
        return _diff(self)


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
    """The :class:`SwapInfo` of a program made by :func:`swap`, or None for any other module."""
    meta = getattr(gm, "meta", None)
    return meta.get("graphsurgeon") if isinstance(meta, dict) else None


# -- planning -----------------------------------------------------------------------------


@dataclass
class _Request:
    call_name: str
    fqn: str
    replacement: torch.nn.Module
    install_path: str
    partition: Partition
    nodes: list[Node]
    # filled while building
    emitted: bool = False
    outputs: dict[str, Any] = field(default_factory=dict)
    call_node: Node | None = None


def _type_name(module: torch.nn.Module) -> str:
    return type(module).__name__


def _plan(index: ProgramIndex, modules: Mapping[str, torch.nn.Module]) -> list[_Request]:
    if not isinstance(modules, Mapping):
        raise SwapError(
            f"swap: expected a mapping {{module name: replacement}}, got {type(modules).__name__}"
        )
    parts = index.partitions()
    known_names = list(index.fqns) + [n for n in parts if "@" in n]
    requests: list[_Request] = []
    for name, replacement in modules.items():
        if not isinstance(name, str):
            raise SwapError(f"swap: module names are strings such as 'blocks.0', got {name!r}")
        if not isinstance(replacement, torch.nn.Module):
            raise ReplacementError(
                f"the replacement for {name!r} is a {type(replacement).__name__}, not a "
                "torch.nn.Module. Wrap a function in an nn.Module whose forward calls it."
            )
        fqn, index_ = split_call_name(name)
        if fqn == "":
            raise SwapError(
                "swap: the root module cannot be swapped; call the replacement model directly"
            )
        if fqn not in index.fqns:
            raise UnknownModuleError(
                f"the program has no module {name!r}.{did_you_mean(name, known_names)} "
                "gs.module_tree(ep) lists every module."
            )
        calls = index.calls_of.get(fqn, [])
        if not calls:
            raise NotSwappableError(
                f"module {fqn!r} was never called during export, so there is nothing to swap "
                "(a container such as nn.ModuleList? swap its children)."
            )
        if index_ is None:
            chosen, install = calls, fqn
        else:
            wanted = call_name(fqn, index_)
            if wanted not in calls:
                raise UnknownModuleError(
                    f"module {fqn!r} was called {len(calls)} time(s) ({', '.join(calls)}); "
                    f"there is no call {name!r}."
                )
            # the first call may be named explicitly as "fqn@0"
            chosen, install = [wanted], name
        for cname in chosen:
            part = parts[cname]
            if not part.preserved:
                raise NotPreservedError(
                    f"cannot swap {cname!r}: its call signature was {part.reason}."
                )
            if not part.swappable:
                raise NotSwappableError(f"cannot swap {cname!r}: {part.reason}.")
            requests.append(
                _Request(
                    call_name=cname,
                    fqn=fqn,
                    replacement=replacement,
                    install_path=install,
                    partition=part,
                    nodes=index.call_nodes.get(cname, []),
                )
            )
    _check_conflicts(requests)
    # an empty partition is never swappable (refused above), so every request has nodes[0]
    requests.sort(key=lambda r: index.order[r.nodes[0]])
    return requests


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


def _keys(spec: pytree.TreeSpec) -> list:
    if spec.type is dict:
        return list(spec.context)
    return list(range(spec.num_children))


def _subtrees(spec, start=0, path=(), out=None):
    """``{(first leaf, number of leaves): [(path, subspec), ...]}`` of every indexable subtree."""
    if out is None:
        out = {}
    out.setdefault((start, spec.num_leaves), []).append((path, spec))
    if spec.is_leaf() or spec.type is type(None):
        return out
    offset = start
    for key, child in zip(_keys(spec), spec.children()):
        _subtrees(child, offset, (*path, key), out)
        offset += child.num_leaves
    return out


def _leaf_paths(spec, path=(), out=None) -> list[tuple]:
    if out is None:
        out = []
    if spec.is_leaf():
        out.append(path)
        return out
    for key, child in zip(_keys(spec), spec.children()):
        _leaf_paths(child, (*path, key), out)
    return out


class _Source:
    """A value in the new graph with a known pytree structure, whose leaves are made lazily."""

    def __init__(
        self, builder: _Builder, node: Node, spec: pytree.TreeSpec, flatten=None, stack=None
    ):
        self.builder = builder
        self.node = node
        self.spec = spec
        # nn_module_stack of the glue nodes taking the value apart (those of its consumer)
        self.stack = stack
        self.indexable = _indexable(spec)
        if self.indexable:
            self.paths = _leaf_paths(spec)
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
            node = self.builder.emit_getitem(parent, path[-1], name, self._meta(meta))
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
            self._flat = self.builder.emit_call(function, (self.node, *extra), "flat")
            if self.stack is not None:
                self._flat.meta["nn_module_stack"] = dict(self.stack)
        return self.builder.emit_getitem(self._flat, i, name, self._meta(meta))


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


class _Builder:
    def __init__(self, index: ProgramIndex, requests: list[_Request]):
        self.index = index
        self.ep = index.ep
        self.requests = requests
        self.graph = torch.fx.Graph()
        self.env: dict[Node, Any] = {}
        self.attrs: dict[str, Any] = {}
        self.non_persistent: set[str] = set()
        self.owner: dict[Node, _Request] = {n: r for r in requests for n in r.nodes}
        self.taken: set[str] = set(index.by_name)
        self.used_names: set[str] = set()
        self.specs: dict[int, tuple[str, pytree.TreeSpec]] = {}
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

    # -- naming and emission helpers ------------------------------------------------------

    def fresh(self, base: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base).strip("_") or "v"
        if base[0].isdigit():
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
        if meta:
            node.meta = dict(meta)
        return node

    def emit_call(self, function, args, suffix: str) -> Node:
        name = self.fresh(f"{args[0].name}_{suffix}" if isinstance(args[0], Node) else suffix)
        return self.graph.create_node("call_function", function, tuple(args), name=name)

    def spec_node(self, spec: pytree.TreeSpec) -> Node:
        key = id(spec)
        if key not in self.specs:
            target = f"_spec_{len(self.specs)}"
            self.specs[key] = (target, spec)
            self.attrs[target] = spec
        target, _ = self.specs[key]
        return self.graph.create_node("get_attr", target, name=self.fresh(target))

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

    def materialize(self, x: Any) -> Any:
        """Make a lazy value (leaf, attribute) into a node of the new graph."""
        if isinstance(x, _Leaf):
            return x.get()
        if isinstance(x, _Attr):
            if x.node is None:
                target = self._retarget(x.target)
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

    def _retarget(self, target: str) -> str:
        # A parameter still used outside a swapped module (tied weights) must not resolve into
        # the replacement now installed at that path: keep it under a name of its own.
        for path in self.swapped_paths:
            if target == path or target.startswith(path + "."):
                return "_retained_" + target.replace(".", "_").replace("@", "_at_")
        return target

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
        return self.graph.create_node(
            "call_function",
            _runtime.unflatten,
            (leaves, self.spec_node(spec)),
            name=self.fresh(f"unflatten_{getattr(kind, '__name__', 'tree')}"),
        )

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
                    self._emit_swapped_call(request)
                self._bind_swapped_node(node, request)
                continue
            self._copy(node)
        self._remove_dead_code()
        self.node_map = self._node_map()
        alive = set(self.graph.nodes)
        self.copies = {new.name: old.name for new, old in self.copied_from.items() if new in alive}
        self.graph.set_codegen(FastCodeGen())
        gm = GraphModule(self.attrs, self.graph, class_name="SwappedProgram")
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
                self.non_persistent.add(self._retarget(target))
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
        for argument, spec in arguments:
            leaves = user_leaves[offset : offset + spec.num_leaves]
            offset += spec.num_leaves
            node = self.graph.placeholder(argument)
            self.used_names.add(node.name)
            if spec.is_leaf():
                node.meta = dict(leaves[0].meta)
                self.env[leaves[0]] = node
                continue
            source = _Source(
                self, node, spec, (_runtime.flatten_input, (self.spec_node(spec), argument))
            )
            for i, leaf in enumerate(leaves):
                self.env[leaf] = _Leaf(source, i, name=leaf.name, meta=dict(leaf.meta))

    def _copy(self, node: Node) -> None:
        if node.op == "get_attr":
            # a subgraph of a higher-order op (torch.cond branches) or a constant module
            target = node.target
            self.attrs.setdefault(target, _get_path(self.ep.graph_module, target))
        args = map_arg(node.args, self.value)
        kwargs = map_arg(node.kwargs, self.value)
        new = self.graph.create_node(
            node.op, node.target, args, kwargs, name=node.name, type_expr=node.type
        )
        new.meta = dict(node.meta)
        self.env[node] = new
        self.copied_from[new] = node

    def _emit_swapped_call(self, request: _Request) -> None:
        signature = request.partition.signature
        flat: list[Any] = []
        for argument in signature.inputs:
            if type(argument).__name__ == "ConstantArgument":
                flat.append(argument.value)
                continue
            node = self.index.by_name.get(argument.name)
            if node is None or node not in self.env:
                # The value was optimized away because nothing used it: the original module
                # ignored this argument. Pass None, as the graph has nothing better.
                flat.append(None)
                continue
            flat.append(self.env[node])
        args_spec, kwargs_spec = signature.in_spec.children()
        args, offset = [], 0
        for child in args_spec.children():
            args.append(self.rebuild(child, flat[offset : offset + child.num_leaves]))
            offset += child.num_leaves
        kwargs = {}
        for key, child in zip(kwargs_spec.context, kwargs_spec.children()):
            kwargs[key] = self.rebuild(child, flat[offset : offset + child.num_leaves])
            offset += child.num_leaves
        base = request.call_name.replace("@", "_call")
        call = self.graph.create_node(
            "call_module",
            request.install_path,
            tuple(args),
            kwargs,
            name=self.fresh(f"swapped_{base}"),
        )
        call.meta = {
            "nn_module_stack": _outer_stack(request.nodes[0], request.fqn),
            "graphsurgeon_swap": request.call_name,
        }
        self.attrs[request.install_path] = request.replacement
        request.call_node = call
        request.emitted = True
        out_spec = signature.out_spec
        type_name = _type_name(request.replacement)
        tensor_out = (
            out_spec.is_leaf()
            and len(signature.outputs) == 1
            and type(signature.outputs[0]).__name__ == "TensorArgument"
        )
        if tensor_out:
            checked = self.emit_call(
                _runtime.check_tensor, (call, request.call_name, type_name), "checked"
            )
        else:
            checked = self.emit_call(
                _runtime.check_structure,
                (call, self.spec_node(out_spec), request.call_name, type_name),
                "checked",
            )
        checked.meta = {
            "nn_module_stack": dict(call.meta["nn_module_stack"]),
            "graphsurgeon_check": request.call_name,
        }
        # the outputs are taken apart in the caller: the call's stack without its own entry
        caller_stack = dict(list(call.meta["nn_module_stack"].items())[:-1])
        source = _Source(
            self,
            checked,
            out_spec,
            (_runtime.flatten_output, (self.spec_node(out_spec), request.call_name, type_name)),
            stack=caller_stack,
        )
        for i, argument in enumerate(signature.outputs):
            name = getattr(argument, "name", "")
            if type(argument).__name__ == "ConstantArgument" or not name:
                continue
            old = self.index.by_name.get(name)
            if old is None:
                continue  # an output nobody used: export removed its node
            if name not in request.outputs:
                request.outputs[name] = _Leaf(source, i, meta=_output_meta(old))

    def _bind_swapped_node(self, node: Node, request: _Request) -> None:
        leaf = request.outputs.get(node.name)
        if leaf is not None:
            self.env[node] = leaf
            return
        alias = in_place_alias(node)
        if alias is not None and alias in self.env:
            # An in-place write to a value the call was given: eager code writes the same
            # tensor object, so later users simply keep using that object.
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
            # The mutation happened inside a swapped call: the replacement, running eagerly,
            # updates its own state in place. Nothing to copy.
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
        interpret: run the graph under ``torch.fx.Interpreter`` instead of generated code
            (slower; easier to debug).

    Returns:
        A GraphModule taking and returning exactly what the original model does.
        ``gm.meta["graphsurgeon"]`` holds a :class:`SwapInfo`.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> x = torch.randn(2, 4)
        >>> gm = gs.swap(gs.export(model, (x,)), {"1": torch.nn.GELU()})
        >>> torch.allclose(gm(x), torch.nn.functional.gelu(model[0](x)))
        True
    """
    index = program_index(ep)
    requests = _plan(index, modules)
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
    gm.meta["graphsurgeon"] = SwapInfo(
        program=ep,
        requests=dict(modules),
        calls={r.call_name: r.replacement for r in requests},
        installed_at={r.call_name: r.install_path for r in requests},
        call_nodes={r.call_name: r.call_node.name for r in requests},
        partitions={r.call_name: r.partition for r in requests},
        node_map=builder.node_map,
        copies=builder.copies,
        result_nodes=tuple(n.name for n in gm.graph.nodes if n.op in _COMPUTATION),
    )
    if interpret:
        gm.forward = _interpreted_forward(gm)
    return gm
