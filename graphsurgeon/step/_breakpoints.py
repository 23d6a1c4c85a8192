"""Where running stops: :class:`Breakpoint`, the :class:`Breakpoints` of a stepper, the
conditions on values (a NaN or an Inf, a magnitude), and where they stop a run of one graph
(:func:`plan_stops`), also inside a swapped call run as one node (:func:`run_watched`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node
from torch.utils._python_dispatch import TorchDispatchMode

from ..checks._exec import NodeRunner
from ..errors import StepError
from ._layout import Layout
from ._summary import has_data, tensor_leaves

__all__ = [
    "Breakpoint",
    "Breakpoints",
    "StopPlan",
    "call_user",
    "conditions_met",
    "plan_stops",
    "run_watched",
]


@dataclass(frozen=True)
class Breakpoint:
    """A place or a condition where running stops.

    Attributes:
        kind: ``"node"`` (stop before the node runs), ``"enter"`` (stop before the first node
            of a module call), ``"leave"`` (stop right after its last node), or ``"condition"``
            (stop after a node whose value makes ``predicate`` true).
        target: the node name, or the module (an fqn: every call; ``"fqn@k"``: one call; a
            container such as nn.ModuleList: each call it covers); for a condition, its label.
        predicate: for a condition, called with each tensor the node produced.
    """

    kind: str
    target: str
    predicate: Callable[[torch.Tensor], bool] | None = field(default=None, repr=False)

    def __str__(self) -> str:
        if self.kind == "node":
            return f"break before node {self.target!r}"
        if self.kind == "enter":
            return f"break on entering {self.target!r}"
        if self.kind == "leave":
            return f"break on leaving {self.target!r}"
        return f"break when {self.target}"


def _nan_or_inf(t: torch.Tensor) -> bool:
    if not (t.is_floating_point() or t.is_complex()) or not has_data(t) or t.numel() == 0:
        return False
    # One reduction in the common case: a NaN or an Inf anywhere makes the sum non-finite.
    # A non-finite sum may also be an overflow of finite values, so that case looks closer.
    if math.isfinite(abs(t.sum().item())):
        return False
    return not bool(torch.isfinite(t).all())


def _has_nan(t: torch.Tensor) -> bool:
    if not (t.is_floating_point() or t.is_complex()) or not has_data(t) or t.numel() == 0:
        return False
    if not math.isnan(abs(t.sum().item())):  # a NaN anywhere makes the sum NaN
        return False
    return bool(torch.isnan(t).any())


class _MagnitudeOver:
    """Condition: some element's magnitude exceeds ``bound``. A class, so it prints its bound."""

    __slots__ = ("bound",)

    def __init__(self, bound: float):
        self.bound = bound

    def __call__(self, t: torch.Tensor) -> bool:
        if t.dtype == torch.bool or not has_data(t) or t.numel() == 0:
            return False
        return bool((t.abs() > self.bound).any())

    def __repr__(self) -> str:
        return f"_MagnitudeOver({self.bound!r})"


class Breakpoints:
    """The breakpoints of one :class:`Stepper`: ``st.breakpoints``.

    Add with :meth:`node`, :meth:`enter`, :meth:`leave`, :meth:`condition`, :meth:`nan_or_inf`,
    :meth:`nan`, :meth:`magnitude_over` (each returns the :class:`Breakpoint`, adding one twice keeps one);
    remove with :meth:`remove` or :meth:`clear`. Iterating gives them in the order added.
    """

    def __init__(self, layout: Layout, changed: Callable[[], None]):
        # the graph's names, to refuse a name when it is given; and what to tell when the
        # set changes (the stepper plans its stops again)
        self._layout = layout
        self._changed = changed
        self._items: list[Breakpoint] = []

    def _add(self, breakpoint: Breakpoint) -> Breakpoint:
        if breakpoint not in self._items:
            self._items.append(breakpoint)
            self._changed()
        return breakpoint

    def node(self, name: str) -> Breakpoint:
        """Stop before node ``name`` runs. ``"call/node"`` names a node inside a swapped or
        fused call (as the call's graph names it, see :meth:`Stepper.step_into`): running
        reaches it by entering the call."""
        if self._layout.inner_target(name) is None:
            self._layout.node(name)
        return self._add(Breakpoint("node", name))

    def enter(self, module: str) -> Breakpoint:
        """Stop before the first node of each call of ``module`` (or of call ``"fqn@k"``)."""
        self._layout.calls_named(module)
        return self._add(Breakpoint("enter", module))

    def leave(self, module: str) -> Breakpoint:
        """Stop right after the last node of each call of ``module`` (or of call ``"fqn@k"``)."""
        self._layout.calls_named(module)
        return self._add(Breakpoint("leave", module))

    def condition(
        self, predicate: Callable[[torch.Tensor], bool], label: str | None = None
    ) -> Breakpoint:
        """Stop after a node when ``predicate(tensor)`` is true for a tensor it produced.

        The predicate sees each tensor of the node's value (a node returning a tuple is
        checked leaf by leaf); non-tensor values are not checked. Checking costs a call per
        node, so runs with a condition are slower than without.
        """
        if not callable(predicate):
            raise StepError(
                f"a condition breakpoint needs a function tensor -> bool, got "
                f"{type(predicate).__name__}"
            )
        text = label or getattr(predicate, "__name__", None) or repr(predicate)
        return self._add(Breakpoint("condition", text, predicate))

    def nan_or_inf(self) -> Breakpoint:
        """Stop after the first node whose value holds a NaN or an Inf."""
        return self._add(Breakpoint("condition", "a NaN or Inf appears", _nan_or_inf))

    def nan(self) -> Breakpoint:
        """Stop after the first node whose value holds a NaN (an Inf, e.g. an attention mask
        filled with ``-inf``, does not stop it)."""
        return self._add(Breakpoint("condition", "a NaN appears", _has_nan))

    def magnitude_over(self, bound: float) -> Breakpoint:
        """Stop after the first node whose value has an element with ``|x| > bound``."""
        if not isinstance(bound, (int, float)) or isinstance(bound, bool) or math.isnan(bound):
            raise StepError(f"magnitude_over: expected a number, got {bound!r}")
        return self._add(Breakpoint("condition", f"|value| > {bound:g}", _MagnitudeOver(bound)))

    def remove(self, breakpoint: Breakpoint) -> None:
        """Remove one breakpoint (as returned when it was added)."""
        if breakpoint not in self._items:
            listed = ", ".join(str(b) for b in self._items) or "none"
            raise StepError(f"{breakpoint} is not set (set: {listed})")
        self._items.remove(breakpoint)
        self._changed()

    def clear(self) -> None:
        """Remove every breakpoint."""
        self._items.clear()
        self._changed()

    def __iter__(self) -> Iterator[Breakpoint]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, breakpoint: object) -> bool:
        return breakpoint in self._items

    def __str__(self) -> str:
        if not self._items:
            return "no breakpoints"
        return "\n".join(f"{i}: {b}" for i, b in enumerate(self._items))

    def __repr__(self) -> str:
        return f"<Breakpoints: {len(self._items)}>"


