"""overlay_values(): a number for every element of a program's picture, to paint on it.

An overlay gives each fx node of the program being drawn a value, and each module call the
value of its nodes taken together, with what a renderer needs to colour and label them (the
kind, the unit, the tolerance, a short description). The kinds:

* ``"error"``: the swapped program against the original, run side by side on the same inputs.
  A kept node is compared with the original's node of the same name, a swapped call by its
  outputs (the outputs of the call it replaced), as the worst error relative to the tolerance,
  ``max |a - b| / (atol + rtol * |b|)`` (``b`` the original's value): below 1 it is within
  tolerance, 37 is 37 times it. Everything downstream of a wrong swap shows it.
* ``"own error"``: each node and swapped call run on the values the original program had at
  its inputs, against the original's value (as :func:`graphsurgeon.compare` tells a call's own
  error from the drift of its inputs): kept nodes give 0, a wrong replacement its own error,
  so where error *starts* stands out from where it spreads.
* ``"latency"``: the time of each node in a profiled run, as a share of the forward (the
  median of a few runs). The profiled run is the program's own generated code with a clock
  read between nodes, so it costs about what a plain forward does (``benchmarks/overlay.py``).
* a mapping ``{node or module name: value}`` of the user's own (any metric), checked against
  the program's names and made the same type.

The values are keyed by the fx node names of the program as it is drawn (for a swap result its
own node names; a swapped call by its ``call_module`` node's name; a fused call by the original
nodes it runs, which the picture draws in its place) and, in :attr:`calls`, by call name
(``"layers.0"``, ``"blk@1"``): the worst of its nodes for errors, the sum for latency. Nothing
is rewritten to compute them: the program drawn is the program run. Values that are not tensors, or have no counterpart in the original, are absent.
Each program runs as it is, on private copies of its buffers: a swapped program whose buffers
a run in training mode wrote (batch norm statistics) is compared with those, and the error
overlay shows them at those buffers.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.checks.overlay import overlay_values
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Tanh())
    >>> x = torch.randn(2, 4)
    >>> s = gs.Surgery.from_model(model, (x,)).swap("1", torch.nn.Sigmoid())
    >>> own = overlay_values(s, kind="own error")
    >>> own["linear"], own["tanh"], own.calls["1"] > 1
    (0.0, 0.0, True)
    >>> overlay_values(s, kind="error")["tanh"] > 1  # tanh only inherits the error
    True
"""

from __future__ import annotations

import copy
import math
import statistics
import time
import types
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from .. import _meta
from .._program import as_program
from ..errors import (
    CompareError,
    GraphSurgeonError,
    RenderError,
    UnknownModuleError,
    UnknownNameError,
    a_type,
    did_you_mean,
    unknown_name,
)
from ..partition import call_index, program_index, split_call_name
from ..rewrite import SwapInfo, _forget_source_with
from ._exec import (
    NodeRunner,
    RandomState,
    _placeholder_signature,
    bind_inputs,
    clone_inputs,
    keep_state,
    original_nodes,
    runnable_original,
    value_lifetimes,
)
from ._grad_overlay import grad_errors
from .verify import compare_leaf, in_order_of

__all__ = ["KINDS", "OverlayValues", "overlay_values"]

#: The overlays computed from a run; a mapping of the user's own values is the other kind.
KINDS = ("error", "own error", "grad error", "own grad error", "latency")

_TOLERANCE_UNIT = "x tolerance"
_LATENCY_UNIT = "share of the forward"


