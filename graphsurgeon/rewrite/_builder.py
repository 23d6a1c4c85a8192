"""The one pass: the exported graph copied node by node into an unlifted graph, each requested
call replaced by one ``call_module`` (see :mod:`graphsurgeon.rewrite`)."""

from __future__ import annotations

import bisect
import operator
import re
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from .. import _derived, _meta
from ..errors import (
    SwapError,
)
from ..partition import (
    ProgramIndex,
    aliased_input,
    program_index,
    returned_object,
    split_call_name,
)
from . import _runtime, _turns
from ._cut import cut_call
from ._guards import InputGuard
from ._parts import PartCache
from ._plan import _Request, _type_name
from ._writer import (
    _SYMBOLIC,
    _Attr,
    _flat_name,
    _get_path,
    _GraphWriter,
    _Leaf,
    _node,
    _Removed,
    _set_meta,
    _Source,
    kept_by_fx,
    mutation_targets,
    safe_path,
)
from .info import scheduled

#: Tests set this: every rewrite also finds the nodes it disturbed from the graph it made, and
#: checks that its footprint (worked out before the pass) holds them all.
CHECK_FOOTPRINT = False


def _check_footprint(footprint: frozenset[Node], disturbed: frozenset[Node]) -> None:
    missed = disturbed - footprint
    if missed:
        names = sorted(node.name for node in missed)
        raise AssertionError(f"the edit's footprint misses nodes it disturbed: {names[:20]}")


def _user_arguments(ep: ExportedProgram) -> list[tuple[str, pytree.TreeSpec]] | None:
    """The model's arguments as the program takes them, ``(name, structure)`` in order
    (keyword arguments last); None for a program without a call spec."""
    in_spec = ep.call_spec.in_spec
    if in_spec is None:
        return None
    root = next((e.signature for e in ep.module_call_graph if e.fqn == ""), None)
    args_spec, kwargs_spec = in_spec.children()
    names = list(root.forward_arg_names) if root and root.forward_arg_names else []
    arguments: list[tuple[str, pytree.TreeSpec]] = []
    for i, spec in enumerate(args_spec.children()):
        arguments.append((names[i] if i < len(names) else f"arg_{i}", spec))
    for key, spec in zip(kwargs_spec.context, kwargs_spec.children()):
        arguments.append((str(key), spec))
    return arguments


def input_guard(ep: ExportedProgram) -> InputGuard:
    """The check of the program's inputs its rewrites run first (:class:`InputGuard`), made
    once per program: a fact about the program, shared by every program built from it.

    Making it parses torch's own guards with ``ast``, which Python 3.11 cannot do on two
    threads at once (``SystemError: AST constructor recursion depth mismatch``): a warm-up
    has it made on the caller's thread before its own starts."""

    def make() -> InputGuard:
        user_leaves = [
            node
            for node, spec in zip(
                (n for n in ep.graph.nodes if n.op == "placeholder"),
                ep.graph_signature.input_specs,
            )
            if spec.kind.name == "USER_INPUT"
        ]
        # what the guard checks; it finds each leaf in torch's own guards (ep._guards_code)
        # by every name torch's tracers give it (L['x'], L['d']['a'], L['flat_args'][3]),
        # from the argument names and structures described here (_guards.tracer_sources)
        described: list[tuple[str, Any, list[tuple[str, Any]]]] = []
        offset = 0
        for argument, spec in _user_arguments(ep) or ():
            leaves = user_leaves[offset : offset + spec.num_leaves]
            offset += spec.num_leaves
            checked = [
                (f"{argument}{keys}", leaf.meta.get("val"))
                for leaf, keys in zip(leaves, _meta.leaf_keystrs(spec))
            ]
            described.append((argument, spec, checked))
        return InputGuard(described, dict(ep.range_constraints), getattr(ep, "_guards_code", ()))

    return _derived.cached(ep, "input guard", make)


