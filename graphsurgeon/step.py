"""Stepper: run a program node by node, like a debugger, and look at every value on the way.

The cursor walks the graph the user sees: a :func:`graphsurgeon.swap` result, the original
program's unlifted graph (for an ExportedProgram: the graph of ``gs.swap(ep, {})``, with the
node names of ``ep.graph``), any other ``torch.fx.GraphModule``, or the ``.module`` of an
object that has one. Nodes run through ``torch.fx.Interpreter.run_node``, so the stepper sees
the true aten ops even where the generated code calls faster bindings, and a swapped call runs
its replacement eagerly, as one node.

Which module call a node belongs to (``"fqn"``, or ``"fqn@k"`` for the k-th repeated call) is
read from the one node -> call index of :mod:`graphsurgeon.partition`, which the pictures read
too: the stepper and the picture always agree on it.

Running to the end costs what ``torch.fx.Interpreter.run`` costs: with no conditional
breakpoint the stepper runs a plain loop over a precomputed node list up to the next
breakpoint position, found by bisection, with nothing allocated per node.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import GraphModule, Node
from torch.utils._python_dispatch import TorchDispatchMode

from . import _meta
from ._meta import describe_value
from ._program import as_inputs, as_program
from .checks._exec import PrivateStateInterpreter, bind_inputs, clone_inputs, runnable_original
from .errors import (
    AlreadyRanError,
    NodeError,
    StepError,
    UnknownModuleError,
    UnknownNameError,
    UnknownNodeError,
    unknown_name,
)
from .export import quiet_export
from .partition import call_index, program_index, split_call_name
from .rewrite import swap_info

__all__ = [
    "Breakpoint",
    "Breakpoints",
    "NodeError",
    "StepError",
    "StepResult",
    "Stepper",
    "Summary",
    "UnknownNodeError",
]


# -- summaries ------------------------------------------------------------------------------


class _TensorText:
    """Stands for a tensor inside a structure shown as text: ``Tensor[2, 4] float32``."""

    __slots__ = ("text",)

    def __init__(self, tensor: torch.Tensor):
        self.text = f"Tensor{list(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"

    def __repr__(self) -> str:
        return self.text


_MAX_TEXT = 200
_MISSING = object()


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list, dict)):
        return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]
    return []


def _has_data(t: torch.Tensor) -> bool:
    # Fake and meta tensors have a shape and a dtype but no values to look at.
    return t.device.type != "meta" and not isinstance(t, FakeTensor)


@dataclass(frozen=True)
class Summary:
    """What a value looks like: for a tensor its shape, dtype, device, statistics and NaN/Inf
    counts; for anything else the value itself, as text (tensors inside shown by shape).

    ``min``, ``max``, ``mean`` and ``std`` (population, ``correction=0``) are over the finite
    elements, so one Inf does not hide the rest; ``nan`` and ``inf`` count the others. They are
    None when there is nothing to measure (no finite element, a meta tensor, a complex dtype).

    Example:
        >>> import torch
        >>> from graphsurgeon.step import Summary
        >>> print(Summary.of(torch.tensor([1.0, 3.0, float("nan")]), name="x"))
        x: Tensor[3] float32 cpu  min 1  max 3  mean 2  std 1  nan 1  inf 0
        >>> print(Summary.of((torch.zeros(2, 2), 4), name="pair"))
        pair: tuple (Tensor[2, 2] float32, 4)
    """

    name: str
    type: str
    op: str = ""
    module: str = ""
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    device: str | None = None
    numel: int | None = None
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    nan: int = 0
    inf: int = 0
    text: str = ""
    measured: bool = True  # False: a tensor whose values were not looked at (meta, complex...)

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None

    @property
    def finite(self) -> bool:
        """No NaN and no Inf anywhere in the value."""
        return self.nan == 0 and self.inf == 0

    @classmethod
    def of(cls, value: Any, name: str = "", op: str = "", module: str = "") -> Summary:
        """Summarize ``value`` (computed now; the value itself is not kept)."""
        if isinstance(value, torch.Tensor):
            return _tensor_summary(value, name, op, module)
        tensors = _tensor_leaves(value)
        nan = inf = 0
        for tensor in tensors:
            if _has_data(tensor) and (tensor.is_floating_point() or tensor.is_complex()):
                nan += int(torch.isnan(tensor).sum())
                inf += int(torch.isinf(tensor).sum())
        shown = (
            pytree.tree_map(lambda v: _TensorText(v) if isinstance(v, torch.Tensor) else v, value)
            if tensors
            else value
        )
        text = repr(shown)
        if len(text) > _MAX_TEXT:
            text = text[: _MAX_TEXT - 3] + "..."
        return cls(
            name=name, type=type(value).__name__, op=op, module=module, nan=nan, inf=inf, text=text
        )

    def __str__(self) -> str:
        head = f"{self.name}: " if self.name else ""
        if not self.is_tensor:
            return f"{head}{self.type} {self.text}"
        parts = [f"{head}Tensor{list(self.shape)} {self.dtype} {self.device}"]
        if self.min is not None:
            parts.append(
                f"min {_g(self.min)}  max {_g(self.max)}  mean {_g(self.mean)}  std {_g(self.std)}"
            )
        if not self.measured:
            parts.append("no values" if self.device == "meta" else "values not measured")
        elif self.numel:
            parts.append(f"nan {self.nan}  inf {self.inf}")
        return "  ".join(parts)

    def row(self) -> list[str]:
        """The cells of this summary in :func:`summary_table`: name, value, statistics."""
        if not self.is_tensor:
            return [self.name, f"{self.type} {self.text}", "", "", "", "", ""]
        value = f"{self.dtype}{list(self.shape)} {self.device}"
        counts = f"{self.nan} / {self.inf}" if self.numel and self.measured else ""
        if not self.measured:
            counts = "no values" if self.device == "meta" else "not measured"
        return [self.name, value, _g(self.min), _g(self.max), _g(self.mean), _g(self.std), counts]

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from . import display

        return display.bundle(summary_table([self]), str(self), include, exclude)


def summary_table(summaries: list[Summary]) -> str:
    """Summaries as one HTML table; a value holding a NaN or an Inf is marked."""
    from . import display as d

    rows = []
    for summary in summaries:
        cells = [d.escape(c) for c in summary.row()]
        if not summary.finite:
            cells[-1] = d.badge(summary.row()[-1] or "nan/inf", "bad")
        rows.append(cells)
    headers = ["node", "value", "min", "max", "mean", "std", "nan / inf"]
    return d.table(headers, rows, numeric=(2, 3, 4, 5), raw=range(7))


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _tensor_summary(value: torch.Tensor, name: str, op: str, module: str) -> Summary:
    t = value.detach()
    n = t.numel()
    basics = {
        "name": name,
        "type": "Tensor",
        "op": op,
        "module": module,
        "shape": tuple(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "device": str(t.device),
        "numel": n,
    }
    if n == 0:
        return Summary(**basics)
    if not _has_data(t) or t.is_complex() or t.is_quantized or t.is_sparse:
        return Summary(**basics, measured=False)
    # Memory-light mode summarizes every value, so the common case is one pass of cheap
    # reductions in float64 and one sync: a finite sum, minimum and maximum mean no NaN and no
    # Inf anywhere. float64 keeps the sum of squares exact enough for the spread.
    flat = t.reshape(-1).double()
    low, high = torch.aminmax(flat)
    stats = torch.stack((flat.sum(), low, high, torch.dot(flat, flat))).tolist()
    nan = inf = 0
    count = n
    if not (math.isfinite(stats[0]) and math.isfinite(stats[1]) and math.isfinite(stats[2])):
        finite = torch.isfinite(flat)
        count = int(finite.sum())
        nan = int(torch.isnan(flat).sum())
        inf = n - count - nan
        if count == 0:
            return Summary(**basics, nan=nan, inf=inf)
        flat = flat[finite]
        low, high = torch.aminmax(flat)
        stats = torch.stack((flat.sum(), low, high, torch.dot(flat, flat))).tolist()
    total, low_value, high_value, squares = stats
    mean = total / count
    std = math.sqrt(max(squares / count - mean * mean, 0.0))
    return Summary(**basics, min=low_value, max=high_value, mean=mean, std=std, nan=nan, inf=inf)


# -- breakpoints ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Breakpoint:
    """A place or a condition where running stops.

    Attributes:
        kind: ``"node"`` (stop before the node runs), ``"enter"`` (stop before the first node
            of a module call), ``"leave"`` (stop right after its last node), or ``"condition"``
            (stop after a node whose value makes ``predicate`` true).
        target: the node name, or the module (an fqn: every call; ``"fqn@k"``: one call);
            for a condition, its label.
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
    if not (t.is_floating_point() or t.is_complex()) or not _has_data(t) or t.numel() == 0:
        return False
    # One reduction in the common case: a NaN or an Inf anywhere makes the sum non-finite.
    # A non-finite sum may also be an overflow of finite values, so that case looks closer.
    if math.isfinite(abs(t.sum().item())):
        return False
    return not bool(torch.isfinite(t).all())


