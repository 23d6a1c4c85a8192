"""Re-export: a program's module hierarchy rebuilt from its own graph, so it exports again.

torch does not preserve module call signatures when it exports a flat GraphModule, so
``Surgery.export()`` exports this hierarchy instead: one module per module of the program,
holding copies of its parameters and buffers, running the nodes of its calls, called by its
parent with the arguments the program recorded, with the replacements set at their names.
:func:`rebuild_hierarchy` builds it, :func:`program_dynamic_shapes` gives the program's own
dynamic sizes as ``dynamic_shapes`` for the model's forward, and :func:`carry_module_types`
gives the re-exported program the original module types.
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node
from torch.fx.graph import CodeGen
from torch.fx.node import map_arg

from ._meta import (
    describe_spec,
    describe_value,
    inside,
    is_constant,
    leaf_keystrs,
    leaf_paths,
    split_arguments,
    split_call_name,
)
from .errors import ReplacementError, SurgeryError
from .export import export_notes, positional_parameters, qualified_type, record_notes
from .partition import program_index, returned_object
from .rewrite._plan import region_partition
from .rewrite._pytree import build_structure
from .rewrite.info import Region, scheduled

__all__ = [
    "carry_module_types",
    "describe_dynamic",
    "program_dynamic_shapes",
    "rebuild_hierarchy",
    "region_path",
]


def carry_module_types(
    original: ExportedProgram,
    again: ExportedProgram,
    replacements: Mapping[str, torch.nn.Module],
    inlined: Mapping[str, str] | None = None,
) -> None:
    """Give the re-exported program the module types and forward parameter names of the
    original and of the replacements, not those of the rebuilt stand-ins: in its notes, and in
    its graph's module stacks (which a saved program keeps). The modules whose nodes their
    caller ran are noted as dropped, with the reason."""
    notes, before = export_notes(again), export_notes(original)
    if notes is None:
        return
    known = program_index(original).types  # the notes' types, or those the graph recorded
    types, parameters = dict(notes.module_types), dict(notes.parameters)
    swapped = tuple(replacements)
    for fqn in types:
        kind = known.get(fqn)
        if kind and not any(inside(fqn, n) for n in swapped):
            types[fqn] = kind
            if before is not None and fqn in before.parameters:
                parameters[fqn] = before.parameters[fqn]
    for name, replacement in replacements.items():
        for sub, module in replacement.named_modules(remove_duplicate=False):
            fqn = f"{name}.{sub}" if sub else name
            types[fqn] = qualified_type(module)
            parameters[fqn] = positional_parameters(module)
    dropped = dict(notes.dropped)
    for fqn, reason in (inlined or {}).items():
        dropped.setdefault(fqn, f"export() ran its nodes in its caller: {reason}")
    record_notes(
        again,
        dataclasses.replace(notes, module_types=types, parameters=parameters, dropped=dropped),
    )
    stand_in = f"{__name__}.{_Stage.__qualname__}"
    for graph_module in again.graph_module.modules():
        if not isinstance(graph_module, GraphModule):
            continue
        for node in graph_module.graph.nodes:
            stack = node.meta.get("nn_module_stack")
            if not stack:
                continue
            fixed = {}
            for key, (path, kind) in stack.items():
                text = kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
                fixed[key] = (path, types.get(path, text) if text == stand_in else kind)
            node.meta["nn_module_stack"] = fixed


# -- re-export: the program's module hierarchy, rebuilt from its graph ------------------------
#
# torch.export.unflatten would build it, but it writes into the program it is given (its
# graph_module.meta keeps the unflattened module, which holds fake tensors: copy.deepcopy of
# the program, and of every swap result of it, then fails), its generated code does not
# compile for module names such as "in" or 'a"b', and a module that reads a dynamic size off
# the model's input is called with that input as an extra argument, so neither a replacement
# nor the re-exported signature takes what the module took. The hierarchy is built here
# instead: one module per module of the program, each call of it called by its caller with the
# arguments of its preserved signature, reading its own parameters and buffers, and
# recomputing the dynamic sizes it needs from its own arguments.

_STATE_KINDS = frozenset({"PARAMETER", "BUFFER", "CONSTANT_TENSOR", "CUSTOM_OBJ"})
_MUTATION_KINDS = frozenset({"BUFFER_MUTATION", "PARAMETER_MUTATION", "USER_INPUT_MUTATION"})
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


class _Inline(Exception):
    """Module ``fqn`` cannot run as a module of its own in the rebuilt hierarchy (``reason``);
    its nodes are then run by the module that calls it, and its signature is not preserved."""

    def __init__(self, fqn: str, reason: str):
        super().__init__(reason)
        self.fqn = fqn


class _Stage(torch.nn.Module):
    """A module of a program's rebuilt hierarchy: it holds the module's parameters, buffers
    and submodules at their names, and runs the nodes of the module's calls (the k-th call of
    a module called several times runs the nodes of its k-th call). Each one has a class of its
    own, whose ``forward`` is the code generated for its calls."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise SurgeryError("internal: a rebuilt module was called before it was completed")


