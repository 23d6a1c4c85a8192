"""What running a program takes, shared by verify, compare and the stepper.

* :func:`runnable_original`: the one runnable form of an ExportedProgram, made once per program
  (``gs.swap(ep, {})``: the program's own nodes, unlifted, with copies of its buffers, so
  running it never changes the program);
* :func:`bind_inputs`: a call's ``(args, kwargs)`` as the values of a graph's placeholders;
* :func:`clone_inputs`: inputs of its own for each run (tensors cloned, aliasing kept);
* :class:`PrivateStateInterpreter` and :class:`keep_state`: runs that leave every buffer of a
  program, a model or a replacement as it was (BatchNorm statistics in training mode).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from ._meta import describe_spec
from .errors import GraphSurgeonError
from .partition import program_index
from .swap import rewrite, swap_info

__all__ = [
    "PrivateStateInterpreter",
    "bind_inputs",
    "clone_inputs",
    "keep_state",
    "original_nodes",
    "runnable_original",
    "state_attributes",
]


def runnable_original(ep: ExportedProgram) -> GraphModule:
    """The program as a runnable GraphModule: ``gs.swap(ep, {})``, built once per program.

    It takes the model's own arguments and refuses what the program refuses; parameters are
    shared with ``ep``, buffers are copies (running it never changes ``ep``); every node keeps
    its name from ``ep.graph``. Callers that run it more than once and need the program's own
    state each time run it inside :class:`keep_state`.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon._exec import runnable_original
        >>> ep = gs.export(torch.nn.Sequential(torch.nn.Linear(4, 4)), (torch.randn(2, 4),))
        >>> [n.name for n in runnable_original(ep).graph.nodes if n.op == "call_function"]
        ['check_inputs', 'linear']
        >>> runnable_original(ep) is runnable_original(ep)
        True
    """
    return _original_entry(ep)[0]


def original_nodes(ep: ExportedProgram) -> dict[str, Node]:
    """``ep.graph`` node name -> the node of :func:`runnable_original` computing that value."""
    return _original_entry(ep)[1]


def _original_entry(ep: ExportedProgram) -> tuple[GraphModule, dict[str, Node]]:
    # kept with the program's index: made again exactly when the index is (a new graph)
    derived = program_index(ep).derived
    entry = derived.get("runnable original")
    if entry is None:
        module = rewrite(ep, {}, weak=True)  # what the index keeps must not keep ep alive
        by_name = {n.name: n for n in module.graph.nodes}
        same = {
            old: by_name[new] for old, new in swap_info(module).node_map.items() if new in by_name
        }
        entry = derived["runnable original"] = (module, same)
    return entry


def _placeholder_signature(gm: GraphModule) -> inspect.Signature:
    # What fx's code generation gives ``forward``: one parameter per placeholder, its default
    # in ``node.args``. Read from the graph, so a replaced ``forward`` cannot mislead it.
    parameters = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        name = str(node.target)
        if name.startswith("**"):
            kind, name = inspect.Parameter.VAR_KEYWORD, name[2:]
        elif name.startswith("*"):
            kind, name = inspect.Parameter.VAR_POSITIONAL, name[1:]
        elif any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
            kind = inspect.Parameter.KEYWORD_ONLY
        else:
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        default = node.args[0] if node.args else inspect.Parameter.empty
        if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            default = inspect.Parameter.empty
        parameters.append(inspect.Parameter(name, kind, default=default))
    return inspect.Signature(parameters)


def bind_inputs(
    gm: GraphModule,
    args: tuple,
    kwargs: Mapping[str, Any],
    error: type[GraphSurgeonError] = GraphSurgeonError,
) -> list[Any]:
    """The values of ``gm``'s placeholders, in order, for a call ``gm(*args, **kwargs)``.

    Keyword arguments are matched to placeholders by name and defaults filled in; a
    GraphModule whose code flattens pytree inputs (``ep.module()``) gets them flattened.
    """
    info = getattr(gm.graph._codegen, "pytree_info", None)
    flattening = info is not None and info.in_spec is not None
    try:
        signature = inspect.signature(gm.forward) if flattening else _placeholder_signature(gm)
    except (TypeError, ValueError) as problem:
        raise error(f"cannot read the parameters of this {type(gm).__name__}: {problem}") from None
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as problem:
        raise error(
            f"the program takes {signature} but was given {len(args)} positional argument(s) "
            f"and keyword(s) {sorted(kwargs)}: {problem}"
        ) from None
    bound.apply_defaults()
    if flattening:
        # The placeholders are the leaves of the call as the model saw it, (args, kwargs),
        # rebuilt here from the bound parameters.
        spec = info.in_spec
        values = [bound.arguments[name] for name in signature.parameters]
        structured: Any = tuple(values)
        children = spec.children() if spec.type is tuple else []
        if len(children) == 2 and children[1].type is dict:
            positional = children[0].num_children
            keys = list(children[1].context)
            if all(k in bound.arguments for k in keys):
                structured = (tuple(values[:positional]), {k: bound.arguments[k] for k in keys})
        leaves, actual = pytree.tree_flatten(structured)
        if actual != spec:
            raise error(
                f"the inputs have the structure {describe_spec(actual)}, but the program takes "
                f"{describe_spec(spec)}"
            )
        return leaves
    values: list[Any] = []
    for parameter in signature.parameters.values():
        value = bound.arguments[parameter.name]
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            values.extend(value)  # a ``*args`` placeholder takes every remaining value
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            if value:
                raise error(
                    f"this program's **{parameter.name} parameter cannot be stepped with keyword "
                    f"arguments ({sorted(value)})"
                )
        else:
            values.append(value)
    return values


def clone_inputs(value: Any) -> Any:
    """A copy of ``value`` with every tensor cloned: each run gets inputs of its own. A tensor
    that appears twice is cloned once, so ``(h, h, h)`` stays one tensor three times.

    Example:
        >>> import torch
        >>> h = torch.ones(2)
        >>> a, b = clone_inputs((h, h))
        >>> a is b and a is not h
        True
    """
    clones: dict[int, torch.Tensor] = {}

    def clone(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        copy = clones.get(id(leaf))
        if copy is None:
            copy = clones[id(leaf)] = leaf.clone()
        return copy

    return pytree.tree_map(clone, value)


def state_attributes(gm: GraphModule) -> frozenset[str]:
    """The ``get_attr`` targets of ``gm`` that are state a run may write: every tensor that is
    not a Parameter (buffers such as BatchNorm statistics, which ``aten.batch_norm`` updates
    in place without saying so in its schema, and the targets of ``copy_`` write-backs)."""
    state = set()
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value: Any = gm
        for part in str(node.target).split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            state.add(str(node.target))
    return frozenset(state)


class PrivateStateInterpreter(torch.fx.Interpreter):
    """An Interpreter that runs on private copies of the program's state (its buffers).

    Running the program then leaves its buffers as they were, and every run after
    :meth:`renew_state` starts from the same state. That holds for the buffers the graph reads
    (``get_attr``) and for those of the modules it calls (replacements, fused calls), which run
    with their buffers swapped for the same private copies (``torch.func.functional_call``): a
    tensor shared by both has one private copy. Other attributes are read as usual.
    """

    def __init__(self, gm: GraphModule, garbage_collect_values: bool = True):
        super().__init__(gm, garbage_collect_values=garbage_collect_values)
        self.written = state_attributes(gm)
        self.called = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_module"})
        self.private: dict[str, Any] = {}
        self.private_buffers: dict[str, dict[str, torch.Tensor]] = {}
        self.renew_state()

    def renew_state(self) -> None:
        copies: dict[int, torch.Tensor] = {}

        def private(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            if id(value) not in copies:
                copies[id(value)] = value.detach().clone()
            return copies[id(value)]

        self.private = {target: private(self.fetch_attr(target)) for target in sorted(self.written)}
        self.private_buffers = {}
        for target in self.called:
            module = self.fetch_attr(target)
            buffers = {name: private(b) for name, b in module.named_buffers()}
            if buffers:
                self.private_buffers[target] = buffers

    def get_attr(self, target, args, kwargs) -> Any:
        if target in self.private:
            return self.private[target]
        return super().get_attr(target, args, kwargs)

    def call_module(self, target, args, kwargs) -> Any:
        buffers = self.private_buffers.get(target)
        if buffers is None:
            return super().call_module(target, args, kwargs)
        module = self.fetch_attr(target)
        return torch.func.functional_call(module, buffers, tuple(args), dict(kwargs), strict=False)


class keep_state:
    """Puts back the buffers of the given modules on exit: a module in training mode updates
    its statistics when it runs, and verify() or compare() is only a question.

    Every buffer reachable from the modules is saved (each tensor once) and copied back, also
    when the run fails. Parameters are not saved: a forward does not write them.
    """

    def __init__(self, modules: Iterable[Any]):
        self.modules = [
            m for m in {id(m): m for m in modules}.values() if isinstance(m, torch.nn.Module)
        ]
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> keep_state:
        seen: set[int] = set()
        for module in self.modules:
            for buffer in module.buffers():
                if id(buffer) not in seen:
                    seen.add(id(buffer))
                    self.saved.append((buffer, buffer.detach().clone()))
        return self

    def __exit__(self, *exc) -> None:
        with torch.no_grad():
            for buffer, saved in self.saved:
                if buffer.shape == saved.shape:
                    buffer.copy_(saved)
                else:  # a module that resized its buffer in place (a cache): give it back whole
                    buffer.data = saved