def _has_nan(t: torch.Tensor) -> bool:
    if not (t.is_floating_point() or t.is_complex()) or not _has_data(t) or t.numel() == 0:
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
        if t.dtype == torch.bool or not _has_data(t) or t.numel() == 0:
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

    def __init__(self, stepper: Stepper):
        self._stepper = stepper
        self._items: list[Breakpoint] = []

    def _add(self, breakpoint: Breakpoint) -> Breakpoint:
        if breakpoint not in self._items:
            self._items.append(breakpoint)
            self._stepper._breakpoints_changed()
        return breakpoint

    def node(self, name: str) -> Breakpoint:
        """Stop before node ``name`` runs. ``"call/node"`` names a node inside a swapped or
        fused call (as the call's graph names it, see :meth:`Stepper.step_into`): running
        reaches it by entering the call."""
        if self._stepper._layout.inner_target(name) is None:
            self._stepper._node(name)
        return self._add(Breakpoint("node", name))

    def enter(self, module: str) -> Breakpoint:
        """Stop before the first node of each call of ``module`` (or of call ``"fqn@k"``)."""
        self._stepper._calls_named(module)
        return self._add(Breakpoint("enter", module))

    def leave(self, module: str) -> Breakpoint:
        """Stop right after the last node of each call of ``module`` (or of call ``"fqn@k"``)."""
        self._stepper._calls_named(module)
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
        self._stepper._breakpoints_changed()

    def clear(self) -> None:
        """Remove every breakpoint."""
        self._items.clear()
        self._stepper._breakpoints_changed()

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


class _Watch(TorchDispatchMode):
    """While a swapped call runs as one node: checks the value of every op its replacement
    runs against the stepper's conditions, and remembers the first that holds (the call runs
    on; :meth:`Stepper._watch` then runs it again from inside)."""

    def __init__(self, conditions: tuple[Breakpoint, ...], stepper: Stepper, node: Node):
        super().__init__()
        self.conditions = conditions
        self.stepper = stepper
        self.node = node
        self.fired: tuple[tuple[Breakpoint, ...], str] | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.fired is None:
            tensors = _tensor_leaves(out)
            fired = tuple(
                c
                for c in self.conditions
                if any(self.stepper._call_user(c.predicate, t, str(c), self.node) for t in tensors)
            )
            if fired:
                self.fired = (fired, str(func))
        return out


# -- results --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """What one move of the stepper did.

    Attributes:
        ran: the names of the nodes that ran, in order.
        position: where the stepper is now (the number of nodes run so far).
        reason: ``"step"`` (moved as far as asked), ``"target"`` (``run_to`` reached its
            target), ``"breakpoint"``, or ``"end"`` (the program finished).
        breakpoints: the breakpoints that stopped it (empty unless ``reason == "breakpoint"``).
        trigger: for a condition breakpoint, the node whose value met it (the last one run).
        note: what the stepper has to say about the move, or None: why ``step_into`` stepped
            over a call instead of entering it, or which call a move entered or left.
    """

    ran: tuple[str, ...]
    position: int
    reason: str
    breakpoints: tuple[Breakpoint, ...] = ()
    trigger: str | None = None
    note: str | None = None

    @property
    def last(self) -> str | None:
        """The last node that ran, or None when nothing ran."""
        return self.ran[-1] if self.ran else None

    def __str__(self) -> str:
        n = len(self.ran)
        if n == 0:
            text = "ran nothing"
        elif n <= 3:
            text = "ran " + ", ".join(self.ran)
        else:
            text = f"ran {n} nodes ({self.ran[0]} .. {self.ran[-1]})"
        if self.reason == "breakpoint":
            why = "; ".join(str(b) for b in self.breakpoints)
            if self.trigger is not None:
                why += f" (node {self.trigger!r})"
            return f"{text}; stopped: {why}"
        if self.reason == "end":
            text = f"{text}; the program finished"
        return f"{text} ({self.note})" if self.note else text

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from . import display as d

        kind = {"breakpoint": "warn", "end": "ok"}.get(self.reason, "info")
        body = f"<div>{d.badge(self.reason, kind)} {d.escape(str(self))}</div>"
        if len(self.ran) > 3:
            body += d.details(f"{len(self.ran)} nodes ran", d.names(self.ran))
        return d.bundle(body, str(self), include, exclude)


# -- the graph's layout ---------------------------------------------------------------------


def _op_text(node: Node) -> str:
    """What a node runs, as every view writes it: ``aten.div.Tensor(other=8.0)``."""
    if node.op in ("placeholder", "output"):
        return node.op
    weights = {n.name for n in node.all_input_nodes if n.op in ("get_attr", "placeholder")}
    return _meta.node_call_text(node, "full", weights)


def _next_text(node: Node) -> str:
    """The node about to run, every argument of its op written out (those left at their
    default too: ``is_causal=False``), tensors by their node names: the full form, for the
    one node a stepper's user is looking at."""
    if node.op != "call_function":
        return _op_text(node)
    arguments = _meta.arguments_text(node, "full")
    name = _meta.op_text(node, "full")
    return f"{name}({arguments})" if arguments else name


