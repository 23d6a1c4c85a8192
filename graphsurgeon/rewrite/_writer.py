"""Writing a new fx graph: fresh names, attribute paths the generated code can spell, values
made into nodes on first use, structures rebuilt with as little glue as possible; and the
GraphModule a rewrite makes (it keeps the mode its program was exported in)."""

from __future__ import annotations

import builtins
import functools
import inspect
import keyword
import operator
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx import GraphModule, Node
from torch.fx.immutable_collections import immutable_dict

from .. import _meta
from ..errors import (
    DeployError,
    InputStructureError,
    ModeError,
    SwapError,
)
from ..partition import (
    ProgramIndex,
    op_argument,
)
from . import _runtime
from ._codegen import FastCodeGen, fast_function
from ._parts import PartCache, Unsupported, write_in_parts
from ._plan import _Request
from ._pytree import _indexable, _subtrees, build_structure

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


@functools.lru_cache(maxsize=1 << 16)
def safe_path(target: str) -> str:
    """``layers.in.weight`` -> ``layers.in_.weight``: the path with every component spellable."""
    return ".".join(_safe_component(p) for p in target.split("."))


class _Graph(torch.fx.Graph):
    """The graph a rewrite writes. Its code is written without fx's pass that renames every
    node for printing (two writes to each node, a third of the time of writing 16,000 nodes'
    code) when the parts writer takes it: that writer names each value by its node's name,
    which this graph's namespace already made unique and legal."""

    def python_code(self, root_module: str, **options: Any) -> Any:
        codegen = self._codegen
        if (
            root_module == "self"
            and isinstance(codegen, FastCodeGen)
            and codegen.parts is not None
            and not any(options.values())
        ):
            try:
                return write_in_parts(
                    self.nodes, codegen.parts, fast_function, codegen.origins, codegen.disturbed
                )
            except Unsupported:
                pass  # fx writes it whole
        return super().python_code(root_module, **options)


def _node(graph: torch.fx.Graph, op: str, target: Any, args: tuple, name: str) -> Node:
    """``graph.create_node(op, target, args, name=name)`` without fx's scan of the arguments
    for raw symbolic values (it only warns, and a copied node's arguments are the program's
    own, where sizes are nodes): a fifth of the time of copying a node."""
    if not _FAST_NODES:
        return graph.create_node(op, target, args, name=name)
    namespace = graph._graph_namespace
    used = namespace._used_names
    # (kept_by_fx, written out: this runs once per node a swap makes)
    if name in used or name in _REFUSED_NAMES or not (name.isascii() and name.isidentifier()):
        name = namespace.create_name(name, None)  # fx makes it unique and legal
    else:  # a legal name not taken (a copied node's own): fx's create_name would keep it as is
        used.add(name)
    node = Node(graph, name, op, target, args, _NO_KWARGS, None)
    namespace.associate_name_with_obj(name, node)
    graph._insert(node)
    graph._find_nodes_lookup_table.insert(node)
    graph._len += 1
    return node


# The keyword arguments of every node _node makes: one empty mapping, shared. fx never changes
# a node's kwargs in place (an edit gives the node new ones, and this type refuses a write), and
# an empty one of its own per node was a sixth of the objects a swap leaves for the collector.
_NO_KWARGS = immutable_dict()


def _set_meta(node: Node, meta: dict) -> None:
    """``node.meta = meta`` without fx's re-filing of the node in its graph's lookup table (which
    is keyed by op and target, not meta)."""
    object.__setattr__(node, "meta", meta)


# names fx never gives a node (keywords, builtins): such a name goes through fx's create_name
_ILLEGAL_NAMES = getattr(torch.fx.graph, "_illegal_names", None)
_REFUSED_NAMES = (
    _ILLEGAL_NAMES
    if isinstance(_ILLEGAL_NAMES, dict)
    else frozenset(keyword.kwlist) | frozenset(dir(builtins))
)


def kept_by_fx(name: str) -> bool:
    """Whether fx gives a node this name as it is, when no other node of its graph has it
    (not a keyword, not a builtin's, an identifier); else it makes another of it."""
    return name not in _REFUSED_NAMES and name.isascii() and name.isidentifier()


# what _node relies on of fx's graph (torch 2.x); elsewhere it asks fx's create_node
_FAST_NODES = (
    isinstance(_ILLEGAL_NAMES, dict)
    and hasattr(getattr(torch.fx.Graph(), "_graph_namespace", None), "_used_names")
    and all(
        hasattr(torch.fx.Graph(), attribute)
        for attribute in ("_graph_namespace", "_insert", "_find_nodes_lookup_table", "_len")
    )
)