def call_user(function: Callable, argument: Any, what: str, node: Node) -> bool:
    """``function(argument)`` of the user's (a condition, a ``run_to`` predicate) as a bool; what
    it raises is said as a :class:`StepError` naming the node it was called for."""
    try:
        return bool(function(argument))
    except Exception as error:
        raise StepError(
            f"the {what} raised {type(error).__name__}: {error} (at node {node.name!r})"
        ) from error


def conditions_met(
    conditions: tuple[Breakpoint, ...], value: Any, node: Node
) -> tuple[Breakpoint, ...]:
    """The conditions that hold for a tensor of ``value`` (a node's value, leaf by leaf)."""
    tensors = tensor_leaves(value)
    if not tensors:
        return ()
    return tuple(
        c for c in conditions if any(call_user(c.predicate, t, str(c), node) for t in tensors)
    )


class _Watch(TorchDispatchMode):
    """While a swapped call runs as one node: checks the value of every op its replacement
    runs against the conditions, and remembers the first that holds (the call runs on;
    :func:`run_watched` then undoes it, to run it again from inside)."""

    def __init__(self, conditions: tuple[Breakpoint, ...], node: Node):
        super().__init__()
        self.conditions = conditions
        self.node = node
        self.fired: tuple[tuple[Breakpoint, ...], str] | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.fired is None:
            fired = conditions_met(self.conditions, out, self.node)
            if fired:
                self.fired = (fired, str(func))
        return out


def run_watched(
    runner: NodeRunner, node: Node, conditions: tuple[Breakpoint, ...]
) -> tuple[Any, tuple[tuple[Breakpoint, ...], str] | None]:
    """Run the swapped call ``node`` as one node, checking every op its replacement runs
    against ``conditions``. Nothing held: ``(its value, None)`` (the value is not kept in the
    runner's env). One held: the call is undone (the buffers it wrote in this run restored), so
    that it can run again from inside, and ``(None, (the conditions, the op))``."""
    state = runner.state_of(node)
    saved = {name: tensor.clone() for name, tensor in state.items()}
    watch = _Watch(conditions, node)
    with watch:
        value = runner.run_node(node)
    if watch.fired is None:
        return value, None
    with torch.no_grad():
        for name, tensor in state.items():
            tensor.copy_(saved[name])
    return None, watch.fired


@dataclass(frozen=True)
class StopPlan:
    """Where the breakpoints stop a run of one graph, planned when they change.

    Attributes:
        at: position -> the breakpoints that stop a run before the node there.
        positions: those positions, sorted (a move finds the next by bisection).
        conditions: the condition breakpoints, checked after every node.
        inner: swapped or fused call -> its ``"call/node"`` breakpoints (set from outside).
        calls: the positions of the calls a move must run from inside (such breakpoints, or
            conditions, which watch every op), sorted.
    """

    at: dict[int, list[Breakpoint]] = field(default_factory=dict)
    positions: list[int] = field(default_factory=list)
    conditions: tuple[Breakpoint, ...] = ()
    inner: dict[str, list[Breakpoint]] = field(default_factory=dict)
    calls: list[int] = field(default_factory=list)


def plan_stops(breakpoints: Breakpoints, layout: Layout) -> StopPlan:
    """Where ``breakpoints`` stop a run of ``layout``'s graph (see :class:`StopPlan`)."""
    at: dict[int, list[Breakpoint]] = {}
    conditions = []
    inner: dict[str, list[Breakpoint]] = {}
    for breakpoint in breakpoints:
        if breakpoint.kind == "condition":
            conditions.append(breakpoint)
            continue
        if breakpoint.kind == "node" and breakpoint.target not in layout.by_name:
            call, _ = layout.inner_target(breakpoint.target)
            inner.setdefault(call, []).append(breakpoint)
            continue
        if breakpoint.kind == "node":
            positions = [layout.position[layout.by_name[breakpoint.target]]]
        else:
            calls = layout.calls_named(breakpoint.target)
            if breakpoint.kind == "enter":
                positions = [layout.entry(c) for c in calls]
            else:
                positions = [layout.span(c)[1] + 1 for c in calls]
        for position in positions:
            at.setdefault(position, []).append(breakpoint)
    watched = layout.calls_at if conditions else {}
    calls = sorted({*watched, *(layout.call_position[c] for c in inner)})
    return StopPlan(at, sorted(at), tuple(conditions), inner, calls)