@dataclass(frozen=True, eq=False, repr=False)
class OverlayValues(Mapping[str, float]):
    """A value for each fx node and module call of a program's picture (:func:`overlay_values`).

    It is a read-only mapping from node names (those of the program drawn) and call names to
    floats: ``ov["linear_3"]``, ``ov["layers.1"]``; where a node and a call have the same name,
    the mapping gives the node's value and :attr:`calls` the call's.

    Attributes:
        kind: ``"error"``, ``"own error"``, ``"latency"``, or ``"values"`` (given by the user).
        unit: ``"x tolerance"`` (errors), ``"share of the forward"`` (latency) or ``""``.
        description: one sentence on what the values are, for a legend or a tooltip.
        nodes: node name -> value, in graph order.
        calls: call name -> value, in model order: the worst of its nodes (``aggregate``
            ``"max"``) or their sum (``"sum"``); a call given a value by the user keeps it.
        aggregate: how a call's value is made from its nodes' values: ``"max"``, ``"sum"``, or
            None (a mapping given with ``aggregate=None``: calls have only the values given).
        threshold: the value from which something is wrong (1.0 for errors: the tolerance),
            or None.
        rtol, atol: the tolerances of the errors (None for other kinds).
        forward_seconds: for latency, the time of the profiled forward (median), else None.
    """

    kind: str
    unit: str
    description: str
    nodes: Mapping[str, float]
    calls: Mapping[str, float]
    aggregate: str | None
    threshold: float | None = None
    rtol: float | None = None
    atol: float | None = None
    forward_seconds: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", types.MappingProxyType(dict(self.nodes)))
        object.__setattr__(self, "calls", types.MappingProxyType(dict(self.calls)))

    def __getitem__(self, name: str) -> float:
        if name in self.nodes:
            return self.nodes[name]
        if name in self.calls:
            return self.calls[name]
        raise UnknownModuleError(
            f"the {self.kind} overlay has no value for {name!r}."
            f"{did_you_mean(str(name), [*self.nodes, *self.calls])} Values exist for tensors "
            "with a counterpart in the original program, and for the module calls holding them."
        )

    def __contains__(self, name: object) -> bool:
        return name in self.nodes or name in self.calls

    def get(self, name: str, default: Any = None) -> Any:
        """The value of node or call ``name``, or ``default`` where it has none.

        Args:
            name: a node name of the program drawn, or a call name (``"layers.0"``,
                ``"blk@1"``); a node's value comes first where both have the name.
            default: what to return for a name without a value.

        Returns:
            The value, or ``default``.
        """
        if name in self.nodes:
            return self.nodes[name]
        return self.calls.get(name, default)

    def __iter__(self) -> Iterator[str]:
        yield from self.nodes
        yield from (name for name in self.calls if name not in self.nodes)

    def __len__(self) -> int:
        return len(self.nodes) + sum(1 for name in self.calls if name not in self.nodes)

    def top(self, n: int = 10, *, of: str = "calls") -> list[tuple[str, float]]:
        """The ``n`` largest values of the calls or of the nodes, largest first.

        Args:
            n: how many to keep (fewer when there are fewer values).
            of: ``"calls"`` (module calls) or ``"nodes"`` (fx nodes).

        Returns:
            ``(name, value)`` pairs, largest value first; ties in graph order.

        Raises:
            RenderError: ``of`` is neither ``"calls"`` nor ``"nodes"``.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> from graphsurgeon.checks.overlay import overlay_values
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
            >>> ep = gs.export(model, (torch.randn(2, 4),))
            >>> overlay_values(ep, kind={"0": 3.0, "1": 5.0}).top(1)
            [('1', 5.0)]
        """
        if of not in ("calls", "nodes"):
            raise RenderError(f"top(of={of!r}): expected 'calls' or 'nodes'")
        values = self.calls if of == "calls" else self.nodes
        ranked = sorted(enumerate(values.items()), key=lambda item: (-item[1][1], item[0]))
        return [pair for _, pair in ranked[: max(0, n)]]

    def describe(self, value: float) -> str:
        """``value`` as a tooltip says it, with the overlay's kind and unit.

        Args:
            value: a value of this overlay (or any number in its unit).

        Returns:
            ``"error: 37.2x tolerance"``, ``"latency: 12.5% of the forward"``,
            ``"values: 0.25"``.
        """
        if self.unit == _LATENCY_UNIT:
            return f"{self.kind}: {self._number(value)} of the forward"
        if self.unit == _TOLERANCE_UNIT:
            number = self._number(value)  # "0", "inf" or "37.2x"
            return f"{self.kind}: {number}" + (" tolerance" if number.endswith("x") else "")
        return f"{self.kind}: {self._number(value)}"

    def combine(self, values: list[float]) -> float | None:
        """The value of a box that draws several elements, made as the calls' values are.

        Args:
            values: the values of the elements the box draws.

        Returns:
            The worst of them (``aggregate`` ``"max"``, or None), or their sum (``"sum"``);
            None for no values.
        """
        if not values:
            return None
        return math.fsum(values) if self.aggregate == "sum" else max(values)

    def number(self, value: float) -> str:
        """``value`` in few characters, in the overlay's unit, as the picture labels it.

        Args:
            value: a value of this overlay (or any number in its unit).

        Returns:
            ``"37.2x"`` (errors; ``"0"`` and ``"inf"`` too), ``"12.5%"`` (latency), ``"0.25"``.
        """
        return self._number(value)

    def _number(self, value: float) -> str:
        if self.unit == _LATENCY_UNIT:
            return f"{value:.1%}"
        if self.unit == _TOLERANCE_UNIT:
            if math.isinf(value):
                return "inf"
            return "0" if value == 0 else f"{value:.3g}x"
        return f"{value:.4g}"

    def _title(self) -> str:
        measured = f"{len(self.nodes):,} nodes, {len(self.calls):,} calls"
        extra = ""
        if self.forward_seconds is not None:
            extra = f", forward {self.forward_seconds * 1e3:.3g} ms"
        if self.rtol is not None:
            extra = f", rtol={self.rtol:g}, atol={self.atol:g}"
        return f"{self.kind} overlay ({measured}{extra})"

    def __str__(self) -> str:
        lines = [self._title(), f"  {self.description}"]
        for of in ("calls", "nodes"):
            top = self.top(5, of=of)
            if top:
                text = ", ".join(f"{name} {self._number(value)}" for name, value in top)
                lines.append(f"  largest {of}: {text}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<OverlayValues {self.kind!r}: {len(self.nodes)} nodes, {len(self.calls)} calls>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display as d

        body = (
            f'<div class="gs-title">{d.escape(self._title())}</div>'
            f'<div class="gs-muted">{d.escape(self.description)}</div>'
        )
        for of in ("calls", "nodes"):
            top = self.top(10, of=of)
            if not top:
                continue
            rows = []
            for name, value in top:
                over = self.threshold is not None and value > self.threshold
                mark = d.badge("beyond", "bad") if over else ""
                rows.append([d.escape(name), d.escape(self._number(value)), mark])
            table = d.table([of[:-1], self.unit or "value", ""], rows, numeric=(1,), raw=(2,))
            body += d.details(f"largest {of}", table, open_=of == "calls")
        return d.bundle(body, repr(self), include, exclude)


# -- what is drawn ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """The program as the picture draws it: the original program alone (``module`` None:
    nothing is swapped), or a swap or fuse result ``module``, drawn from its own graph with each
    fused call as the original nodes it runs (the values are keyed the same way; no rewrite
    runs here, as none runs to draw it)."""

    ep: ExportedProgram
    module: GraphModule | None
    info: SwapInfo | None
    args: tuple | None
    kwargs: Mapping[str, Any] | None

    @property
    def graph(self) -> torch.fx.Graph:
        return (self.module if self.module is not None else self.ep).graph

    @property
    def fused(self) -> dict[str, str]:
        """The ``call_module`` node of each fused call -> the call."""
        info = self.info
        if info is None:
            return {}
        return {info.call_nodes[c]: c for c in info.fused if c in info.call_nodes}

    def drawn(self) -> tuple[list[str], dict[str, tuple[str, ...]]]:
        """The node names as the picture draws them, in order, and the module calls each sits
        in: a fused call's node is drawn as the original nodes it runs (by their names)."""
        program = self.module if self.module is not None else self.ep
        chains = dict(call_index(program).chains)
        fused = self.fused
        if not fused:
            return [node.name for node in self.graph.nodes], chains
        original = call_index(self.ep).chains
        names: list[str] = []
        for node in self.graph.nodes:
            call = fused.get(node.name)
            if call is None:
                names.append(node.name)
                continue
            inner = [n for n in self.info.partitions[call].nodes if n in original]
            names += inner
            chains.update((n, original[n]) for n in inner)
        return names, chains

    def members(self) -> dict[str, list[str]]:
        """Each module call's nodes, as the picture draws them (see :meth:`drawn`)."""
        names, chains = self.drawn()
        members: dict[str, list[str]] = {}
        for name in names:
            for call in chains.get(name, ()):
                members.setdefault(call, []).append(name)
        program = self.module if self.module is not None else self.ep
        order = call_index(program).calls
        return {c: members[c] for c in [*order, *members] if c in members}


