"""The :class:`Stepper`, a cursor over a program's graph, and :class:`StepResult`, what one of
its moves did. Its layout, breakpoints, summaries and entered calls are rooms of their own in
this package; nodes run through :class:`graphsurgeon.checks._exec.NodeRunner`.

Example:
    Every move, on a model of two modules, the first of two (a step into a call is
    :meth:`Stepper.step_into`'s example):

    >>> import torch, graphsurgeon as gs
    >>> inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> x = torch.tensor([[1.0, -1.0]])
    >>> st = gs.Stepper(gs.export(torch.nn.Sequential(inner, torch.nn.Tanh()), (x,)), x)
    >>> st.step().ran  # the input, its checks and the weights run on the way to the first op
    ('input_1', 'input_guard_0', 'check_inputs', 'p_0_0_weight', 'p_0_0_bias')
    >>> st.step().ran, st.current.name, st.stack  # in module "0" now, at its ReLU
    (('linear',), 'relu', ('0', '0.1'))
    >>> st.step_out().ran, st.stack  # to the end of "0"
    (('relu',), ('1',))
    >>> st.reset()
    >>> _ = st.run_to("0")  # the module's first op: at its entry, not in it yet
    >>> st.step_over().ran, st.current.name  # the whole of "0"
    (('linear', 'relu'), 'tanh')
    >>> st.summary("relu").shape, st.module_of("relu"), st.nodes_of("0.1")
    ((1, 2), '0.1', ('relu',))
    >>> st.reset()
    >>> _ = st.breakpoints.node("tanh")
    >>> print(st.continue_())
    ran 7 nodes (input_1 .. relu); stopped: break before node 'tanh'
    >>> st.run_to(lambda node: node.op == "output").ran, st.continue_().reason
    (('tanh',), 'end')
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.fx import GraphModule, Node

from .. import _meta
from .._program import as_inputs, as_program
from ..checks._exec import NodeRunner, bind_inputs, clone_inputs, runnable_original
from ..errors import AlreadyRanError, NodeError, StepError, UnknownNameError, UnknownNodeError
from ..rewrite import swap_info
from ._breakpoints import (
    Breakpoint,
    Breakpoints,
    StopPlan,
    call_user,
    conditions_met,
    plan_stops,
    run_watched,
)
from ._frames import Frame, Replacements
from ._keep import Keeping
from ._layout import Layout, next_text, op_text
from ._summary import Summary, stepper_html

__all__ = ["StepResult", "Stepper"]


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
        from .. import display as d

        kind = {"breakpoint": "warn", "end": "ok"}.get(self.reason, "info")
        body = f"<div>{d.badge(self.reason, kind)} {d.escape(str(self))}</div>"
        if len(self.ran) > 3:
            body += d.details(f"{len(self.ran)} nodes ran", d.names(self.ran))
        return d.bundle(body, str(self), include, exclude)


# -- the stepper ----------------------------------------------------------------------------

_MISSING = object()


class _EnvView(Mapping):
    """``st.env``: node name -> value, for the nodes that ran and whose values are kept."""

    __slots__ = ("_stepper",)

    def __init__(self, stepper: Stepper):
        self._stepper = stepper

    def __getitem__(self, name: str) -> Any:
        stepper = self._stepper
        node = stepper._layout.node(name)
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


class Stepper:
    """A cursor over a program's graph: run it node by node, stop where you like, look around.

    Each run gets its own copy of the inputs, so :meth:`reset` replays exactly the same run.
    The module's example shows every move.

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

    Memory (:attr:`keep`): by default ``env`` holds the values later nodes still need, those
    of the last 128 nodes run, the parameters and buffers and, at the end, the output, so a
    run costs what ``torch.fx.Interpreter.run`` costs at any size. ``env`` refuses an older
    value with an :class:`UnknownNodeError` that says how to keep it; :meth:`summary` gives
    its shape and dtype. ``st.keep = "all"`` keeps every value, ``st.keep = ["layers.3"]``
    those named too; ``st.memory_light = True`` only what later nodes need, each value
    summarized as it is dropped (:meth:`summary` then has statistics for every node).

    Errors: when a node raises, the stepper stops *at* that node (it has not run), keeps the
    error in ``st.error`` and raises it as a :class:`NodeError` naming the node and its module
    call. Everything stays inspectable; fix the cause and step again, or :meth:`reset`. A move
    once the program has finished raises :class:`AlreadyRanError`.

    Args:
        program: an ExportedProgram (its unlifted graph is stepped), a GraphModule (from
            ``gs.swap``, or any other), a Surgery, or an object with a ``.module`` GraphModule.
        *args: the inputs, as for calling the program; none: a Surgery's example inputs.
        **kwargs: the keyword inputs, matched by name.

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
        inputs = clone_inputs(bind_inputs(gm, args, kwargs, error=StepError))
        self._setup(NodeRunner(gm), inputs, own=True)

    def _setup(self, runner: NodeRunner, inputs: list[Any], own: bool, depth: int = 0) -> None:
        # The one node-by-node runner: a graph that writes buffers (BatchNorm statistics), its
        # own or its replacements', runs on private copies of them, so stepping leaves the
        # program and every module as they were, and every reset() replays the same run.
        self._runner = runner
        self._interpreter = runner.interpreter
        self._gm = gm = runner.gm
        self._layout = Layout(gm, depth)
        self._inputs = inputs
        # A stepper of a call entered with step_into runs on the very values the call received
        # (a call may write its inputs in place); a user's stepper runs on copies of its own.
        self._own_inputs = own
        self._frame: Frame | None = None
        self._replacements = Replacements()
        self._total = len(self._layout.nodes)
        self._breakpoints = Breakpoints(self._layout, self._breakpoints_changed)
        self._plan = StopPlan()
        self._keeping = Keeping(self._layout)
        self.reset()

    # -- state ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Back to the start, with fresh copies of the inputs. Breakpoints are kept; a call
        entered with :meth:`step_into` is left."""
        self._frame = None
        self._summaries: dict[Node, Summary] = {}
        self._pos = 0
        self._output: Any = None
        self._error: NodeError | None = None
        inputs = clone_inputs(self._inputs) if self._own_inputs else list(self._inputs)
        self._runner.start(inputs)
        self._env: dict[Node, Any] = self._runner.env

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
        """Whether the program has run to its end (``output`` is then what it returned)."""
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
    def keep(self) -> str | tuple[str, ...]:
        """Which values ``env`` keeps: ``"recent"`` (the default: those later nodes need and
        those of the last 128 nodes run), ``"all"``, ``"needed"`` (memory-light: only those
        later nodes need, each summarized as it goes), or the node and module names given,
        whose values are kept on top of the recent ones.

        It applies from now on: what it does not keep is dropped at once, what is dropped
        stays so until ``reset()``. An entered call keeps its values the same way (names
        given: its recent ones).

        Example (a longer run: :mod:`graphsurgeon.step._keep`):
            >>> import torch, graphsurgeon as gs
            >>> x = torch.ones(1, 2)
            >>> st = gs.Stepper(gs.export(torch.nn.Linear(2, 2), (x,)), x)
            >>> st.keep = "all"; _ = st.continue_(); len(st.env) == st.total
            True
        """
        return self._keeping.keep

    @keep.setter
    def keep(self, keep: str | Iterable[str]) -> None:
        self._keeping.set(keep)
        if self._frame is not None:
            self._frame.stepper.keep = self._keeping.mode
        for node in self._keeping.dropped_by(self._pos):  # what it no longer keeps goes now
            self._retire(node)

    @property
    def memory_light(self) -> bool:
        """``keep == "needed"``; set False: ``keep = "recent"``."""
        return self._keeping.keep == "needed"

    @memory_light.setter
    def memory_light(self, on: bool) -> None:
        self.keep = "needed" if on else "recent"

    def module_of(self, name: str) -> str:
        """The innermost module call node ``name`` belongs to ('' for the top level)."""
        stack = self._layout.stacks[self._layout.position[self._layout.node(name)]]
        return stack[-1] if stack else ""

    def nodes_of(self, module: str) -> tuple[str, ...]:
        """The names of the nodes of ``module`` (every call of an fqn, or one ``"fqn@k"``)."""
        positions = sorted(
            {i for call in self._layout.calls_named(module) for i in self._layout.members[call]}
        )
        return tuple(self._layout.names[i] for i in positions)

    def summary(self, name: str) -> Summary:
        """The :class:`Summary` of a node's value (it must have run).

        Args:
            name: the node; inside an entered call, its nodes are looked up first.
        """
        inner = self._frame.stepper if self._frame is not None else None
        if inner is not None and (inner._frame is not None or name in inner._layout.by_name):
            return inner.summary(name)
        node = self._layout.node(name)
        if node in self._env:
            return self._summarize(node, self._env[node])
        kept = self._summaries.get(node)
        if kept is not None:
            return kept
        husk = self._keeping.husk(node) if self._layout.position[node] < self._pos else None
        if husk is not None:  # it ran; its value was not kept, its shape and dtype are known
            return husk
        raise UnknownNodeError(self._why_no_value(node))

    def where(self) -> str:
        """Where the stepper is, in one line."""
        frame, active, stack = self._frame, self._active(), self.stack
        if frame is None and self.done:
            return f"done: ran all {self._total} nodes"
        head, inside = "", f" in {stack[-1]}" if stack else " at the top level"
        if frame is not None:
            head = f"in {frame.kind} call {frame.call!r}: "
            if active.done:  # never for long: the call is left as soon as it has run
                return f"{head}ran all {active._total} nodes"
            inside = f" in {stack[-1]}" if stack and stack[-1] != frame.call else ""
        node = active.current
        text = (
            f"{head}at {active._pos}/{active._total}: next {node.name!r} ({next_text(node)})"
            f"{inside}"
        )
        if active._error is not None:
            text += f"; it raised {type(active._error.cause).__name__}"
        return text

    def __repr__(self) -> str:
        count = len(self._breakpoints)
        marks = f"; {count} breakpoint{'s' if count != 1 else ''}" if count else ""
        keep = self._keeping.keep
        kept = (
            "" if keep == "recent" else "; memory-light" if keep == "needed" else f"; keep={keep!r}"
        )
        return f"<Stepper {self.where()}{marks}{kept}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        """Where the stepper is, the module calls around it, and the values at hand: what the
        next node reads and the last values computed."""
        from .. import display as d

        active = self._active()
        current = active.current
        inputs = current.all_input_nodes if current is not None else []
        recent = active._layout.nodes[max(0, active._pos - 4) : active._pos]
        summaries = []
        for node in [*inputs, *[n for n in recent if n not in inputs]]:
            if node.op == "get_attr" and not isinstance(active._env.get(node), torch.Tensor):
                continue  # the program's own constants (specs, what a check expects)
            if node in active._env or node in active._summaries:
                summaries.append(active.summary(node.name))
        title = "what the next node reads, and the last values" if inputs else "the last values"
        body = stepper_html(
            self.where(), self.stack, active.error, list(self._breakpoints), summaries, title
        )
        return d.bundle(body, repr(self), include, exclude)

    # -- moving -----------------------------------------------------------------------------

    def step(self, n: int = 1) -> StepResult:
        """Run the next ``n`` ops (or swapped or fused calls), and what carries values between
        them, up to the next op (fewer if a breakpoint or the end comes first). Inside a call
        entered with :meth:`step_into`, a step that finishes the call leaves it and stops.

        Args:
            n: how many ops to run, at least 1.

        Returns:
            The :class:`StepResult` of the move, as every move returns.
        """
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
        common = self._layout.common_depth(self._pos)
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
        common = self._layout.common_depth(self._pos)
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

        ``target`` is a node name, a module (fqn: its next call; ``"fqn@k"``: that call; a
        container such as nn.ModuleList: the next of the calls it covers, as a highlight of it
        covers them; stop at the call's first op), a node inside a swapped or fused call
        (``"call/node"``: the call is entered, see :meth:`step_into`), or a predicate on the
        ``torch.fx.Node`` about to run. When a name is both a node and a module, say which with
        ``node=`` or ``module=``. If ``current`` already is the target, nothing runs.

        Args:
            target: a node or module name, ``"call/node"``, or a predicate on the next node.
            node: a node name, for a name that is a module's too.
            module: a module or call name, for a name that is a node's too.

        Returns:
            The :class:`StepResult`; ``reason`` ``"target"`` once it is there.
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
            return self._advance(self._layout.node_position(node, self._pos), "target")
        if module is not None:
            return self._advance(self._layout.next_entry(module, self._pos), "target")
        if not isinstance(target, str):
            raise StepError(f"run_to: expected a name or a predicate, got {type(target).__name__}")
        is_node = target in self._layout.by_name
        is_module = self._layout.is_module(target)
        if is_node and is_module:
            raise StepError(
                f"{target!r} is both a node and a module; say run_to(node={target!r}) or "
                f"run_to(module={target!r})"
            )
        if is_module:
            return self._advance(self._layout.next_entry(target, self._pos), "target")
        if not is_node:
            self._layout.refuse(target)
        return self._advance(self._layout.node_position(target, self._pos), "target")

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
            return self._layout.is_module(module)
        return isinstance(target, str) and (
            target in layout.by_name or self._layout.is_module(target)
        )

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
        self._drop_after(position)
        if self._pos >= self._total:  # never: the output node comes last
            self._output = self._gm.graph.process_outputs(self._env[self._layout.nodes[-1]])
        return frame.node.name

    def _enter(self, node: Node, call: str) -> str | None:
        """Start stepping the call ``node`` runs; None when entered, else why it was not."""
        module, args, kwargs = self._runner.call(node)
        fused = _meta.FUSED in node.meta
        graph = module if fused else self._replacements.graph(module, args, kwargs)
        if isinstance(graph, str):
            return graph
        try:
            inputs = bind_inputs(graph, args, kwargs, error=StepError)
        except StepError as problem:
            return f"its graph does not take the call's inputs ({problem})"
        prefix = self._layout.stacks[self._layout.position[node]]
        child = Stepper.__new__(Stepper)
        # The call reads and writes the state this run uses: this stepper's private copies of
        # the module's buffers (BatchNorm statistics), shared, so what the call writes stays.
        runner = self._runner.inner(node, graph, inputs)
        child._setup(runner, inputs, own=False, depth=len(prefix) if fused else 0)
        child._keeping.set(self._keeping.mode)
        for condition in self._plan.conditions:  # NaN/Inf and other conditions hold inside too
            child._breakpoints._add(condition)
        for breakpoint in self._plan.inner.get(call, ()):  # "call/node", set from outside
            inner = breakpoint.target[len(call) + 1 :]
            if inner in child._layout.by_name:
                child._breakpoints._add(Breakpoint("node", inner))
        # the call's inputs, parameters and buffers are bound on the way in: the first stop
        # inside is its first op
        first = min(child._layout.next_stop(0), child._total - 1)
        child._run_plain(0, first)
        child._pos = first
        self._frame = Frame(child, call, node, "fused" if fused else "swapped", prefix)
        return None

    def _check_not_done(self) -> None:
        if self._pos >= self._total:
            raise AlreadyRanError("the program has finished", "to run it again")

    def _why_no_value(self, node: Node) -> str:
        return self._keeping.why_no_value(node, self._pos)

    def _summarize(self, node: Node, value: Any) -> Summary:
        stack = self._layout.stacks[self._layout.position[node]]
        return Summary.of(value, node.name, self._layout.op_text(node), stack[-1] if stack else "")

    def _retire(self, node: Node) -> None:
        value = self._env.pop(node, _MISSING)
        # already gone if an interrupt cut a previous pass short
        if value is not _MISSING and self._keeping.summarizes:
            self._summaries[node] = self._summarize(node, value)

    def _drop_after(self, position: int) -> None:
        """Drop what is not kept once the node at ``position`` has run."""
        for dead in self._keeping.drops[position] if self._keeping.drops is not None else ():
            self._retire(dead)

    def _breakpoints_changed(self) -> None:
        self._plan = plan_stops(self._breakpoints, self._layout)

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
            plan = self._plan
            stops = plan.positions
            k = bisect.bisect_right(stops, here) if first else bisect.bisect_left(stops, here)
            stop = stops[k] if k < len(stops) else total + 1
            limit = min(end, stop, total)
            # a call this move must run from inside (a breakpoint in it, or conditions that
            # watch every op) comes before the limit: run up to it, then through it
            j = bisect.bisect_left(plan.calls, here)
            call_at = plan.calls[j] if j < len(plan.calls) else None
            if call_at is not None and call_at >= limit:
                call_at = None
            segment = limit if call_at is None else call_at
            trigger: Node | None = None
            fired: tuple[Breakpoint, ...] = ()
            if plan.conditions or until is not None:
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
            if until is not None and call_user(until, node, "run_to predicate", node):
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
        at_stop = tuple(self._plan.at.get(reached, ())) if reached == stop else ()
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
        breaks = self._plan.inner.get(call, ())
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
        """Run the swapped call ``node`` as one node, its replacement's ops watched by the
        conditions (:func:`run_watched`). Nothing held: its value is kept, and None. One held:
        the call is undone, to run again from inside, and ``(the conditions, the op)``."""
        try:
            value, fired = run_watched(self._runner, node, self._plan.conditions)
        except StepError:
            raise  # a condition of the user's raised: said as it is
        except BaseException as error:
            self._stopped_by_error(node, error)
        if fired is None:
            position = self._layout.position[node]
            self._env[node] = value
            self._drop_after(position)
            self._pos = position + 1
        return fired

    def _run_plain(self, start: int, limit: int) -> None:
        runner, keeping = self._runner, self._keeping
        try:
            if keeping.drops is None:
                runner.run_span(start, limit)
            elif keeping.summarizes:
                runner.run_span(start, limit, keeping.drops, self._retire)
            else:  # dropped as Interpreter.run drops them: the hot loop deletes them itself
                runner.run_span(start, limit, keeping.drops)
        except BaseException as error:
            self._stopped_by_error(runner.failed_at, error)

    def _run_checked(
        self, start: int, limit: int, until: Callable[[Node], bool] | None
    ) -> tuple[int, Node | None, tuple[Breakpoint, ...]]:
        env = self._env
        run_node = self._runner.run_node
        nodes = self._layout.nodes
        frees = self._keeping.drops
        conditions = self._plan.conditions
        for i in range(start, limit):
            node = nodes[i]
            if until is not None:
                self._pos = i  # where the stepper stands should the predicate raise
                if call_user(until, node, "run_to predicate", node):
                    return i, None, ()
            try:
                value = run_node(node)
            except BaseException as error:
                self._stopped_by_error(node, error)
            env[node] = value
            fired: tuple[Breakpoint, ...] = ()
            if conditions:
                self._pos = i + 1  # where the stepper stands should a condition raise
                fired = conditions_met(conditions, value, node)
            if frees is not None:
                for dead in frees[i]:
                    self._retire(dead)
            if fired:
                return i + 1, node, fired
        return limit, None, ()

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
            f"while executing node {node.name!r} ({op_text(node)}) {where}: "
            f"{type(error).__name__}: {str(error).rstrip('.')}. The stepper stopped at this node: look at "
            "st.env and st.summary(name), then step again, or reset()."
        )
        self._error = NodeError(message, node.name, call, position, error)
        raise self._error from error
