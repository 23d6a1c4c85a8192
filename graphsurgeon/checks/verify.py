"""verify(): do two programs compute the same thing? Output by output, pytree-aware."""

from __future__ import annotations

import cmath
import collections
import copy
import dataclasses
import math
import numbers
import sys
from collections.abc import Iterator, Mapping
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

__all__ = ["LeafCheck", "VerifyReport", "as_callable", "verify"]


@dataclass(frozen=True)
class LeafCheck:
    """One output leaf compared.

    Attributes:
        path: where the leaf sits in the output, e.g. ``"[0]['logits']"`` (``""`` for a bare tensor).
        ok: whether it matches.
        max_abs / max_rel: the largest absolute and relative errors (numbers and tensors; NaN
            when no error can be measured: shapes, dtypes or devices differ, meta tensors).
        problem: what differs when not ok ("shape [2, 4] vs expected [2, 3]", "integers
            differ at 1 of 8 positions (largest difference 1)", ...); for a leaf that is ok, a
            note when there is one ("meta tensors: ... values not compared").
        values_compared: False when no value was compared (meta tensors, another shape, dtype,
            device or type): the report then says "no values compared", not an error of NaN.
        tolerance_ratio: the worst error relative to what the tolerances allow there,
            ``max |a - b| / (atol + rtol * |a|)`` (``a`` the expected value): below 1 the leaf
            matches, 0.41 is 41% of the allowance, 37 is 37 times it. It explains an "ok" beside
            a max rel far above ``rtol`` (that relative error sits where ``atol`` covers it).
            Infinite where no tolerance applies (integers that differ, NaN or Inf apart); 0
            when no value was compared.
        by_axis: for a tensor that differs, where, axis by axis: the index ranges along each
            dimension at which some value differs and those at which all match, e.g.
            ``"dim 1: 0–10 differ, 11 matches"`` (a causal mask forgotten: only the last token,
            which sees every token anyway, is right). Dimensions along which every index
            differs somewhere are left out; ``""`` when the leaf matches.
        differing: the same as data: for each dimension, the index ranges (``range`` objects,
            merged) at which some value differs; ``()`` when the leaf matches.
        scale: the largest finite ``|a|`` of a floating-point leaf (``a`` the expected value):
            what ``atol`` is measured against (:attr:`VerifyReport.decided_by_atol`); NaN where
            no floating-point value was compared.
    """

    path: str
    ok: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    problem: str = ""
    values_compared: bool = True
    tolerance_ratio: float = 0.0
    by_axis: str = ""
    differing: tuple[tuple[range, ...], ...] = ()
    scale: float = math.nan


# A matching leaf whose ``atol`` is at least this share of its largest value was not checked
# relative to its values: ``atol`` alone let it be off by that much (outputs of ~1e-9, or
# ~2e-5 under the default atol=1e-5, match whatever they are).
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
    shown = d.table(headers, rows[:limit], numeric=(2, 3, 4), raw=(0,))
    if len(rows) <= limit:
        return shown
    rest = d.table(headers, rows[limit:], numeric=(2, 3, 4), raw=(0,))
    return shown + d.details(f"{len(rows) - limit} more leaves", rest)


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