# -- building -----------------------------------------------------------------------------


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
        self.graph = _Graph()
        self.attrs: dict[str, Any] = {}
        self.taken = taken  # names the new graph must not reuse (those of the program)
        self.used_names: set[str] = set()
        self._constants: dict[int, tuple[str, Any]] = {}
        self.attributes_made: list[_Attr] = []  # in the order their nodes were made

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
        node = _node(self.graph, "call_function", operator.getitem, (parent, key), name)
        _set_meta(node, {**(meta or {}), _meta.GLUE: "through"})
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
                x.node = _node(self.graph, "get_attr", target, (), x.name)
                _set_meta(x.node, x.meta)
                self.attributes_made.append(x)
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
        return build_structure(spec, values, self.rebuild, self._unflatten)

    def _unflatten(self, spec: pytree.TreeSpec, values: list) -> Node:
        """A node building a structure of a registered type (a dataclass, a model output)."""
        leaves = [self.materialize(v) for v in values]
        node = self.graph.create_node(
            "call_function",
            _runtime.unflatten,
            (leaves, self.spec_node(spec)),
            name=self.fresh(f"unflatten_{getattr(spec.type, '__name__', 'tree')}"),
        )
        node.meta[_meta.GLUE] = "build"
        return node

    def module(
        self,
        class_name: str,
        parts: PartCache | None = None,
        origins: dict | None = None,
        disturbed: frozenset | None = None,
    ) -> GraphModule:
        """The GraphModule of the graph written. ``origins``: node -> the program node it is a
        copy of (its code is then written from what earlier copies of them were written as);
        ``disturbed``: the program nodes the edit reached (see :func:`._parts.write_in_parts`)."""
        codegen = FastCodeGen(parts)
        codegen.origins = origins
        codegen.disturbed = disturbed
        self.graph.set_codegen(codegen)
        # fx's GraphModule(attrs, graph) installs each attribute through nn.Module's checked
        # setattr: a fifth of a swap's time at 16,000 nodes. The same tree, written directly.
        empty = torch.fx.Graph()
        empty.output(None)
        module = _ProgramModule({}, empty, class_name=class_name)
        _install(module, self.attrs, self.graph)
        try:
            module.graph = self.graph  # compiles the forward
        finally:
            codegen.origins = codegen.disturbed = None
        return module


def _install(root: torch.nn.Module, attrs: dict[str, Any], graph: torch.fx.Graph) -> None:
    """What ``GraphModule(attrs, graph)`` installs: each attribute the graph reads or calls, at
    its path, with plain modules between (parents first); tensors that are no parameter as
    buffers. Modules made here take their children, parameters and buffers by a direct write
    (they have no hooks); anything else by ``setattr`` / ``register_buffer``, as fx does."""
    targets = []
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module"):
            if node.target not in attrs:
                raise RuntimeError(
                    f"Node {node} referenced target {node.target} but that target was not provided"
                )
            targets.append(node.target)
    targets.sort(key=lambda t: t.count("."))
    direct = _FAST_INSTALL and not _module_hooks()
    made: set[int] = {id(root)} if direct else set()
    owners: dict[str, Any] = {"": root}
    for target in targets:
        prefix, _, field = target.rpartition(".")
        owner = owners.get(prefix)
        if owner is None:
            owner, path = root, ""
            for item in prefix.split("."):
                path = f"{path}.{item}" if path else item
                child = owners.get(path)
                if child is None:
                    if owner is not root and id(owner) in made:  # a plain module made here:
                        child = owner._modules.get(item)  # its children are all in _modules
                    else:
                        child = getattr(owner, item, None)
                    if child is None:
                        child = _plain_module() if direct else torch.nn.Module()
                        _put(owner, item, child, direct and id(owner) in made)
                        if direct:
                            made.add(id(child))
                    owners[path] = child
                owner = child
        _put(owner, field, attrs[target], direct and id(owner) in made)


def _module_state() -> tuple[list[tuple[str, Any, Any]], dict[str, type]] | None:
    """What ``torch.nn.Module()`` holds once made: ``(state, registries)``. ``state``: the
    attributes a path module is made with, as (attribute, the type of its fresh empty
    container or None, the value); ``registries``: the empty hook registries (ordered dicts)
    and sets it makes on first use instead, by type. None where a module holds anything else
    (then modules are made by their __init__)."""
    made = torch.nn.Module()
    state, registries = [], {}
    for key, value in made.__dict__.items():
        if type(value) in (OrderedDict, set) and not value:
            registries[key] = type(value)
        elif type(value) is dict and not value:
            state.append((key, dict, None))
        elif value is None or type(value) is bool:
            state.append((key, None, value))
        else:
            return None
    if not {"_parameters", "_buffers", "_modules"} <= {key for key, _, _ in state}:
        return None
    return state, registries


