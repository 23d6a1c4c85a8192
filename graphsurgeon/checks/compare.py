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

``cmp.locate()`` then goes inside the first diverging call and names the line of the
replacement where it starts to compute something else (:mod:`graphsurgeon.checks.locate`). compare
does that on its own when the call is small (its report then shows the line), and otherwise
says to call it.

With ``backward=True`` each call is also checked backward: from the gradient that reaches its
outputs in the swapped program, the gradients of its inputs and parameters, original partition
vs replacement (:mod:`graphsurgeon.checks._compare_backward`). A replacement whose outputs
match and whose gradients do not (a hand-written ``torch.autograd.Function`` backward off by a
factor) is then the first divergence, ``first_divergence_pass`` is ``"backward"``, and
``cmp.locate()`` names the line of its backward where it starts to differ
(:mod:`graphsurgeon.checks._locate_backward`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from .. import _meta
from .._program import as_inputs, as_program, not_a_program
from ..errors import CompareError, UnknownModuleError, did_you_mean
from ..fuse import fused_call
from ..partition import call_index, op_argument, program_index
from ..rewrite import swap_info
from ._compare_backward import (
    CallBackward,
    catch_upstream,
    compare_call_backward,
    detached_copy,
    program_backward,
)
from ._exec import (
    PrivateStateInterpreter,
    RandomState,
    bind_inputs,
    clone_inputs,
    keep_state,
    original_nodes,
    runnable_original,
)
from ._grad import input_labels
from ._locate_backward import BackwardRecord, locate_backward
from .locate import CallRecord, Location, locate_call, not_located
from .verify import (
    LeafCheck,
    VerifyReport,
    backward_report,
    compare_leaf,
    compare_outputs,
    in_order_of,
    tolerance_text,
)

__all__ = ["CallComparison", "Comparison", "compare"]


class _Recorder(PrivateStateInterpreter):
    """Runs a GraphModule node by node, keeping copies of the values it is asked to watch.

    ``calls``: call_module node names whose (args, kwargs) and output are captured, with
    torch's random state just before the call (``call_random``), so the original nodes can run
    from the state the replacement ran from.
    ``values``: node names whose values are captured. Nothing is registered on any module.
    ``grad``: the run has autograd on (``compare(..., backward=True)``): the copies are cut
    from its graph, and a hook on each watched call's outputs keeps, in ``call_upstream``, the
    gradient that reaches them when the run goes backward.
    """

    def __init__(self, gm: GraphModule, calls=(), values=(), grad: bool = False):
        super().__init__(gm)
        self.watch_calls = set(calls)
        self.watch_values = set(values)
        self.grad = grad
        self.call_inputs: dict[str, tuple[tuple, dict]] = {}
        self.call_outputs: dict[str, Any] = {}
        self.call_random: dict[str, RandomState] = {}
        self.call_upstream: dict[str, list[torch.Tensor | None]] = {}
        self.values: dict[str, Any] = {}
        self.failed_at: Node | None = None

    def run_node(self, n: Node) -> Any:
        self.failed_at = n
        copy = detached_copy if self.grad else clone_inputs
        if n.name in self.watch_calls:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            # copies: the replacement, or a later node, may write its inputs in place
            self.call_inputs[n.name] = copy((tuple(args), dict(kwargs)))
            self.call_random[n.name] = RandomState()
            result = getattr(self, n.op)(n.target, args, kwargs)
            self.call_outputs[n.name] = copy(result)
            if self.grad:
                catch_upstream(result, self.call_upstream.setdefault(n.name, []))
        else:
            result = super().run_node(n)
        if n.name in self.watch_values:
            self.values[n.name] = copy(result)
        self.failed_at = None
        return result


def _run(recorder: _Recorder, which: str, values: list[Any]) -> Any:
    with _failing(recorder, which), torch.no_grad():
        result = recorder.run(*values, enable_io_processing=False)
    return recorder.graph.process_outputs(result)


@contextlib.contextmanager
def _failing(recorder: _Recorder, which: str) -> Iterator[None]:
    """A run of ``recorder`` that fails raises a CompareError naming the node."""
    try:
        yield
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
        leaves: one :class:`~graphsurgeon.types.LeafCheck` per output leaf (path as in the output).
        input_drift: the largest absolute difference between the inputs this call received
            in the swapped program and in the original program (0.0 when upstream matches
            exactly; NaN when shapes differ).
        ok: whether the call matches: every output leaf within tolerance and, when the
            backward was checked, no gradient differs (``forward_ok`` and ``backward_ok`` are
            the two halves).
        backward_ok: with ``compare(..., backward=True)``, whether the gradients of the call's
            inputs and parameters match, from the same upstream gradient at its outputs; None
            when the backward was not checked or could not be (``backward_note`` says why).
        gradient_leaves: one check per gradient, named ``"grad of input x"`` or by the
            parameter's full name (``"grad of layers.3.norm.weight"``).
        backward_note: what was not differentiated or compared, or why the backward was not
            checked; ``""`` when there is nothing to say.
        tolerance_ratio: the worst error relative to the tolerance over its leaves (see
            :attr:`LeafCheck.tolerance_ratio <graphsurgeon.types.LeafCheck>`): below 1 it
            matches.
    """

    call_name: str
    replacement: str
    original: str
    leaves: tuple[LeafCheck, ...]
    input_drift: float
    ok: bool
    backward_ok: bool | None = None
    gradient_leaves: tuple[LeafCheck, ...] = ()
    backward_note: str = ""

    @property
    def forward_ok(self) -> bool:
        """Whether every output leaf matches within tolerance, whatever the gradients do."""
        return all(leaf.ok for leaf in self.leaves)

    @property
    def diverges_in(self) -> str | None:
        """``"forward"`` when its outputs differ, else ``"backward"`` when a gradient does,
        else None."""
        if not self.forward_ok:
            return "forward"
        return "backward" if self.backward_ok is False else None

    @property
    def worst_gradient(self) -> LeafCheck | None:
        """The gradient furthest beyond its tolerance (the first that differs when none was
        measured), or None when every gradient matches."""
        bad = [leaf for leaf in self.gradient_leaves if not leaf.ok]
        return max(bad, key=lambda leaf: (leaf.values_compared, leaf.tolerance_ratio), default=None)

    @property
    def max_abs(self) -> float:
        """The largest absolute difference over its output leaves."""
        return max((leaf.max_abs for leaf in self.leaves), default=0.0)

    @property
    def max_rel(self) -> float:
        """The largest relative difference over its output leaves."""
        return max((leaf.max_rel for leaf in self.leaves), default=0.0)

    @property
    def tolerance_ratio(self) -> float:
        """The worst error relative to the tolerance over its leaves: below 1 it matches."""
        return max(
            (leaf.tolerance_ratio for leaf in self.leaves if leaf.values_compared), default=0.0
        )

    @property
    def values_compared(self) -> bool:
        """Whether any value of its outputs was compared (False on meta tensors)."""
        return any(leaf.values_compared for leaf in self.leaves)

    @property
    def problem(self) -> str:
        """What differs, and where along each axis, for the first mismatching leaf ('' when
        the call matches): ``"(output): values differ beyond tolerance at 704 of 768
        positions; dim 1: 0–10 differ, 11 matches"``; in its backward, the worst gradient:
        ``"backward: grad of layers.3.norm.weight: values differ ..."``."""
        for leaf in self.leaves:
            if not leaf.ok:
                where = leaf.path or "(output)"
                detail = "; ".join(part for part in (leaf.problem, leaf.by_axis) if part)
                return f"{where}: {detail}" if detail else where
        if self.backward_ok is False:
            worst = self.worst_gradient
            if worst is None:
                return f"backward: {self.backward_note}"
            detail = "; ".join(part for part in (worst.problem, worst.by_axis) if part)
            return f"backward: {worst.path}: {detail}" if detail else f"backward: {worst.path}"
        return ""

    @property
    def backward_text(self) -> str:
        """The backward verdict in a few words: ``"ok"``, ``"differs: grad of x 0.5"`` (the
        worst gradient and its largest absolute error), ``"not checked"`` or
        ``"no gradient"``."""
        if self.backward_ok is None:
            return "no gradient" if self.backward_note else "not checked"
        if self.backward_ok:
            measured = any(g.values_compared for g in self.gradient_leaves)
            return "ok" if measured or not self.gradient_leaves else "no values compared"
        worst = self.worst_gradient
        if worst is None:
            return "differs"
        error = _meta.number_text(worst.max_abs) if worst.values_compared else "no values"
        return f"differs: {worst.path.removeprefix('grad of ')} {error}"


# What the table of a comparison shows of each call, as text and as HTML.
_COLUMNS = (
    "call",
    "replacement",
    "leaves",
    "max abs",
    "max rel",
    "of tolerance",
    "input drift",
)


@dataclass(frozen=True, repr=False)
class Comparison:
    """What :func:`compare` found, call by call in graph order, and at the program's outputs.

    ``first_divergence`` is the first call whose outputs differ beyond tolerance (or None);
    ``outputs`` is a :class:`~graphsurgeon.VerifyReport` of the original program's outputs vs
    the swapped program's. Truthy when no call diverges and the outputs match.
    ``random_ops`` says where the programs draw random numbers (``"node 'dropout' in module
    'd'"``; empty when they do not): both programs, and each original call, run from the same
    random state, yet a replacement that draws its random numbers otherwise sees another
    stream, and the report says so when something differs.
    ``print(cmp)`` shows a report, ``cmp.table()`` only the table, ``cmp.rows`` a list of dicts
    (``pandas.DataFrame(cmp.rows)``), ``cmp["layers.1.attn"]`` one call. ``cmp.locate()`` goes
    inside the first diverging call and names the line of its replacement where it starts to
    differ; ``cmp.location`` is that answer when it is already known (compare finds it on its
    own for a small call), else None.
    """

    calls: tuple[CallComparison, ...]
    outputs: VerifyReport
    rtol: float
    atol: float
    random_ops: tuple[str, ...] = ()
    #: whether the backward was checked too (``compare(..., backward=True)``): each call's
    #: gradients, and the program's (``outputs.gradients``)
    backward: bool = False
    # what locate() needs of the first diverging call (its inputs as received, ...)
    _record: CallRecord | None = field(default=None, repr=False, compare=False)
    _by_name: Mapping[str, CallComparison] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {c.call_name: c for c in self.calls})

    @property
    def first_divergence(self) -> str | None:
        """The first call (in graph order) whose outputs differ beyond tolerance, or, with
        ``backward=True``, whose gradients do; None when none does."""
        return next((c.call_name for c in self.calls if not c.ok), None)

    @property
    def first_divergence_pass(self) -> str | None:
        """Where the first diverging call differs: ``"forward"`` (its outputs), ``"backward"``
        (its outputs match, a gradient does not), or None when no call diverges."""
        first = self.first_divergence
        return None if first is None else self[first].diverges_in

    @property
    def divergent(self) -> tuple[str, ...]:
        """Every call whose outputs (or, with ``backward=True``, gradients) differ beyond
        tolerance, in graph order."""
        return tuple(c.call_name for c in self.calls if not c.ok)

    @property
    def ok(self) -> bool:
        """Whether no call diverges and the program's outputs match."""
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

    def locate(self) -> Location:
        """Inside the first diverging call, the first op of the replacement whose value matches
        no value the original call computes while its inputs do: ``.call``, ``.op``,
        ``.source`` (``"file.py:LINE"`` in the replacement's code) and ``.line`` (its text).

        The replacement is exported on the very inputs the call received in the swapped run
        and run node by node beside the original call's own nodes (:mod:`graphsurgeon.checks.locate`
        says how values are matched). When nothing can be found the answer is falsy and its
        ``.reason`` says why: no call diverges, the replacement cannot be traced (and why), the
        programs ran on the meta device, or every op's value matches (the difference is in
        what the replacement returns where). Computed once; ``cmp.location`` then has it.

        When the first diverging call diverges in its backward (``compare(...,
        backward=True)``: its outputs match, its gradients do not), the answer is the first op
        of the replacement's backward whose value matches no value the original's backward
        computes while its inputs do: a line of a ``torch.autograd.Function``'s ``backward``,
        or, for a replacement autograd differentiates, the forward line whose derivative
        differs (:mod:`graphsurgeon.checks._locate_backward`).

        Example:
            >>> import torch, graphsurgeon as gs
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
            >>> x = torch.randn(2, 4)
            >>> ep = gs.export(model, (x,))
            >>> located = gs.compare(ep, gs.swap(ep, {"1": torch.nn.Sigmoid()}), (x,)).locate()
            >>> located.call, located.op
            ('1', 'aten.sigmoid.default(f32[2, 4])')
        """
        first = self.first_divergence
        if first is None:
            if not self.values_compared:
                return not_located(
                    "",
                    "the programs ran on the meta device: no values were compared, so no call "
                    "diverges and there is no op to find; run compare on real tensors",
                )
            return not_located("", "no call diverges: there is nothing to locate")
        if self._record is None:
            return not_located(
                first,
                "this Comparison keeps no inputs of the call (it was not made by compare); run "
                "gs.compare again",
                self[first].replacement,
            )
        if self._record.backward is not None:
            return locate_backward(self._record)
        return locate_call(self._record)

    @property
    def location(self) -> Location | None:
        """The answer of :meth:`locate` when it is already known, else None (nothing is
        computed here)."""
        if self._record is None:
            return None
        return self._record.cache.get("location")

    def _location_text(self) -> str:
        """One line on where the first diverging call goes wrong, or how to find out."""
        first = self.first_divergence
        found = self.location
        if found is None:
            return f"cmp.locate() names the line of the replacement of {first!r} where it starts to differ"
        if found.found:
            return f"located: {found.where}: {found.verdict}"
        return f"not located: {found.reason}"

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
                "tolerance_ratio": c.tolerance_ratio,
                "input_drift": c.input_drift,
                "ok": c.ok,
                "values_compared": c.values_compared,
                **(self._backward_row(c) if self.backward else {}),
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
                "tolerance_ratio": max(
                    (leaf.tolerance_ratio for leaf in self.outputs.leaves if leaf.values_compared),
                    default=0.0,
                ),
                "input_drift": math.nan,
                "ok": self.outputs.ok,
                "values_compared": self.outputs.values_compared,
                **(self._backward_outputs_row() if self.backward else {}),
            }
        )
        return rows

    @staticmethod
    def _backward_row(call: CallComparison) -> dict[str, Any]:
        worst = call.worst_gradient
        return {
            "forward_ok": call.forward_ok,
            "backward_ok": call.backward_ok,
            "backward": call.backward_text,
            "worst_gradient": worst.path if worst is not None else "",
            "gradient_max_abs": max((g.max_abs for g in call.gradient_leaves), default=0.0),
        }

    def _backward_outputs_row(self) -> dict[str, Any]:
        report = self.outputs
        bad = report.gradient_mismatches
        worst = max(bad, key=lambda g: (g.values_compared, g.tolerance_ratio), default=None)
        if report.backward_problem:
            text = "no gradient"
        elif worst is None and not any(g.values_compared for g in report.gradients):
            text = "no values compared" if report.gradients else "match"
        elif worst is None:
            text = "match"
        else:
            text = (
                f"differs: {worst.path.removeprefix('grad of ')} {_meta.number_text(worst.max_abs)}"
            )
        return {
            "forward_ok": report.outputs_ok,
            # None, as a call's: the program's backward could not run (the report says why)
            "backward_ok": None if report.backward_problem else report.gradients_ok,
            "backward": text,
            "worst_gradient": worst.path if worst is not None else "",
            "gradient_max_abs": max((g.max_abs for g in report.gradients), default=0.0),
        }

    def table(self) -> str:
        """The rows as an aligned text table."""
        backward = ("backward",) if self.backward else ()
        header = (*_COLUMNS, *backward, "verdict")
        lines = [header]
        for row in self.rows:
            outputs = row["call"] == "(outputs)"
            if outputs:
                verdict = "match" if row["ok"] else "DRIFT"
                if self.backward and row["backward_ok"] is None and row["forward_ok"]:
                    verdict = "NOT CHECKED"  # verify's word for a backward that could not run
            else:
                verdict = "ok" if row["ok"] else "DIVERGES"
                if self.backward and not row["ok"] and row["forward_ok"]:
                    verdict = "DIVERGES in backward"
            measured = row["values_compared"]
            lines.append(
                (
                    row["call"],
                    row["replacement"],
                    str(row["leaves"]),
                    _meta.number_text(row["max_abs"]) if measured else "no values compared",
                    _meta.number_text(row["max_rel"]) if measured else "",
                    tolerance_text(row["tolerance_ratio"]) if measured else "",
                    "" if outputs or not measured else _meta.number_text(row["input_drift"]),
                    *((row["backward"],) if self.backward else ()),
                    verdict,
                )
            )
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        text = []
        for line in lines:
            cells = [
                cell.rjust(width) if 2 <= i <= 6 else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(line, widths))
            ]
            text.append("  ".join(cells).rstrip())
        return "\n".join(text)

    @property
    def values_compared(self) -> bool:
        """False when the programs ran on the meta device: only structure, shapes and dtypes
        were compared (every leaf says so), not values."""
        leaves = [leaf for call in self.calls for leaf in call.leaves] + list(self.outputs.leaves)
        return not leaves or not all("values not compared" in leaf.problem for leaf in leaves)

    def __str__(self) -> str:
        first = self.first_divergence
        n = len(self.calls)
        head = f"compare: {n} swapped call{'s' if n != 1 else ''}"
        if not self.values_compared:
            head += " (meta tensors: shapes and dtypes only, no values compared)"
        if first is None:
            head += ", none diverges"
        else:
            head += f", first divergence: {first!r}"
            if self.first_divergence_pass == "backward":
                head += " (in its backward)"
        if self.backward:
            head += ", forward and backward"
        head += f" (rtol={self.rtol:g}, atol={self.atol:g})"
        lines = [head, *("  " + line for line in self.table().splitlines())]
        if first is not None:
            call = self[first]
            if self.first_divergence_pass == "backward":
                lines.append(
                    f"  {first!r} ({call.replacement}) diverges in its backward: its outputs "
                    "match, its gradients do not, from the same upstream gradient"
                )
            lines.append(f"  {first!r} ({call.replacement}): {call.problem}")
            if call.input_drift and call.input_drift > 0:
                lines.append(
                    f"  (its inputs had already drifted by {_meta.number_text(call.input_drift)}, "
                    "but it was compared on exactly what it received)"
                )
            lines.append(f"  {self._location_text()}")
        elif not self.outputs.ok:
            lines.append("  " + self._drift_without_divergence())
        if self.random_ops and not self.ok:
            lines.append("  " + self._random_note())
        if self.outputs.structure_problem:
            lines.append(f"  outputs: {self.outputs.structure_problem}")
        return "\n".join(lines)

    def _drift_without_divergence(self) -> str:
        if self.backward and self.outputs.outputs_ok and not self.outputs.ok:
            bad = self.outputs.gradient_mismatches
            if not bad:
                return f"the program's gradients were not checked: {self.outputs.backward_problem}"
            worst = max(bad, key=lambda g: (g.values_compared, g.tolerance_ratio))
            return (
                "no call diverges on its own, but the program's gradients differ (worst: "
                f"{worst.path}, max abs {_meta.number_text(worst.max_abs)})"
            )
        drift = _meta.number_text(self.outputs.max_abs)
        drift = f"no call diverges on its own, but the outputs drift by {drift}"
        if self.random_ops:  # then a different random stream explains it as well as any
            return drift
        return f"{drift}: small differences add up downstream"

    def _random_note(self) -> str:
        where = self.random_ops[0]
        more = len(self.random_ops) - 1
        if more:
            where += f", and {more} more"
        return (
            f"the model uses random ops ({where}): differences may come from a different "
            "random stream (a replacement that draws random numbers in another order or "
            "amount) rather than from what the calls compute"
        )

    def __repr__(self) -> str:
        first = self.first_divergence
        verdict = f"first divergence {first!r}" if first else "no divergence"
        if self.first_divergence_pass == "backward":
            verdict += " in its backward"
        drift = (
            "outputs match"
            if self.outputs.ok
            else f"outputs drift {_meta.number_text(self.outputs.max_abs)}"
        )
        if self.backward and self.outputs.outputs_ok and not self.outputs.ok:
            said = "not checked" if self.outputs.backward_problem else "differ"
            drift = f"outputs match, gradients {said}"
        calls = f"{len(self.calls)} swapped call{'' if len(self.calls) == 1 else 's'}"
        if not self.values_compared:
            drift = "no values compared (meta)"
        return f"<Comparison: {calls}, {verdict}, {drift}>"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        from .. import display as d

        first = self.first_divergence
        n = len(self.calls)
        if first is None:
            verdict = d.badge("no call diverges", "ok")
        elif self.first_divergence_pass == "backward":
            verdict = d.badge(f"first divergence: {first}, in its backward", "bad")
        else:
            verdict = d.badge(f"first divergence: {first}", "bad")
        outputs = (
            d.badge("outputs match", "ok")
            if self.outputs.ok
            else d.badge(f"outputs drift {_meta.number_text(self.outputs.max_abs)}", "warn")
        )
        if self.backward and self.outputs.outputs_ok and not self.outputs.ok:
            said = "not checked" if self.outputs.backward_problem else "differ"
            outputs = d.badge(f"outputs match, gradients {said}", "warn")
        if not self.outputs.ok and not self.outputs.values_compared:
            outputs = d.badge("outputs differ (no values compared)", "warn")
        if not self.values_compared:
            outputs = d.badge("meta: shapes only, no values compared", "warn")
        passes = ", forward and backward" if self.backward else ""
        head = (
            f'<div class="gs-title">compare {verdict} {outputs} <span class="gs-muted">{n} '
            f"swapped call{'s' if n != 1 else ''}{passes}, rtol={self.rtol:g}, "
            f"atol={self.atol:g}</span></div>"
        )
        body = d.comparison_table(self)  # the one writer, the widget's compare panel's too
        note = ""
        if first is not None and self.first_divergence_pass == "backward":
            note += (
                f"<div>{d.escape(first)} diverges in its backward: its outputs match, its "
                "gradients do not, from the same upstream gradient.</div>"
            )
        if first is not None:
            note += self._location_html()
        if first is not None and self[first].input_drift and self[first].input_drift > 0:
            note += (
                f'<div class="gs-muted">{d.escape(first)} was compared on exactly what it '
                f"received; its inputs had already drifted by "
                f"{_meta.number_text(self[first].input_drift)}.</div>"
            )
        elif first is None and self.backward and self.outputs.outputs_ok and not self.outputs.ok:
            note = f'<div class="gs-muted">{d.escape(self._drift_without_divergence())}.</div>'
        elif first is None and not self.outputs.ok and not self.random_ops:
            note = (
                '<div class="gs-muted">no call diverges on its own, but small differences add '
                "up downstream.</div>"
            )
        elif first is None and not self.outputs.ok:
            note = '<div class="gs-muted">no call diverges on its own.</div>'
        if self.random_ops and not self.ok:
            note += f'<div class="gs-muted">{d.escape(self._random_note())}.</div>'

        outputs_table = d.details("the program's outputs", self.outputs._repr_html_())
        return head + body + note + outputs_table

    def _location_html(self) -> str:
        from .. import display as d

        found = self.location
        if found is None:
            return (
                f'<div class="gs-muted"><code>cmp.locate()</code> names the line of the '
                f"replacement of {d.escape(self.first_divergence)} where it starts to "
                "differ.</div>"
            )
        if not found.found:
            return f"<div>{d.badge('not located', 'warn')} {d.escape(found.reason)}</div>"
        return (
            f"<div>{d.badge('located', 'bad')} <code>{d.escape(found.source or found.op)}</code>"
            f" <code>{d.escape(found.line)}</code>: {d.escape(found.verdict)} "
            f'<span class="gs-muted">({d.escape(found.op)})</span></div>'
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display

        return display.bundle(self._repr_html_(), repr(self), include, exclude)


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
    locate: bool | None = None,
    backward: bool = False,
) -> Comparison:
    """Compare every swapped call of ``swapped`` with the original partition it replaced.

    Args:
        ep: the ExportedProgram ``swapped`` was made from (it is not modified).
        swapped: the result of ``gs.swap(ep, {...})`` (or a Surgery of ``ep``: its current
            program).
        args: the model's positional inputs, as for ``gs.verify``.
        kwargs: its keyword inputs.
        rtol: the relative tolerance: a leaf matches when ``|a - b| <= atol + rtol * |a|``
            everywhere (NaN matches NaN), ``a`` being the original's value.
        atol: the absolute tolerance.
        locate: whether to find the line where the first diverging call's replacement starts
            to differ now (``cmp.locate()``, shown in the report): True, False, or None (the
            default) for "when the call is small" (at most 400 nodes and 16 MiB of inputs:
            exporting and running it costs a fraction of the comparison). Otherwise the report
            says to call ``cmp.locate()``.
        backward: also compare each call's backward. The swapped program runs forward with
            autograd on and backward from seeded standard-normal gradients at its outputs (as
            ``gs.verify(..., backward=True)`` seeds them); the gradient that reaches each
            swapped call's outputs is kept. Then the original partition and the replacement
            each run forward from the call's captured inputs and backward from that same
            gradient, and the gradients of the call's floating inputs (``"grad of input x"``)
            and parameters (``"grad of layers.3.norm.weight"``) are compared as verify compares
            them (:attr:`CallComparison.backward_ok`, ``.gradient_leaves``). A call whose
            outputs no gradient reaches is said so, not counted as a divergence. The
            program-level check (``cmp.outputs``) then compares the program's gradients too.

    Both programs run once, under ``no_grad``, each on its own copy of the inputs. For each
    swapped call, the original partition runs on a copy of the inputs the replacement received
    in the swapped run, and its outputs are compared with the replacement's, leaf by leaf.

    With ``backward=True`` they run with autograd on instead (nothing is accumulated into any
    ``.grad``): a replacement whose forward matches and whose backward does not is the first
    divergence, and ``cmp.first_divergence_pass`` says ``"backward"``.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.checks.compare import compare
        >>> class Halved(torch.autograd.Function):  # a forward that is right, a backward not
        ...     @staticmethod
        ...     def forward(ctx, x):
        ...         return torch.relu(x)
        ...     @staticmethod
        ...     def backward(ctx, grad):
        ...         return grad / 2
        >>> class HalvedReLU(torch.nn.Module):
        ...     def forward(self, x):
        ...         return Halved.apply(x)
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> x = torch.randn(2, 4)
        >>> ep = gs.export(model, (x,))
        >>> cmp = compare(ep, gs.swap(ep, {"1": HalvedReLU()}), (x,), backward=True, locate=False)
        >>> cmp.first_divergence, cmp.first_divergence_pass, cmp["1"].forward_ok, cmp["1"].backward_ok
        ('1', 'backward', True, False)

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
    if not isinstance(ep, ExportedProgram):
        raise not_a_program(ep, "compare")
    if not isinstance(backward, bool):
        raise CompareError(f"compare: backward={backward!r}: expected True or False")
    candidate = as_program(swapped, verb="compare")  # a model, any other object: refused alike
    args, kwargs = as_inputs(args, kwargs, verb="compare")
    if candidate.module is None and candidate.surgery is not None:
        swapped = candidate.surgery.module  # nothing swapped: there is nothing to compare
    elif candidate.module is None:
        raise CompareError(
            f"compare: the second argument ({type(swapped).__name__}) was not made by gs.swap; "
            "pass gs.swap(ep, {name: replacement})"
        )
    else:
        swapped = candidate.module
    info = swap_info(swapped)
    if info.program is not ep:
        raise CompareError(
            "compare: the swapped program was made from another ExportedProgram than the one "
            "given; pass the program it was made from (graphsurgeon.swap.swap_info(swapped).program)"
        )
    original, same = runnable_original(ep), original_nodes(ep)
    # fused calls run the program's own nodes: nothing to compare there
    call_nodes = {c: n for c, n in info.call_nodes.items() if c not in info.fused}
    watched_inputs = {
        same[name].name
        for call in call_nodes
        for name in _meta.graph_names(info.partitions[call].signature.inputs)
        if name in same
    }
    # Both programs run from the same random state, and each original call from the state the
    # swapped run had just before that call: a faithful replacement of a module that draws
    # random numbers (dropout in training mode) compares exactly. The caller's random stream
    # is left as it was.
    start = RandomState()
    try:
        reference = _Recorder(original, values=watched_inputs, grad=backward)
        capture = _Recorder(swapped, calls=call_nodes.values(), grad=backward)
        if backward:
            # the program's gradients too, from the same seeded upstream gradients; the hooks
            # of the swapped run keep the gradient that reaches each call's outputs
            labels = input_labels(original, args, kwargs)
            with _failing(reference, "original program"):
                expected_run = program_backward(reference, original, args, kwargs, labels, None)
            start.restore()
            with _failing(capture, "swapped program"):
                actual_run = program_backward(
                    capture, swapped, args, kwargs, labels, expected_run.upstream
                )
            expected, actual = expected_run.outputs, actual_run.outputs
            outputs = backward_report(expected_run, actual_run, rtol, atol)
        else:
            expected = _run(
                reference,
                "original program",
                bind_inputs(original, clone_inputs(args), clone_inputs(kwargs)),
            )
            start.restore()
            actual = _run(
                capture,
                "swapped program",
                bind_inputs(swapped, clone_inputs(args), clone_inputs(kwargs)),
            )
            outputs = compare_outputs(expected, actual, rtol=rtol, atol=atol)
        original_values = {name: reference.values.get(node.name) for name, node in same.items()}
        calls = []
        record = None
        for name, node_name in call_nodes.items():
            replacement = info.calls[name]
            if node_name not in capture.call_inputs:
                continue  # the call never ran (dead code): nothing to compare
            capture.call_random[node_name].restore()
            compared, original_out = _compare_call(
                ep,
                name,
                info.partitions[name],
                replacement,
                capture.call_inputs[node_name],
                capture.call_outputs[node_name],
                original_values,
                rtol,
                atol,
            )
            grads = None
            if backward:
                grads = compare_call_backward(
                    ep,
                    name,
                    info.partitions[name],
                    replacement,
                    capture.call_inputs[node_name],
                    capture.call_outputs[node_name],
                    original_out,
                    capture.call_upstream.get(node_name),
                    capture.call_random[node_name],
                    rtol,
                    atol,
                )
                compared = dataclasses.replace(
                    compared,
                    ok=compared.ok and grads.ok is not False,
                    backward_ok=grads.ok,
                    gradient_leaves=grads.leaves,
                    backward_note=grads.note,
                )
            calls.append(compared)
            if record is None and not compared.ok:
                # what cmp.locate() needs, kept for the first diverging call only
                record = CallRecord(
                    ep,
                    name,
                    replacement,
                    info.partitions[name].signature,
                    capture.call_inputs[node_name],
                    capture.call_outputs[node_name],
                    capture.call_random[node_name],
                    compared.leaves,
                    rtol,
                    atol,
                    partition=info.partitions[name],
                    backward=_backward_part(compared, grads),
                )
    finally:
        start.restore()
    comparison = Comparison(
        tuple(calls),
        outputs,
        rtol,
        atol,
        random_ops=_random_ops(ep, info.calls),
        backward=backward,
        _record=record,
    )
    if record is not None and (locate or (locate is None and _small(record, info))):
        try:
            comparison.locate()
        except Exception as error:  # compare's answer stands; say why the line is missing
            if locate:
                raise
            record.cache["location"] = not_located(
                record.call,
                f"locating failed: {type(error).__name__}: {error}",
                type(record.replacement).__name__,
            )
    return comparison


# What compare locates on its own: a call this small exports and runs in a fraction of the
# time the comparison itself takes (benchmarks/locate.py).
_SMALL_NODES = 400
_SMALL_BYTES = 16 * 2**20


def _backward_part(compared: CallComparison, grads: CallBackward | None) -> Any:
    """What locate needs to go into a call's backward: the upstream gradients, the input
    labels and the gradients that differ; None when the call diverges in its forward."""
    if grads is None or not compared.forward_ok or grads.ok is not False:
        return None
    return BackwardRecord(
        grads.upstream, grads.original_upstream, grads.labels, grads.leaves, grads.note
    )


def _small(record: CallRecord, info: Any) -> bool:
    if info.partitions[record.call].num_nodes > _SMALL_NODES:
        return False
    tensors = [t for t in pytree.tree_leaves(record.inputs) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors) <= _SMALL_BYTES


def _random_ops(ep: ExportedProgram, replacements: Mapping[str, Any]) -> tuple[str, ...]:
    """Where the program and its replacements draw random numbers, as text: the program's
    nodes whose op is seeded (``torch.Tag.nondeterministic_seeded``: dropout, bernoulli, rand,
    ...) unless they are told not to (``train=False``), and the dropout modules of the
    replacements that are in training mode."""
    where = []
    calls = call_index(ep)
    for node in ep.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if torch.Tag.nondeterministic_seeded not in node.target.tags or not _draws(node):
            continue
        call = calls.call_of(node.name) if node.name in calls.chains else ""
        where.append(f"node {node.name!r} in module {call!r}" if call else f"node {node.name!r}")
    for name, replacement in replacements.items():
        if not isinstance(replacement, torch.nn.Module):
            continue
        for inner, module in replacement.named_modules():
            dropout = isinstance(module, torch.nn.modules.dropout._DropoutNd)
            if dropout and module.training and module.p > 0:
                fqn = f"{name}.{inner}" if inner else name
                where.append(f"{type(module).__name__} {fqn!r} of the replacement")
    return tuple(where)


def _draws(node: Node) -> bool:
    """Whether a seeded op's call draws random numbers: not when its ``train`` argument is
    False (dropout in eval mode) or its probability (``p``, attention's ``dropout_p``) is 0."""
    train = op_argument(node, "train", True)
    if train is False:
        return False
    for name in ("p", "dropout_p"):
        value = op_argument(node, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
            return False
    return True


def _compare_call(
    ep, name, part, replacement, inputs, output, original_values, rtol, atol
) -> tuple[CallComparison, Any]:
    """The call compared, and what the original partition returned (its backward reads it)."""
    signature = part.signature
    flat_inputs = _up_to(signature.in_spec, inputs)
    if flat_inputs is None or len(flat_inputs) != len(signature.inputs):
        raise CompareError(
            f"internal: the inputs captured for {name!r} have the structure "
            f"{_meta.describe_spec(pytree.tree_structure(inputs))}, not the signature's "
            f"{_meta.describe_spec(signature.in_spec)}"
        )
    index = program_index(ep)
    graph_inputs = [v for a, v in zip(signature.inputs, flat_inputs) if not _meta.is_constant(a)]
    upstream = [original_values.get(n) for n in _meta.graph_names(signature.inputs)]
    drift = _max_drift(upstream, graph_inputs)
    module = fused_call(ep, name, part)  # a module's call, or a region's (Surgery.replace)
    args, kwargs = inputs
    try:
        # the cut has buffers of its own: put them back after it ran, for the next question
        # (an output that is such a buffer keeps the values it was returned with)
        with torch.no_grad(), keep_state([module]) as state:
            original_out = state.unshared(module(*clone_inputs(args), **clone_inputs(kwargs)))
    except Exception as error:
        raise CompareError(
            f"running the original nodes of {name!r} on the captured inputs failed: "
            f"{type(error).__name__}: {error}"
        ) from error
    expected_leaves = _up_to(signature.out_spec, original_out)
    # a dict returned with its keys in another order holds the same outputs
    flat_out = _up_to(signature.out_spec, in_order_of(original_out, output))
    paths = _meta.leaf_keystrs(signature.out_spec)
    leaves = []
    if flat_out is None or len(flat_out) != len(signature.outputs):
        leaves.append(
            LeafCheck(
                "",
                False,
                math.nan,
                math.nan,
                f"returned {_meta.describe_spec(pytree.tree_structure(output))}, expected "
                f"{_meta.describe_spec(signature.out_spec)}",
            )
        )
    else:
        for argument, path, expected, actual in zip(
            signature.outputs, paths, expected_leaves, flat_out
        ):
            constant = _meta.is_constant(argument)
            node = None if constant else index.by_name.get(argument.name)
            if not constant and node is None:
                # the original program never computed it (nothing used it): nothing to compare
                leaves.append(
                    LeafCheck(path, True, 0.0, 0.0, "unused: not computed by the original")
                )
                continue
            leaf = compare_leaf(path, expected, actual, rtol=rtol, atol=atol)
            if node is not None and not node.users:
                # an output nothing in the program reads: a difference there cannot matter
                problem = "unused by the program" + ("" if leaf.ok else f"; {leaf.problem}")
                leaf = dataclasses.replace(leaf, ok=True, problem=problem, by_axis="", differing=())
            leaves.append(leaf)
    compared = CallComparison(
        call_name=name,
        replacement=type(replacement).__name__,
        original=part.type_name,
        leaves=tuple(leaves),
        input_drift=drift,
        ok=all(leaf.ok for leaf in leaves),
    )
    return compared, original_out
