"""One module call cut out of a program: a GraphModule of exactly its nodes (the form a fused
call takes, and what compare runs the original of a swapped call with)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from .. import _meta
from ..errors import (
    NotSwappableError,
    SwapError,
    UnknownModuleError,
    did_you_mean,
)
from ..partition import (
    Partition,
    ProgramIndex,
    program_index,
)
from . import _runtime
from ._writer import (
    _SYMBOLIC,
    _Attr,
    _flat_name,
    _get_path,
    _GraphWriter,
    _Leaf,
    _Source,
    mutation_targets,
    safe_path,
)

# -- one call, cut out ----------------------------------------------------------------------


class _CallCut(_GraphWriter):
    """The nodes of one module call, copied into a GraphModule that takes and returns what the
    module did (its arguments as the program passed them, its output structure)."""

    def __init__(self, index: ProgramIndex, part: Partition, state, mutations):
        super().__init__(set())
        self.index = index
        self.name = part.call_name
        self.part = part
        self.members = {index.by_name[n] for n in part.nodes if n in index.by_name}
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
        for node in sorted(self.members, key=self.index.order.__getitem__):
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
        fqn = self.part.fqn  # never the root: it cannot be cut
        if _meta.inside(target, fqn, strictly=True):
            return safe_path(target[len(fqn) + 1 :])
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
    partition: Partition | None = None,
) -> GraphModule:
    """The nodes of call ``name`` as a GraphModule of their own: the form a fused call takes.

    It takes the arguments the program passed the module (as the module's forward names them),
    checks the constants it was exported with and that arguments that were one value still are,
    runs the call's original nodes, and returns the module's output structure. ``state`` gives
    the value of each lifted parameter or buffer the nodes read (default: the program's
    parameters, and copies of its buffers, so running it never changes the program).
    ``partition``: the call's partition, for a call that is no module's (a :class:`Region`'s,
    as ``SwapInfo.partitions`` holds it).
    """
    index = (
        program_index(index_or_program)
        if isinstance(index_or_program, ExportedProgram)
        else index_or_program
    )
    parts = index.partitions()
    part = partition if partition is not None else parts.get(name)
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
        mutations = mutation_targets(index)
    return _CallCut(index, part, state, mutations).build()


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
