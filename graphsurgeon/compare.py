"""compare(): where does a swapped program start to compute something else?

:func:`graphsurgeon.verify` says *whether* a swapped program still matches; :func:`compare`
says *where* it stops matching. It runs the swapped program once and captures what every
swapped call really receives and returns. Then, for each call, it runs the original partition
(the module's own nodes, cut out of the original program as a small GraphModule: the fused
sub-graph that ``torch.export._swap`` builds and throws away) on those very inputs and
compares its outputs with the replacement's, leaf by leaf.

Because every call is fed the inputs it saw in the swapped run, an error is charged to the call
that makes it, not to the calls downstream that merely inherit it: the first call in graph order
whose outputs differ beyond tolerance is ``first_divergence``. Each row also says how far the
call's inputs had already drifted from the original program (``input_drift``), and the report
ends with the drift at the program's outputs.
"""

from __future__ import annotations

import inspect
import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from ._runtime import describe_spec
from .errors import CompareError, GraphSurgeonError, UnknownModuleError, did_you_mean
from .partition import partition, program_index
from .swap import swap, swap_info
from .verify import LeafCheck, VerifyReport, compare_leaf, compare_outputs

__all__ = [
    "CallComparison",
    "CompareError",
    "Comparison",
    "compare",
    "partition_module",
    "unlifted",
]


# -- the original program, unlifted, and its partitions as small GraphModules ---------------

# Keyed by the program, so nothing here keeps a program alive; each entry remembers the graph
# it was made from, so a program whose graph was replaced gets fresh ones.
_UNLIFTED: weakref.WeakKeyDictionary[ExportedProgram, tuple[Any, GraphModule, dict[str, Node]]] = (
    weakref.WeakKeyDictionary()
)
_CUTS: weakref.WeakKeyDictionary[ExportedProgram, tuple[Any, dict[str, GraphModule]]] = (
    weakref.WeakKeyDictionary()
)


def unlifted(ep: ExportedProgram) -> GraphModule:
    """The original program as a runnable GraphModule: ``gs.swap(ep, {})``, built once per program.

    It takes the model's own arguments; parameters and buffers are ``get_attr`` nodes named
    like ``ep``'s placeholders, and every other node keeps its name from ``ep.graph``.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.compare import unlifted
        >>> ep = gs.export(torch.nn.Sequential(torch.nn.Linear(4, 4)), (torch.randn(2, 4),))
        >>> [(n.op, n.name) for n in unlifted(ep).graph.nodes if n.op != "placeholder"]
        [('get_attr', 'p_0_weight'), ('get_attr', 'p_0_bias'), ('call_function', 'linear'), ('output', 'output')]
        >>> unlifted(ep) is unlifted(ep)
        True
    """
    return _unlifted_entry(ep)[1]


def _unlifted_entry(ep: ExportedProgram) -> tuple[Any, GraphModule, dict[str, Node]]:
    if not isinstance(ep, ExportedProgram):
        raise CompareError(
            f"expected a torch.export.ExportedProgram, got {type(ep).__name__}; "
            "make one with gs.export(model, args)"
        )
    cached = _UNLIFTED.get(ep)
    if cached is None or cached[0] is not ep.graph:
        module = swap(ep, {})
        cached = (ep.graph, module, _same_nodes(ep, module))
        _UNLIFTED[ep] = cached
    return cached


def _same_nodes(ep: ExportedProgram, module: GraphModule) -> dict[str, Node]:
    """``ep.graph`` node name -> the node of ``module`` that computes the same value."""
    by_name = {n.name: n for n in module.graph.nodes}
    node_map = swap_info(module).node_map
    return {old: by_name[new] for old, new in node_map.items() if new in by_name}