def compiled_parts(ep: ExportedProgram) -> PartCache:
    """The program's cache of compiled parts: the code its earlier rewrites compiled, reused."""
    return _derived.cached(ep, "compiled parts", PartCache)


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
        self._swapped_set = frozenset(self.swapped_paths)
        # what a path inside a swapped one starts with (few swaps: one C-level startswith)
        self._swapped_prefixes = tuple(f"{p}." for p in self.swapped_paths)
        self.copied_from: dict[Node, Node] = {}
        # program nodes whose copy took another name, and whose copy the pass removed as dead
        self.renamed: list[Node] = []
        self.dead: list[Node] = []
        # functional graphs: mutated value's node name -> the placeholder it writes
        self.mutation_targets: dict[str, Node] = mutation_targets(index)
        # parameters and constants a replacement is given (as an argument, or a view of one):
        # the result holds its own copies of them, so a replacement that writes one in place
        # (w.mul_(2)) writes the copy, never the user's model or the program
        self.given_state = _state_given_to_replacements(index, requests)
        self._own_copies: dict[int, Any] = {}
        # a swapped module's state read outside its call: target -> (where the replacement is
        # installed, the attribute read from it)
        self.replacement_attributes: dict[str, tuple[str, str]] = {
            read.target: (safe_path(r.install_path), read.attribute)
            for r in requests
            for read in r.attributes_read
        }

    def value(self, old: Any) -> Any:
        """The new-graph value of a value of the old graph (an old node, or a constant)."""
        if isinstance(old, Node):
            try:
                old = self.env[old]
            except KeyError:
                raise SwapError(
                    f"internal: node {old.name!r} is used before it is defined in the swapped graph"
                ) from None
            if type(old) is Node:  # most values: a node already made (no lazy value to make)
                return old
        return self.materialize(old)

    def materialize(self, x: Any) -> Any:
        if isinstance(x, _Attr) and x.node is None and x.target in self.replacement_attributes:
            x.node = self._replacement_attribute(x)
        return super().materialize(x)

    def _replacement_attribute(self, x: _Attr) -> Node:
        """A swapped module's state that its parent reads directly (``self.child.scale``):
        read from the replacement, as eager reads it (the plan checked it holds one of that
        shape and dtype). Read at run time from the installed module, never copied onto it:
        the replacement is the user's and is not changed."""
        install, attribute = self.replacement_attributes[x.target]
        held = self.graph.create_node("get_attr", install, name=self.fresh(f"{install}_module"))
        held.meta[_meta.GLUE] = "constant"
        parts = attribute.split(".")
        for depth, part in enumerate(parts, start=1):
            held = self.graph.create_node(
                "call_function",
                getattr,
                (held, part),
                name=x.name if depth == len(parts) else self.fresh(f"{install}_{part}"),
            )
        held.meta = x.meta
        return held

    def attribute_target(self, target: str) -> str:
        # A parameter still used outside a swapped module (tied weights) must not resolve into
        # the replacement now installed at that path: keep it under a name of its own ("blk@1",
        # one call's install path, holds nothing of "blk": see _meta.inside).
        if "@" in target:
            inside = any(_meta.inside(target, path) for path in self.swapped_paths)
        else:  # _meta.inside of a plain path: the path is one of its prefixes
            swapped = self._swapped_set
            if len(swapped) <= 16:
                inside = (
                    "" in swapped or target in swapped or target.startswith(self._swapped_prefixes)
                )
            else:  # many: one look-up per prefix of the path
                parts = target.split(".")
                inside = "" in swapped or any(
                    ".".join(parts[:end]) in swapped for end in range(1, len(parts) + 1)
                )
        if inside:
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
        footprint = self._footprint()
        for count, node in enumerate(self._schedule()):
            if not count & 255:
                _turns.pause_point()  # a warm-up's turn to wait (see _turns)
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
        alive = set(self.graph.nodes)
        self.node_map = self._node_map(alive)
        self.copies = {new.name: old.name for new, old in self.copied_from.items() if new in alive}
        origins = self._code_origins()
        if CHECK_FOOTPRINT:
            _check_footprint(footprint, self._disturbed(placeholders, origins))
        gm = self.module("SwappedProgram", compiled_parts(ep), origins=origins, disturbed=footprint)
        for target in self.non_persistent:
            owner_path, _, leaf = target.rpartition(".")
            owner = gm.get_submodule(owner_path) if owner_path else gm
            owner._non_persistent_buffers_set.add(leaf)
        return gm

    def _code_origins(self) -> dict[Node, Node]:
        """What the code writer reuses earlier code by (:func:`._parts.write_in_parts`): each
        new node -> the program node it copies. A parameter's ``get_attr`` copies its
        placeholder when it is read as the program reads it (same name, same path). Made
        from :attr:`copied_from` in place (read before: :attr:`copies`)."""
        origins = self.copied_from
        by_name = self.index.by_name
        for value in self.attributes_made:
            node = value.node
            if node.name == value.name and node.target == safe_path(value.target):
                origins[node] = by_name[value.name]
        return origins

    def _footprint(self) -> frozenset[Node]:
        """The program nodes whose part this edit may change, worked out from the program's
        own users before the pass (what the code writer keeps parts by: see
        :func:`._parts.write_in_parts`). It costs what the edit touches, not what the
        program holds, and it holds every node :meth:`_disturbed` finds after the pass
        (tests check it on every rewrite: :data:`CHECK_FOOTPRINT`):

        - the calls' nodes, what they read and what reads them; the arguments each call is
          given and the values its nodes return, alias or write (readers move to them);
        - the glue a call alone used, which the pass drops (a node whose every reader is
          gone, and what it reads), and what reads it;
        - nodes whose copy takes another name (a name the new graph already gave, or one fx
          will not give), and what reads them;
        - what the model returns and the inputs it writes (read by the new output node);
        - state read another way: from a replacement, or under a name of its own.

        It may hold more than the pass disturbs (glue that stays, an argument read as
        before): such a part is only written again."""
        index = self.index
        by_name = index.by_name
        removed: set[Node] = set()
        given: set[Node] = set()  # the calls' arguments: the new calls read them
        moved_to: set[Node] = set()  # what the calls' nodes alias or write: readers move to it
        for request in self.requests:
            removed.update(request.nodes)
            for argument in request.partition.signature.inputs:
                node = None if _meta.is_constant(argument) else by_name.get(argument.name)
                if node is not None:
                    given.add(node)
            for node in request.nodes:
                moved_to.add(self.mutation_targets.get(node.name))
                moved_to.add(returned_object(node))
        moved_to.discard(None)
        touched: set[Node] = removed | given | moved_to
        # the glue only the calls read, dropped with them (as _remove_dead_code drops it), then
        # what only that glue read; re-checked whenever a reader of it goes
        pending = [value for node in removed for value in node._input_nodes]
        while pending:
            node = pending.pop()
            if node in removed or node in given or not node.users:
                continue
            goes = node.op == "placeholder" or (node.op == "call_function" and _droppable(node))
            if goes and all(user in removed for user in node.users):
                removed.add(node)
                pending.extend(node._input_nodes)
        touched |= removed
        for node in removed:
            touched.update(node._input_nodes)
        # the names the new graph gave before any copy (arguments, the input check): the
        # pass gives new nodes names no program node has, so no copy collides with those
        taken = {node.name for node in self.graph.nodes} | self.used_names
        moved = [by_name[name] for name in taken if name in by_name]
        moved.extend(_renamed_by_fx(self.ep))
        moved = [n for n in moved if n.op != "placeholder" or n.name in index.state_specs]
        touched.update(moved)
        for node in (*removed, *moved):
            touched.update(node.users)
        output = index.nodes[-1]
        touched.update(output._input_nodes)
        touched.update(self.mutation_targets.values())
        # state read from a replacement, or under a name of its own (tied to a swapped module's)
        state = _state_by_target(self.ep)
        for target in self.replacement_attributes:
            touched.update(state.at(target))
        for path in self.swapped_paths:
            if "@" not in path:  # one call's install path holds no state (see _meta.inside)
                touched.update(state.under(path))
        return frozenset(touched)

    def _disturbed(self, placeholders: list[Node], origins: dict[Node, Node]) -> frozenset:
        """The program nodes whose part this edit changed, found from the graph the pass
        made (what :meth:`_footprint` must hold; tests compare the two):

        - the nodes it removed (the calls' nodes, dead code) and the nodes whose copy took
          another name, with their readers (which read another value, or another name);
        - what the removed nodes read, and what its new nodes read: their readers changed,
          so where each is last read, and whether its part returns it, may have changed;
        - the state placeholders read another way (from a replacement, or under a name of
          their own).

        A value's other readers are not disturbed by that: their statements read it by the
        same name, from the same part. A part of copies of none of these reads and returns
        what it did in the program."""
        removed: set[Node] = set(self.dead)
        for request in self.requests:
            removed.update(request.nodes)
        renamed: set[Node] = set(self.renamed)
        changed: set[Node] = removed | renamed
        for old in removed:
            changed.update(old._input_nodes)
        for placeholder in placeholders:
            value = self.env.get(placeholder)
            if not isinstance(value, _Attr) or value.node is None:
                continue
            if value.node.name != placeholder.name:
                renamed.add(placeholder)  # its readers read another name
                changed.add(placeholder)
            elif origins.get(value.node) is not placeholder:
                changed.add(placeholder)  # read another way
        for node in self.graph.nodes:
            if node not in origins:  # a node of this edit's own: what it reads is disturbed
                for value in node._input_nodes:
                    old = origins.get(value)
                    if old is not None:
                        changed.add(old)
        disturbed = set(changed)
        for old in removed | renamed:
            disturbed.update(old.users)
        return frozenset(disturbed)

    def _schedule(self) -> list[Node]:
        """The program's nodes in the order they are copied (see :func:`info.scheduled`)."""
        groups = [list(r.nodes) for r in self.requests if r.region is not None]
        return scheduled(self.index.nodes, groups)

    def _state(self, spec) -> Any:
        ep, target = self.ep, spec.target
        if spec.kind.name == "PARAMETER":
            value = ep.state_dict[target]
            return self._own_copy(value) if target in self.given_state else value
        if spec.kind.name == "BUFFER":
            if spec.persistent is False and target not in self.replacement_attributes:
                self.non_persistent.add(self.attribute_target(target))
                value = ep.constants[target]
            else:
                value = ep.state_dict[target]
            # Buffers are written by forward (BatchNorm statistics): run on our own copy, so
            # running the swapped program never changes the ExportedProgram it came from.
            return value.clone()
        value = ep.constants[target]
        return self._own_copy(value) if target in self.given_state else value

    def _own_copy(self, value: Any) -> Any:
        """The result's own copy of a parameter or constant tensor (one per tensor: tied names
        share it), with the parameter's ``requires_grad``."""
        if not isinstance(value, torch.Tensor):
            return value
        copied = self._own_copies.get(id(value))
        if copied is None:
            copied = value.detach().clone()
            if isinstance(value, torch.nn.Parameter):
                copied = torch.nn.Parameter(copied, requires_grad=value.requires_grad)
            self._own_copies[id(value)] = copied
        return copied

    def _inputs(self, user_leaves: list[Node]) -> None:
        ep = self.ep
        arguments = _user_arguments(ep)
        if arguments is None:
            for node in user_leaves:
                self.env[node] = self.graph.placeholder(node.name)
            return
        if sum(s.num_leaves for _, s in arguments) != len(user_leaves):
            raise SwapError("internal: the program's input structure does not match its inputs")
        offset = 0
        placeholders: list[Node] = []
        for argument, spec in arguments:
            leaves = user_leaves[offset : offset + spec.num_leaves]
            offset += spec.num_leaves
            node = self.graph.placeholder(argument)
            self.used_names.add(node.name)
            placeholders.append(node)
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
            args = (self.constant_node(input_guard(ep), "input_guard"), *placeholders)
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
        target = safe_path(node.target) if node.op == "get_attr" else node.target
        if node.kwargs or node.type is not None:
            kwargs = map_arg(node.kwargs, self.value)
            new = self.graph.create_node(
                node.op, target, args, kwargs, name=node.name, type_expr=node.type
            )
        else:
            new = _node(self.graph, node.op, target, args, node.name)
        _set_meta(new, dict(node.meta))
        self.env[node] = new
        self.copied_from[new] = node
        if new.name != node.name:
            self.renamed.append(node)

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
                partition=request.partition if request.region is not None else None,
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
        region = request.region
        if region is None:  # the module's own stack entry last: the call is drawn where it was
            stack = _outer_stack(request.nodes[0], request.fqn)
            caller_stack = dict(list(stack.items())[:-1])
        else:  # no module of its own: it sits in the call that holds its nodes
            stack = _outer_stack(request.nodes[0], split_call_name(region.call)[0])
            caller_stack = dict(stack)
        call.meta = {
            "nn_module_stack": stack,
            _meta.FUSED if request.fused else _meta.SWAPPED: request.call_name,
        }
        self.attrs[install] = request.module
        request.call_node = call
        request.emitted = True
        out_spec = signature.out_spec
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

    def _node_map(self, alive: set[Node]) -> dict[str, str]:
        """Old node name -> the name of the node holding its value in the new graph (``alive``:
        the nodes of the new graph)."""
        mapping = {}
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
            if old is not None:
                self.dead.append(old)
            self.graph.erase_node(node)
        still = {n.target for n in self.graph.nodes if n.op == "get_attr"}
        for target in removed_attrs - still:
            self.attrs.pop(target, None)