def _new_stage() -> _Stage:
    return type("_Stage", (_Stage,), {"__module__": __name__})()


@dataclass(frozen=True)
class _Held:
    """In a region's extras: the hierarchy's copy of the program's tensor ``path``."""

    path: str


@dataclass(frozen=True)
class _Owner:
    """In a region's extras: the hierarchy's module ``path``."""

    path: str


def _relative(path: str, fqn: str) -> str:
    return path[len(fqn) + 1 :] if fqn else path


def _flat_name(path: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in path)


def _is_namedtuple(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields")


def _indexable(spec: pytree.TreeSpec) -> bool:
    """Whether every leaf of ``spec`` is reached by plain ``[key]`` lookups."""
    if spec.is_leaf():
        return True
    kind = spec.type
    if not (kind in (tuple, list, dict, type(None)) or _is_namedtuple(kind)):
        return False
    return all(_indexable(child) for child in spec.children())


def _leaves(value: Any) -> list:
    """The leaves of a structure of a registered pytree type (called by generated code)."""
    return pytree.tree_leaves(value)


def _check_output(value: Any, spec: pytree.TreeSpec, call: str, type_name: str) -> Any:
    """``value`` (what a replacement returned) when it has the structure ``spec`` (called by
    generated code: its leaves are then taken by position)."""
    if pytree.tree_structure(value) != spec:
        raise ReplacementError(
            f"{call!r} ({type_name}) returned {describe_value(value)}, but the program expects "
            f"{describe_spec(spec)} there (the original module's output structure). Make its "
            "forward return the same structure."
        )
    return value


def _unflatten(leaves: list, spec: pytree.TreeSpec) -> Any:
    """A structure of a registered pytree type from its leaves (called by generated code)."""
    return pytree.tree_unflatten(list(leaves), spec)


def _plain(part: str) -> bool:
    return part.isidentifier() and not keyword.iskeyword(part)


def _spell(module: torch.nn.Module, base: str, target: str) -> str:
    """Code reading attribute path ``target`` of ``module`` (named ``base`` in the code).

    A name that is no plain identifier (``0``, ``in``, ``a"b``) is read from the dict that
    holds it, ``self.layers._modules['0']``: code that compiles whatever the name, and that
    dynamo (strict export) records as the module path ``layers.0``."""
    text, current = base, module
    for part in target.split("."):
        if _plain(part):
            text, current = f"{text}.{part}", getattr(current, part, None)
            continue
        for table in ("_modules", "_parameters", "_buffers"):
            held = getattr(current, table, None)
            if isinstance(held, dict) and part in held:
                text, current = f"{text}.{table}[{part!r}]", held[part]
                break
        else:
            text, current = f"getattr({text}, {part!r})", getattr(current, part, None)
    return text


class _AttributeCodeGen(CodeGen):
    """fx's code generation, with every attribute path spelled by :func:`_spell`.

    fx writes ``self.d.in`` for module ``d.in`` and ``getattr(self.d, "a"b")`` for ``d.a"b``,
    neither of which compiles, and ``getattr(self.layers, "0")``, which strict export records
    as a module path of its own."""

    _TOKEN = "_graphsurgeon_target_"

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def _gen_python_code(self, nodes, root_module, namespace, **kwargs):
        renamed: list[tuple[Node, str]] = []
        for node in nodes:
            if node.op in ("get_attr", "call_module") and not all(
                _plain(part) for part in str(node.target).split(".")
            ):
                renamed.append((node, node.target))
                object.__setattr__(node, "target", f"{self._TOKEN}{len(renamed) - 1}")
        try:
            code = super()._gen_python_code(nodes, root_module, namespace, **kwargs)
        finally:
            for node, target in renamed:
                object.__setattr__(node, "target", target)
        if renamed:
            pattern = rf"\b{re.escape(root_module)}\.{self._TOKEN}(\d+)\b"
            code.src = re.sub(
                pattern,
                lambda m: _spell(self.module, root_module, renamed[int(m.group(1))][1]),
                code.src,
            )
        return code


class _Plan:
    """What the rebuilt hierarchy is made of: the program's calls, state and mutations, which
    modules run as modules of their own (``outlined``) and which are replaced."""

    def __init__(
        self,
        program: ExportedProgram,
        replacements: Mapping[str, torch.nn.Module],
        inline: set[str],
        regions: Mapping[str, Region] | None = None,
    ):
        self.ep = program
        self.index = program_index(program)
        self.parts = dict(self.index.partitions())
        self.replacements = dict(replacements)
        self.inline = inline
        # a replaced region of ops (Surgery.replace) becomes a module of its own, in the module
        # that holds its nodes: its call is emitted there like a submodule's
        self.paths: dict[str, str] = {}  # region name -> its module's path
        self.region_of: dict[str, str] = {}  # node name -> the region it is in
        for name, region in (regions or {}).items():
            if name not in self.replacements:
                continue
            path = region_path(region)
            self.paths[name] = path
            self.replacements[path] = self.replacements.pop(name)
            self.parts[name] = region_partition(self.index, region)
            for node in region.nodes:
                self.region_of[node] = name
        signature = program.graph_signature
        self.state_specs = {
            spec.arg.name: spec
            for spec in signature.input_specs
            if spec.kind.name in _STATE_KINDS and getattr(spec.arg, "name", None)
        }
        self.values: dict[str, Any] = dict(program.state_dict)
        for path, value in program.constants.items():
            self.values.setdefault(path, value)
        by_identity: dict[int, list[str]] = {}
        for path, value in self.values.items():
            by_identity.setdefault(id(value), []).append(path)
        self.aliases = {path: by_identity[id(value)] for path, value in self.values.items()}
        placeholders = [n for n in self.index.nodes if n.op == "placeholder"]
        by_target = {
            spec.target: node
            for node, spec in zip(placeholders, signature.input_specs)
            if spec.target is not None
        }
        # functional graphs: the node holding a new value -> the placeholder it is written to
        self.mutations: dict[str, Node] = {}
        for spec in signature.output_specs:
            kind = spec.kind.name
            if kind == "USER_INPUT_MUTATION":
                self.mutations[spec.arg.name] = self.index.by_name[spec.target]
            elif kind in ("BUFFER_MUTATION", "PARAMETER_MUTATION"):
                self.mutations[spec.arg.name] = by_target[spec.target]
        self._outlined: dict[str, bool] = {}
        self._copies: dict[int, Any] = {}
        # attribute of the root -> the state it holds there: state read outside every
        # replacement whose every name is inside one (a weight tied to a replaced module)
        self.retained: dict[str, str] = {}
        # a replaced module's state that the program reads outside its calls (a parent's
        # self.child.scale): read from the replacement, as eager and the rewrite read it
        self.read_from_replacement = {
            read.target for name in self.replacements for read in self.index.outside_reads(name)
        }

    def copy_of(self, path: str) -> Any:
        """The hierarchy's own copy of the program's tensor ``path`` (one per tensor, so
        tied names share it)."""
        value = self.values[path]
        found = self._copies.get(id(value))
        if found is None:
            if isinstance(value, torch.nn.Parameter):
                found = torch.nn.Parameter(value.detach().clone(), value.requires_grad)
            elif isinstance(value, torch.Tensor):
                found = value.detach().clone()
            else:
                found = value  # a script object
            self._copies[id(value)] = found
        return found

    def replaced_above(self, path: str) -> bool:
        return any(inside(path, name, strictly=True) for name in self.replacements)

    def outlined(self, fqn: str) -> bool:
        """Whether module ``fqn`` is called as a module of its own (a replacement, or a
        module every call of which can be cut out along its preserved signature)."""
        known = self._outlined.get(fqn)
        if known is None:
            if fqn in self.replacements:
                known = True
            elif not fqn or fqn in self.inline or self.replaced_above(fqn):
                known = False
            else:
                calls = self.index.calls_of.get(fqn, [])
                known = bool(calls) and all(
                    self.parts[c].preserved and self.parts[c].swappable for c in calls
                )
            self._outlined[fqn] = known
        return known

    def child_call(self, node: Node, call: str) -> str | None:
        """The outermost call inside ``call`` ('' for the root) that runs ``node`` as a
        module of its own (a submodule's call, or a replaced region's), or None when ``call``'s
        own module runs it."""
        chain = self.index.calls.chain(node.name)
        if call:
            if call not in chain:
                return None
            chain = chain[chain.index(call) + 1 :]
        for name in chain:
            if self.outlined(split_call_name(name)[0]):
                return name
        return self.region_of.get(node.name)

    def region_groups(self) -> list[list[Node]]:
        """The program's nodes of each replaced region, in graph order."""
        return [sorted(self.members(name), key=self.index.order.__getitem__) for name in self.paths]

    def path_of(self, child: str) -> str:
        """The module path of a child call: a submodule's fqn, or a region's module."""
        return self.paths.get(child) or split_call_name(child)[0]

    def members(self, child: str) -> set[Node]:
        """The program's nodes a child call runs."""
        if child in self.paths:
            return {self.index.by_name[n] for n in self.parts[child].nodes}
        return set(self.index.call_nodes.get(child, []))

    def state_path(self, target: str, fqn: str) -> str | None:
        """A name of the tensor ``target`` that module ``fqn`` holds (itself or an alias:
        tied weights), outside every replacement; None if it holds none."""
        for path in (target, *self.aliases.get(target, ())):
            if inside(path, fqn, strictly=True) and not self.replaced_above(path):
                return path
        return None


class _Region:
    """The graph of one module call (or of the root), written from the program's nodes: each
    call of a submodule that runs as a module of its own becomes one ``call_module`` with the
    arguments of its preserved signature."""

    def __init__(self, plan: _Plan, fqn: str, call: str, number: int):
        self.plan = plan
        self.fqn = fqn
        self.call = call
        self.graph = torch.fx.Graph()
        self.env: dict[Node, Any] = {}
        self.arguments: list[tuple[Node, Any]] = []  # (program node, its value here)
        self.emitted: set[str] = set()
        self.extras: dict[str, Any] = {}  # plain attributes the module holds for this graph
        self._prefix = f"_graphsurgeon_{number}_"
        self._attrs: dict[str, Node] = {}
        self._items: dict[tuple[Node, tuple], Node] = {}

    # -- the pass -------------------------------------------------------------------------

    def build(self) -> _Region:
        plan = self.plan
        if self.call:
            self._call_inputs()
            nodes = plan.index.call_nodes.get(self.call, [])
        else:
            self._program_inputs()
            nodes = [n for n in plan.index.nodes if n.op not in ("placeholder", "output")]
        # a region's call runs at its first node, after what it reads (as the rewrite emits it)
        nodes = scheduled(nodes, plan.region_groups())
        written = []
        for node in nodes:
            child = plan.child_call(node, self.call)
            if child is not None:
                if child not in self.emitted:
                    self._emit(child)
                continue
            if node.op == "get_attr" or node in self.env:
                continue  # an attribute is read where it is used
            self._copy(node)
            if node.name in plan.mutations:
                written.append(node)
        for node in written:  # a functional graph's writes to buffers and inputs, done here
            destination = self.value(plan.mutations[node.name])
            source = self.env[node]
            if destination is not source:
                self.graph.call_function(torch.ops.aten.copy_.default, (destination, source))
        if self.call:
            self._call_outputs()
        else:
            self._program_outputs()
        return self

    def _copy(self, node: Node) -> Node:
        new = self.graph.create_node(
            node.op,
            node.target,
            map_arg(node.args, self.value),
            map_arg(node.kwargs, self.value),
            name=node.name,
            type_expr=node.type,
        )
        new.meta = dict(node.meta)
        self.env[node] = new
        return new

    # -- values ---------------------------------------------------------------------------

    def value(self, old: Any) -> Any:
        """The value here of a value of the program (a node, or a constant)."""
        if not isinstance(old, Node):
            return old
        if old not in self.env:
            self.env[old] = self._resolve(old)
        return self.env[old]

    def _resolve(self, old: Node) -> Any:
        plan = self.plan
        if old.name in plan.state_specs:
            return self._state(old)
        if old.op == "get_attr":
            return self._attribute(old)
        if old.op != "placeholder":
            child = plan.child_call(old, self.call)
            if child is not None and child in self.emitted:
                # a node of a submodule's (or region's) call that is not one of its outputs
                alias = returned_object(old)
                if alias is not None:
                    # at run time a tensor from before the call (written in place, or
                    # converted to the dtype it has): the object the call was given
                    return self.value(alias)
                target = plan.mutations.get(old.name)
                if target is not None:  # the same in a functional graph
                    return self.value(target)
                raise _Inline(
                    plan.path_of(child),
                    f"node {old.name!r} of it is used outside it but is not one of its outputs",
                )
        if isinstance(old.meta.get("val"), (*_SYMBOLIC, int, float, bool)):
            return self._size(old)
        raise _Inline(
            self.fqn, f"node {old.name!r} outside it feeds it without being one of its arguments"
        )

    def _get_attr(self, target: str, meta: Mapping[str, Any]) -> Node:
        node = self._attrs.get(target)
        if node is None:
            node = self.graph.get_attr(target)
            node.meta = dict(meta)
            self._attrs[target] = node
        return node

    def _extra(self, kind: str, value: Any, key: str = "") -> Node:
        name = f"{self._prefix}{kind}_{key or len(self.extras)}"
        self.extras[name] = value
        return self._get_attr(name, {})

    def _state(self, old: Node) -> Node:
        plan = self.plan
        spec = plan.state_specs[old.name]
        if spec.target in plan.read_from_replacement:
            return self._held_by(spec.target, old.meta)
        path = plan.state_path(spec.target, self.fqn)
        if path is not None:
            return self._get_attr(_relative(path, self.fqn), old.meta)
        if spec.kind.name in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
            # a constant need not be shared: the module holds it under a name of its own
            return self._extra("constant", _Held(spec.target), _flat_name(spec.target))
        home = plan.state_path(spec.target, "")
        if home is None:
            # every name of it is inside a replacement: the root keeps it under one of its own
            home = "_graphsurgeon_retained_" + _flat_name(spec.target)
            plan.retained[home] = spec.target
        return self._held_by(home, old.meta)

    def _held_by(self, path: str, meta: Mapping[str, Any]) -> Node:
        """The parameter or buffer the hierarchy holds at ``path``, read from this module."""
        if inside(path, self.fqn, strictly=True):
            return self._get_attr(_relative(path, self.fqn), meta)
        # another module's parameter or buffer (as a module reads its parent's through a
        # reference): read through a plain reference to the module holding it, as export
        # recognizes a parameter only where it is registered
        owner, _, leaf = path.rpartition(".")
        name = f"{self._prefix}owner_{_flat_name(owner) or 'root'}"
        self.extras[name] = _Owner(owner)
        return self._get_attr(f"{name}.{leaf}", meta)

    def _attribute(self, old: Node) -> Node:
        """An attribute of the program's graph module (a torch.cond branch): the module
        holds the same object, as a plain attribute (not a submodule)."""
        value: Any = self.plan.ep.graph_module
        for part in str(old.target).split("."):
            value = getattr(value, part)
        node = self._extra("attr", value, _flat_name(str(old.target)))
        node.meta = dict(old.meta)
        return node

    def _size(self, old: Node) -> Any:
        """A size (or a number) computed outside this call: read off an argument that has it,
        or computed again here from what this call has."""
        want = old.meta.get("val")
        if not isinstance(want, _SYMBOLIC):
            return want  # static: the number itself
        expression = want.node.expr
        for program_node, here in self.arguments:
            value = program_node.meta.get("val")
            if isinstance(value, _SYMBOLIC) and value.node.expr == expression:
                return here
            if not isinstance(value, torch.Tensor):
                continue
            for dim, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt) and size.node.expr == expression:
                    node = self.graph.call_function(torch.ops.aten.sym_size.int, (here, dim))
                    node.meta = dict(old.meta)
                    return node
        if old.op == "call_function":
            try:
                return self._copy(old)  # computed again here, from what this call has
            except _Inline as problem:
                if problem.fqn != self.fqn:
                    raise
        raise _Inline(
            self.fqn, f"it reads the size {old.name!r} ({want}), which none of its arguments has"
        )

    # -- structures -----------------------------------------------------------------------

    def _take_apart(self, node: Node, spec: pytree.TreeSpec) -> list[Node]:
        """The leaves of the structure ``spec`` that ``node`` holds."""
        if spec.is_leaf():
            return [node]
        if _indexable(spec):
            return [self._item(node, path) for path in leaf_paths(spec)]
        flat = self.graph.call_function(_leaves, (node,))
        return [
            self.graph.call_function(operator.getitem, (flat, i)) for i in range(spec.num_leaves)
        ]

    def _item(self, node: Node, path: tuple) -> Node:
        if not path:
            return node
        found = self._items.get((node, path))
        if found is None:
            parent = self._item(node, path[:-1])
            found = self.graph.call_function(operator.getitem, (parent, path[-1]))
            self._items[(node, path)] = found
        return found

    def _build(self, spec: pytree.TreeSpec, values: list) -> Any:
        """The structure ``spec`` over ``values``."""
        if spec.is_leaf():
            return values[0]
        return build_structure(
            spec,
            values,
            self._build,
            lambda s, v: self.graph.call_function(_unflatten, (list(v), self._extra("spec", s))),
        )

    # -- the edges of the graph -----------------------------------------------------------

    def _placeholder(self, name: str) -> Node:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise _Inline(self.fqn, f"its argument {name!r} is not a Python name")
        return self.graph.placeholder(name)

    def _program_inputs(self) -> None:
        ep = self.plan.ep
        placeholders = [n for n in self.plan.index.nodes if n.op == "placeholder"]
        user = []
        for node, spec in zip(placeholders, ep.graph_signature.input_specs):
            kind = spec.kind.name
            if kind == "USER_INPUT":
                user.append(node)
            elif kind not in _STATE_KINDS:
                raise SurgeryError(
                    f"cannot export again a program with {kind} inputs (input {node.name!r}); "
                    "export the model without effect tokens"
                )
        args_spec, kwargs_spec = ep.call_spec.in_spec.children()
        root = next((e.signature for e in ep.module_call_graph if e.fqn == ""), None)
        names = list(root.forward_arg_names or ()) if root is not None else []
        arguments = [
            (names[i] if i < len(names) else f"arg_{i}", spec)
            for i, spec in enumerate(args_spec.children())
        ]
        arguments += [(str(k), s) for k, s in zip(kwargs_spec.context, kwargs_spec.children())]
        if sum(spec.num_leaves for _, spec in arguments) != len(user):
            raise SurgeryError("internal: the program's input structure does not match its inputs")
        offset = 0
        for name, spec in arguments:
            node = self._placeholder(name)
            if spec.is_leaf() and offset < len(user):
                node.meta = dict(user[offset].meta)
            for old, new in zip(
                user[offset : offset + spec.num_leaves], self._take_apart(node, spec)
            ):
                self.env[old] = new
            offset += spec.num_leaves

    def _program_outputs(self) -> None:
        ep = self.plan.ep
        output = next(n for n in self.plan.index.nodes if n.op == "output")
        flat = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
        user = []
        for value, spec in zip(flat, ep.graph_signature.output_specs):
            kind = spec.kind.name
            if kind in ("USER_OUTPUT", "LOSS_OUTPUT"):
                user.append(self.value(value))
            elif kind not in _MUTATION_KINDS:  # mutations are written where they are made
                raise SurgeryError(f"cannot export again a program with {kind} outputs")
        out_spec = ep.call_spec.out_spec
        self.graph.output(self._build(out_spec, user) if out_spec is not None else tuple(user))

    def _call_inputs(self) -> None:
        signature = self.plan.parts[self.call].signature
        args_spec, kwargs_spec = signature.in_spec.children()
        taken = {str(k) for k in kwargs_spec.context}
        names = []
        for name in self.plan.index.parameter_names(self.fqn, args_spec.num_children):
            while name in taken:
                name += "_"
            taken.add(name)
            names.append(name)
        leaves: list[Node] = []
        for key, spec, _ in split_arguments(signature.in_spec):
            node = self._placeholder(names[key] if isinstance(key, int) else str(key))
            leaves += self._take_apart(node, spec)
        for argument, leaf in zip(signature.inputs, leaves):
            if is_constant(argument):
                continue  # a constant argument is baked into the call's nodes
            old = self.plan.index.by_name.get(argument.name)
            if old is None or old in self.env:
                continue  # an argument the module ignored, or passed twice (read once)
            self.env[old] = leaf
            self.arguments.append((old, leaf))

    def _call_outputs(self) -> None:
        signature = self.plan.parts[self.call].signature
        values = []
        for argument in signature.outputs:
            if is_constant(argument):
                values.append(getattr(argument, "value", None))
                continue
            old = self.plan.index.by_name.get(argument.name)
            values.append(None if old is None else self.value(old))
        self.graph.output(self._build(signature.out_spec, values))

    def _emit(self, child: str) -> None:
        """One call of a submodule, with the arguments of its preserved signature."""
        plan = self.plan
        fqn = plan.path_of(child)
        if not inside(fqn, self.fqn, strictly=True):
            raise _Inline(self.fqn, f"it calls {fqn!r}, which is not one of its submodules")
        signature = plan.parts[child].signature
        flat = []
        for argument in signature.inputs:
            if is_constant(argument):
                flat.append(getattr(argument, "value", None))
                continue
            old = plan.index.by_name.get(argument.name)
            # an input the module ignored has no node left: pass None, as swap does
            flat.append(None if old is None else self.value(old))
        args, kwargs = [], {}
        for key, spec, offset in split_arguments(signature.in_spec):
            value = self._build(spec, flat[offset : offset + spec.num_leaves])
            if isinstance(key, int):
                args.append(value)
            else:
                kwargs[str(key)] = value
        call = self.graph.call_module(_relative(fqn, self.fqn), tuple(args), kwargs)
        self.emitted.add(child)
        replacement = plan.replacements.get(fqn)
        if replacement is not None:
            spec, kind = self._extra("spec", signature.out_spec), type(replacement).__name__
            call = self.graph.call_function(_check_output, (call, spec, child, kind))
        members = plan.members(child)
        leaves: list[Node] | None = None
        for i, argument in enumerate(signature.outputs):
            if is_constant(argument):
                continue
            old = plan.index.by_name.get(argument.name)
            if old is None or old not in members or old in self.env:
                continue  # unused, or an input returned unchanged: it keeps its value here
            if leaves is None:
                leaves = self._take_apart(call, signature.out_spec)
            self.env[old] = leaves[i]