def checked_tolerance(
    name: str, value: Any, error: type[GraphSurgeonError] = VerifyError, where: str = ""
) -> float:
    """``value`` as a float when it is a usable tolerance (a finite number >= 0); else an
    ``error`` naming ``name`` (after ``where``, such as ``"bisect: "``). Every entry point that
    takes ``rtol``/``atol`` reads them here."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(
            f"{where}{name}={value!r}: expected a finite number >= 0 such as {name}=1e-5, got "
            f"{a_type(value)}"
        )
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise error(
            f"{where}{name}={value!r}: expected a finite number >= 0 such as {name}=1e-5 "
            "(0 asks for exact equality)"
        )
    return number


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_mismatch(path: str, expected: Any, actual: Any) -> LeafCheck:
    return LeafCheck(
        path,
        False,
        math.nan,
        math.nan,
        f"{type(actual).__name__} vs expected {type(expected).__name__}",
        values_compared=False,
    )


def _largest(values: list[float]) -> float:
    # NaN (an error that could not be measured) wins: max() alone would depend on the order.
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values, default=0.0)


def _combine(path: str, checks: list[LeafCheck]) -> LeafCheck:
    """One check for a leaf made of parts (a list leaf, a nested tensor): all parts must match."""
    bad = [c for c in checks if not c.ok]
    notes = [f"{c.path or '(part)'}: {c.problem}" for c in (bad or checks) if c.problem]
    problem = "; ".join(notes[:3]) + (f"; and {len(notes) - 3} more" if len(notes) > 3 else "")
    where = [f"{c.path or '(part)'}: {c.by_axis}" for c in bad if c.by_axis]
    return LeafCheck(
        path,
        not bad,
        _largest([c.max_abs for c in checks]),
        _largest([c.max_rel for c in checks]),
        problem,
        values_compared=not checks or any(c.values_compared for c in checks),
        tolerance_ratio=max((c.tolerance_ratio for c in checks if c.values_compared), default=0.0),
        by_axis=_capped("; ".join(where)),
        scale=max((c.scale for c in checks if not math.isnan(c.scale)), default=math.nan),
    )


def _compare_tensors(
    path: str, a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float
) -> LeafCheck:
    a, b = a.detach(), b.detach()
    if a.is_nested or b.is_nested:
        return _compare_nested(path, a, b, rtol, atol)
    problems = []
    if a.layout != b.layout:
        problems.append(f"layout {b.layout} vs expected {a.layout}")
    if a.shape != b.shape:
        problems.append(f"shape {list(b.shape)} vs expected {list(a.shape)}")
    if a.dtype != b.dtype:
        problems.append(f"dtype {b.dtype} vs expected {a.dtype}")
    if a.device != b.device:
        problems.append(f"device {b.device} vs expected {a.device}")
    if problems:
        return LeafCheck(path, False, math.nan, math.nan, "; ".join(problems), False)
    if a.device.type == "meta":
        # meta tensors carry no values: say so instead of reporting an error of 0
        return LeafCheck(
            path,
            True,
            math.nan,
            math.nan,
            "meta tensors: shape and dtype agree, values not compared",
            values_compared=False,
        )
    if a.layout != torch.strided:
        a, b = a.to_dense(), b.to_dense()  # sparse: the values they stand for
    if a.is_quantized:
        a, b = a.dequantize(), b.dequantize()
    if a.numel() == 0:
        return LeafCheck(path, True)
    if a.is_floating_point() or a.is_complex():
        return _compare_close(path, a, b, rtol, atol)
    return _compare_exact(path, a, b)


def _as_int64(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.uint64:
        # Flipping the sign bit maps unsigned order onto signed order and keeps every
        # difference the same modulo 2**64, which is all _compare_exact needs.
        return t.view(torch.int64) ^ torch.iinfo(torch.int64).min
    return t.to(torch.int64)


# Values are compared block by block, each block at most this many elements: each float64
# temporary of a comparison is 2 MB, whatever the size of the outputs (benchmarks/verify.py),
# and blocks this small are also faster than whole tensors (they stay in the CPU's caches).
_BLOCK = 2**18


def _blocks(shape: torch.Size, limit: int = _BLOCK) -> Iterator[tuple]:
    """Indexes that cut a tensor of ``shape`` into blocks of at most ``limit`` elements, in
    row-major order: the same cut for every tensor of that shape, whatever its strides, and
    each block of a contiguous tensor is a view (no copy).

    Example:
        >>> list(_blocks(torch.Size([5, 2]), limit=4))
        [(slice(0, 2, None),), (slice(2, 4, None),), (slice(4, 6, None),)]
        >>> list(_blocks(torch.Size([2, 3]), limit=2))[:3]
        [(0, slice(0, 2, None)), (0, slice(2, 4, None)), (1, slice(0, 2, None))]
    """

    def cut(dims: tuple[int, ...], prefix: tuple) -> Iterator[tuple]:
        if math.prod(dims) <= limit:
            yield prefix
            return
        row = math.prod(dims[1:])  # elements under one index of the first dimension
        step = limit // row
        if step:
            for start in range(0, dims[0], step):
                yield (*prefix, slice(start, start + step))
        else:
            for index in range(dims[0]):
                yield from cut(dims[1:], (*prefix, index))

    yield from cut(tuple(shape), ())


def _pieces(a: torch.Tensor, b: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The same blocks of two tensors of one shape, each flattened."""
    for index in _blocks(a.shape, _BLOCK):
        yield a[index].reshape(-1), b[index].reshape(-1)


