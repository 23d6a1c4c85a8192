"""What running a program takes, shared by verify, compare, the overlays and the stepper.

* :func:`runnable_original`: the one runnable form of an ExportedProgram, made once per program
  (``gs.swap(ep, {})``: the program's own nodes, unlifted, with copies of its buffers, so
  running it never changes the program);
* :func:`bind_inputs`: a call's ``(args, kwargs)`` as the values of a graph's placeholders;
* :func:`clone_inputs`: inputs of its own for each run (tensors cloned, aliasing kept);
* :class:`PrivateStateInterpreter` and :class:`keep_state`: runs that leave every buffer of a
  program, a model or a replacement as it was (BatchNorm statistics in training mode, a buffer
  a forward reassigns);
* :class:`NodeRunner`: the one node-by-node runner (the stepper and the overlays run programs
  through it), and :func:`value_lifetimes`, when each value of a graph is last read;
* :class:`RandomState`: torch's random state, to start two runs from the same one.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from .. import _derived, _meta
from .._meta import describe_spec
from ..errors import GraphSurgeonError
from ..partition import program_index
from ..rewrite import rewrite, swap_info

__all__ = [
    "NodeRunner",
    "PrivateStateInterpreter",
    "RandomState",
    "bind_inputs",
    "clone_inputs",
    "keep_state",
    "map_tensors",
    "original_nodes",
    "runnable_original",
    "state_attributes",
    "value_lifetimes",
]


def runnable_original(ep: ExportedProgram) -> GraphModule:
    """The program as a runnable GraphModule: ``gs.swap(ep, {})``, built once per program.

    It takes the model's own arguments and refuses what the program refuses; parameters are
    shared with ``ep``, buffers are copies (running it never changes ``ep``); every node keeps
    its name from ``ep.graph``. Callers that run it more than once and need the program's own
    state each time run it inside :class:`keep_state`.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.checks._exec import runnable_original
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
    program_index(ep)  # refuses what is not a program, as every entry point does

    def make() -> tuple[GraphModule, dict[str, Node]]:
        module = rewrite(ep, {}, weak=True)  # what the record keeps must not keep ep alive
        by_name = {n.name: n for n in module.graph.nodes}
        same = {
            old: by_name[new] for old, new in swap_info(module).node_map.items() if new in by_name
        }
        return module, same

    return _derived.cached(ep, "runnable original", make)


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
    in place without saying so in its schema, and the targets of ``copy_`` write-backs), and
    the parameters a swapped program hands to a replacement (:func:`_given_paths`)."""
    state = set(_given_paths(gm))
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
    ``shared``: attribute -> a tensor read and written in place of its private copy (another
    run's copy of that state, when this graph runs one of that run's module calls).
    """

    def __init__(
        self,
        gm: GraphModule,
        garbage_collect_values: bool = True,
        shared: Mapping[str, torch.Tensor] | None = None,
    ):
        super().__init__(gm, garbage_collect_values=garbage_collect_values)
        self.written = state_attributes(gm)
        self.called = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_module"})
        # state read and written as it is, not copied: another run's private copies, when this
        # graph runs a call of that run (a fused call, a replacement's export)
        self.shared = dict(shared or {})
        self.private: dict[str, Any] = {}
        self.private_buffers: dict[str, dict[str, torch.Tensor]] = {}
        self.renew_state()

    def renew_state(self) -> None:
        copies: dict[int, torch.Tensor] = {}
        for target in self.written & self.shared.keys():  # another run's copy: used as it is
            copies[id(self.fetch_attr(target))] = self.shared[target]

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