def _inputs(target: _Target, kind: str) -> tuple[tuple, dict]:
    args, kwargs = target.args, target.kwargs
    if args is None:
        raise RenderError(
            f"the {kind!r} overlay runs the program: pass its inputs, as for the model "
            "(args=(x,), kwargs=...); a Surgery made with gs.Surgery.from_model(model, args) "
            "has them"
        )
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, tuple):
        raise RenderError(
            f"args: expected a tuple of the model's positional inputs, got {a_type(args)}; "
            "wrap a single input as (x,)"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise RenderError(
            f"kwargs: expected a mapping of keyword inputs such as {{'mask': mask}}, got "
            f"{a_type(kwargs)}"
        )
    return args, dict(kwargs or {})


def _aggregate(
    members: Mapping[str, list[str]], nodes: Mapping[str, float], how: str | None
) -> dict[str, float]:
    """Each call's value from its nodes' values: the worst (``"max"``) or the sum."""
    found: dict[str, float] = {}
    if how is None:
        return found
    for name, inside in members.items():
        values = [nodes[m] for m in inside if m in nodes]
        if values:
            found[name] = max(values) if how == "max" else math.fsum(values)
    return found


# -- errors, run side by side -------------------------------------------------------------------


def _ratio(actual: Any, expected: Any, rtol: float, atol: float) -> float | None:
    """``max |a - b| / (atol + rtol * |b|)`` of two tensors (``b`` expected); 0 where equal,
    infinite where no tolerance applies (integers that differ, NaN or Inf apart, another shape
    or dtype); None where no value can be compared (not tensors, meta tensors)."""
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return None
    if "meta" in (actual.device.type, expected.device.type):
        return None
    if (actual.shape, actual.dtype, actual.device) != (
        expected.shape,
        expected.dtype,
        expected.device,
    ):
        return math.inf
    if actual.layout is not torch.strided or actual.is_quantized or actual.is_complex():
        leaf = compare_leaf("", expected, actual, rtol=rtol, atol=atol)
        if not leaf.values_compared:
            return None
        return getattr(leaf, "tolerance_ratio", None) or (0.0 if leaf.ok else math.inf)
    if torch.equal(actual, expected):  # the common case: computed exactly as the original
        return 0.0
    if not actual.is_floating_point():
        return math.inf  # integers and bools: no tolerance applies
    worst = 0.0
    # in blocks, in double precision: a few MB beyond the two tensors, whatever their size
    for a, b in zip(_blocks(actual), _blocks(expected)):
        a, b = a.double(), b.double()
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        if not torch.equal(nan_a, nan_b):
            return math.inf
        same = (a == b) | nan_a
        diff = torch.where(same, torch.zeros_like(a), (a - b).abs())
        if not bool(torch.isfinite(diff).all()):
            return math.inf  # an infinity on one side only
        allowed = b.abs().mul_(rtol).add_(atol)
        ratio = diff.div_(allowed)
        if atol == 0:  # 0 / 0 where both are 0
            ratio = torch.nan_to_num(ratio, nan=0.0, posinf=math.inf)
        if ratio.numel():
            worst = max(worst, float(ratio.max()))
    return worst


_BLOCK = 1 << 20


def _blocks(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    flat = tensor.reshape(-1)
    for start in range(0, max(flat.numel(), 1), _BLOCK):
        yield flat[start : start + _BLOCK]


def _worst(values: list[float | None]) -> float | None:
    measured = [v for v in values if v is not None]
    return max(measured) if measured else None


class _Walk:
    """One program run a node at a time (a :class:`NodeRunner`: on private copies of its state),
    from a random stream of its own: two walks interleaved each see the random numbers they
    would see alone.

    ``before(node)`` may return the random state to run that node from instead; ``capture``:
    nodes before which the random state is kept in ``captured``. ``expand``: the
    ``call_module`` nodes run one node at a time (fused calls, drawn as the nodes they run):
    their nodes and values are in ``inner`` after the step that ran them, and
    ``inner_before`` is their ``before``.
    """

    def __init__(
        self,
        runner: NodeRunner,
        start: RandomState,
        which: str,
        expand: Iterable[str] = (),
    ):
        self.runner = runner
        self.nodes = iter(runner.nodes)
        # the values no later node reads, after each node: dropped once the walk moves on
        self.dead = value_lifetimes(runner.nodes)[1]
        self.random = start
        self.which = which
        self.count = 0  # nodes run so far
        self.last: Node | None = None
        self.before: Callable[[Node], RandomState | None] | None = None
        self.capture: set[Node] = set()
        self.captured: dict[Node, RandomState] = {}
        self.expand = set(expand)
        self.inner: list[tuple[Node, Any]] = []
        self.inner_before: Callable[[Node], RandomState | None] | None = None

    @property
    def env(self) -> dict[Node, Any]:
        """The values of the run so far (node -> value): what later nodes read."""
        return self.runner.env

    def step(self) -> tuple[Node, Any] | None:
        runner = self.runner
        if self.last is not None:  # its value could still be replaced (own error): free now
            for dead in self.dead[self.count - 1]:
                runner.env.pop(dead, None)
        node = next(self.nodes, None)
        self.last = node
        if node is None:
            return None
        try:
            chosen = self.before(node) if self.before is not None else None
            (chosen or self.random).restore()
            if node in self.capture:
                self.captured[node] = RandomState()
            if node.name in self.expand:
                value = runner.env[node] = self._run_inside(node, chosen or self.random)
            else:
                value = runner.run(node)
        except GraphSurgeonError:
            raise  # the program refused its inputs (GuardError, ...): that error says it best
        except Exception as error:
            cause = str(error).split("\n\n", 1)[0]  # without torch's "While executing" trailer
            raise CompareError(
                f"overlay: running the {self.which} failed at node {node.name!r}: "
                f"{type(error).__name__}: {cause}. gs.Stepper(program, *args) stops at the "
                "failing node for a closer look."
            ) from error
        self.random = RandomState()
        self.count += 1
        return node, value

    def _run_inside(self, node: Node, start: RandomState) -> Any:
        """Run a fused call's GraphModule one node at a time (each kept in ``inner``): what
        the call computes, node by node, as the picture draws it."""
        module, args, kwargs = self.runner.call(node)
        values = bind_inputs(module, args, kwargs, CompareError)
        walk = _Walk(self.runner.inner(node, module, values), start, self.which)
        walk.before = self.inner_before
        self.inner = []
        result = None
        while (step := walk.step()) is not None:
            if step[0].op == "output":
                result = step[1]
            else:
                self.inner.append(step)
        return result


def _seeded(node: Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in target.tags
    )


def _side_by_side(
    target: _Target, args: tuple, kwargs: dict, rtol: float, atol: float, own: bool
) -> dict[str, float]:
    """The error of every node of the swapped program against the original (see the module
    docstring); ``own``: each node on the original's values at its inputs."""
    ep, module, info = target.ep, target.module, target.info
    original, same = runnable_original(ep), original_nodes(ep)
    position = {node: i for i, node in enumerate(original.graph.nodes)}
    # the nodes each fused call runs, drawn by the original's names: fused node -> their nodes
    fused = target.fused
    inside = {
        call_node: {n: same[n] for n in info.partitions[call].nodes if n in same}
        for call_node, call in fused.items()
    }
    # swapped node name -> the original nodes whose value it holds
    holders: dict[str, list[Node]] = {}
    for old, new in info.node_map.items():
        if old in same:
            holders.setdefault(new, []).append(same[old])
    swapped_calls = {info.call_nodes[c]: c for c in info.calls if c not in info.fused}
    outputs: dict[str, list[tuple[Node | None, Any]]] = {}  # call -> (original node, constant)
    for call in swapped_calls.values():
        signature = info.partitions[call].signature
        outputs[call] = [
            (None, getattr(argument, "value", None))
            if _meta.is_constant(argument)
            else (same.get(argument.name), None)
            for argument in signature.outputs
        ]
    original_output = next(n for n in reversed(original.graph.nodes) if n.op == "output")
    needed = Counter(o for found in holders.values() for o in found)
    needed.update(o for leaves in outputs.values() for o, _ in leaves if o is not None)
    needed.update(o for nodes in inside.values() for o in nodes.values())
    needed[original_output] += 1

    start = RandomState()
    values: dict[str, float] = {}
    try:
        with torch.no_grad():
            swapped_walk = _Walk(
                NodeRunner(
                    module,
                    bind_inputs(module, clone_inputs(args), clone_inputs(kwargs), CompareError),
                ),
                start,
                "swapped program",
                expand=fused,
            )
            original_walk = _Walk(
                NodeRunner(
                    original,
                    bind_inputs(original, clone_inputs(args), clone_inputs(kwargs), CompareError),
                ),
                start,
                "original program",
            )
            pending: dict[Node, Any] = {}

            def advance_to(node: Node) -> None:
                while original_walk.count <= position[node]:
                    step = original_walk.step()
                    if step is None:
                        raise CompareError(f"internal: the original never computed {node.name!r}")
                    if needed.get(step[0]):
                        # a copy: a later node may write the value in place (a buffer's add_)
                        pending[step[0]] = clone_inputs(step[1])

            def original_value(node: Node) -> Any:
                advance_to(node)
                value = pending[node]
                needed[node] -= 1
                if not needed[node]:
                    del pending[node]
                return value

            inner_original = {n: o for nodes in inside.values() for n, o in nodes.items()}
            if own:
                _align_random(info, same, holders, swapped_calls, original_walk)
                swapped_walk.before = _random_of_original(
                    info, same, holders, swapped_calls, original_walk, advance_to
                )
                original_walk.capture.update(o for o in inner_original.values() if _seeded(o))

                def inner_before(node: Node) -> RandomState | None:
                    counterpart = inner_original.get(node.name)
                    if counterpart is None or not _seeded(counterpart):
                        return None
                    advance_to(counterpart)
                    return original_walk.captured.get(counterpart)

                swapped_walk.inner_before = inner_before
            env = swapped_walk.env
            while (step := swapped_walk.step()) is not None:
                node, value = step
                if node.op == "output":
                    expected = original_value(original_output)
                    worst = _structure_ratio(value, expected, rtol, atol)
                    if worst is not None:
                        values[node.name] = worst
                    break
                if node.name in inside:  # a fused call: its own nodes, by the original's names
                    counterparts = inside[node.name]
                    for inner, inner_value in swapped_walk.inner:
                        counterpart = counterparts.get(inner.name)
                        if counterpart is None:
                            continue
                        worst = _ratio(inner_value, original_value(counterpart), rtol, atol)
                        if worst is not None:
                            values[inner.name] = worst
                    swapped_walk.inner = []
                call = swapped_calls.get(node.name)
                if call is not None:
                    leaves = [
                        (original_value(o) if o is not None else constant)
                        for o, constant in outputs[call]
                    ]
                    signature = info.partitions[call].signature
                    expected = pytree.tree_unflatten(leaves, signature.out_spec)
                    worst = _structure_ratio(value, expected, rtol, atol, signature.out_spec)
                    if worst is not None:
                        values[node.name] = worst
                    if own:  # what comes after runs on the original call's outputs
                        env[node] = clone_inputs(expected)
                    continue
                found = holders.get(node.name)
                if not found:
                    continue
                expected_values = [original_value(o) for o in found]
                worst = _worst([_ratio(value, e, rtol, atol) for e in expected_values])
                if worst is not None:
                    values[node.name] = worst
                if own:  # what reads this node reads the original's value
                    env[node] = clone_inputs(expected_values[0])
    finally:
        start.restore()
    return values


def _align_random(info, same, holders, swapped_calls, original_walk) -> None:
    """For own error: the original's random state is kept before each node that draws random
    numbers and before the first node of each swapped call, so that their counterparts in the
    swapped program draw the same numbers from the same inputs."""
    for found in holders.values():
        original_walk.capture.update(o for o in found if _seeded(o))
    for call in swapped_calls.values():
        first = next((same[n] for n in info.partitions[call].nodes if n in same), None)
        if first is not None:
            original_walk.capture.add(first)


def _random_of_original(info, same, holders, swapped_calls, original_walk, advance_to):
    """The ``before`` of the swapped walk for own error: a swapped call runs from the random
    state the original had before the call's first node, a node that draws random numbers from
    the state its counterpart ran from."""
    first_of = {}
    for node_name, call in swapped_calls.items():
        first_of[node_name] = next(
            (same[n] for n in info.partitions[call].nodes if n in same), None
        )

    def before(node: Node) -> RandomState | None:
        if node.name in first_of:
            counterpart = first_of[node.name]
        elif _seeded(node) and holders.get(node.name):
            counterpart = holders[node.name][0]
        else:
            return None
        if counterpart is None:
            return None
        advance_to(counterpart)
        return original_walk.captured.get(counterpart)

    return before


def _structure_ratio(
    actual: Any, expected: Any, rtol: float, atol: float, spec: Any = None
) -> float | None:
    """The worst :func:`_ratio` over the tensor leaves of two structures (infinite when the
    structures differ); ``spec``: flatten up to it (a call's output signature)."""
    actual = in_order_of(expected, actual)
    if spec is None:
        expected_leaves, expected_spec = pytree.tree_flatten(expected)
        actual_leaves, actual_spec = pytree.tree_flatten(actual)
        if expected_spec != actual_spec:
            return math.inf
    else:
        try:
            expected_leaves = list(spec.flatten_up_to(expected))
            actual_leaves = list(spec.flatten_up_to(actual))
        except (TypeError, ValueError, RuntimeError):
            return math.inf
    return _worst([_ratio(a, e, rtol, atol) for a, e in zip(actual_leaves, expected_leaves)])


def _unswapped_errors(ep: ExportedProgram) -> dict[str, float]:
    """Nothing is swapped: the program against itself, 0 for every tensor it computes."""
    return {
        node.name: 0.0
        for node in ep.graph.nodes
        if node.op == "output" or isinstance(node.meta.get("val"), torch.Tensor)
    }


# -- latency ------------------------------------------------------------------------------------

# runnable GraphModule -> (a weak reference to its graph, the timed copy, the timed nodes'
# names). Weak: a graph refers to its module, and the cache must not keep the module alive.
_TIMED: weakref.WeakKeyDictionary[GraphModule, tuple] = weakref.WeakKeyDictionary()


def _timed(
    module: GraphModule, inline: Mapping[str, Iterable[str]] | None = None
) -> tuple[GraphModule, list[str]]:
    """A copy of ``module`` that also returns the clock (``time.perf_counter_ns``) read before
    its first node and after every node, and the names of the nodes timed. Its code is the
    module's own, made by the same code generator, with a clock read between the nodes: it runs
    about as fast as the module does. ``inline``: the ``call_module`` nodes (fused calls) whose
    GraphModule's nodes are copied in and timed one by one, each with the names of the nodes
    timed by name (the others are timed, unnamed: ``""``). Made once per module."""
    cached = _TIMED.get(module)
    if cached is not None and cached[0]() is module.graph:
        return cached[1], cached[2]
    inline = inline or {}
    graph = torch.fx.Graph()
    codegen = module.graph._codegen
    if getattr(codegen, "pytree_info", None) is None:  # a code generator of its own kind
        graph.set_codegen(copy.copy(codegen))
    env: dict[Node, Any] = {}
    stamps: list[Node] = []
    timed: list[str] = []

    def stamp(name: str) -> None:
        stamps.append(graph.call_function(time.perf_counter_ns))
        timed.append(name)

    for node in module.graph.nodes:
        if node.op == "output":
            result = torch.fx.node.map_arg(node.args[0], env.__getitem__)
            graph.output((result, tuple(stamps)))
            break
        if node.op != "placeholder" and not stamps:
            stamps.append(graph.call_function(time.perf_counter_ns))
        if node.op == "call_module" and node.name in inline:
            named = set(inline[node.name])
            args = torch.fx.node.map_arg(node.args, env.__getitem__)
            kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
            for inner, value in _copied_inside(graph, module, node, args, kwargs):
                if inner is None:
                    env[node] = value
                else:
                    stamp(inner if inner in named else "")
            continue
        env[node] = graph.node_copy(node, env.__getitem__)
        if node.op != "placeholder":
            stamp(node.name)
    copied = GraphModule(module, graph, class_name="TimedProgram")
    _forget_source_with(copied)
    _TIMED[module] = (weakref.ref(module.graph), copied, timed)
    return copied, timed


def _copied_inside(
    graph: torch.fx.Graph, module: GraphModule, node: Node, args: Any, kwargs: Any
) -> Iterator[tuple[str | None, Any]]:
    """Copy the nodes of ``node``'s GraphModule (a fused call of ``module``) into ``graph``, on
    ``args`` and ``kwargs`` (nodes of ``graph``), yielding each copied node's name in the
    GraphModule as it is copied, and at the end ``(None, what it returns)``."""
    inner_module = module.get_submodule(str(node.target))
    bound = _placeholder_signature(inner_module).bind(*args, **kwargs)
    bound.apply_defaults()
    inner_env: dict[Node, Any] = {}
    for inner in inner_module.graph.nodes:
        if inner.op == "placeholder":
            inner_env[inner] = bound.arguments[str(inner.target).lstrip("*")]
        elif inner.op == "output":
            yield None, torch.fx.node.map_arg(inner.args[0], inner_env.__getitem__)
            return
        else:
            copied = graph.node_copy(inner, inner_env.__getitem__)
            if inner.op in ("get_attr", "call_module"):  # an attribute of the fused call's own
                copied.target = f"{node.target}.{inner.target}"
            inner_env[inner] = copied
            yield inner.name, copied


def _latency(
    module: GraphModule,
    args: tuple,
    kwargs: dict,
    repeat: int,
    inline: Mapping[str, Iterable[str]] | None = None,
) -> tuple[dict[str, float], float]:
    """Each node's share of the forward (median over ``repeat`` runs after one warm-up run),
    and the forward's time in seconds (median). ``inline``: see :func:`_timed`."""
    timed, names = _timed(module, inline)
    values = bind_inputs(module, clone_inputs(args), clone_inputs(kwargs), CompareError)
    shares: list[list[float]] = [[] for _ in names]
    totals: list[float] = []
    start = RandomState()
    try:
        with torch.no_grad(), keep_state([module, timed]):
            for run in range(repeat + 1):
                inputs = clone_inputs(values)
                start.restore()  # every run draws the same random numbers
                try:
                    _, stamps = timed(*inputs)
                except GraphSurgeonError:
                    raise
                except Exception as error:
                    raise CompareError(
                        f"overlay: the profiled run failed: {type(error).__name__}: "
                        f"{str(error).split(chr(10) * 2, 1)[0]}"
                    ) from error
                if run == 0:
                    continue  # a warm-up: first calls allocate and look things up
                total = max(stamps[-1] - stamps[0], 1)
                totals.append(total / 1e9)
                for i in range(len(names)):
                    shares[i].append((stamps[i + 1] - stamps[i]) / total)
    finally:
        start.restore()
    found = {name: statistics.median(s) for name, s in zip(names, shares) if name}
    return found, statistics.median(totals)


# -- values of the user's own -------------------------------------------------------------------


def _number(name: str, value: Any) -> float:
    problem = None
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value
    if isinstance(value, (bool, str, bytes, torch.Tensor)):
        problem = f"got {a_type(value)}"
    else:
        try:
            number = float(value)
        except (TypeError, ValueError):
            problem = f"got {a_type(value)}"
        else:
            if math.isnan(number):
                problem = "got NaN"
    if problem is not None:
        raise RenderError(
            f"overlay: the value for {name!r} must be a number (an int, a float or a "
            f"one-element tensor); {problem}. Leave a name out to give it no value."
        )
    return number


def _given(
    target: _Target, given: Mapping[Any, Any], aggregate: str | None
) -> tuple[dict[str, float], dict[str, float]]:
    """The user's ``{node or module name: value}`` as node values and call values."""
    index = program_index(target.ep)
    drawn, _ = target.drawn()
    node_names = set(drawn)
    nodes: dict[str, float] = {}
    whole: dict[str, float] = {}  # a module's value, for each of its calls
    one: dict[str, float] = {}  # one call's value: wins over its module's
    for name, value in given.items():
        if not isinstance(name, str):
            raise RenderError(
                f"overlay: the names must be node or module names (str), got {a_type(name)} "
                f"({name!r})"
            )
        if name in node_names:
            nodes[name] = _number(name, value)
            continue
        if name == "":
            raise RenderError(
                "overlay: '' is the root module, the whole program: name a submodule or a node"
            )
        try:
            resolved = index.resolve(name)  # the one reading of a name ("blk@0" is "blk")
        except UnknownModuleError as error:
            if split_call_name(name)[0] in index.fqn_set:  # a module, but no such call of it
                raise UnknownModuleError(f"overlay: {error}") from None
            choices = [*node_names, *index.known_names()]
            raise UnknownNameError(
                "overlay: "
                + unknown_name(name, choices, kind="node or module")
                + " The picture's tooltips name the nodes."
            ) from None
        number = _number(name, value)
        if not resolved.one_call:
            for call in resolved.calls or (resolved.fqn,):  # a container keeps its own name
                whole[call] = number
            continue
        wanted = resolved.name
        one[wanted] = number
    members = target.members()
    calls = _aggregate(members, nodes, aggregate)
    calls.update(whole)
    calls.update(one)
    order = {name: i for i, name in enumerate(members)}
    ordered = dict(sorted(calls.items(), key=lambda item: order.get(item[0], len(order))))
    return nodes, ordered


# -- the entry point ----------------------------------------------------------------------------


def _tolerance(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RenderError(
            f"overlay: {name}={value!r}: expected a number >= 0 such as {name}=1e-5, got "
            f"{a_type(value)}"
        )
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise RenderError(f"overlay: {name}={value!r}: expected a finite number >= 0")
    return number


def _descriptions(rtol: float, atol: float, repeat: int) -> dict[str, str]:
    relative = (
        f"the worst error relative to the tolerance, max |a - b| / (atol + rtol |b|) with b the "
        f"original's value (rtol={rtol:g}, atol={atol:g}: from 1 on, beyond it)"
    )
    return {
        "error": (
            "The swapped program against the original, run side by side on the same inputs, "
            f"node by node: {relative}; a module call: the worst of its nodes."
        ),
        "own error": (
            "Each node and swapped call run on the values the original had at its inputs, "
            f"against the original: {relative}. Kept nodes give 0, so error starts where a "
            "value is not 0; a module call: the worst of its nodes."
        ),
        "grad error": (
            "The gradients of the swapped program against the original's, both run backward "
            "from the same seeded upstream gradients at the outputs: at each node, "
            f"{relative}; a swapped call: the worst of the gradients of its parameters and of "
            "the values it reads. A wrong backward shows at its call and everything before it."
        ),
        "own grad error": (
            "Each swapped call's own backward: the original nodes and the replacement on the "
            "original's values at the call's inputs, backward from the original's gradient at "
            f"its outputs: {relative}, the worst of the gradients of its inputs and "
            "parameters. Kept nodes give 0, so the calls whose backward is wrong stand out."
        ),
        "latency": (
            f"Each node's time in a profiled run, as a share of the forward (median of "
            f"{repeat} run{'s' if repeat != 1 else ''}); a module call: the sum of its nodes."
        ),
        "unswapped": "Nothing is swapped: the program against itself, 0 everywhere.",
        "values": "Values given, one per node or module call.",
    }


def overlay_values(
    program: Any,
    args: tuple[Any, ...] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    kind: str | Mapping[str, Any] = "error",
    *,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    repeat: int = 3,
    aggregate: str | None = "max",
) -> OverlayValues:
    """A value for each node and module call of ``program``'s picture (see the module docstring).

    An ExportedProgram has nothing swapped: its errors are 0. Errors run both programs under
    ``no_grad``, node by node, from the same random state (the caller's is left as it was), each
    on private copies of its buffers; the latency runs put back the buffers they write.

    Args:
        program: an ExportedProgram, a :func:`graphsurgeon.swap` or :func:`graphsurgeon.fuse`
            result, or a :class:`graphsurgeon.Surgery` (its current program against its
            original, on its inputs unless others are given). None of them is changed.
        args: the model's positional inputs (a tuple), for the kinds that run the program;
            default: a Surgery's example inputs.
        kwargs: the model's keyword inputs, likewise.
        kind: ``"error"``, ``"own error"``, ``"latency"``, or a mapping ``{node or module
            name: number}`` of your own (node names of the program drawn; module names, which
            stand for each of the module's calls, and call names such as ``"blk@1"``).
        rtol: the relative tolerance the errors are measured against (as for gs.verify).
        atol: the absolute tolerance the errors are measured against.
        repeat: latency: the timed runs (after one warm-up run); each node's median is kept.
        aggregate: a mapping's call values from its nodes' values: ``"max"``, ``"sum"``, or
            None (only the calls named get values). The kinds aggregate as they must.

    Returns:
        The :class:`OverlayValues`: a value per node drawn and per module call.

    Raises:
        RenderError: an unknown kind, a bad tolerance or value, or no inputs for a kind that
            runs the program.
        NotAProgramError: ``program`` is no program (a model: export it first).
        InputStructureError: ``args`` or ``kwargs`` not as every entry point reads them (a
            list where the tuple goes).
        UnknownModuleError: a name in the mapping the program does not have ("did you mean").
        CompareError: a program failed to run (the node where it did).

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.checks.overlay import overlay_values
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> ep = gs.export(model, (torch.randn(2, 4),))
        >>> given = overlay_values(ep, kind={"linear": 2.0, "1": 0.5})
        >>> given["linear"], given.calls["0"], given.calls["1"]
        (2.0, 2.0, 0.5)
    """
    rtol, atol = _tolerance("rtol", rtol), _tolerance("atol", atol)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise RenderError(f"overlay: repeat={repeat!r}: expected a positive int (timed runs)")
    if aggregate not in ("max", "sum", None):
        raise RenderError(f"overlay: aggregate={aggregate!r}: expected 'max', 'sum' or None")
    texts = _descriptions(rtol, atol, repeat)
    source = as_program(program, args, kwargs, verb="overlay")  # read as every entry point does
    target = _Target(source.ep, source.module, source.info, source.args, source.kwargs)
    if isinstance(kind, Mapping):
        nodes, calls = _given(target, kind, aggregate)
        return OverlayValues("values", "", texts["values"], nodes, calls, aggregate)
    choices = f"{', '.join(map(repr, KINDS))}, or a mapping {{node or module name: value}}"
    if not isinstance(kind, str):
        raise RenderError(f"overlay: kind: expected {choices}; got {a_type(kind)}")
    if kind not in KINDS:
        raise RenderError(
            f"overlay: unknown kind {kind!r}.{did_you_mean(kind, KINDS)} Choose {choices}."
        )
    if kind == "latency":
        args, kwargs = _inputs(target, kind)
        runnable = target.module if target.module is not None else runnable_original(target.ep)
        inline = {node: target.info.partitions[call].nodes for node, call in target.fused.items()}
        timed, seconds = _latency(runnable, args, kwargs, repeat, inline)
        if target.module is None:  # keyed by the program's own node names
            name_of = {node.name: name for name, node in original_nodes(target.ep).items()}
            timed = {name_of[n]: v for n, v in timed.items() if n in name_of}
        for node in target.graph.nodes:
            # the inputs, parameters, buffers and the output compute nothing: what a clock
            # read beside them measures is the clock's own time
            if node.op in ("placeholder", "output", "get_attr"):
                timed[node.name] = 0.0
        drawn, _ = target.drawn()
        order = {name: i for i, name in enumerate(drawn)}
        nodes = dict(sorted(timed.items(), key=lambda item: order.get(item[0], len(order))))
        nodes = {name: value for name, value in nodes.items() if name in order}
        calls = _aggregate(target.members(), nodes, "sum")
        return OverlayValues(
            kind, _LATENCY_UNIT, texts[kind], nodes, calls, "sum", forward_seconds=seconds
        )
    if target.module is None:
        nodes = _unswapped_errors(target.ep)
        description = texts["unswapped"]
    elif kind in ("grad error", "own grad error"):
        args, kwargs = _inputs(target, kind)
        found = grad_errors(target, args, kwargs, rtol, atol, kind == "own grad error", _ratio)
        drawn, _ = target.drawn()
        nodes = {name: found[name] for name in drawn if name in found}
        description = texts[kind]
    else:
        args, kwargs = _inputs(target, kind)
        found = _side_by_side(target, args, kwargs, rtol, atol, own=kind == "own error")
        drawn, _ = target.drawn()
        nodes = {name: found[name] for name in drawn if name in found}
        description = texts[kind]
    calls = _aggregate(target.members(), nodes, "max")
    return OverlayValues(
        kind, _TOLERANCE_UNIT, description, nodes, calls, "max", 1.0, rtol=rtol, atol=atol
    )