def _compare_exact(path: str, a: torch.Tensor, b: torch.Tensor) -> LeafCheck:
    """Integers and bools: equal or not, no tolerance, never through floating point."""
    count, largest, max_rel = 0, 0, 0.0
    for block_a, block_b in _pieces(a, b):
        x, y = _as_int64(block_a), _as_int64(block_b)
        differ = x != y
        differing = int(differ.sum())
        if differing == 0:
            continue
        count += differing
        x, y = x[differ], y[differ]
        gap = torch.maximum(x, y) - torch.minimum(x, y)
        # A gap of 2**63 or more wraps around to a negative int64: add 2**64 back, in Python
        # ints.
        wrapped = gap < 0
        largest = max(
            largest, int(gap[wrapped].max()) + 2**64 if bool(wrapped.any()) else int(gap.max())
        )
        # The relative error is for the report only; the verdict above is exact.
        true_gap = gap.to(torch.float64) + wrapped.to(torch.float64) * 2.0**64
        # relative to the expected value; against an expected 0 (False) it is infinite, said so
        relative = true_gap / block_a[differ].to(torch.float64).abs()
        max_rel = max(max_rel, float(relative.max()))
    if count == 0:
        return LeafCheck(path, True)
    kind = "bools" if a.dtype == torch.bool else "integers"
    return LeafCheck(
        path,
        False,
        float(largest),
        max_rel,
        f"{kind} differ at {count} of {a.numel()} positions (largest difference {largest})",
        tolerance_ratio=math.inf,  # no tolerance applies to integers
        **_pattern(a, b, lambda x, y: _as_int64(x) != _as_int64(y)),
    )


@dataclass
class _Tally:
    """What the blocks of a floating-point comparison found so far."""

    compared: int = 0  # values compared (NaN on both sides are not)
    inf_apart: bool = False  # an infinity on one side only, or of another sign
    max_abs: float = 0.0
    max_rel: float = 0.0
    beyond: int = 0  # values beyond the tolerance
    ratio: float = 0.0  # the largest error relative to its tolerance
    scale: float = 0.0  # the largest finite |expected value|

    def add(self, x: torch.Tensor, y: torch.Tensor, rtol: float, atol: float) -> None:
        """Adds values without NaN, as float64 or complex128 (complex: by the modulus)."""
        if x.numel() == 0:
            return
        self.compared += x.numel()
        same_inf = (x == y) | ~(torch.isinf(x) | torch.isinf(y))
        if not bool(same_inf.all()):
            self.inf_apart = True
        if self.inf_apart:
            return  # the verdict is made: only a NaN elsewhere can change what is said
        diff = (x - y).abs()
        diff = torch.where(x == y, torch.zeros_like(diff), diff)  # inf == inf
        self.max_abs = max(self.max_abs, float(diff.max()))
        # relative to the expected value: infinite where it is 0 and the candidate is not
        magnitude = x.abs()
        largest = float(magnitude.max())
        if math.isinf(largest):  # an infinity both sides agree on says nothing of the scale
            largest = float(torch.nan_to_num(magnitude, posinf=0.0).max())
        self.scale = max(self.scale, largest)
        rel = diff / magnitude
        self.max_rel = max(
            self.max_rel, float(torch.where(diff == 0, torch.zeros_like(rel), rel).max())
        )
        del rel
        allowed = magnitude.mul_(rtol).add_(atol)  # magnitude is not needed any more
        self.beyond += int((diff > allowed).sum())
        ratio = diff.div_(allowed)  # nor is diff
        if atol == 0:  # 0 / 0 where the expected value is 0 and the candidate too: no error
            ratio = torch.nan_to_num(ratio, nan=0.0, posinf=math.inf)
        self.ratio = max(self.ratio, float(ratio.max()))