class NodeRunner:
    """One run of a GraphModule, node by node: the one node-by-node runner of the package (the
    stepper and the overlays run programs through it).

    :meth:`run` runs a node with ``torch.fx.Interpreter.run_node`` (the true aten ops, a
    ``call_module`` node calling its module), on its arguments fetched from :attr:`env` (node ->
    value), and keeps its value there; placeholders take ``inputs`` in order (see
    :func:`bind_inputs`). A graph that writes state (BatchNorm statistics, its own buffers or
    its modules') runs on private copies of it (:class:`PrivateStateInterpreter`): the program
    and its modules stay as they were, and :meth:`start` begins again from the same state.

    The module calls: :meth:`call` is the module a ``call_module`` node calls with its
    arguments from :attr:`env`; :meth:`inner` a runner of a graph for that call (a fused call's
    own GraphModule, a replacement's export) that reads and writes this run's copies of the
    module's state, so that what the call writes stays in this run.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> x = torch.randn(1, 2)
        >>> gm = runnable_original(gs.export(model, (x,)))
        >>> runner = NodeRunner(gm, bind_inputs(gm, (x,), {}))
        >>> for node in runner.nodes:
        ...     value = runner.run(node)
        >>> [node.name for node in runner.env][-3:]
        ['linear', 'relu', 'output']
        >>> torch.equal(gm.graph.process_outputs(value), model(x))  # what gm(x) returns
        True
    """

    def __init__(
        self,
        gm: GraphModule,
        inputs: Iterable[Any] = (),
        shared: Mapping[str, torch.Tensor] | None = None,
    ):
        private = PrivateStateInterpreter(gm, garbage_collect_values=False, shared=shared)
        # a graph without state to write runs on the plain Interpreter: the same values, and
        # no lookup of private copies per attribute read or module call
        stateful = private.private or private.private_buffers
        self.interpreter: torch.fx.Interpreter = (
            private if stateful else torch.fx.Interpreter(gm, garbage_collect_values=False)
        )
        self.gm = gm
        self.nodes: list[Node] = list(gm.graph.nodes)
        # bound once: the loops that run thousands of nodes call it directly
        self.run_node = self.interpreter.run_node
        self.env: dict[Node, Any] = {}
        self.failed_at: Node | None = None
        self.start(inputs, renew=False)

    def start(self, inputs: Iterable[Any], *, renew: bool = True) -> None:
        """Begin a run again: a new :attr:`env`, these inputs, and (``renew``) fresh private
        copies of the state."""
        self.env = {}
        self.interpreter.env = self.env
        self.interpreter.args_iter = iter(inputs)
        self.failed_at = None
        if renew and isinstance(self.interpreter, PrivateStateInterpreter):
            self.interpreter.renew_state()

    def run(self, node: Node) -> Any:
        """Run ``node`` on its arguments from :attr:`env`; its value is kept there and returned."""
        value = self.env[node] = self.run_node(node)
        return value

    def run_span(
        self,
        start: int,
        limit: int,
        dead: list[tuple[Node, ...]] | None = None,
        drop: Callable[[Node], None] | None = None,
    ) -> None:
        """Run the nodes at positions ``start`` to ``limit`` (excluded), in order. With
        ``dead``, the values of ``dead[i]`` leave :attr:`env` once the node at ``i`` has run
        (values no later node reads, :func:`value_lifetimes`, or any other schedule): each is
        handed to ``drop``, or, without it, deleted. On an error, :attr:`failed_at` is the node
        that was running (its value kept if it ran) and the error goes on as it is."""
        # The hot loop: what Interpreter.run does per node, minus its bookkeeping.
        env, run_node, nodes = self.env, self.run_node, self.nodes
        node = None
        try:
            if dead is None:
                for node in nodes[start:limit]:
                    env[node] = run_node(node)
            elif drop is None:
                pop = env.pop
                for i in range(start, limit):
                    node = nodes[i]
                    env[node] = run_node(node)
                    for value in dead[i]:
                        pop(value, None)  # gone already if an interrupt cut a pass short
            else:
                for i in range(start, limit):
                    node = nodes[i]
                    env[node] = run_node(node)
                    for value in dead[i]:
                        drop(value)
        except BaseException:
            self.failed_at = node
            raise

    def call(self, node: Node) -> tuple[torch.nn.Module, tuple, dict]:
        """The module ``call_module`` node ``node`` calls, and its arguments from :attr:`env`."""
        args, kwargs = self.interpreter.fetch_args_kwargs_from_env(node)
        return self.interpreter.fetch_attr(node.target), tuple(args), dict(kwargs)

    def state_of(self, node: Node) -> dict[str, torch.Tensor]:
        """This run's private copies of the buffers of the module ``node`` calls, by name
        (empty when it runs on the module's own: it writes none)."""
        private = getattr(self.interpreter, "private_buffers", {})
        return private.get(str(node.target), {})

    def inner(self, node: Node, graph: GraphModule, inputs: Iterable[Any]) -> NodeRunner:
        """A runner of ``graph``, a graph of the module ``node`` calls (its own GraphModule, or
        its export), on ``inputs``, reading and writing this run's copies of that module's
        buffers (:meth:`state_of`)."""
        return NodeRunner(graph, inputs, shared=self.state_of(node))