def _compile(
    module: torch.nn.Module, regions: list[_Region], modules: Mapping[str, torch.nn.Module]
) -> list[Callable]:
    """The forward function of each region's graph, run with ``module`` as ``self``."""
    functions = []
    for region in regions:
        for name, value in region.extras.items():
            if isinstance(value, _Held):
                value = region.plan.copy_of(value.path)
            elif isinstance(value, _Owner):
                value = modules[value.path]
            object.__setattr__(module, name, value)  # plain attributes, not submodules
        region.graph.set_codegen(_AttributeCodeGen(module))
        holder = GraphModule(module, region.graph, class_name="RebuiltModule")
        functions.append(type(holder).forward)
    return functions


def _dispatcher(functions: list[Callable], count: list[int]) -> Callable:
    """A forward running the k-th call's function at the k-th call. A run of the root makes
    every call once, so the count is back at 0 after it (the root resets it after a run that
    failed). The count is kept off the module: a module whose attributes change is one strict
    export reads through ``__dict__``, and records its submodules' paths that way."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        k = count[0]
        count[0] = (k + 1) % len(functions)
        return functions[k](self, *args, **kwargs)

    return forward


def _hierarchy(plan: _Plan) -> torch.nn.Module:
    index = plan.index
    root_region = _Region(plan, "", "", 0).build()
    regions: dict[str, list[_Region]] = {}
    number = 1
    for fqn in index.fqns:
        if not fqn or fqn in plan.replacements or not plan.outlined(fqn):
            continue
        for call in index.calls_of.get(fqn, []):
            regions.setdefault(fqn, []).append(_Region(plan, fqn, call, number).build())
            number += 1
    root = _new_stage()
    modules: dict[str, torch.nn.Module] = {"": root}

    def module_at(path: str) -> torch.nn.Module:
        found = modules.get(path)
        if found is None:
            parent_path, _, leaf = path.rpartition(".")
            parent = module_at(parent_path)
            found = parent._modules.get(leaf)
            if found is None:
                found = torch.nn.Module()  # a container, or a module run by its caller
                parent._modules[leaf] = found
            modules[path] = found
        return found

    placed = sorted([*regions, *plan.replacements], key=lambda n: n.count("."))
    for fqn in placed:
        parent_path, _, leaf = fqn.rpartition(".")
        module = plan.replacements.get(fqn) or _new_stage()
        module_at(parent_path)._modules[leaf] = module
        modules[fqn] = module
    for fqn in index.fqns:  # every module of the program is one of the hierarchy
        if fqn not in plan.replacements and not plan.replaced_above(fqn):
            module_at(fqn)
    # the program's state, copied (tied names share one copy), outside every replacement
    signature = plan.ep.graph_signature
    kinds = {spec.target: spec for spec in signature.input_specs if spec.kind.name in _STATE_KINDS}
    non_persistent = set(signature.non_persistent_buffers)

    def install(owner: torch.nn.Module, leaf: str, path: str) -> None:
        value = plan.copy_of(path)
        spec = kinds.get(path)
        kind = spec.kind.name if spec is not None else None
        if kind == "PARAMETER" or (kind is None and isinstance(value, torch.nn.Parameter)):
            owner._parameters[leaf] = value
        elif kind == "BUFFER" or path in plan.ep.state_dict or path in non_persistent:
            owner._buffers[leaf] = value
            if path in non_persistent:
                owner._non_persistent_buffers_set.add(leaf)
        else:
            object.__setattr__(owner, leaf, value)  # a constant: a plain attribute

    for path in plan.values:
        if plan.replaced_above(path):
            continue
        owner_path, _, leaf = path.rpartition(".")
        install(module_at(owner_path), leaf, path)
    for name, target in plan.retained.items():
        install(root, name, target)
    counts: list[list[int]] = []
    for fqn, calls in regions.items():
        stage = modules[fqn]
        functions = _compile(stage, calls, modules)
        if len(functions) > 1:
            counts.append([0])
            forward = _dispatcher(functions, counts[-1])
        else:
            forward = functions[0]
        type(stage).forward = forward
    (run,) = _compile(root, [root_region], modules)
    if counts:
        run_once = run

        @functools.wraps(run_once)
        def run(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return run_once(self, *args, **kwargs)
            except BaseException:
                for count in counts:  # a run that failed halfway: start again at call 0
                    count[0] = 0
                raise

    type(root).forward = run
    return root


def region_path(region: Region) -> str:
    """Where a replaced region of ops lives in the rebuilt hierarchy (and the program exported
    again): a module of its own in the module that holds its nodes, ``replaced_<name>``."""
    leaf = "replaced_" + "".join(c if c.isalnum() else "_" for c in region.type_name).strip("_")
    index = region.name.rpartition("#")[2] if "#" in region.name else ""
    leaf += f"_{index}" if index.isdigit() else ""
    fqn = split_call_name(region.call)[0]
    call = split_call_name(region.call)[1]
    if call:  # one call of a module called several times: its regions are kept apart
        leaf += f"_call{call}"
    return f"{fqn}.{leaf}" if fqn else leaf


def rebuild_hierarchy(
    program: ExportedProgram,
    replacements: Mapping[str, torch.nn.Module],
    regions: Mapping[str, Region] | None = None,
) -> tuple[torch.nn.Module, dict[str, str]]:
    """``program`` as a hierarchy of modules, with each replacement set at its name, and the
    modules whose nodes their caller runs, each with the reason (they are modules of the
    hierarchy, but not called). Every other module of the program whose calls are preserved
    and swappable is called with the arguments of its preserved signature. The hierarchy
    holds copies of the program's parameters and buffers and computes what
    ``gs.swap(program, replacements)`` computes; ``program`` is not changed."""
    inline: dict[str, str] = {}
    while True:
        try:
            return _hierarchy(_Plan(program, replacements, set(inline), regions)), inline
        except _Inline as problem:
            if not problem.fqn or problem.fqn in inline or problem.fqn in replacements:
                raise SurgeryError(
                    f"cannot rebuild the program's modules to export it again: "
                    f"{problem.fqn or 'the root'}: {problem}"
                ) from None
            inline[problem.fqn] = str(problem)


# -- dynamic sizes ------------------------------------------------------------------------------


def _bound(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if abs(number) < 2**62 else None


def _user_arguments(program: ExportedProgram) -> list[tuple[str, pytree.TreeSpec, list[Node]]]:
    """The model's forward arguments as the program takes them: (name, structure, the input
    placeholders of its leaves), positional ones first, then keywords."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    user = [
        node
        for node, spec in zip(placeholders, program.graph_signature.input_specs)
        if spec.kind.name == "USER_INPUT"
    ]
    args_spec, kwargs_spec = program.call_spec.in_spec.children()
    root = next((e.signature for e in program.module_call_graph if e.fqn == ""), None)
    names = list(root.forward_arg_names or ()) if root is not None else []
    arguments = [
        (names[i] if i < len(names) else f"arg_{i}", spec)
        for i, spec in enumerate(args_spec.children())
    ]
    arguments += [(str(k), s) for k, s in zip(kwargs_spec.context, kwargs_spec.children())]
    result, offset = [], 0
    for name, spec in arguments:
        result.append((name, spec, user[offset : offset + spec.num_leaves]))
        offset += spec.num_leaves
    return result