def partition_module(ep: ExportedProgram, call_name: str) -> GraphModule:
    """The nodes of one module call of ``ep``, cut out as a GraphModule of their own.

    Its placeholders are the call signature's inputs in signature order (constants excluded),
    its output is the tuple of the signature's graph outputs, and parameters are ``get_attr``
    nodes sharing the original program's tensors. Built once per program and call.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.compare import partition_module
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> ep = gs.export(model, (torch.randn(2, 4),))
        >>> part = partition_module(ep, "1")
        >>> [n.op for n in part.graph.nodes]
        ['placeholder', 'call_function', 'output']
        >>> part(torch.tensor([[-1.0, 2.0]]))
        (tensor([[0., 2.]]),)
    """
    _, original, same = _unlifted_entry(ep)
    cached = _CUTS.get(ep)
    if cached is None or cached[0] is not ep.graph:
        cached = (ep.graph, {})
        _CUTS[ep] = cached
    cuts = cached[1]
    module = cuts.get(call_name)
    if module is None:
        module = _cut(ep, original, same, call_name)
        cuts[call_name] = module
    return module


def _cut(
    ep: ExportedProgram, original: GraphModule, same: dict[str, Node], call_name: str
) -> GraphModule:
    parts = partition(ep)
    part = parts.get(call_name)
    if part is None:
        raise UnknownModuleError(
            f"the program has no module call {call_name!r}.{did_you_mean(call_name, parts)} "
            "gs.partition(ep) lists every call."
        )
    if part.signature is None:
        raise CompareError(
            f"the call signature of {call_name!r} was not preserved, so its inputs and outputs "
            "are unknown; export with gs.export(model, args) to preserve it"
        )
    members = {same[name] for name in part.nodes if name in same}
    graph = torch.fx.Graph()
    env: dict[Node, Node] = {}
    for argument in part.signature.inputs:
        if _is_constant(argument):
            continue
        placeholder = graph.placeholder(argument.name or "unused")
        source = same.get(argument.name)
        # The same value passed twice fills two placeholders; the graph uses the first.
        if source is not None and source not in env:
            env[source] = placeholder

    def lookup(node: Node) -> Node:
        found = env.get(node)
        if found is not None:
            return found
        if node.op == "get_attr":
            env[node] = graph.node_copy(node)
            return env[node]
        raise CompareError(
            f"internal: the nodes of {call_name!r} use {node.name!r}, which is neither one of "
            "its inputs nor one of its own nodes"
        )

    for node in original.graph.nodes:
        if node in members and node.op not in ("placeholder", "output"):
            env[node] = graph.node_copy(node, lookup)
    outputs: list[Node | None] = []
    for argument in part.signature.outputs:
        if _is_constant(argument):
            continue
        node = same.get(argument.name)
        if node is None:
            outputs.append(None)  # an output nothing used: export removed its node
            continue
        if node not in env:
            raise CompareError(
                f"internal: output {argument.name!r} of {call_name!r} is not computed by its nodes"
            )
        outputs.append(env[node])
    graph.output(tuple(outputs))
    return GraphModule(original, graph, class_name=f"Original_{_identifier(call_name)}")