class _Layout:
    """Everything about the graph that stepping needs, computed once per stepper."""

    def __init__(self, gm: GraphModule, depth: int = 0):
        nodes = list(gm.graph.nodes)
        self.nodes = nodes
        self.names = [n.name for n in nodes]
        self.by_name = {n.name: n for n in nodes}
        self.position = {n: i for i, n in enumerate(nodes)}
        info = swap_info(gm)
        swapped_types = {}
        if info is not None:
            swapped_types = {c: type(m).__name__ for c, m in info.calls.items()}
        self.swapped = swapped_types
        # the module calls enclosing each node, outermost first: the one index every view reads
        # (a fused call's graph keeps the program's module stacks: ``depth`` calls around it
        # are the call itself and its parents, which its stepper does not step through)
        chains = call_index(gm).chains
        own = [chains[node.name][depth:] for node in nodes]
        self.stacks: list[tuple[str, ...]] = own
        self.members: dict[str, list[int]] = {}
        for i, calls in enumerate(self.stacks):
            for call in calls:
                self.members.setdefault(call, []).append(i)
        self.fqn_calls: dict[str, list[str]] = {}
        for call in self.members:
            fqn, _ = split_call_name(call)
            self.fqn_calls.setdefault(fqn, []).append(call)
        self._op_texts: dict[Node, str] = {}
        # where moves stop: nodes that compute (ops, swapped and fused calls), never the glue
        # around them, inputs, state or checks (the one rule the pictures draw by)
        self.stops: list[int] = [i for i, node in enumerate(nodes) if _meta.computes(node)]
        # the swapped and fused calls, which a stepper can enter: position -> call name
        self.calls_at: dict[int, str] = {
            i: node.meta.get(_meta.FUSED) or node.meta[_meta.SWAPPED]
            for i, node in enumerate(nodes)
            if node.op == "call_module" and (_meta.FUSED in node.meta or _meta.SWAPPED in node.meta)
        }
        self.call_position: dict[str, int] = {call: i for i, call in self.calls_at.items()}
        for i, call in self.calls_at.items():  # a region's call is no module's: its node alone
            if call not in self.members:
                self.members[call] = [i]
                self.fqn_calls.setdefault(call, [call])
        self.program_fqns: set[str] = set()
        # the program's index, where names are read as every entry point reads them
        self.index = None
        if info is not None:
            self.index = program_index(info.program)
            self.program_fqns = set(self.index.fqns)
        # the position after which each node's value is no longer needed
        last = list(range(len(nodes)))
        for i, node in enumerate(nodes):
            for arg in node.all_input_nodes:
                j = self.position[arg]
                last[j] = max(last[j], i)
        self.last_use = last
        self.frees: list[tuple[Node, ...]] = [() for _ in nodes]
        pending: dict[int, list[Node]] = {}
        for j, i in enumerate(last):
            # Parameters and buffers (get_attr) stay: the module holds them anyway, so dropping
            # them would free nothing and only cost a summary each.
            if nodes[j].op not in ("output", "get_attr"):
                pending.setdefault(i, []).append(nodes[j])
        for i, dead in pending.items():
            self.frees[i] = tuple(dead)

    def span(self, call: str) -> tuple[int, int]:
        members = self.members[call]
        return members[0], members[-1]

    def entry(self, call: str) -> int:
        """Where a move into ``call`` stops: its first op (its first node when it has none;
        the weights it reads come before)."""
        start, end = self.span(call)
        first = self.next_stop(start)
        return first if first <= end else start

    def op_text(self, node: Node) -> str:
        """:func:`_op_text` of ``node``, written once per stepper (a memory-light run writes
        one summary per node, every run)."""
        text = self._op_texts.get(node)
        if text is None:
            text = self._op_texts[node] = _op_text(node)
        return text

    def next_stop(self, position: int) -> int:
        """The first stop at or after ``position`` (the end when none is left)."""
        k = bisect.bisect_left(self.stops, position)
        return self.stops[k] if k < len(self.stops) else len(self.nodes)

    def stop_after(self, position: int, n: int) -> int:
        """The ``n``-th stop after ``position`` (the end when fewer are left)."""
        k = bisect.bisect_right(self.stops, position) + n - 1
        return self.stops[k] if k < len(self.stops) else len(self.nodes)

    def inner_target(self, name: str) -> tuple[str, str] | None:
        """``"call/node"``, a node inside a swapped or fused call, as ``(call, node)``."""
        if not isinstance(name, str) or name in self.by_name:
            return None
        for call in self.call_position:
            if name.startswith(call + "/") and len(name) > len(call) + 1:
                return call, name[len(call) + 1 :]
        return None


# -- the stepper ----------------------------------------------------------------------------


class _EnvView(Mapping):
    """``st.env``: node name -> value, for the nodes that ran and whose values are kept."""

    __slots__ = ("_stepper",)

    def __init__(self, stepper: Stepper):
        self._stepper = stepper

    def __getitem__(self, name: str) -> Any:
        stepper = self._stepper
        node = stepper._node(name)
        try:
            return stepper._env[node]
        except KeyError:
            raise UnknownNodeError(stepper._why_no_value(node)) from None

    def __contains__(self, name: object) -> bool:
        node = self._stepper._layout.by_name.get(name) if isinstance(name, str) else None
        return node is not None and node in self._stepper._env

    def __iter__(self) -> Iterator[str]:
        return iter([node.name for node in self._stepper._env])

    def __len__(self) -> int:
        return len(self._stepper._env)

    def __repr__(self) -> str:
        names = [node.name for node in self._stepper._env]
        shown = ", ".join(names[-5:])
        more = f"{len(names) - 5} more, then " if len(names) > 5 else ""
        plural = "" if len(names) == 1 else "s"
        return f"<env: {len(names)} value{plural} ({more}{shown})>"


def _resolve_program(program: Any, args: tuple, kwargs: dict) -> tuple[GraphModule, tuple, dict]:
    """The GraphModule to step (a swap or fuse result, a Surgery's current module, the runnable
    original of an ExportedProgram; any other GraphModule as it is) and the inputs to step it
    on, read as every entry point reads them (none given: a Surgery's example inputs)."""
    if isinstance(program, GraphModule) and swap_info(program) is None:
        # a GraphModule made elsewhere: its own graph, stepped as it is
        return (program, *as_inputs(args, kwargs, verb="Stepper"))
    given = bool(args or kwargs)
    source = as_program(program, args if given else None, kwargs if given else None, verb="Stepper")
    gm = source.module if source.module is not None else runnable_original(source.ep)
    if source.args is None:
        return gm, (), {}  # none given or kept: binding says what the program takes
    return gm, source.args, dict(source.kwargs or {})


@dataclass(frozen=True)
class _Frame:
    """A call entered with ``step_into``: a stepper of its own over the call's graph."""

    stepper: Stepper
    call: str  # the call name, "layers.1.attn"
    node: Node  # the call_module node of the outer graph whose value the call computes
    kind: str  # "fused" or "swapped"
    prefix: tuple[str, ...]  # the module calls around that node in the outer graph

    def outer_stack(self, inner: tuple[str, ...]) -> tuple[str, ...]:
        """The stack of a node of the call's graph, seen from the program."""
        if self.kind == "fused":  # the program's own module calls, below the call
            return self.prefix + inner
        # the replacement's own modules, named from where it is installed
        fqn = split_call_name(self.call)[0]
        return self.prefix + tuple(f"{fqn}.{name}" for name in inner)