def _symbolic_sizes(value: Any) -> dict[int, Any]:
    if not isinstance(value, torch.Tensor):
        return {}
    return {
        i: size.node.expr
        for i, size in enumerate(value.shape)
        if isinstance(size, torch.SymInt) and not size.node.expr.is_number
    }


def program_dynamic_shapes(program: ExportedProgram) -> dict[str, Any] | None:
    """``dynamic_shapes`` for ``torch.export`` that keep ``program``'s dynamic sizes, with
    their ranges, keyed by the names of the model's forward arguments; None when every size is
    static. A size that is a multiple of another plus a constant is derived from it, as
    torch.export writes it (``2 * t``); any other expression is left for torch to infer."""
    ranges = {str(k): v for k, v in program.range_constraints.items()}
    dims: dict[Any, Any] = {}

    def dim(expression: Any) -> Any:
        if expression.is_Symbol:
            if expression not in dims:
                found = ranges.get(str(expression))
                low = _bound(found.lower) if found is not None else None
                high = _bound(found.upper) if found is not None else None
                dims[expression] = torch.export.Dim(
                    _flat_name(str(expression)), min=low if low is not None else 0, max=high
                )
            return dims[expression]
        symbols = list(expression.free_symbols)
        if len(symbols) == 1:
            (symbol,) = symbols
            scale = expression.coeff(symbol)
            offset = expression - scale * symbol
            if scale.is_Integer and offset.is_Integer and int(scale) > 0:
                base = dim(symbol)
                derived = base * int(scale) if int(scale) != 1 else base
                return derived + int(offset) if int(offset) else derived
        return torch.export.Dim.AUTO

    dynamic = False
    result: dict[str, Any] = {}
    for name, spec, leaves in _user_arguments(program):
        specs = []
        for node in leaves:
            value = node.meta.get("val")
            if isinstance(value, _SYMBOLIC):  # a dynamic number (an int input)
                dynamic = True
                specs.append(torch.export.Dim.DYNAMIC)
                continue
            sizes = {i: dim(expression) for i, expression in _symbolic_sizes(value).items()}
            dynamic = dynamic or bool(sizes)
            specs.append(sizes or None)
        result[name] = specs[0] if spec.is_leaf() else pytree.tree_unflatten(specs, spec)
    return result if dynamic else None


def describe_dynamic(program: ExportedProgram) -> str:
    """``x.shape[0] in [2, 9], n``: the program's dynamic sizes, by input."""
    ranges = {str(k): v for k, v in program.range_constraints.items()}
    parts = []
    for name, spec, leaves in _user_arguments(program):
        for keys, node in zip(leaf_keystrs(spec), leaves):
            value = node.meta.get("val")
            if isinstance(value, _SYMBOLIC):
                parts.append(f"{name}{keys}")
            for i, expression in _symbolic_sizes(value).items():
                found = ranges.get(str(expression))
                low = _bound(found.lower) if found is not None else None
                high = _bound(found.upper) if found is not None else None
                bounds = "" if found is None else f" in [{low}, {'inf' if high is None else high}]"
                parts.append(f"{name}{keys}.shape[{i}]{bounds}")
    return ", ".join(parts)