def _compare_close(
    path: str, a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float
) -> LeafCheck:
    """Floating point and complex: ``|a - b| <= atol + rtol * |a|``, NaN matching NaN.

    Complex values compare by the modulus where neither side has a NaN; a NaN is matched
    component by component (``nan+1j`` is not ``5+nanj``), and where both sides have the
    same NaN component the other components compare as real numbers (``nan+1j`` is not
    ``nan+2j``). The comparison runs block by block in double precision (complex128 for
    complex), so it needs a few MB beyond the two tensors, whatever their size.
    """
    wide = torch.complex128 if a.is_complex() else torch.float64
    tally = _Tally()
    nan_apart = False
    for block_a, block_b in _pieces(a, b):
        x, y = block_a.to(wide), block_b.to(wide)
        if x.is_complex():
            # NaN compares per component: a complex NaN says nothing of its other component
            x_parts, y_parts = torch.view_as_real(x), torch.view_as_real(y)
            nan_x, nan_y = torch.isnan(x_parts), torch.isnan(y_parts)
            if not torch.equal(nan_x, nan_y):
                nan_apart = True
                break
            partial = nan_x.any(-1)
            if bool(partial.any()):
                whole = ~partial
                tally.add(x[whole], y[whole], rtol, atol)
                kept = ~nan_x[partial]
                tally.add(x_parts[partial][kept], y_parts[partial][kept], rtol, atol)
            else:
                tally.add(x, y, rtol, atol)
            continue
        nan_x, nan_y = torch.isnan(x), torch.isnan(y)
        if not torch.equal(nan_x, nan_y):
            nan_apart = True
            break
        if bool(nan_x.any()):
            x, y = x[~nan_x], y[~nan_x]
        tally.add(x, y, rtol, atol)
    if nan_apart or tally.inf_apart:
        # the second pass (where they differ) only runs for a leaf that does not match
        where = _pattern(a, b, _beyond_tolerance(wide, rtol, atol))
        if nan_apart:
            return LeafCheck(
                path, False, math.nan, math.nan, "NaN in different places", True, math.inf, **where
            )
        return LeafCheck(
            path, False, math.inf, math.inf, "Inf in different places", True, math.inf, **where
        )
    if tally.compared == 0:
        return LeafCheck(path, True)
    if tally.beyond == 0:
        return LeafCheck(
            path,
            True,
            tally.max_abs,
            tally.max_rel,
            tolerance_ratio=tally.ratio,
            scale=tally.scale,
        )
    return LeafCheck(
        path,
        False,
        tally.max_abs,
        tally.max_rel,
        f"values differ beyond tolerance at {tally.beyond} of {a.numel()} positions",
        tolerance_ratio=tally.ratio,
        scale=tally.scale,
        **_pattern(a, b, _beyond_tolerance(wide, rtol, atol)),
    )