def value_lifetimes(nodes: list[Node]) -> tuple[list[int], list[tuple[Node, ...]]]:
    """When each value of a graph (``nodes``: its nodes in order) is last read: for each node
    the position of the last node reading it (its own when none does), and for each position
    the values no later node reads, to drop once the node there has run. The output and the
    parameters and buffers (``get_attr``) are never dropped: the module holds those anyway, so
    dropping them would free nothing."""
    position = {node: i for i, node in enumerate(nodes)}
    last = list(range(len(nodes)))
    for i, node in enumerate(nodes):
        for arg in node.all_input_nodes:
            j = position[arg]
            last[j] = max(last[j], i)
    dead: list[tuple[Node, ...]] = [() for _ in nodes]
    pending: dict[int, list[Node]] = {}
    for j, i in enumerate(last):
        if nodes[j].op not in ("output", "get_attr"):
            pending.setdefault(i, []).append(nodes[j])
    for i, values in pending.items():
        dead[i] = tuple(values)
    return last, dead


class keep_state:
    """Puts the state of the given modules back on exit: a module in training mode updates its
    statistics when it runs, a forward may write a cache or reassign a buffer
    (``self.ema = self.ema * 0.5 + x.mean(0)``), and verify() or compare() is only a question.

    On exit, every module reachable from the given ones holds again the very buffer objects it
    held, under the same names (a buffer reassigned, deleted or added is put back or removed),
    and so do its plain tensor attributes; each of those tensors (each once) has its values
    back, also when the run failed. Parameters are not saved (a forward does not write them),
    but for those a swapped program hands a replacement as an argument, which it may write.

    A run's output may be that state (a cache the forward writes and returns): pass it through
    :meth:`unshared` before the block ends, so it keeps the values it had when it was returned.

    Example:
        >>> import torch
        >>> class Ema(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.register_buffer("ema", torch.zeros(2))
        ...     def forward(self, x):
        ...         self.ema = self.ema * 0.5 + x
        ...         return self.ema
        >>> model = Ema()
        >>> before = model.ema
        >>> with keep_state([model]) as state:
        ...     out = state.unshared(model(torch.ones(2)))
        >>> model.ema is before, model.ema.tolist(), out.tolist()
        (True, [0.0, 0.0], [1.0, 1.0])
    """

    def __init__(self, modules: Iterable[Any]):
        self.modules = [
            m for m in {id(m): m for m in modules}.values() if isinstance(m, torch.nn.Module)
        ]
        # (tensor object, a copy of its values), each tensor once
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        # the saved tensors that held an autograd history on entry (theirs to keep)
        self.had_history: set[int] = set()
        # (module, its buffers by name, its non-persistent names, its plain tensor attributes)
        self.held: list[tuple[torch.nn.Module, dict, set, dict]] = []

    def __enter__(self) -> keep_state:
        tensors: set[int] = set()
        modules: set[int] = set()
        for top in self.modules:
            for module in top.modules():
                if id(module) in modules:
                    continue
                modules.add(id(module))
                buffers = dict(module._buffers)
                attributes = {
                    name: value
                    for name, value in vars(module).items()
                    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)
                }
                self.held.append(
                    (module, buffers, set(module._non_persistent_buffers_set), attributes)
                )
                for tensor in [*buffers.values(), *attributes.values(), *_given(module)]:
                    if tensor is not None and id(tensor) not in tensors:
                        tensors.add(id(tensor))
                        self.saved.append((tensor, tensor.detach().clone()))
                        if tensor.grad_fn is not None:
                            self.had_history.add(id(tensor))
        return self

    def unshared(self, value: Any) -> Any:
        """``value`` with every tensor that is, or shares memory with, the saved state replaced
        by a copy of its current values (the rest is returned as it is: no copy)."""
        saved = {id(tensor) for tensor, _ in self.saved}
        storages = {_storage_of(tensor) for tensor, _ in self.saved} - {None}
        if not saved:
            return value

        def own(tensor: torch.Tensor) -> torch.Tensor:
            if id(tensor) in saved or _storage_of(tensor) in storages:
                return tensor.detach().clone()
            return tensor

        return map_tensors(value, own)

    def __exit__(self, *exc) -> None:
        with torch.no_grad():
            for tensor, saved in self.saved:
                if tensor.device.type == "meta":
                    continue  # no values to put back
                if (tensor.shape, tensor.dtype, tensor.device) != (
                    saved.shape,
                    saved.dtype,
                    saved.device,
                ):
                    # a module that resized its buffer in place (a cache): give it back whole
                    tensor.data = saved
                elif not _equal(tensor, saved):  # unchanged: leave its version alone
                    tensor.copy_(saved)
                if tensor.grad_fn is not None and id(tensor) not in self.had_history:
                    # a run with autograd on (a backward check) wrote it from values that need
                    # a gradient: its history goes with the values, or the module's next
                    # backward would run into this run's graph, freed by then
                    _forget_history(tensor)
        for module, buffers, non_persistent, attributes in self.held:
            now = module._buffers
            if list(now) != list(buffers) or any(now[k] is not v for k, v in buffers.items()):
                now.clear()
                now.update(buffers)
            if module._non_persistent_buffers_set != non_persistent:
                module._non_persistent_buffers_set.clear()
                module._non_persistent_buffers_set.update(non_persistent)
            state = vars(module)
            for name in [n for n, v in state.items() if isinstance(v, torch.Tensor)]:
                if name not in attributes and not isinstance(state[name], torch.nn.Parameter):
                    del state[name]  # a tensor attribute the run added (or put over a buffer)
            state.update(attributes)