def _identifier(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _is_constant(argument: Any) -> bool:
    return type(argument).__name__ == "ConstantArgument" or not getattr(argument, "name", "")


# -- running a program and binding its inputs ----------------------------------------------


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
    error: type[GraphSurgeonError] = CompareError,
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
    """A copy of ``value`` with every tensor cloned: each run gets inputs of its own."""
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value)


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
    :meth:`renew_state` starts from the same state. Other attributes are read as usual.
    """

    def __init__(self, gm: GraphModule, garbage_collect_values: bool = True):
        super().__init__(gm, garbage_collect_values=garbage_collect_values)
        self.written = state_attributes(gm)
        self.private: dict[str, Any] = {}
        self.renew_state()

    def renew_state(self) -> None:
        self.private = {
            target: _copy_value(self.fetch_attr(target)) for target in sorted(self.written)
        }

    def get_attr(self, target, args, kwargs) -> Any:
        if target in self.private:
            return self.private[target]
        return super().get_attr(target, args, kwargs)


def _copy_value(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


class _Recorder(PrivateStateInterpreter):
    """Runs a GraphModule node by node, keeping copies of the values it is asked to watch.

    ``calls``: call_module node names whose (args, kwargs) and output are captured.
    ``values``: node names whose values are captured. Nothing is registered on any module.
    """

    def __init__(self, gm: GraphModule, calls=(), values=()):
        super().__init__(gm)
        self.watch_calls = set(calls)
        self.watch_values = set(values)
        self.call_inputs: dict[str, tuple[tuple, dict]] = {}
        self.call_outputs: dict[str, Any] = {}
        self.values: dict[str, Any] = {}
        self.failed_at: Node | None = None

    def run_node(self, n: Node) -> Any:
        self.failed_at = n
        if n.name in self.watch_calls:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            # copies: the replacement, or a later node, may write its inputs in place
            self.call_inputs[n.name] = clone_inputs((tuple(args), dict(kwargs)))
            result = getattr(self, n.op)(n.target, args, kwargs)
            self.call_outputs[n.name] = clone_inputs(result)
        else:
            result = super().run_node(n)
        if n.name in self.watch_values:
            self.values[n.name] = clone_inputs(result)
        self.failed_at = None
        return result


class _KeepState:
    """Puts back the buffers of the given modules on exit: a replacement in training mode
    updates its statistics when it runs, and compare() is only a question."""

    def __init__(self, modules):
        self.modules = list({id(m): m for m in modules}.values())
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> _KeepState:
        for module in self.modules:
            for buffer in module.buffers():
                self.saved.append((buffer, buffer.detach().clone()))
        return self

    def __exit__(self, *exc) -> None:
        with torch.no_grad():
            for buffer, saved in self.saved:
                buffer.copy_(saved)


def _run(recorder: _Recorder, which: str, values: list[Any]) -> Any:
    try:
        with torch.no_grad():
            result = recorder.run(*values, enable_io_processing=False)
        return recorder.graph.process_outputs(result)
    except Exception as error:
        node = recorder.failed_at
        where = f" at node {node.name!r}" if node is not None else ""
        # torch appends its own "While executing ..." trailer; the first paragraph is the cause
        cause = str(error).split("\n\n", 1)[0]
        raise CompareError(
            f"running the {which} failed{where}: {type(error).__name__}: {cause}. "
            "gs.Stepper(program, *args) stops at the failing node for a closer look."
        ) from error


# -- the report ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CallComparison:
    """One swapped call: the original partition vs the replacement, on the same inputs.

    Attributes:
        call_name: ``"layers.1.attn"``, or ``"shared@1"`` for the second call of ``shared``.
        replacement: the replacement's class name; ``original`` the original module's.
        leaves: one :class:`~graphsurgeon.LeafCheck` per output leaf (path as in the output).
        input_drift: the largest absolute difference between the inputs this call received
            in the swapped program and in the original program (0.0 when upstream matches
            exactly; NaN when shapes differ).
        ok: whether every output leaf matches within tolerance.
    """

    call_name: str
    replacement: str
    original: str
    leaves: tuple[LeafCheck, ...]
    input_drift: float
    ok: bool

    @property
    def max_abs(self) -> float:
        return max((leaf.max_abs for leaf in self.leaves), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((leaf.max_rel for leaf in self.leaves), default=0.0)

    @property
    def problem(self) -> str:
        """What differs, for the first mismatching leaf ('' when the call matches)."""
        for leaf in self.leaves:
            if not leaf.ok:
                where = leaf.path or "(output)"
                return f"{where}: {leaf.problem}" if leaf.problem else where
        return ""


@dataclass(frozen=True, repr=False)
class Comparison:
    """What :func:`compare` found, call by call in graph order, and at the program's outputs.

    ``first_divergence`` is the first call whose outputs differ beyond tolerance (or None);
    ``outputs`` is a :class:`~graphsurgeon.VerifyReport` of the original program's outputs vs
    the swapped program's. Truthy when no call diverges and the outputs match.
    ``print(cmp)`` shows a report, ``cmp.table()`` only the table, ``cmp.rows`` a list of dicts
    (``pandas.DataFrame(cmp.rows)``), ``cmp["layers.1.attn"]`` one call.
    """

    calls: tuple[CallComparison, ...]
    outputs: VerifyReport
    rtol: float
    atol: float
    _by_name: Mapping[str, CallComparison] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {c.call_name: c for c in self.calls})

    @property
    def first_divergence(self) -> str | None:
        return next((c.call_name for c in self.calls if not c.ok), None)

    @property
    def divergent(self) -> tuple[str, ...]:
        """Every call whose outputs differ beyond tolerance, in graph order."""
        return tuple(c.call_name for c in self.calls if not c.ok)

    @property
    def ok(self) -> bool:
        return not self.divergent and self.outputs.ok

    def __bool__(self) -> bool:
        return self.ok

    def __getitem__(self, call_name: str) -> CallComparison:
        try:
            return self._by_name[call_name]
        except KeyError:
            raise UnknownModuleError(
                f"no swapped call {call_name!r} was compared.{did_you_mean(call_name, self._by_name)}"
                f" Compared: {', '.join(self._by_name) or 'none'}."
            ) from None

    def __len__(self) -> int:
        return len(self.calls)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One dict per call, then one for the program outputs (``call`` is ``"(outputs)"``)."""
        rows = [
            {
                "call": c.call_name,
                "replacement": c.replacement,
                "original": c.original,
                "leaves": len(c.leaves),
                "max_abs": c.max_abs,
                "max_rel": c.max_rel,
                "input_drift": c.input_drift,
                "ok": c.ok,
            }
            for c in self.calls
        ]
        rows.append(
            {
                "call": "(outputs)",
                "replacement": "",
                "original": "",
                "leaves": len(self.outputs.leaves),
                "max_abs": self.outputs.max_abs,
                "max_rel": max((leaf.max_rel for leaf in self.outputs.leaves), default=0.0),
                "input_drift": math.nan,
                "ok": self.outputs.ok,
            }
        )
        return rows

    def table(self) -> str:
        """The rows as an aligned text table."""
        header = ("call", "replacement", "leaves", "max abs", "max rel", "input drift", "verdict")
        lines = [header]
        for row in self.rows:
            outputs = row["call"] == "(outputs)"
            if outputs:
                verdict = "match" if row["ok"] else "DRIFT"
            else:
                verdict = "ok" if row["ok"] else "DIVERGES"
            lines.append(
                (
                    row["call"],
                    row["replacement"],
                    str(row["leaves"]),
                    _number(row["max_abs"]),
                    _number(row["max_rel"]),
                    "" if outputs else _number(row["input_drift"]),
                    verdict,
                )
            )
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        text = []
        for line in lines:
            cells = [
                cell.rjust(width) if 2 <= i <= 5 else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(line, widths))
            ]
            text.append("  ".join(cells).rstrip())
        return "\n".join(text)

    def __str__(self) -> str:
        first = self.first_divergence
        n = len(self.calls)
        head = f"compare: {n} swapped call{'s' if n != 1 else ''}"
        if first is None:
            head += ", none diverges"
        else:
            head += f", first divergence: {first!r}"
        head += f" (rtol={self.rtol:g}, atol={self.atol:g})"
        lines = [head, *("  " + line for line in self.table().splitlines())]
        if first is not None:
            call = self[first]
            lines.append(f"  {first!r} ({call.replacement}): {call.problem}")
            if call.input_drift and call.input_drift > 0:
                lines.append(
                    f"  (its inputs had already drifted by {_number(call.input_drift)}, "
                    "but it was compared on exactly what it received)"
                )
        elif not self.outputs.ok:
            lines.append(
                f"  no call diverges on its own, but the outputs drift by "
                f"{_number(self.outputs.max_abs)}: small differences add up downstream"
            )
        if self.outputs.structure_problem:
            lines.append(f"  outputs: {self.outputs.structure_problem}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        first = self.first_divergence
        verdict = f"first divergence {first!r}" if first else "no divergence"
        drift = (
            "outputs match" if self.outputs.ok else f"outputs drift {_number(self.outputs.max_abs)}"
        )
        return f"<Comparison: {len(self.calls)} swapped calls, {verdict}, {drift}>"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))


