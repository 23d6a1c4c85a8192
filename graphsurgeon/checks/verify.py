"""verify(): do two programs compute the same thing? Output by output, pytree-aware."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from .._meta import describe_spec, number_text, tolerance_text
from .._program import as_inputs
from ..errors import GraphSurgeonError, VerifyError, a_type, did_you_mean
from ..rewrite import check_module
from ._exec import RandomState, clone_inputs, keep_state, runnable_original
from ._grad import Backward, given_upstream, input_labels, run_backward
from ._leaves import (
    LeafCheck,
    _largest,
    checked_tolerance,
    compare_leaf,
    in_order_of,
)

__all__ = [
    "LeafCheck",
    "VerifyReport",
    "as_callable",
    "candidate_kind",
    "checked_tolerance",
    "compare_leaf",
    "in_order_of",
    "verify",
]


_ATOL_SHARE = 0.01


def _measured(leaf: LeafCheck) -> str:
    """A leaf's errors as text: ``"max abs 0.5, max rel 0.25, 37x of tolerance"``, or ``"no
    values compared"`` (never an error of NaN where nothing was measured)."""
    if not leaf.values_compared:
        return "no values compared"
    return (
        f"max abs {leaf.max_abs:.3g}, max rel {leaf.max_rel:.3g}, "
        f"{tolerance_text(leaf.tolerance_ratio)} of tolerance"
    )