def _forget_history(tensor: torch.Tensor) -> None:
    """Make ``tensor`` a leaf again, its values kept (a view cannot be detached in place: it is
    given back its values as a tensor of its own)."""
    try:
        tensor.detach_()
    except RuntimeError:
        tensor.data = tensor.detach().clone()


def _given_paths(module: Any) -> tuple[str, ...]:
    """Where a swapped program holds the parameters it hands to a replacement as arguments
    (its own copies, which the replacement may write in place): state, like buffers. Other
    parameters a forward does not write, and a copy of every weight would double a check's
    memory."""
    meta = getattr(module, "meta", None)
    info = meta.get(_meta.INFO) if isinstance(meta, dict) else None
    return tuple(getattr(info, "given_state", ()))


def _given(module: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors at :func:`_given_paths` of ``module``."""
    held = []
    for path in _given_paths(module):
        value: Any = module
        for part in path.split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor):
            held.append(value)
    return held


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return bool(torch.equal(a, b))
    except (RuntimeError, NotImplementedError):  # a layout torch.equal does not take
        return False


def _storage_of(tensor: torch.Tensor) -> int | None:
    """Where a tensor's memory starts (its storage's address), or None when it has none to
    share (meta tensors, sparse layouts, tensors without storage)."""
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    return pointer or None


def map_tensors(value: Any, fn: Any) -> Any:
    """``value`` with ``fn`` applied to every tensor in it: through pytree containers and the
    fields of dataclass instances pytree does not know. What ``fn`` leaves as it is stays the
    same object."""

    def leaf(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            return fn(item)
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            changed = {}
            for f in dataclasses.fields(item):
                old = getattr(item, f.name, None)
                new = map_tensors(old, fn)
                if new is not old:
                    changed[f.name] = new
            if not changed:
                return item
            copied = copy.copy(item)
            for name, new in changed.items():
                object.__setattr__(copied, name, new)  # frozen dataclasses too
            return copied
        return item

    return pytree.tree_map(leaf, value)


class RandomState:
    """torch's global random state (the CPU generator, and each device generator of an
    accelerator in use), captured when made and put back by :meth:`restore`: two runs started
    from one state draw the same random numbers (dropout masks), and the caller's own random
    stream is left as it was.

    Example:
        >>> import torch
        >>> start = RandomState()
        >>> first = torch.rand(2)
        >>> start.restore()
        >>> torch.equal(torch.rand(2), first)
        True
    """

    def __init__(self) -> None:
        self.cpu = torch.random.get_rng_state()
        self.device_module: Any = None
        self.devices: list[torch.Tensor] = []
        try:
            accelerator = torch.accelerator.current_accelerator()
        except (AttributeError, RuntimeError):  # a torch without torch.accelerator
            accelerator = None
        if accelerator is None:
            return
        module = torch.get_device_module(accelerator.type)
        initialized = getattr(module, "is_initialized", None)
        if initialized is not None and not initialized():
            return  # never used: its generators have drawn nothing to put back
        self.device_module = module
        self.devices = [module.get_rng_state(i) for i in range(module.device_count())]

    def restore(self) -> None:
        torch.random.set_rng_state(self.cpu)
        for index, state in enumerate(self.devices):
            self.device_module.set_rng_state(state, index)