def _number(x: float) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return "0" if x == 0 else f"{x:.3g}"


def _spec_paths(spec: pytree.TreeSpec) -> list[str]:
    # Key paths of a structure known only by its spec: unflatten placeholders, flatten with paths.
    dummy = pytree.tree_unflatten([0] * spec.num_leaves, spec)
    return [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(dummy)[0]]


def _up_to(spec: pytree.TreeSpec, value: Any) -> list[Any] | None:
    # flatten_up_to keeps a None that stands where the spec has a leaf (an unused argument).
    try:
        return list(spec.flatten_up_to(value))
    except (TypeError, ValueError, RuntimeError):
        return None


def _max_drift(original: list[Any], swapped: list[Any]) -> float:
    drift = 0.0
    for a, b in zip(original, swapped):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            error = compare_leaf("", a, b, rtol=0.0, atol=0.0).max_abs
            if math.isnan(error):
                return math.nan
            drift = max(drift, error)
    return drift


def compare(
    ep: ExportedProgram,
    swapped: GraphModule,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> Comparison:
    """Compare every swapped call of ``swapped`` with the original partition it replaced.

    Args:
        ep: the ExportedProgram ``swapped`` was made from (it is not modified).
        swapped: the result of ``gs.swap(ep, {...})``.
        args, kwargs: inputs for the model, as for ``gs.verify``.
        rtol, atol: a leaf matches when ``|a - b| <= atol + rtol * |a|`` everywhere (NaN
            matches NaN), ``a`` being the original's value.

    Both programs run once, under ``no_grad``, each on its own copy of the inputs. For each
    swapped call, the original partition runs on a copy of the inputs the replacement received
    in the swapped run, and its outputs are compared with the replacement's, leaf by leaf.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.compare import compare
        >>> _ = torch.manual_seed(0)
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Tanh())
        >>> x = torch.randn(2, 4)
        >>> ep = gs.export(model, (x,))
        >>> swapped = gs.swap(ep, {"1": torch.nn.ReLU(), "2": torch.nn.Sigmoid()})
        >>> cmp = compare(ep, swapped, (x,))
        >>> cmp.first_divergence, cmp["1"].ok, cmp["1"].max_abs
        ('2', True, 0.0)
        >>> bool(cmp.outputs)
        False
    """
    if not isinstance(args, tuple):
        args = (args,)
    kwargs = dict(kwargs or {})
    if not isinstance(ep, ExportedProgram):
        raise CompareError(
            f"compare: the first argument is a {type(ep).__name__}; pass the ExportedProgram "
            "that the swapped program was made from"
        )
    info = swap_info(swapped)
    if info is None:
        raise CompareError(
            f"compare: the second argument ({type(swapped).__name__}) was not made by gs.swap; "
            "pass gs.swap(ep, {name: replacement})"
        )
    if info.program is not ep:
        raise CompareError(
            "compare: the swapped program was made from another ExportedProgram than the one "
            "given; pass the program it was made from (gs.swap_info(swapped).program)"
        )
    _, original, same = _unlifted_entry(ep)
    call_nodes = dict(info.call_nodes)
    watched_inputs = {
        same[a.name].name
        for part in info.partitions.values()
        for a in part.signature.inputs
        if not _is_constant(a) and a.name in same
    }
    reference = _Recorder(original, values=watched_inputs)
    expected = _run(
        reference,
        "original program",
        bind_inputs(original, clone_inputs(args), clone_inputs(kwargs)),
    )
    capture = _Recorder(swapped, calls=call_nodes.values())
    with _KeepState(info.calls.values()):
        actual = _run(
            capture,
            "swapped program",
            bind_inputs(swapped, clone_inputs(args), clone_inputs(kwargs)),
        )
    calls = []
    for name, replacement in info.calls.items():
        node_name = call_nodes[name]
        if node_name not in capture.call_inputs:
            continue  # the call never ran (dead code): nothing to compare
        calls.append(
            _compare_call(
                ep,
                name,
                info.partitions[name],
                replacement,
                capture.call_inputs[node_name],
                capture.call_outputs[node_name],
                {name: reference.values.get(node.name) for name, node in same.items()},
                rtol,
                atol,
            )
        )
    return Comparison(
        tuple(calls), compare_outputs(expected, actual, rtol=rtol, atol=atol), rtol, atol
    )


def _compare_call(
    ep, name, part, replacement, inputs, output, original_values, rtol, atol
) -> CallComparison:
    signature = part.signature
    flat_inputs = _up_to(signature.in_spec, inputs)
    if flat_inputs is None or len(flat_inputs) != len(signature.inputs):
        raise CompareError(
            f"internal: the inputs captured for {name!r} have the structure "
            f"{describe_spec(pytree.tree_structure(inputs))}, not the signature's "
            f"{describe_spec(signature.in_spec)}"
        )
    index = program_index(ep)
    graph_inputs = [v for a, v in zip(signature.inputs, flat_inputs) if not _is_constant(a)]
    upstream = [original_values.get(a.name) for a in signature.inputs if not _is_constant(a)]
    drift = _max_drift(upstream, graph_inputs)
    module = partition_module(ep, name)
    try:
        # the cut shares the original program's buffers: put them back after it ran
        with torch.no_grad(), _KeepState([module]):
            original_out = list(module(*graph_inputs))
    except Exception as error:
        raise CompareError(
            f"running the original nodes of {name!r} on the captured inputs failed: "
            f"{type(error).__name__}: {error}"
        ) from error
    flat_out = _up_to(signature.out_spec, output)
    paths = _spec_paths(signature.out_spec)
    leaves = []
    if flat_out is None or len(flat_out) != len(signature.outputs):
        leaves.append(
            LeafCheck(
                "",
                False,
                math.nan,
                math.nan,
                f"returned {describe_spec(pytree.tree_structure(output))}, expected "
                f"{describe_spec(signature.out_spec)}",
            )
        )
    else:
        produced = iter(original_out)
        for argument, path, actual in zip(signature.outputs, paths, flat_out):
            expected = argument.value if _is_constant(argument) else next(produced)
            if expected is None and not _is_constant(argument):
                # the original program never computed it (nothing used it): nothing to compare
                leaves.append(
                    LeafCheck(path, True, 0.0, 0.0, "unused: not computed by the original")
                )
                continue
            leaf = compare_leaf(path, expected, actual, rtol=rtol, atol=atol)
            node = None if _is_constant(argument) else index.by_name.get(argument.name)
            if node is not None and not node.users:
                # an output nothing in the program reads: a difference there cannot matter
                problem = "unused by the program" + ("" if leaf.ok else f"; {leaf.problem}")
                leaf = LeafCheck(path, True, leaf.max_abs, leaf.max_rel, problem)
            leaves.append(leaf)
    return CallComparison(
        call_name=name,
        replacement=type(replacement).__name__,
        original=part.type_name,
        leaves=tuple(leaves),
        input_drift=drift,
        ok=all(leaf.ok for leaf in leaves),
    )