_MODULE_STATE = _module_state()
_REGISTRIES: dict[str, type] = _MODULE_STATE[1] if _MODULE_STATE is not None else {}
_NOTHING: dict[str, Any] = {}  # a state not written yet (a copy being made) holds nothing


class _PathModule(torch.nn.Module):
    """A module on the path to what a program reads or calls (``layers``, ``layers.3``, ...):
    a plain ``torch.nn.Module`` that makes its hook registries when first asked for them.

    A 384-layer program has ~4,200 of them, made anew by every edit; eleven empty ordered
    dicts and a set each were a quarter of the objects an edit leaves behind, and Python's
    cyclic collector, which runs in proportion to them, took about a third of a swap's time.
    Nothing calls a path module, so its registries stay empty unless asked for
    (``register_forward_hook``, ``state_dict``): they are then made as ``nn.Module`` makes
    them, and behave the same. Attribute lookup is ``nn.Module``'s, in the same order."""

    def __getattr__(self, name: str) -> Any:
        # read on every forward (the program's code reads its parameters through path
        # modules): nn.Module's lookup written out, without a call of it
        state = self.__dict__
        parameters = state.get("_parameters", _NOTHING)
        if name in parameters:
            return parameters[name]
        buffers = state.get("_buffers", _NOTHING)
        if name in buffers:
            return buffers[name]
        modules = state.get("_modules", _NOTHING)
        if name in modules:
            return modules[name]
        kind = _REGISTRIES.get(name)
        if kind is not None:
            made = state[name] = kind()
            return made
        raise AttributeError(f"'Module' object has no attribute '{name}'")

    def _get_name(self) -> str:
        return "Module"  # printed as the plain module it stands for


def _plain_module() -> torch.nn.Module:
    """A new path module (:class:`_PathModule`) with its fresh state written at once: a
    fifth of the time of ``torch.nn.Module()``'s ``__init__``, paid by each of the ~4,000
    modules on the paths of a 384-layer program."""
    if _MODULE_STATE is None:
        return torch.nn.Module()
    module = _PathModule.__new__(_PathModule)
    object.__setattr__(
        module,
        "__dict__",
        {key: (kind() if kind is not None else value) for key, kind, value in _MODULE_STATE[0]},
    )
    return module


def _put(owner: Any, field: str, value: Any, direct: bool) -> None:
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        if direct and field not in owner.__dict__:
            owner._buffers[field] = value
        else:
            owner.register_buffer(field, value)
    elif direct and field not in owner.__dict__ and isinstance(value, torch.nn.Parameter):
        owner._parameters[field] = value
    elif direct and field not in owner.__dict__ and isinstance(value, torch.nn.Module):
        owner._modules[field] = value
    else:
        setattr(owner, field, value)


def _module_hooks() -> bool:
    """Whether global hooks watch modules, parameters or buffers being registered (then every
    attribute goes through nn.Module's own registration)."""
    hooks = torch.nn.modules.module
    return any(
        getattr(hooks, name, None)
        for name in (
            "_global_module_registration_hooks",
            "_global_parameter_registration_hooks",
            "_global_buffer_registration_hooks",
        )
    )


# the nn.Module internals _install writes (torch 2.x); elsewhere every attribute is set
_FAST_INSTALL = all(
    hasattr(torch.nn.Module(), attribute) for attribute in ("_buffers", "_parameters", "_modules")
)


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

    def __reduce__(self) -> tuple:
        # fx pickles a GraphModule as its code and traces that code again when loaded; this
        # code calls what was made in this process (its input checks, its parts), which fx
        # cannot name, and the trace would not give this program back: say so, and what works
        name = type(self).__name__
        raise DeployError(
            f"a {name} cannot be pickled (pickle, torch.save): it runs code made in this "
            "process for its graph and its input checks. To save the program, export it again "
            "and save that: torch.export.save(gs.export(program, args), 'program.pt2') "
            "(s.export() for a Surgery s); graphsurgeon.deploy.package(program, path) writes an "
            "AOTInductor package. copy.deepcopy(program) copies it within this process"
        )

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


_SYMBOLIC = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _get_path(root: torch.nn.Module, target: str) -> Any:
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _flat_name(target: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in target.replace("@", "_at_"))


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


def mutation_targets(index: ProgramIndex) -> dict[str, Node]:
    """In a functional graph, which input each written value is the new value of (read from
    :attr:`ProgramIndex.mutation_targets <graphsurgeon.partition.ProgramIndex>`)."""
    return index.mutation_targets