def _beyond_tolerance(wide: torch.dtype, rtol: float, atol: float):
    """Where two blocks differ beyond tolerance, as :func:`_compare_close` judges it (NaN
    matching NaN), computed in ``wide`` precision."""

    def beyond(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.to(wide), y.to(wide)
        return ~torch.isclose(y, x, rtol=rtol, atol=atol, equal_nan=True)

    return beyond


# -- where two tensors differ, axis by axis -----------------------------------------------------

# How many index ranges each side of one dimension lists, and how long the whole text may be.
_RANGES_SHOWN = 4
_AXIS_TEXT_LIMIT = 240


def _pattern(a: torch.Tensor, b: torch.Tensor, differs) -> dict[str, Any]:
    """``by_axis`` and ``differing`` of a :class:`LeafCheck` for two tensors of one shape.

    ``differs(block_a, block_b)`` says, element by element, where two blocks differ. It runs
    block by block (the blocks of :func:`_blocks`), so it needs a few MB beyond the tensors
    whatever their size, and keeps one flag per index of each dimension.
    """
    shape = tuple(a.shape)
    if not shape:
        return {}
    flags = [torch.zeros(size, dtype=torch.bool) for size in shape]
    for index in _blocks(a.shape, _BLOCK):
        bad = differs(a[index], b[index])
        if not bool(bad.any()):
            continue
        # the block's dimensions are the tensor's after those its index fixed to one position
        fixed = len(index) - 1 if index and isinstance(index[-1], slice) else len(index)
        for dim in range(len(shape)):
            if dim < fixed:
                flags[dim][index[dim]] = True
                continue
            inner = dim - fixed
            others = tuple(d for d in range(bad.dim()) if d != inner)
            along = bad.any(dim=others) if others else bad
            start = index[dim].start if dim == fixed and dim < len(index) else 0
            flags[dim][start : start + along.numel()] |= along
    differing = tuple(_ranges(f) for f in flags)
    return {"differing": differing, "by_axis": _axis_text(differing, shape)}


def _ranges(flags: torch.Tensor) -> tuple[range, ...]:
    """The runs of True in a flag vector, as ranges: ``[T, T, F, T]`` -> ``(range(0, 2),
    range(3, 4))``."""
    positions = flags.nonzero().flatten().tolist()
    runs: list[range] = []
    for position in positions:
        if runs and runs[-1].stop == position:
            runs[-1] = range(runs[-1].start, position + 1)
        else:
            runs.append(range(position, position + 1))
    return tuple(runs)


def _complement(ranges: tuple[range, ...], size: int) -> tuple[range, ...]:
    gaps, start = [], 0
    for r in ranges:
        if r.start > start:
            gaps.append(range(start, r.start))
        start = r.stop
    if start < size:
        gaps.append(range(start, size))
    return tuple(gaps)


def _spans_text(ranges: tuple[range, ...]) -> str:
    texts = [str(r.start) if len(r) == 1 else f"{r.start}–{r.stop - 1}" for r in ranges]
    if len(texts) > _RANGES_SHOWN:
        texts = [*texts[:_RANGES_SHOWN], f"… ({len(texts) - _RANGES_SHOWN} more)"]
    return ", ".join(texts)


def _axis_text(differing: tuple[tuple[range, ...], ...], shape: tuple[int, ...]) -> str:
    """``"dim 1: 0–10 differ, 11 matches"``: each dimension along which some index is free
    of differences, its differing and matching index ranges.

    Example:
        >>> _axis_text(((range(0, 1),), (range(0, 11),), (range(0, 64),)), (1, 12, 64))
        'dim 1: 0–10 differ, 11 matches'
        >>> _axis_text(((range(0, 2),), (range(0, 3),)), (2, 3))
        'spread over every index of every dimension'
    """
    parts = []
    for dim, (ranges, size) in enumerate(zip(differing, shape)):
        if size <= 1 or sum(len(r) for r in ranges) == size:
            continue  # every index differs somewhere: nothing to tell apart along it
        matching = _complement(ranges, size)
        differ = "differs" if sum(len(r) for r in ranges) == 1 else "differ"
        match = "matches" if sum(len(r) for r in matching) == 1 else "match"
        parts.append(f"dim {dim}: {_spans_text(ranges)} {differ}, {_spans_text(matching)} {match}")
    if not parts:
        return "spread over every index of every dimension" if any(s > 1 for s in shape) else ""
    return _capped("; ".join(parts))


def _capped(text: str) -> str:
    return text if len(text) <= _AXIS_TEXT_LIMIT else text[: _AXIS_TEXT_LIMIT - 1] + "…"


def _compare_nested(
    path: str, a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float
) -> LeafCheck:
    if not (a.is_nested and b.is_nested):
        kind = {True: "nested tensor", False: "tensor"}
        return LeafCheck(
            path,
            False,
            math.nan,
            math.nan,
            f"{kind[b.is_nested]} vs expected {kind[a.is_nested]}",
            values_compared=False,
        )
    parts_a, parts_b = a.unbind(), b.unbind()
    if len(parts_a) != len(parts_b):
        return LeafCheck(
            path,
            False,
            math.nan,
            math.nan,
            f"nested tensor of {len(parts_b)} parts vs expected {len(parts_a)}",
            values_compared=False,
        )
    return _combine(
        path,
        [
            _compare_tensors(f"{path}<{i}>", x, y, rtol, atol)
            for i, (x, y) in enumerate(zip(parts_a, parts_b))
        ],
    )


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
    GraphModule. Tensors must agree in layout, shape, dtype and device; floating-point and
    complex values then match when ``|a - b| <= atol + rtol * |a|`` (NaN matches NaN), while
    integers and bools must be equal, whatever the tolerances. :func:`compare_leaf` has the
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
    if backward:
        return _verify_backward(reference, candidate, args, kwargs, rtol, atol, grad_outputs)
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
    return compare_outputs(expected, actual, rtol=rtol, atol=atol)


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
            # checked against the reference's outputs before the reference runs backward
            with torch.no_grad():
                shape_of = _run(reference, "reference", args, kwargs)
            upstream = given_upstream(grad_outputs, shape_of, "verify: ")
            start.restore()
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


def compare_leaf(
    path: str, expected: Any, actual: Any, *, rtol: float = 1e-5, atol: float = 1e-5
) -> LeafCheck:
    """Compare one output leaf. A mismatch, or a leaf it cannot compare, is reported, not raised.

    Tensors must agree in layout, shape, dtype and device; floating-point and complex values
    then match when ``|a - b| <= atol + rtol * |a|`` (NaN matches NaN), integers and bools
    only when equal. Meta tensors compare by shape and dtype (the check says so). Sparse
    tensors compare by the values they stand for, quantized ones dequantized. numpy arrays
    follow the same rules; Python ints and bools compare exactly, floats and complex numbers
    with the tolerances (NaN per component, as for tensors); lists, tuples and dicts part by
    part (dicts key by key, in any order); dataclass instances field by field (those with
    ``compare=False`` left out); anything else by ``==``.

    Example:
        >>> import torch
        >>> compare_leaf("", torch.tensor([2**53]), torch.tensor([2**53 + 1])).problem
        'integers differ at 1 of 1 positions (largest difference 1)'
    """
    rtol, atol = checked_tolerance("rtol", rtol), checked_tolerance("atol", atol)
    try:
        return _compare_values(path, expected, actual, rtol, atol)
    except Exception as error:  # a leaf nobody taught verify to compare: a mismatch, loudly
        detail = (str(error).strip().splitlines() or [""])[0][:120]
        return LeafCheck(
            path,
            False,
            math.nan,
            math.nan,
            f"cannot compare {type(actual).__name__} with expected {type(expected).__name__} "
            f"({type(error).__name__}: {detail})",
            values_compared=False,
        )


def _number_kind(value: Any) -> str | None:
    for kind in (bool, int, float, complex):
        if isinstance(value, kind):
            return kind.__name__
    return None


def _compare_values(path: str, expected: Any, actual: Any, rtol: float, atol: float) -> LeafCheck:
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        return _compare_tensors(path, expected, actual, rtol, atol)
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        return _type_mismatch(path, expected, actual)
    numpy = sys.modules.get("numpy")  # no numpy imported: no numpy values either
    if numpy is not None:
        numpy_types = (numpy.ndarray, numpy.generic)
        if isinstance(expected, numpy_types) or isinstance(actual, numpy_types):
            return _compare_numpy(path, expected, actual, rtol, atol, numpy)
    kinds = _number_kind(expected), _number_kind(actual)
    if kinds != (None, None):
        if kinds[0] != kinds[1]:
            return _type_mismatch(path, expected, actual)
        return _compare_numbers(path, expected, actual, rtol, atol)
    if not _is_leaf(expected) or not _is_leaf(actual):
        return _compare_parts(path, expected, actual, rtol, atol)
    if _is_dataclass_instance(expected) or _is_dataclass_instance(actual):
        if type(expected) is not type(actual):
            return _type_mismatch(path, expected, actual)
        return _compare_fields(path, expected, actual, rtol, atol)
    equal = expected == actual
    if not isinstance(equal, bool):
        raise TypeError(f"== returned a {type(equal).__name__}, not True or False")
    if equal:
        return LeafCheck(path, True)
    return LeafCheck(
        path,
        False,
        math.nan,
        math.nan,
        f"{_short_repr(actual)} vs expected {_short_repr(expected)}",
    )


def _is_dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _compare_fields(path: str, expected: Any, actual: Any, rtol: float, atol: float) -> LeafCheck:
    """A dataclass instance pytree does not know: field by field (its ``==`` would compare
    tensors with ``==`` and fail), leaving out the fields its ``==`` leaves out."""
    return _combine(
        path,
        [
            compare_leaf(
                f"{path}.{f.name}",
                getattr(expected, f.name, None),
                getattr(actual, f.name, None),
                rtol=rtol,
                atol=atol,
            )
            for f in dataclasses.fields(expected)
            if f.compare
        ],
    )


def _compare_numbers(path: str, expected: Any, actual: Any, rtol: float, atol: float) -> LeafCheck:
    text = f"{_short_repr(actual)} vs expected {_short_repr(expected)}"
    if isinstance(expected, int):  # and bool: exact, in Python's unbounded ints
        gap = abs(int(actual) - int(expected))
        if gap == 0:
            return LeafCheck(path, True)
        try:
            relative = gap / abs(expected) if expected else math.inf
        except OverflowError:  # too large for a float: the verdict above stays exact
            relative = math.inf
        return LeafCheck(path, False, _to_float(gap), relative, text, tolerance_ratio=math.inf)
    nan_expected, nan_actual = cmath.isnan(expected), cmath.isnan(actual)
    if isinstance(expected, complex) and (nan_expected or nan_actual):
        # as for tensors: a NaN matches a NaN in the same component, the rest compares
        parts = [(expected.real, actual.real), (expected.imag, actual.imag)]
        if any(math.isnan(e) != math.isnan(a) for e, a in parts):
            return LeafCheck(path, False, math.nan, math.nan, text)
        checks = [_compare_numbers(path, e, a, rtol, atol) for e, a in parts if not math.isnan(e)]
        ratio = max((check.tolerance_ratio for check in checks), default=0.0)
        if all(check.ok for check in checks):
            return LeafCheck(path, True, *_extremes(checks), tolerance_ratio=ratio)
        return LeafCheck(
            path, False, *_extremes(checks), f"{text} (beyond tolerance)", tolerance_ratio=ratio
        )
    if nan_expected and nan_actual:
        return LeafCheck(path, True)  # as for tensors: NaN matches NaN
    if nan_expected or nan_actual:
        return LeafCheck(path, False, math.nan, math.nan, text, tolerance_ratio=math.inf)
    if expected == actual:
        return LeafCheck(path, True)  # also inf == inf
    if cmath.isinf(expected) or cmath.isinf(actual):
        # no tolerance reaches infinity
        return LeafCheck(path, False, math.inf, math.inf, text, tolerance_ratio=math.inf)
    gap = abs(actual - expected)
    relative = gap / max(abs(expected), sys.float_info.min)
    allowed = atol + rtol * abs(expected)
    ok = gap <= allowed
    ratio = gap / allowed if allowed > 0 else math.inf
    return LeafCheck(
        path, ok, gap, relative, "" if ok else f"{text} (beyond tolerance)", tolerance_ratio=ratio
    )


def _extremes(checks: list[LeafCheck]) -> tuple[float, float]:
    return _largest([c.max_abs for c in checks]), _largest([c.max_rel for c in checks])


def _to_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _is_leaf(value: Any) -> bool:
    return pytree.tree_structure(value).is_leaf()


# dict types whose == ignores the order of the keys (an OrderedDict's does not)
_UNORDERED = (dict, collections.defaultdict)


def in_order_of(expected: Any, actual: Any) -> Any:
    """``actual`` with the keys of each of its dicts in the order of ``expected``'s dict at the
    same place, where both have the same keys: pytree's structures then agree when only the
    order of keys differs. Everything else is left as it is (and is the same object).

    Example:
        >>> list(in_order_of({"a": 1, "b": 2}, {"b": 3, "a": 4}))
        ['a', 'b']
    """
    if (
        type(expected) in _UNORDERED
        and type(actual) is type(expected)
        and list(actual) != list(expected)
        and actual.keys() == expected.keys()
    ):
        reordered = copy.copy(actual)  # a defaultdict keeps its default_factory
        reordered.clear()
        reordered.update((key, actual[key]) for key in expected)
        actual = reordered
    expected_children, expected_spec = _children(expected)
    actual_children, actual_spec = _children(actual)
    if (
        expected_spec.is_leaf()
        or actual_spec.is_leaf()
        or len(expected_children) != len(actual_children)
    ):
        return actual
    aligned = [in_order_of(e, a) for e, a in zip(expected_children, actual_children)]
    if all(new is old for new, old in zip(aligned, actual_children)):
        return actual
    return pytree.tree_unflatten(aligned, actual_spec)


def _children(value: Any) -> tuple[list[Any], pytree.TreeSpec]:
    """One level of ``value``'s pytree: its children as leaves (a leaf: no children)."""
    return pytree.tree_flatten(value, is_leaf=lambda node: node is not value)


def _compare_parts(path: str, expected: Any, actual: Any, rtol: float, atol: float) -> LeafCheck:
    """A leaf that is itself a list, tuple or dict (when called directly): part by part, dicts
    key by key in any order."""
    actual = in_order_of(expected, actual)
    expected_parts, expected_spec = pytree.tree_flatten_with_path(expected)
    actual_parts, actual_spec = pytree.tree_flatten_with_path(actual)
    if expected_spec != actual_spec:
        return LeafCheck(
            path,
            False,
            math.nan,
            math.nan,
            f"{describe_spec(actual_spec)} vs expected {describe_spec(expected_spec)}",
            values_compared=False,
        )
    return _combine(
        path,
        [
            compare_leaf(path + pytree.keystr(key), x, y, rtol=rtol, atol=atol)
            for (key, x), (_, y) in zip(expected_parts, actual_parts)
        ],
    )


def _compare_numpy(
    path: str, expected: Any, actual: Any, rtol: float, atol: float, numpy: Any
) -> LeafCheck:
    """numpy arrays and scalars: dtype and shape exactly, then values by the tensor rules."""
    if type(expected) is not type(actual):
        return _type_mismatch(path, expected, actual)
    a, b = numpy.asarray(expected), numpy.asarray(actual)
    problems = []
    if a.shape != b.shape:
        problems.append(f"shape {list(b.shape)} vs expected {list(a.shape)}")
    if a.dtype != b.dtype:
        problems.append(f"dtype {b.dtype} vs expected {a.dtype}")
    if problems:
        return LeafCheck(path, False, math.nan, math.nan, "; ".join(problems), False)
    if a.dtype.kind in "biufc":
        try:
            # a native, contiguous copy: torch takes neither other byte orders nor odd strides
            native = a.dtype.newbyteorder("=")
            x = torch.from_numpy(numpy.array(a, dtype=native, order="C", copy=True))
            y = torch.from_numpy(numpy.array(b, dtype=native, order="C", copy=True))
        except TypeError:  # a dtype torch has no equivalent of (longdouble, ...)
            pass
        else:
            return _compare_tensors(path, x, y, rtol, atol)
        if a.dtype.kind in "fc":
            ok = bool(numpy.isclose(b, a, rtol=rtol, atol=atol, equal_nan=True).all())
            return LeafCheck(
                path,
                ok,
                math.nan,
                math.nan,
                "" if ok else "values differ",
                values_compared=True,
                tolerance_ratio=0.0 if ok else math.inf,  # not measured: only the verdict
            )
    ok = bool(numpy.array_equal(a, b))
    return LeafCheck(
        path,
        ok,
        0.0 if ok else math.nan,
        0.0 if ok else math.nan,
        "" if ok else "values differ",
        tolerance_ratio=0.0 if ok else math.inf,
    )


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