class Stepper:
    """A cursor over a program's graph: run it node by node, stop where you like, look around.

    ``program`` is an ExportedProgram (its unlifted graph is stepped), a GraphModule (from
    ``gs.swap``, or any other), or an object with a ``.module`` GraphModule; ``args`` and
    ``kwargs`` are the inputs, as for calling the program (keywords matched by name; none
    given: a Surgery's example inputs). Each run gets its own copy of the inputs, so
    :meth:`reset` replays exactly the same run.

    Moving: :meth:`step`, :meth:`step_over`, :meth:`step_out`, :meth:`run_to`,
    :meth:`continue_`, :meth:`step_into`, :meth:`reset`. Every move stops at breakpoints
    (``st.breakpoints``), except at the position it starts from, and returns a
    :class:`StepResult`. Moves stop only before nodes that compute (ops, swapped and fused
    calls): inputs, weights, the glue a swap adds around a call, ``getitem`` and input checks
    run on the way, never as stops (``run_to`` a node by name reaches any node).

    Inside calls: :meth:`step_into` enters a swapped call (its replacement's graph, exported on
    the inputs it receives) or a fused one. ``"call/node"`` names a node inside such a call,
    for ``run_to`` and ``breakpoints.node``: running enters the call to reach it. Conditions
    (``breakpoints.nan_or_inf()`` and the like) watch every op inside swapped and fused calls
    too, and stop inside at the op that made the value.

    Looking: ``current`` (the node that runs next; None when done), ``position`` / ``total``,
    ``stack`` (the module calls around ``current``), ``env`` (values by node name),
    :meth:`summary`, ``done``, ``output``, ``error``.

    Memory: by default every value stays in ``env``. With ``st.memory_light = True`` a value is
    dropped as soon as no later node needs it, after its :class:`Summary` is taken; ``env``
    then holds only the values later nodes still need, the parameters and buffers (``get_attr``
    nodes: the module holds them anyway) and, at the end, the output, while :meth:`summary`
    answers for every node that ran.

    Errors: when a node raises, the stepper stops *at* that node (it has not run), keeps the
    error in ``st.error`` and raises it as a :class:`NodeError` naming the node and its module
    call. Everything stays inspectable; fix the cause and step again, or :meth:`reset`.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.step import Stepper
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> x = torch.tensor([[1.0, -1.0]])
        >>> st = Stepper(gs.export(model, (x,)), x)
        >>> st.total, st.current.op
        (8, 'placeholder')
        >>> st.run_to("1").ran[1:]   # to the first node of module "1", the ReLU
        ('input_guard_0', 'check_inputs', 'p_0_weight', 'p_0_bias', 'linear')
        >>> st.current.name, st.stack
        ('relu', ('1',))
        >>> st.env["linear"].shape
        torch.Size([1, 2])
        >>> st.continue_().reason
        'end'
        >>> torch.equal(st.output, model(x))
        True
    """

    def __init__(self, program: Any, /, *args: Any, **kwargs: Any):
        gm, args, kwargs = _resolve_program(program, args, kwargs)
        # a copy of its own: the caller may change those tensors later, reset() replays this run
        self._setup(gm, clone_inputs(bind_inputs(gm, args, kwargs, error=StepError)), own=True)

    def _setup(self, gm: GraphModule, inputs: list[Any], own: bool, depth: int = 0) -> None:
        self._gm = gm
        self._layout = _Layout(gm, depth)
        self._inputs = inputs
        # A stepper of a call entered with step_into runs on the very values the call received
        # (a call may write its inputs in place); a user's stepper runs on copies of its own.
        self._own_inputs = own
        self._frame: _Frame | None = None
        self._exports: dict[tuple[str, str], Any] = {}
        # A graph that writes buffers (BatchNorm statistics), its own or its replacements',
        # runs on private copies of them: stepping leaves the program and every module as they
        # were, and every reset() replays the same run.
        private = PrivateStateInterpreter(gm, garbage_collect_values=False)
        stateful = private.private or private.private_buffers
        self._interpreter = (
            private if stateful else torch.fx.Interpreter(gm, garbage_collect_values=False)
        )
        self._total = len(self._layout.nodes)
        self._breakpoints = Breakpoints(self)
        self._stops: dict[int, list[Breakpoint]] = {}
        self._stop_positions: list[int] = []
        self._conditions: tuple[Breakpoint, ...] = ()
        # call -> node breakpoints inside it ("call/node"); and the positions of the calls a
        # move must run from inside (such breakpoints, or conditions that watch every op)
        self._inner_breaks: dict[str, list[Breakpoint]] = {}
        self._call_stops: list[int] = []
        self._light = False
        self.reset()

    # -- state ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Back to the start, with fresh copies of the inputs. Breakpoints are kept; a call
        entered with :meth:`step_into` is left."""
        self._frame = None
        self._env: dict[Node, Any] = {}
        self._summaries: dict[Node, Summary] = {}
        self._pos = 0
        self._output: Any = None
        self._error: NodeError | None = None
        self._interpreter.env = self._env
        inputs = clone_inputs(self._inputs) if self._own_inputs else list(self._inputs)
        self._interpreter.args_iter = iter(inputs)
        if isinstance(self._interpreter, PrivateStateInterpreter):
            self._interpreter.renew_state()

    @property
    def graph_module(self) -> GraphModule:
        """The GraphModule being stepped."""
        return self._gm

    @property
    def breakpoints(self) -> Breakpoints:
        """Where running stops: add, remove and list them (see :class:`Breakpoints`)."""
        return self._breakpoints

    @property
    def current(self) -> Node | None:
        """The node that runs next (a ``torch.fx.Node``), or None when the program is done.
        Inside a call entered with :meth:`step_into`: the call's next node."""
        if self._frame is not None:
            return self._frame.stepper.current
        return self._layout.nodes[self._pos] if self._pos < self._total else None

    @property
    def position(self) -> int:
        """How many nodes have run: the position of ``current`` in graph order (inside an
        entered call: in the call's graph)."""
        if self._frame is not None:
            return self._frame.stepper.position
        return self._pos

    @property
    def total(self) -> int:
        """The number of nodes in the graph (placeholders and the output node included);
        inside an entered call, in the call's graph."""
        if self._frame is not None:
            return self._frame.stepper.total
        return self._total

    @property
    def frames(self) -> tuple[str, ...]:
        """The fused or swapped calls entered with :meth:`step_into`, outermost first; ``()``
        in the program's own graph."""
        frames: list[str] = []
        stepper = self
        while stepper._frame is not None:
            frames.append(stepper._frame.call)
            stepper = stepper._frame.stepper
        return tuple(frames)

    @property
    def call_graph(self) -> GraphModule | None:
        """The graph being stepped in the innermost entered call (a swapped call: its
        replacement as exported on the inputs it received; a fused call: the program's own
        nodes), or None in the program's own graph. Its node names are those ``current``,
        ``env`` and ``"call/node"`` use inside the call."""
        active = self._active()
        return active._gm if active is not self else None

    @property
    def done(self) -> bool:
        return self._pos >= self._total

    @property
    def output(self) -> Any:
        """What the program returned, once it is done."""
        if not self.done:
            raise StepError(
                f"the program has not finished (at {self._pos}/{self._total}); "
                "continue_() runs it to the end"
            )
        return self._output

    @property
    def error(self) -> NodeError | None:
        """The error of the node the stepper is stopped at, if it raised; else None."""
        return self._active()._error

    @property
    def env(self) -> Mapping[str, Any]:
        """Read-only: node name -> value, for the nodes that ran and whose values are kept
        (inside a call entered with :meth:`step_into`: the call's values)."""
        return _EnvView(self._active())

    @property
    def stack(self) -> tuple[str, ...]:
        """The module calls enclosing ``current``, outermost first (``()`` at the top level).
        Inside an entered call it continues below the call: ``("layers.1", "layers.1.attn",
        "layers.1.attn.q")``."""
        if self._frame is not None:
            return self._frame.outer_stack(self._frame.stepper.stack)
        if self._pos >= self._total:
            return ()
        return self._layout.stacks[self._pos]

    @property
    def memory_light(self) -> bool:
        """Whether values are dropped once no later node needs them (summaries are kept)."""
        return self._light

    @memory_light.setter
    def memory_light(self, on: bool) -> None:
        if self._frame is not None:
            self._frame.stepper.memory_light = on
        self._light = bool(on)
        if self._light:  # drop what is already dead
            last_use = self._layout.last_use
            position = self._layout.position
            for node in [n for n in self._env if last_use[position[n]] < self._pos]:
                if node.op not in ("output", "get_attr"):
                    self._retire(node)

    def module_of(self, name: str) -> str:
        """The innermost module call node ``name`` belongs to ('' for the top level)."""
        stack = self._layout.stacks[self._layout.position[self._node(name)]]
        return stack[-1] if stack else ""

    def nodes_of(self, module: str) -> tuple[str, ...]:
        """The names of the nodes of ``module`` (every call of an fqn, or one ``"fqn@k"``)."""
        positions = sorted(
            {i for call in self._calls_named(module) for i in self._layout.members[call]}
        )
        return tuple(self._layout.names[i] for i in positions)

    def summary(self, name: str) -> Summary:
        """The :class:`Summary` of node ``name``'s value (it must have run). Inside an entered
        call, the call's nodes are looked up first, then the program's."""
        inner = self._frame.stepper if self._frame is not None else None
        if inner is not None and (inner._frame is not None or name in inner._layout.by_name):
            return inner.summary(name)
        node = self._node(name)
        if node in self._env:
            return self._summarize(node, self._env[node])
        kept = self._summaries.get(node)
        if kept is not None:
            return kept
        raise UnknownNodeError(self._why_no_value(node))

    def where(self) -> str:
        """Where the stepper is, in one line."""
        if self._frame is not None:
            frame = self._frame
            inner, stack = self._active(), self.stack
            if inner.done:  # never for long: the call is left as soon as it has run
                return f"in {frame.kind} call {frame.call!r}: ran all {inner._total} nodes"
            node = inner.current
            inside = f" in {stack[-1]}" if stack and stack[-1] != frame.call else ""
            text = (
                f"in {frame.kind} call {frame.call!r}: at {inner._pos}/{inner._total}: next "
                f"{node.name!r} ({_next_text(node)}){inside}"
            )
            if inner._error is not None:
                text += f"; it raised {type(inner._error.cause).__name__}"
            return text
        if self.done:
            return f"done: ran all {self._total} nodes"
        node = self.current
        stack = self.stack
        inside = f" in {stack[-1]}" if stack else " at the top level"
        text = f"at {self._pos}/{self._total}: next {node.name!r} ({_next_text(node)}){inside}"
        if self._error is not None:
            text += f"; it raised {type(self._error.cause).__name__}"
        return text

    def __repr__(self) -> str:
        count = len(self._breakpoints)
        marks = f"; {count} breakpoint{'s' if count != 1 else ''}" if count else ""
        light = "; memory-light" if self._light else ""
        return f"<Stepper {self.where()}{marks}{light}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        """Where the stepper is, the module calls around it, and the values at hand: what the
        next node reads and the last values computed."""
        from . import display as d

        active = self._active()
        body = f'<div class="gs-title">Stepper <span class="gs-muted">{d.escape(self.where())}</span></div>'
        stack = self.stack
        if stack:
            crumbs = " › ".join(f"<code>{d.escape(c)}</code>" for c in stack)
            body += f'<div><span class="gs-muted">in</span> {crumbs}</div>'
        if active.error is not None:
            body += f"<div>{d.badge('error', 'bad')} {d.escape(active.error)}</div>"
        if len(self._breakpoints):
            body += d.details(
                f"{len(self._breakpoints)} breakpoints",
                "<br>".join(d.escape(b) for b in self._breakpoints),
            )
        summaries = []
        current = active.current
        inputs = current.all_input_nodes if current is not None else []
        recent = active._layout.nodes[max(0, active._pos - 4) : active._pos]
        for node in [*inputs, *[n for n in recent if n not in inputs]]:
            if node.op == "get_attr" and not isinstance(active._env.get(node), torch.Tensor):
                continue  # the program's own constants (specs, what a check expects)
            if node in active._env or node in active._summaries:
                summaries.append(active.summary(node.name))
        if summaries:
            title = "what the next node reads, and the last values" if inputs else "the last values"
            body += f'<div class="gs-muted">{title}</div>' + summary_table(summaries)
        return d.bundle(body, repr(self), include, exclude)

    # -- moving -----------------------------------------------------------------------------

    def step(self, n: int = 1) -> StepResult:
        """Run the next ``n`` ops (or swapped or fused calls), and what carries values between
        them, up to the next op (fewer if a breakpoint or the end comes first). Inside a call
        entered with :meth:`step_into`, a step that finishes the call leaves it and stops."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise StepError(f"step(n): n is a number of nodes, at least 1; got {n!r}")
        if self._frame is not None:
            return self._inside(lambda inner: inner.step(n))
        self._check_not_done()
        return self._advance(self._layout.stop_after(self._pos, n), "step")

    def step_over(self) -> StepResult:
        """Run the next node; if it starts a module call (or is a swapped call), run the whole call.

        Of the calls that begin at ``current``, the outermost one is run to its end.
        """
        if self._frame is not None:
            return self._inside(lambda inner: inner.step_over())
        self._check_not_done()
        layout, pos = self._layout, self._pos
        here = layout.stacks[pos]
        common = self._common_depth()
        if len(here) > common:
            end = layout.span(here[common])[1] + 1
        else:
            end = pos + 1
        return self._advance(layout.next_stop(end), "step")

    def step_out(self) -> StepResult:
        """Run to the end of the module call the stepper is in (at the top level: to the end).
        At the top of a call entered with :meth:`step_into`: finish that call and leave it."""
        if self._frame is not None:
            return self._inside(lambda inner: inner.step_out())
        self._check_not_done()
        common = self._common_depth()
        if common == 0:
            return self._advance(self._total, "step")
        call = self._layout.stacks[self._pos][common - 1]
        return self._advance(self._layout.next_stop(self._layout.span(call)[1] + 1), "step")

    def run_to(
        self,
        target: str | Callable[[Node], bool] | None = None,
        *,
        node: str | None = None,
        module: str | None = None,
    ) -> StepResult:
        """Run until ``current`` is the target: stop *before* it runs.

        ``target`` is a node name, a module (fqn: its next call; ``"fqn@k"``: that call; stop
        at the call's first op), a node inside a swapped or fused call (``"call/node"``: the
        call is entered, see :meth:`step_into`), or a predicate on the ``torch.fx.Node`` about
        to run. When a name is both a node and a module, say which with ``node=`` or
        ``module=``. If ``current`` already is the target, nothing runs.
        """
        given = [t for t in (target, node, module) if t is not None]
        if len(given) != 1:
            raise StepError(
                "run_to: give exactly one target: a name, node=..., module=..., or a predicate"
            )
        inner = self._layout.inner_target(node if node is not None else target)
        if inner is not None and module is None:
            return self._run_into(*inner)
        if self._frame is not None:
            inner = self._frame.stepper

            def again() -> StepResult:
                return self.run_to(target, node=node, module=module)

            if inner._knows(target, node, module):  # a node or module of the entered call
                return self._inside(lambda s: s.run_to(target, node=node, module=module))
            if callable(target) and not isinstance(target, str):
                return self._inside(lambda s: s.run_to(target), then=again)
            # a target of the program: finish the call first
            return self._inside(lambda s: s.continue_(), then=again)
        self._check_not_done()
        if callable(target) and not isinstance(target, str):
            return self._advance(self._total, "target", until=target)
        if node is not None:
            return self._advance(self._node_position(node), "target")
        if module is not None:
            return self._advance(self._module_position(module), "target")
        if not isinstance(target, str):
            raise StepError(f"run_to: expected a name or a predicate, got {type(target).__name__}")
        is_node = target in self._layout.by_name
        is_module = self._is_module(target)
        if is_node and is_module:
            raise StepError(
                f"{target!r} is both a node and a module; say run_to(node={target!r}) or "
                f"run_to(module={target!r})"
            )
        if is_module:
            return self._advance(self._module_position(target), "target")
        if not is_node:
            layout = self._layout
            inside_swap = any(
                target.startswith(split_call_name(c)[0] + ".") for c in layout.swapped
            )
            if target in layout.program_fqns or inside_swap:
                self._calls_named(target)  # raises, saying why this module has no nodes here
            choices = list(layout.by_name) + list(layout.fqn_calls)
            raise UnknownNameError(
                unknown_name(target, choices, kind="node or module", where="the graph")
            )
        return self._advance(self._node_position(target), "target")

    def _run_into(self, call: str, name: str) -> StepResult:
        """``run_to("call/node")``: to the call, into it, then to its node ``name``."""
        frame = self._frame
        if frame is not None and frame.call == call:
            return self._inside(lambda inner: inner.run_to(name))
        if frame is not None:  # another call is entered: finish it first
            return self._inside(
                lambda inner: inner.continue_(), then=lambda: self._run_into(call, name)
            )
        self._check_not_done()
        position = self._layout.call_position[call]
        if position < self._pos:
            raise AlreadyRanError(
                f"call {call!r} already ran (position {position}; the stepper is at {self._pos})"
            )
        reached = self._advance(position, "target")
        if self._frame is not None or self._pos != position:  # a breakpoint came first
            return reached
        why = self._enter(self._layout.nodes[position], call)
        if why is not None:
            raise StepError(f"cannot run to {call + '/' + name!r}: {why}")
        try:
            inside = self._inside(lambda inner: inner.run_to(name))
        except UnknownNameError as error:
            raise type(error)(
                f"inside call {call!r} (now entered, at its first op): {error}"
            ) from None
        return replace(inside, ran=reached.ran + inside.ran)

    def continue_(self) -> StepResult:
        """Run to the next breakpoint, or to the end."""
        if self._frame is not None:
            return self._inside(lambda inner: inner.continue_(), then=self.continue_)
        self._check_not_done()
        return self._advance(self._total, "step")

    def step_into(self) -> StepResult:
        """Enter the call that runs next, to step through its nodes; elsewhere, :meth:`step`.

        A fused call (:func:`graphsurgeon.fuse`) is entered into its own nodes, the program's.
        A swapped call is entered into its replacement's aten graph: the replacement is
        exported (``torch.export``) on the very inputs it receives here. When it does not
        export (data-dependent control flow, say), the call is run as one node and the
        result's ``note`` says why. Entering binds the call's inputs and weights: ``current``
        is then its first op. While inside, every move, ``current``, ``stack``, ``env`` and
        ``summary`` are the call's, with the call's node names (``frames`` lists the calls
        entered); the call is left when its last node has run, by any move, and its output is
        the call's value.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> x = torch.tensor([[1.0, -1.0]])
            >>> st = gs.Stepper(gs.fuse(gs.export(model, (x,)), "0"), x)
            >>> st.run_to("0").ran[-1]
            'check_inputs'
            >>> st.step_into().note
            "entered fused call '0'"
            >>> st.frames, st.current.name, st.stack  # its inputs and weights bound, at its op
            (('0',), 'linear', ('0',))
            >>> st.step_out().note
            "left fused call '0'"
            >>> st.continue_().reason, torch.equal(st.output, model(x))
            ('end', True)
        """
        if self._frame is not None:
            return self._inside(lambda inner: inner.step_into())
        self._check_not_done()
        node = self._layout.nodes[self._pos]
        call = None
        if node.op == "call_module":
            call = node.meta.get(_meta.FUSED) or node.meta.get(_meta.SWAPPED)
        if call is None:
            return self.step()
        why = self._enter(node, call)
        if why is not None:
            return replace(self.step(), note=f"stepped over {call!r} (it ran as one node): {why}")
        frame = self._frame
        return StepResult(
            (), frame.stepper.position, "step", note=f"entered {frame.kind} call {call!r}"
        )

    # -- internals --------------------------------------------------------------------------

    def _active(self) -> Stepper:
        """The stepper of the innermost entered call (``self`` when none is entered)."""
        stepper = self
        while stepper._frame is not None:
            stepper = stepper._frame.stepper
        return stepper

    def _knows(self, target: Any, node: str | None, module: str | None) -> bool:
        """Whether ``run_to``'s target names a node or module of this graph or an entered one."""
        if self._frame is not None and self._frame.stepper._knows(target, node, module):
            return True
        layout = self._layout
        if node is not None:
            return node in layout.by_name
        if module is not None:
            return self._is_module(module)
        return isinstance(target, str) and (target in layout.by_name or self._is_module(target))

    def _inside(
        self, move: Callable[[Stepper], StepResult], then: Callable[[], StepResult] | None = None
    ) -> StepResult:
        """Make ``move`` in the entered call; when that finishes the call, leave it (and go on
        with ``then`` in this graph, for moves that run past the call)."""
        frame = self._frame
        result = move(frame.stepper)
        if not frame.stepper.done:
            return result
        ran = (*result.ran, self._leave())
        note = f"left {frame.kind} call {frame.call!r}"
        if then is not None and not self.done:
            rest = then()
            return replace(rest, ran=ran + rest.ran, note=rest.note or note)
        if self.done:
            return StepResult(ran, self._pos, "end", note=note)
        return StepResult(ran, self._pos, "step", note=note)

    def _leave(self) -> str:
        """The entered call has run: its output is the call node's value; move past it."""
        frame = self._frame
        self._frame = None
        position = self._layout.position[frame.node]
        self._env[frame.node] = frame.stepper.output
        self._pos = position + 1
        if self._light:
            for dead in self._layout.frees[position]:
                self._retire(dead)
        if self._pos >= self._total:  # never: the output node comes last
            self._output = self._gm.graph.process_outputs(self._env[self._layout.nodes[-1]])
        return frame.node.name

    def _enter(self, node: Node, call: str) -> str | None:
        """Start stepping the call ``node`` runs; None when entered, else why it was not."""
        interpreter = self._interpreter
        args, kwargs = interpreter.fetch_args_kwargs_from_env(node)
        module = interpreter.fetch_attr(node.target)
        fused = _meta.FUSED in node.meta
        if fused:
            graph = module
        else:
            graph = self._exported_replacement(call, module, args, kwargs)
            if isinstance(graph, str):
                return graph
        try:
            inputs = bind_inputs(graph, tuple(args), dict(kwargs), error=StepError)
        except StepError as problem:
            return f"its graph does not take the call's inputs ({problem})"
        prefix = self._layout.stacks[self._layout.position[node]]
        child = Stepper.__new__(Stepper)
        child._setup(graph, inputs, own=False, depth=len(prefix) if fused else 0)
        child._light = self._light
        # The call reads and writes the state this run uses: this stepper's private copies of
        # the module's buffers (BatchNorm statistics), shared, so what the call writes stays.
        shared = getattr(interpreter, "private_buffers", {}).get(str(node.target), {})
        if isinstance(child._interpreter, PrivateStateInterpreter):
            for name, tensor in shared.items():
                if name in child._interpreter.private:
                    child._interpreter.private[name] = tensor
        for condition in self._conditions:  # NaN/Inf and other conditions hold inside too
            child._breakpoints._add(condition)
        for breakpoint in self._inner_breaks.get(call, ()):  # "call/node", set from outside
            inner = breakpoint.target[len(call) + 1 :]
            if inner in child._layout.by_name:
                child._breakpoints._add(Breakpoint("node", inner))
        # the call's inputs, parameters and buffers are bound on the way in: the first stop
        # inside is its first op
        first = min(child._layout.next_stop(0), child._total - 1)
        child._run_plain(0, first)
        child._pos = first
        self._frame = _Frame(child, call, node, "fused" if fused else "swapped", prefix)
        return None

    def _exported_replacement(
        self, call: str, module: torch.nn.Module, args: Any, kwargs: Any
    ) -> GraphModule | str:
        """The replacement's aten graph for these inputs (exported once per call and input
        shapes), or why it has none."""
        # one export per replacement and input shapes (a replacement serving many calls, or
        # one call run again after reset(), is exported once)
        key = (id(module), describe_value((tuple(args), dict(kwargs))))
        if key not in self._exports:
            from .export import export  # the stepper exports only when asked to step inside

            kind = type(module).__name__
            if isinstance(module, torch.jit.ScriptModule):
                origin = getattr(module, "original_name", "") or kind
                self._exports[key] = (
                    f"its replacement is a TorchScript module (scripted {origin}), which "
                    "torch.export cannot trace; swap the eager module to step into it"
                )
                return self._exports[key]
            try:
                with quiet_export():  # the reason goes in the note, not to stderr
                    program = export(module, tuple(args), dict(kwargs), preserve=())
                # the program too: its runnable original refers to it without keeping it
                self._exports[key] = (program, runnable_original(program))
            except Exception as problem:  # any reason a module does not export: say it, go on
                first = str(problem).strip().splitlines()[0] if str(problem).strip() else ""
                self._exports[key] = (
                    f"its replacement {kind} does not export on the inputs it received "
                    f"({type(problem).__name__}: {first[:200]})"
                )
        made = self._exports[key]
        return made[1] if isinstance(made, tuple) else made

    def _check_not_done(self) -> None:
        if self._pos >= self._total:
            raise AlreadyRanError("the program has finished", "to run it again")

    def _common_depth(self) -> int:
        """How many module calls the last op run and ``current`` share (the frame we are in).
        The last op, not the last node: the weights a call reads run before its first op, and
        standing at that op is standing at the call's entry."""
        layout, pos = self._layout, self._pos
        here = layout.stacks[pos]
        k = bisect.bisect_left(layout.stops, pos) - 1
        before = layout.stacks[layout.stops[k]] if k >= 0 else ()
        depth = 0
        for a, b in zip(before, here):
            if a != b:
                break
            depth += 1
        return depth

    def _node(self, name: str) -> Node:
        node = self._layout.by_name.get(name) if isinstance(name, str) else None
        if node is None:
            raise UnknownNodeError(
                unknown_name(name, self._layout.by_name, kind="node", where="the graph")
            )
        return node

    def _node_position(self, name: str) -> int:
        position = self._layout.position[self._node(name)]
        if position < self._pos:
            raise AlreadyRanError(
                f"node {name!r} already ran (position {position}; the stepper is at {self._pos})"
            )
        return position

    def _is_module(self, name: str) -> bool:
        layout = self._layout
        if name in layout.members or name in layout.fqn_calls:
            return True
        fqn, index = split_call_name(name)
        if index == 0 and fqn in layout.members:
            return True
        if layout.index is not None and fqn in layout.index.fqns:
            try:
                return any(c in layout.members for c in layout.index.resolve(name).calls)
            except UnknownModuleError:
                return False
        return False

    def _calls_named(self, module: str) -> list[str]:
        """The calls of this graph a module or call name stands for (``"blk@0"`` is ``"blk"``,
        read by the program's index as every entry point reads it)."""
        layout = self._layout
        if not isinstance(module, str):
            raise StepError(f"expected a module name such as 'layers.0', got {module!r}")
        if module in layout.call_position and module not in layout.program_fqns:
            return [module]  # a region made one call (Surgery.replace, swap_region)
        if layout.index is not None:
            resolved = layout.index.resolve(module)  # an unknown name: UnknownModuleError
            calls = [call for call in resolved.calls if call in layout.members]
            if calls:
                return calls
            module = resolved.name
        else:  # a GraphModule made elsewhere: the calls its graph records
            fqn, index = split_call_name(module)
            if index == 0:
                module = fqn
            if module in layout.fqn_calls:  # an fqn: every call of it
                return list(layout.fqn_calls[module])
            if module in layout.members:  # one call, "fqn@k"
                return [module]
        for call, kind in layout.swapped.items():
            outer, _ = split_call_name(call)
            if module.startswith(outer + "."):
                raise UnknownModuleError(
                    f"module {module!r} runs inside the swapped call {call!r} ({kind}), which "
                    f"is one node here: run_to({call!r}), then step_into() steps through the "
                    "replacement's own graph."
                )
        if module in layout.program_fqns or module == "":
            raise UnknownModuleError(
                f"module {module!r} has no nodes of its own in this graph (the root, or a "
                "container such as nn.ModuleList: use one of its children)"
            )
        choices = list(layout.fqn_calls) + [c for c in layout.members if "@" in c]
        raise UnknownModuleError(unknown_name(module, choices, where="the graph"))

    def _module_position(self, module: str) -> int:
        starts = sorted(self._layout.entry(call) for call in self._calls_named(module))
        later = [s for s in starts if s >= self._pos]
        if not later:
            raise AlreadyRanError(
                f"no call of {module!r} starts at or after the stepper's position {self._pos} "
                f"(its calls start at {starts})"
            )
        return later[0]

    def _why_no_value(self, node: Node) -> str:
        position = self._layout.position[node]
        if position >= self._pos:
            return (
                f"node {node.name!r} has not run yet (position {position}; the stepper is at "
                f"{self._pos}); run_to({node.name!r}) then step() runs it"
            )
        return (
            f"the value of {node.name!r} was dropped in memory-light mode (no later node needs "
            f"it); summary({node.name!r}) still describes it"
        )

    def _summarize(self, node: Node, value: Any) -> Summary:
        stack = self._layout.stacks[self._layout.position[node]]
        return Summary.of(value, node.name, self._layout.op_text(node), stack[-1] if stack else "")

    def _retire(self, node: Node) -> None:
        value = self._env.pop(node, _MISSING)
        if value is not _MISSING:  # already gone if an interrupt cut a previous pass short
            self._summaries[node] = self._summarize(node, value)

    def _breakpoints_changed(self) -> None:
        stops: dict[int, list[Breakpoint]] = {}
        conditions = []
        inner: dict[str, list[Breakpoint]] = {}
        layout = self._layout
        for breakpoint in self._breakpoints:
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
                calls = self._calls_named(breakpoint.target)
                if breakpoint.kind == "enter":
                    positions = [layout.entry(c) for c in calls]
                else:
                    positions = [layout.span(c)[1] + 1 for c in calls]
            for position in positions:
                stops.setdefault(position, []).append(breakpoint)
        self._stops = stops
        self._stop_positions = sorted(stops)
        self._conditions = tuple(conditions)
        self._inner_breaks = inner
        watched = layout.calls_at if conditions else {}
        self._call_stops = sorted({*watched, *(layout.call_position[c] for c in inner)})

    def _advance(
        self, end: int, reason: str, until: Callable[[Node], bool] | None = None
    ) -> StepResult:
        self._error = None
        ran: list[str] = []
        note: str | None = None
        layout, total = self._layout, self._total
        first = True
        while True:
            here = self._pos
            # The next breakpoint position: never the start of the move itself (a stepper
            # stopped at a breakpoint must be able to move on), any later one.
            stops = self._stop_positions
            k = bisect.bisect_right(stops, here) if first else bisect.bisect_left(stops, here)
            stop = stops[k] if k < len(stops) else total + 1
            limit = min(end, stop, total)
            # a call this move must run from inside (a breakpoint in it, or conditions that
            # watch every op) comes before the limit: run up to it, then through it
            j = bisect.bisect_left(self._call_stops, here)
            call_at = self._call_stops[j] if j < len(self._call_stops) else None
            if call_at is not None and call_at >= limit:
                call_at = None
            segment = limit if call_at is None else call_at
            trigger: Node | None = None
            fired: tuple[Breakpoint, ...] = ()
            if self._conditions or until is not None:
                reached, trigger, fired = self._run_checked(here, segment, until)
            else:
                self._run_plain(here, segment)
                reached = segment
            self._pos = reached
            ran.extend(layout.names[here:reached])
            if trigger is not None:
                return StepResult(tuple(ran), reached, "breakpoint", fired, trigger.name)
            if until is not None and reached < segment:  # the predicate matched
                return StepResult(tuple(ran), reached, "target")
            if call_at is None:
                break
            node = layout.nodes[call_at]
            if until is not None and self._call_user(until, node, "run_to predicate", node):
                return StepResult(tuple(ran), call_at, "target")
            inside, stopped, said = self._run_call(call_at)
            ran.extend(inside)
            note = note or said
            if stopped is not None:
                return replace(stopped, ran=tuple(ran), note=stopped.note or note)
            first = False
        reached = self._pos
        if reached >= total:
            self._output = self._gm.graph.process_outputs(self._env[layout.nodes[-1]])
            return StepResult(tuple(ran), reached, "end", note=note)
        at_stop = tuple(self._stops.get(reached, ())) if reached == stop else ()
        if reason == "target" and reached == end:
            return StepResult(tuple(ran), reached, "target", at_stop, note=note)
        if at_stop:
            return StepResult(tuple(ran), reached, "breakpoint", at_stop, note=note)
        return StepResult(tuple(ran), reached, reason, note=note)

    def _run_call(self, position: int) -> tuple[tuple[str, ...], StepResult | None, str | None]:
        """Run the swapped or fused call at ``position`` from inside: entered, to a breakpoint
        set in it; or, for conditions alone, watched op by op and entered only when one holds
        (the conditions then stop at that op inside). Returns the names that ran, the result
        when the move stopped inside (the call stays entered), and a note."""
        node = self._layout.nodes[position]
        call = self._layout.calls_at[position]
        breaks = self._inner_breaks.get(call, ())
        if not breaks and _meta.SWAPPED in node.meta:
            watched = self._watch(node)
            if watched is None:  # nothing held inside: the call ran, as one node
                return (node.name,), None, None
            fired, op = watched
            why = self._enter(node, call)
            if why is not None:  # it ran; say where inside, stop after it
                self._run_plain(position, position + 1)
                self._pos = position + 1
                note = f"{fired[0].target} inside {call!r}, at {op}; cannot step into it: {why}"
                result = StepResult((node.name,), self._pos, "breakpoint", fired, node.name, note)
                return (node.name,), result, note
        else:
            why = self._enter(node, call)
            if why is not None:
                self._run_plain(position, position + 1)
                self._pos = position + 1
                return (node.name,), None, f"stepped over {call!r} (it ran as one node): {why}"
        child = self._frame.stepper
        missing = [
            b.target for b in breaks if b.target[len(call) + 1 :] not in child._layout.by_name
        ]
        note = f"entered {self._frame.kind} call {call!r}"
        if missing:
            note += f"; {', '.join(map(repr, missing))} names no node of its graph here"
        current = child.current
        at_entry = tuple(
            b
            for b in child._breakpoints
            if b.kind == "node" and current is not None and b.target == current.name
        )
        if at_entry:
            return (), StepResult((), child._pos, "breakpoint", at_entry, note=note), note
        result = child._advance(child._total, "step")
        if not child.done:
            return result.ran, replace(result, note=note), note
        return (*result.ran, self._leave()), None, note if missing else None

    def _watch(self, node: Node) -> tuple[tuple[Breakpoint, ...], str] | None:
        """Run the swapped call ``node`` as one node, checking every op its replacement runs
        against the conditions. Nothing held: its value is kept, and None. One held: the
        call is undone (its value dropped, the buffers it wrote restored) so that it can run
        again from inside, and ``(the conditions, the op)`` are returned."""
        private = getattr(self._interpreter, "private_buffers", {}).get(str(node.target), {})
        saved = {name: tensor.clone() for name, tensor in private.items()}
        watch = _Watch(self._conditions, self, node)
        try:
            with watch:
                value = self._interpreter.run_node(node)
        except StepError:
            raise  # a condition of the user's raised: said as it is
        except BaseException as error:
            self._stopped_by_error(node, error)
        if watch.fired is None:
            position = self._layout.position[node]
            self._env[node] = value
            if self._light:
                for dead in self._layout.frees[position]:
                    self._retire(dead)
            self._pos = position + 1
            return None
        with torch.no_grad():
            for name, tensor in private.items():
                tensor.copy_(saved[name])
        return watch.fired

    def _run_plain(self, start: int, limit: int) -> None:
        # The hot loop: what Interpreter.run does per node, minus its bookkeeping.
        env = self._env
        run_node = self._interpreter.run_node
        nodes = self._layout.nodes
        node = None
        try:
            if self._light:
                frees = self._layout.frees
                retire = self._retire
                for i in range(start, limit):
                    node = nodes[i]
                    env[node] = run_node(node)
                    for dead in frees[i]:
                        retire(dead)
            else:
                for node in nodes[start:limit]:
                    env[node] = run_node(node)
        except BaseException as error:
            self._stopped_by_error(node, error)

    def _run_checked(
        self, start: int, limit: int, until: Callable[[Node], bool] | None
    ) -> tuple[int, Node | None, tuple[Breakpoint, ...]]:
        env = self._env
        run_node = self._interpreter.run_node
        nodes = self._layout.nodes
        frees = self._layout.frees if self._light else None
        conditions = self._conditions
        for i in range(start, limit):
            node = nodes[i]
            if until is not None:
                self._pos = i  # where the stepper stands should the predicate raise
                if self._call_user(until, node, "run_to predicate", node):
                    return i, None, ()
            try:
                value = run_node(node)
            except BaseException as error:
                self._stopped_by_error(node, error)
            env[node] = value
            fired: tuple[Breakpoint, ...] = ()
            if conditions:
                tensors = _tensor_leaves(value)
                if tensors:
                    self._pos = i + 1
                    fired = tuple(
                        c
                        for c in conditions
                        if any(self._call_user(c.predicate, t, str(c), node) for t in tensors)
                    )
            if frees is not None:
                for dead in frees[i]:
                    self._retire(dead)
            if fired:
                return i + 1, node, fired
        return limit, None, ()

    def _call_user(self, function: Callable, argument: Any, what: str, node: Node) -> bool:
        try:
            return bool(function(argument))
        except Exception as error:
            raise StepError(
                f"the {what} raised {type(error).__name__}: {error} (at node {node.name!r})"
            ) from error

    def _stopped_by_error(self, node: Node | None, error: BaseException) -> None:
        position = self._layout.position[node] if node is not None else self._pos
        if node is not None and node in self._env:
            position += 1  # it ran; what failed came after it (freeing, or an interrupt)
        self._pos = position
        if not isinstance(error, Exception) or node is None:
            raise error  # KeyboardInterrupt and the like: position kept, nothing wrapped
        stack = self._layout.stacks[self._layout.position[node]]
        call = stack[-1] if stack else ""
        where = f"in module {call!r}" if call else "at the top level"
        message = (
            f"while executing node {node.name!r} ({_op_text(node)}) {where}: "
            f"{type(error).__name__}: {str(error).rstrip('.')}. The stepper stopped at this node: look at "
            "st.env and st.summary(name), then step again, or reset()."
        )
        self._error = NodeError(message, node.name, call, position, error)
        raise self._error from error