def _details(leaf: LeafCheck) -> str:
    """What a leaf's problem is and where it differs, as one text."""
    return "; ".join(part for part in (leaf.problem, leaf.by_axis) if part)


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`. Truthy when every output leaf matches.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> report = gs.verify(torch.nn.ReLU(), torch.nn.ReLU(), (torch.randn(3),))
        >>> bool(report), len(report.leaves)
        (True, 1)
    """

    ok: bool
    leaves: tuple[LeafCheck, ...]
    structure_problem: str
    rtol: float
    atol: float
    #: what the candidate was compared with, in words ("the eager model with the same
    #: replacements"); '' when the caller said nothing
    against: str = ""
    #: the second verdict of a Surgery's verify: the same program against the *original* model
    #: (does it still compute what the original did?), when this report is against the eager
    #: model with the same replacements (is the swap faithful?); None otherwise
    original: VerifyReport | None = field(default=None, repr=False)
    #: when a Surgery's faithful check fails: each swapped module that eager calls with other
    #: arguments than the program does ("in eager, 'attn' gets mask=None; the program passes
    #: mask=b8[1, 1, 6, 6]"), the likely cause when the replacement itself is right
    call_differences: tuple[str, ...] = ()
    #: whether the gradients were checked too (``verify(..., backward=True)``)
    backward: bool = False
    #: with ``backward``: one check per gradient, named ``"grad of layers.3.norm.weight"`` or
    #: ``"grad of input x"``, in the reference's order (inputs, then parameters)
    gradients: tuple[LeafCheck, ...] = ()
    #: with ``backward``: what was not differentiated or not compared, in words (integer
    #: inputs, buffers, frozen parameters, parameters only one side has, where the upstream
    #: gradients came from)
    backward_notes: tuple[str, ...] = ()
    #: with ``backward``: why the gradients could not be checked ('' when they were): the
    #: report is then not truthy, it does not pass a check that did not run
    backward_problem: str = ""
    #: what the candidate was, in words (:func:`candidate_kind`): "an AOTInductor package", "a
    #: torch.compile'd module", "a GraphModule", "an ExportedProgram", "an eager model"...; the
    #: text and the HTML name it when it is compiled code (what ships), not Python graphsurgeon
    #: reads
    candidate_kind: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @property
    def mismatches(self) -> tuple[LeafCheck, ...]:
        """The output leaves that do not match, in output order."""
        return tuple(leaf for leaf in self.leaves if not leaf.ok)

    @property
    def gradient_mismatches(self) -> tuple[LeafCheck, ...]:
        """The gradients that do not match (with ``backward=True``), in the reference's order."""
        return tuple(leaf for leaf in self.gradients if not leaf.ok)

    @property
    def outputs_ok(self) -> bool:
        """Whether the outputs match, whatever the gradients do."""
        return not self.structure_problem and all(leaf.ok for leaf in self.leaves)

    @property
    def gradients_ok(self) -> bool | None:
        """Whether every gradient matches; None when no gradient was checked."""
        if not self.backward:
            return None
        return not self.backward_problem and all(leaf.ok for leaf in self.gradients)

    @property
    def max_abs(self) -> float:
        """The largest absolute error; NaN when a leaf's error could not be measured."""
        return _largest([leaf.max_abs for leaf in self.leaves])

    @property
    def values_compared(self) -> bool:
        """Whether any output value was compared (False on meta tensors, for instance)."""
        return any(leaf.values_compared for leaf in self.leaves)

    @property
    def decided_by_atol(self) -> tuple[LeafCheck, ...]:
        """The matching floating-point leaves so small that ``atol`` alone decided they match:
        ``atol`` is at least 1% of their largest value, so they could be off by that share and
        still match (outputs of ~1e-9 at random init; a perturbation smaller than ``atol``).
        :attr:`atol_note` says it in words and suggests a tolerance relative to the outputs.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> tiny = torch.full((3,), 2e-6)
            >>> report = gs.verify(lambda x: x, lambda x: x * 1.5, (tiny,))
            >>> bool(report), [leaf.path for leaf in report.decided_by_atol]
            (True, [''])
            >>> print(report.atol_note)  # doctest: +NORMALIZE_WHITESPACE
            the verdict is decided by atol: the outputs are small (largest |value| 2e-06), and
            atol=1e-05 alone lets them be off by 500% of that; for a check relative to the
            outputs, pass atol=2e-11 (rtol x the largest |value|)
        """
        return tuple(
            leaf
            for leaf in self.leaves
            if leaf.ok
            and leaf.values_compared
            and not math.isnan(leaf.scale)
            and leaf.scale > 0
            and self.atol >= _ATOL_SHARE * leaf.scale
        )

    @property
    def atol_note(self) -> str:
        """When a match is decided by ``atol`` alone (:attr:`decided_by_atol`): what that
        means and a tolerance relative to the outputs; ``""`` otherwise (and for a mismatch)."""
        small = self.decided_by_atol if self.ok else ()
        if not small:
            return ""
        smallest = min(small, key=lambda leaf: leaf.scale)
        where = f" at {smallest.path}" if smallest.path and len(self.leaves) > 1 else ""
        share = self.atol / smallest.scale
        suggested = (self.rtol or 1e-5) * smallest.scale
        how = "rtol" if self.rtol else "1e-5"
        return (
            f"the verdict is decided by atol: the outputs are small (largest |value| "
            f"{smallest.scale:.2g}{where}), and atol={self.atol:g} alone lets them be off by "
            f"{share:.0%} of that; for a check relative to the outputs, pass "
            f"atol={suggested:.2g} ({how} x the largest |value|)"
        )

    def __str__(self) -> str:
        head = "match" if self.ok else "MISMATCH"
        if self.atol_note:
            head += " (decided by atol alone: see the note)"
        against = f" against {self.against}" if self.against else ""
        n = len(self.gradients)
        grads = f", {n} gradient{'' if n == 1 else 's'}" if self.backward else ""
        lines = [
            f"verify: {head}{against} ({len(self.leaves)} output {'leaf' if len(self.leaves) == 1 else 'leaves'}{grads}, rtol={self.rtol:g}, atol={self.atol:g})"
        ]
        if self.candidate_kind in COMPILED_KINDS:
            lines.append(f"  candidate: {self.candidate_kind}")
        if self.atol_note:
            lines.append(f"  note: {self.atol_note}")
        lines.extend(f"  why: {difference}" for difference in self.call_differences)
        if self.original is not None:
            second = "match" if self.original.ok else "MISMATCH"
            both = " (outputs and gradients)" if self.original.backward else ""
            lines.append(
                f"  and against the original model{both}: {second}"
                + (f" ({_measured_report(self.original)})" if not self.original.ok else "")
            )
        if self.structure_problem:
            lines.append(f"  structure: {self.structure_problem}")
        for leaf in self.leaves:
            mark = "ok " if leaf.ok else "BAD"
            where = leaf.path or "(output)"
            detail = _measured(leaf)
            if _details(leaf):
                detail += f"; {_details(leaf)}"
            lines.append(f"  {mark} {where}: {detail}")
        if self.backward:
            lines.extend(self._backward_lines())
        return "\n".join(lines)

    def _backward_summary(self) -> str:
        """The gradients' verdict in one line: ``backward: MISMATCH, 2 of 14 gradients differ``."""
        if self.backward_problem:
            return f"backward: NOT CHECKED: {self.backward_problem}"
        n, bad = len(self.gradients), len(self.gradient_mismatches)
        noun = "gradient" if n == 1 else "gradients"
        if bad:
            return f"backward: MISMATCH, {bad} of {n} {noun} differ"
        return f"backward: match ({n} {noun})"

    def _backward_lines(self) -> list[str]:
        lines = [f"  {self._backward_summary()}"]
        for leaf in self.gradients:
            if leaf.ok:
                continue
            detail = _measured(leaf)
            if _details(leaf):
                detail += f"; {_details(leaf)}"
            lines.append(f"  BAD {leaf.path}: {detail}")
        lines.extend(f"  note: {note}" for note in self.backward_notes)
        return lines

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        from .. import display as d

        n = len(self.leaves)
        if self.original is not None:
            # a Surgery's two verdicts, each with its own badge (saying why where it can)
            if self.ok:
                faithful = (
                    d.badge("faithful, decided by atol", "warn")
                    if self.atol_note
                    else d.badge("faithful", "ok")
                )
            elif self.call_differences:
                faithful = d.badge("not faithful: eager passes other arguments", "bad")
            else:
                faithful = d.badge("not faithful", "bad")
            same = (
                d.badge("equal to the original", "ok")
                if self.original.ok
                else d.badge("differs from the original", "bad")
            )
            verdict = f"{faithful} {same}"
        elif self.ok:
            verdict = (
                d.badge("match, decided by atol", "warn")
                if self.atol_note
                else d.badge("match", "ok")
            )
        else:
            verdict = d.badge("MISMATCH", "bad")
        against = f"against {d.escape(self.against)}, " if self.against else ""
        if self.candidate_kind in COMPILED_KINDS:
            kind = d.escape(self.candidate_kind)
            against = f"{kind} {against}" if against else f"{kind}, "
        head = (
            f'<div class="gs-title">verify {verdict} <span class="gs-muted">{against}{n} output '
            f"{'leaf' if n == 1 else 'leaves'}, rtol={self.rtol:g}, atol={self.atol:g}</span></div>"
        )
        if self.original is not None and not self.original.ok:
            head += (
                '<div class="gs-muted">against the original model: '
                f"{d.escape(_measured_report(self.original))}</div>"
            )
        if self.structure_problem:
            head += f"<div>{d.badge('structure', 'bad')} {d.escape(self.structure_problem)}</div>"
        if self.atol_note:
            head += f"<div>{d.badge('decided by atol', 'warn')} {d.escape(self.atol_note)}</div>"
        for difference in self.call_differences:
            head += (
                f"<div>{d.badge('eager calls it otherwise', 'warn')} {d.escape(difference)}</div>"
            )
        body = leaf_table(self.leaves)
        if self.backward:
            kind = "bad" if not self.gradients_ok else "ok"
            if self.backward_problem:
                kind = "warn"
            body += f'<div class="gs-title">{d.badge(self._backward_summary(), kind)}</div>'
            if self.gradients:
                body += leaf_table(self.gradients)
            for note in self.backward_notes:
                body += f'<div class="gs-muted">{d.escape(note)}</div>'
        return head + body

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display

        lines = str(self).splitlines()
        if len(lines) > 12:  # the plain form stays short; the table holds every leaf
            lines = [*lines[:11], f"  ... and {len(lines) - 11} more leaves"]
        return display.bundle(self._repr_html_(), "\n".join(lines), include, exclude)


def _measured_report(report: VerifyReport) -> str:
    """A report's worst leaf in one phrase: ``max abs 0.31 at [0]['logits'] (37x tolerance)``."""
    if report.structure_problem:
        return report.structure_problem
    bad = [leaf for leaf in report.leaves if not leaf.ok]
    if not bad and report.backward_problem:
        return f"gradients not checked: {report.backward_problem}"
    if not bad:  # the outputs match: the gradients, when checked, say what differs
        bad = list(report.gradient_mismatches)
    if not bad:
        return "every leaf matches"
    worst = bad[0]
    return f"{worst.path or '(output)'}: {_measured(worst)}"


def leaf_table(leaves: tuple[LeafCheck, ...], limit: int = 12) -> str:
    """Leaves as an HTML table, the worst first (mismatches, then the largest relative error);
    past ``limit`` rows the rest is folded."""
    from .. import display as d

    def badness(leaf: LeafCheck) -> tuple:
        rel = leaf.max_rel if leaf.max_rel == leaf.max_rel else math.inf  # NaN: unmeasured
        return (leaf.ok, -rel)

    rows = [
        [
            d.badge("ok", "ok") if leaf.ok else d.badge("differs", "bad"),
            leaf.path or "(output)",
            number_text(leaf.max_abs) if leaf.values_compared else "no values compared",
            number_text(leaf.max_rel) if leaf.values_compared else "",
            tolerance_text(leaf.tolerance_ratio) if leaf.values_compared else "",
            _details(leaf),
        ]
        for leaf in sorted(leaves, key=badness)
    ]
    headers = ["", "leaf", "max abs", "max rel", "of tolerance", ""]
    shown = d.table(headers, rows[:limit], numeric=(2, 3, 4), raw=(0,), cards=True)
    if len(rows) <= limit:
        return shown
    rest = d.table(headers, rows[limit:], numeric=(2, 3, 4), raw=(0,), cards=True)
    return shown + d.details(f"{len(rows) - limit} more leaves", rest)


#: the kinds of candidate that are compiled code, not Python graphsurgeon reads: a report names
#: them, so that a verdict says it was the artifact that ships that was checked
AOTI_PACKAGE = "an AOTInductor package"
COMPILED_KINDS = (AOTI_PACKAGE, "a torch.compile'd module", "a torch.compile'd function")


def candidate_kind(program: Any) -> str:
    """What ``program`` is, in the words of a report: ``"an AOTInductor package"`` (what
    ``torch._inductor.aoti_load_package`` returns), ``"a torch.compile'd module"`` (or
    ``function``), ``"a GraphModule"``, ``"an ExportedProgram"``, ``"an eager model"`` (any
    other ``nn.Module``), ``"a function"``. Read by the class's name, so that neither
    torch._dynamo nor torch._inductor is imported to ask.

    Example:
        >>> import torch
        >>> candidate_kind(torch.nn.ReLU()), candidate_kind(torch.relu)
        ('an eager model', 'a function')
    """
    kind = type(program)
    if kind.__name__ == "AOTICompiledModel":
        return AOTI_PACKAGE
    if kind.__name__ == "OptimizedModule" and kind.__module__.startswith("torch._dynamo"):
        return COMPILED_KINDS[1]
    if isinstance(program, ExportedProgram):
        return "an ExportedProgram"
    if isinstance(program, torch.fx.GraphModule):
        return "a GraphModule"
    if isinstance(program, torch.nn.Module):
        return "an eager model"
    if callable(getattr(program, "_torchdynamo_orig_callable", None)):
        return COMPILED_KINDS[2]
    return "a function" if callable(program) else a_type(program)


def as_callable(program: Any) -> Any:
    """A runnable module for an eager model, a GraphModule or an ExportedProgram.

    An ExportedProgram runs as its one runnable original (``graphsurgeon.checks._exec``), which holds
    copies of the program's buffers: running it never changes the program. A program whose
    structure graphsurgeon cannot read runs as ``program.module()``, inside :class:`keep_state`
    like everything verify runs.
    """
    if isinstance(program, ExportedProgram):
        try:
            return runnable_original(program)
        except GraphSurgeonError:
            return program.module()
    if isinstance(program, torch.nn.Module):
        return program
    if callable(program):
        return program
    raise VerifyError(
        f"cannot run a {type(program).__name__}: pass an nn.Module, a GraphModule or an "
        "ExportedProgram"
    )


def _run(program: Any, which: str, args: tuple, kwargs: Mapping[str, Any]) -> Any:
    module = as_callable(program)
    try:
        # verify is a question: a model in training mode updates its statistics when it runs,
        # so its buffers (and a program's) are put back afterwards; an output that is such a
        # buffer (a cache the run writes and returns) keeps the values it was returned with
        with torch.no_grad(), keep_state([module]) as state:
            return state.unshared(module(*clone_inputs(args), **clone_inputs(dict(kwargs))))
    except Exception as error:
        raise VerifyError(
            f"verify: running the {which} ({type(program).__name__}) failed: "
            f"{type(error).__name__}: {error}"
        ) from error


def verify(
    reference: Any,
    candidate: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    backward: bool = False,
    grad_outputs: Any = None,
) -> VerifyReport:
    """Run ``reference`` and ``candidate`` on the same inputs and compare every output leaf.

    ``reference`` and ``candidate`` may each be an eager model, an ExportedProgram or a
    GraphModule; the candidate may also be what ships: a ``torch.compile``'d module or a loaded
    AOTInductor package (``torch._inductor.aoti_load_package``), which the report names
    (:attr:`VerifyReport.candidate_kind`). A package runs inference only: ``backward=True``
    on one raises :class:`VerifyError`. Tensors must agree in layout, shape, dtype and
    device; floating-point and complex values then match when
    ``|a - b| <= atol + rtol * |a|`` (NaN matches NaN), while integers and bools must be
    equal, whatever the tolerances. :func:`compare_leaf` has the
    rules for other leaves; dicts compare key by key, in any order. Each program runs once,
    under ``no_grad``, on its own copy of the inputs, from the same random state (which is
    left as it was); buffers a run writes or reassigns are put back after it, and an output
    that is such a buffer is compared as it was returned. A mismatch never raises: the report
    says what differs, how far beyond the tolerance (``37x of tolerance``; an "ok" says how
    close to it: ``0.41x``) and where, axis by axis (``dim 1: 0–10 differ, 11 matches``;
    :class:`LeafCheck` has both as data). If a program fails to run, or a tolerance is not a
    finite number >= 0, :class:`VerifyError` says which. ``args`` and ``kwargs`` are read as
    every entry point reads inputs (a lone tensor is the one input; a list raises
    :class:`~graphsurgeon.errors.InputStructureError`).

    With ``backward=True`` both sides run with autograd on and then backward from the same
    upstream gradients: ``grad_outputs`` (one tensor or None per output leaf, in the outputs'
    structure) or, by default, standard-normal ones drawn from a generator seeded with 0. The
    gradient of every floating input leaf and of every parameter that requires grad is then
    compared by name (``"grad of layers.3.norm.weight"``, ``"grad of input x"``) with the same
    tolerances and the same per-axis pattern as the outputs (:attr:`VerifyReport.gradients`).
    The report is truthy only when the outputs and the gradients match. Integer inputs,
    buffers and frozen parameters are not differentiated, and parameters only one side has are
    not compared: :attr:`VerifyReport.backward_notes` says which. When no output needs a
    gradient the report says so and is not truthy. Nothing is accumulated into any ``.grad``.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> class Halved(torch.autograd.Function):  # a forward that is right, a backward not
        ...     @staticmethod
        ...     def forward(ctx, x):
        ...         return x * 2
        ...     @staticmethod
        ...     def backward(ctx, grad):
        ...         return grad
        >>> report = gs.verify(lambda x: x * 2, Halved.apply, (torch.ones(3),), backward=True)
        >>> bool(report), report.outputs_ok, [g.path for g in report.gradient_mismatches]
        (False, True, ['grad of input x'])
    """
    rtol, atol = checked_tolerance("rtol", rtol), checked_tolerance("atol", atol)
    args, kwargs = as_inputs(args, kwargs, verb="verify")
    if not isinstance(backward, bool):
        raise VerifyError(f"verify: backward={backward!r}: expected True or False")
    kind = candidate_kind(candidate)
    if backward:
        _refuse_inference_only(reference, "reference")
        _refuse_inference_only(candidate, "candidate")
        report = _verify_backward(reference, candidate, args, kwargs, rtol, atol, grad_outputs)
        return dataclasses.replace(report, candidate_kind=kind)
    if grad_outputs is not None:
        raise VerifyError(
            "verify: grad_outputs is given but backward=False; pass backward=True to check "
            "the gradients from those upstream gradients"
        )
    # Both run from the same random state (dropout in training mode draws the same masks), and
    # the caller's random stream is left as it was.
    start = RandomState()
    try:
        expected = _run(reference, "reference", args, kwargs)
        start.restore()
        actual = _run(candidate, "candidate", args, kwargs)
    finally:
        start.restore()
    report = compare_outputs(expected, actual, rtol=rtol, atol=atol)
    return dataclasses.replace(report, candidate_kind=kind)


def _refuse_inference_only(program: Any, which: str) -> None:
    """An AOTInductor package runs inference only (its outputs carry no gradient): asked for
    its gradients, verify says so, rather than report every gradient missing."""
    if candidate_kind(program) == AOTI_PACKAGE:
        raise VerifyError(
            f"verify: the {which} is {AOTI_PACKAGE}, which runs inference only: its outputs "
            "carry no gradient, so backward=True cannot check it. Verify the package with "
            "backward=False, and the gradients on the program it was made from (s.verify("
            "backward=True) for a Surgery)"
        )


def _run_backward(
    program: Any,
    which: str,
    args: tuple,
    kwargs: Mapping[str, Any],
    labels: list[str],
    upstream: Any,
) -> Backward:
    module = as_callable(program)
    try:
        with keep_state([module]) as state:
            run = run_backward(
                module, clone_inputs(args), clone_inputs(dict(kwargs)), labels, upstream
            )
            return dataclasses.replace(run, outputs=state.unshared(run.outputs))
    except GraphSurgeonError:
        raise
    except Exception as error:
        raise VerifyError(
            f"verify: running the {which} ({type(program).__name__}) forward and backward "
            f"failed: {type(error).__name__}: {_first_line(error)}"
        ) from error


def _first_line(error: BaseException) -> str:
    """An error's first line, at most 300 characters: what a report says of a failed run."""
    return (str(error).strip().splitlines() or [""])[0][:300]


def _verify_backward(
    reference: Any,
    candidate: Any,
    args: tuple,
    kwargs: Mapping[str, Any],
    rtol: float,
    atol: float,
    grad_outputs: Any,
) -> VerifyReport:
    """verify(backward=True): both sides forward with autograd on, then backward from the
    same upstream gradients; outputs and gradients compared."""
    labels = input_labels(as_callable(reference), args, kwargs)
    start = RandomState()
    try:
        upstream = None
        if grad_outputs is not None:
            # checked against the reference's outputs, once they are computed, before backward
            def upstream(outputs: Any) -> tuple:
                return given_upstream(grad_outputs, outputs, "verify: ")

        expected = _run_backward(reference, "reference", args, kwargs, labels, upstream)
        start.restore()
        actual = _run_backward(candidate, "candidate", args, kwargs, labels, expected.upstream)
    finally:
        start.restore()
    return backward_report(expected, actual, rtol, atol, given=grad_outputs is not None)


def backward_report(
    expected: Backward, actual: Backward, rtol: float, atol: float, *, given: bool = False
) -> VerifyReport:
    """The report of two programs run forward and backward from the same upstream gradients
    (``given``: the caller's ``grad_outputs``, else seeded): outputs and gradients compared,
    as ``verify(..., backward=True)`` reports them (``compare(..., backward=True)`` reads it)."""
    outputs = compare_outputs(expected.outputs, actual.outputs, rtol=rtol, atol=atol)
    gradients, notes = compare_gradients(expected, actual, rtol=rtol, atol=atol)
    source = (
        "upstream gradients: grad_outputs as given"
        if given
        else "upstream gradients: standard normal, seeded (the same for both sides)"
    )
    problem = expected.problem
    ok = outputs.ok and not problem and all(leaf.ok for leaf in gradients)
    return dataclasses.replace(
        outputs,
        ok=ok,
        backward=True,
        gradients=gradients,
        backward_notes=(*notes, source),
        backward_problem=f"the reference: {problem}" if problem else "",
    )


def compare_gradients(
    expected: Backward, actual: Backward, *, rtol: float = 1e-5, atol: float = 1e-5
) -> tuple[tuple[LeafCheck, ...], tuple[str, ...]]:
    """The gradients of two backward runs compared by name, as output leaves are compared,
    and the notes that say what was not: ``(checks, notes)``. A gradient that flows on one side
    only is compared with zeros and says so; one that flows on neither side matches."""
    checks = []
    for name, want in expected.gradients.items():
        if name not in actual.gradients:
            continue
        got = actual.gradients[name]
        if want is None and got is None:
            checks.append(LeafCheck(name, True, problem="no gradient flows here on either side"))
            continue
        note = ""
        if want is None:
            want, note = torch.zeros_like(got), "no gradient flows here in the reference"
        elif got is None:
            got, note = torch.zeros_like(want), "no gradient flows here in the candidate"
        check = compare_leaf(name, want, got, rtol=rtol, atol=atol)
        if note:
            problem = "; ".join(p for p in (note, check.problem) if p)
            check = dataclasses.replace(check, problem=problem)
        checks.append(check)
    notes = []
    if expected.skipped:
        notes.append("not differentiated: " + _listed(expected.skipped))
    only = [n for n in expected.gradients if n not in actual.gradients]
    if only:
        notes.append(
            "not compared, the candidate has no such parameter (or it is frozen): " + _listed(only)
        )
    extra = [n for n in actual.gradients if n not in expected.gradients]
    if extra:
        notes.append(
            "not compared, the reference has no such parameter (or it is frozen): " + _listed(extra)
        )
    return tuple(checks), tuple(notes)


def _listed(names: Any, limit: int = 6) -> str:
    names = list(names)
    shown = ", ".join(str(n).removeprefix("grad of ") for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def compare_outputs(
    expected: Any, actual: Any, *, rtol: float = 1e-5, atol: float = 1e-5
) -> VerifyReport:
    """Compare two outputs already computed, as :func:`verify` does (pytree-aware).

    Example:
        >>> import torch
        >>> bool(compare_outputs({"a": torch.ones(2)}, {"a": torch.ones(2) + 1e-7}))
        True
    """
    rtol, atol = checked_tolerance("rtol", rtol), checked_tolerance("atol", atol)
    actual = in_order_of(expected, actual)  # dicts compare key by key, in any order
    expected_leaves, expected_spec = pytree.tree_flatten_with_path(expected)
    actual_leaves, actual_spec = pytree.tree_flatten_with_path(actual)
    if expected_spec != actual_spec:
        problem = (
            f"candidate returned {describe_spec(actual_spec)}, reference returned "
            f"{describe_spec(expected_spec)}"
        )
        return VerifyReport(False, (), problem, rtol, atol)
    checks = [
        compare_leaf(pytree.keystr(key_path), a, b, rtol=rtol, atol=atol)
        for (key_path, a), (_, b) in zip(expected_leaves, actual_leaves)
    ]
    return VerifyReport(all(c.ok for c in checks), tuple(checks), "", rtol, atol)


def eager_reference(
    model: torch.nn.Module, replacements: Mapping[str, torch.nn.Module]
) -> torch.nn.Module:
    """A deep copy of ``model`` with each replacement set by setattr, parents before children.

    Only whole-module names (no ``@k``) have an eager equivalent. The replacements themselves
    are deep-copied along with the model, so the reference shares no state with them.
    """
    if not isinstance(model, torch.nn.Module):
        raise VerifyError(
            f"eager_reference: the model is {a_type(model)}, not a torch.nn.Module; pass the "
            "eager model the program was exported from"
        )
    if not isinstance(replacements, Mapping):
        raise VerifyError(f"eager_reference: expected {{name: module}}, got {a_type(replacements)}")
    modules = dict(model.named_modules())
    for name, replacement in replacements.items():
        if "@" in str(name):
            raise VerifyError(
                f"{name!r} swaps one call of a module; an eager model has no such reference"
            )
        if name not in modules or name == "":
            raise VerifyError(
                f"eager_reference: the model has no submodule {name!r}."
                f"{did_you_mean(str(name), [m for m in modules if m])}"
            )
        try:
            check_module(name, replacement)
        except GraphSurgeonError as problem:
            raise VerifyError(f"eager_reference: {problem}") from None
    reference = copy.deepcopy(model)
    for name in sorted(replacements, key=lambda n: n.count(".")):
        parent_name, _, leaf = name.rpartition(".")
        parent = reference.get_submodule(parent_name) if parent_name else reference
        setattr(parent, leaf, copy.deepcopy(replacements[name]))
    return reference