class _StateByTarget:
    """A program's state placeholders by the state's name, sorted, so that the state under
    one module is found by bisection (an edit reads what it swaps, not all the state)."""

    def __init__(self, ep: ExportedProgram):
        index = program_index(ep)
        pairs = sorted(
            (spec.target, index.by_name[name])
            for name, spec in index.state_specs.items()
            if spec.target and name in index.by_name
        )
        self.targets = [target for target, _ in pairs]
        self.nodes = [node for _, node in pairs]

    def at(self, target: str) -> list[Node]:
        start = bisect.bisect_left(self.targets, target)
        end = bisect.bisect_right(self.targets, target)
        return self.nodes[start:end]

    def under(self, path: str) -> list[Node]:
        """The state of module ``path`` and its submodules (``path`` itself, ``path.…``)."""
        found = self.at(path)
        prefix = path + "."
        start = bisect.bisect_left(self.targets, prefix)
        end = bisect.bisect_left(self.targets, path + "/")  # "/" sorts right after "."
        return found + self.nodes[start:end]


def _state_by_target(ep: ExportedProgram) -> _StateByTarget:
    return _derived.cached(ep, "state by target", lambda: _StateByTarget(ep))


def _renamed_by_fx(ep: ExportedProgram) -> tuple[Node, ...]:
    """The program's nodes whose copy fx may name otherwise, whatever the edit: a name fx does
    not give (a builtin's, a keyword, not an identifier), and the names such a copy may take
    instead (``input`` -> ``input_1``, ``a.b`` -> ``a_b``: the program may have a node of that
    name, which is then renamed in its turn). Made once per program."""

    def make() -> tuple[Node, ...]:
        nodes = program_index(ep).nodes
        refused = [n for n in nodes if not kept_by_fx(n.name)]
        if not refused:
            return ()
        candidates: set[str] = set()
        for node in refused:  # as fx's namespace cleans a name up
            candidate = re.sub(r"[^0-9a-zA-Z_]+", "_", node.name) or "_unnamed"
            if candidate[0].isdigit():
                candidate = "_" + candidate
            candidates.add(candidate)
        bases = {_NAME_SUFFIX.match(c).group(1) for c in candidates}
        taken_instead = [
            n for n in nodes if n.name in candidates or _NAME_SUFFIX.match(n.name).group(1) in bases
        ]
        return tuple(dict.fromkeys([*refused, *taken_instead]))

    return _derived.cached(ep, "names fx renames", make)


# a name and its numeric suffix, as fx's namespace splits it (``add_12`` -> ``add``, ``12``)
_NAME_SUFFIX = re.compile(r"^(.*?)(?:_(\d+))?$", re.DOTALL)


def _state_given_to_replacements(index: ProgramIndex, requests: list[_Request]) -> set[str]:
    """The parameters and constant tensors (by target) that a replacement receives as an
    argument, itself or through views of it (``self.m(self.w.t())``). Buffers need nothing:
    the result holds copies of every buffer already."""
    given: set[str] = set()
    kinds = ("PARAMETER", "CONSTANT_TENSOR")
    for request in requests:
        if request.fused:
            continue  # runs the program's own (functional) ops
        for argument in request.partition.signature.inputs:
            if _meta.is_constant(argument):
                continue
            node = index.by_name.get(argument.name)
            seen = 0
            while node is not None and seen < 64:  # a chain of views back to what it shows
                spec = index.state_specs.get(node.name)
                if spec is not None:
                    if spec.kind.name in kinds and spec.target:
                        given.add(spec.target)
                    break
                node, seen = aliased_input(node), seen + 1
    return given


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
