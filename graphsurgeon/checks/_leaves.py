"""How two values compare, leaf by leaf: the rules :func:`graphsurgeon.verify` and every other
check apply to one output leaf or one gradient (tensors with tolerances and a per-axis pattern,
integers exactly, numbers, containers, dataclasses, numpy arrays).

:mod:`graphsurgeon.checks.verify` re-exports the public names (``LeafCheck``,
``compare_leaf``, ``checked_tolerance``, ``in_order_of``)."""

from __future__ import annotations

import cmath
import collections
import copy
import dataclasses
import math
import numbers
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from .._meta import describe_spec
from ..errors import GraphSurgeonError, VerifyError, a_type

__all__ = ["LeafCheck", "checked_tolerance", "compare_leaf", "in_order_of"]


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
# array of a comparison is 512 KB, whatever the size of the outputs (benchmarks/verify.py),
# and blocks this small are also faster than whole tensors: the arrays of one block stay in
# the CPU's cache (blocks of 2**18 compared gradients at half the speed, with 2 MB of cache
# per core).
_BLOCK = 2**16


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

    def add_figures(
        self, compared: int, max_abs: float, max_rel: float, ratio: float, scale: float
    ) -> None:
        """Adds the figures of values all finite and within the tolerance (:func:`_screened`)."""
        self.compared += compared
        self.max_abs = max(self.max_abs, max_abs)
        self.max_rel = max(self.max_rel, max_rel)
        self.ratio = max(self.ratio, ratio)
        self.scale = max(self.scale, scale)

    def add_finite(
        self,
        x: np.ndarray,
        error: np.ndarray,
        rtol: float,
        atol: float,
        largest: float | None = None,
        work: _Work | None = None,
    ) -> np.ndarray | None:
        """:meth:`add` for float64 values that are all finite on both sides, given
        ``|x - y|`` and, when known, its largest value: the same figures in about a third of
        the passes, in numpy arrays written in place (``work``'s, when given), which is what
        keeps a backward check's millions of gradient values cheap (benchmarks/verify.py).
        Returns where values are beyond the tolerance, or None where none is: what the
        per-axis pattern of a mismatch is made of, without a second pass. ``error`` is
        overwritten."""
        size = x.size
        if size == 0:
            return None
        work = work or _Work(size)
        self.compared += size
        if largest is None:
            largest = float(error.max())
        self.max_abs = max(self.max_abs, largest)
        magnitude = np.abs(x, out=work.magnitude[:size])
        self.scale = max(self.scale, float(magnitude.max()))
        if largest == 0:
            return None  # equal everywhere: no relative error, none beyond the tolerance
        with np.errstate(all="ignore"):  # 0 / 0, d / 0 and overflow are read below
            # 0 / 0 (both 0) is no error; d / 0 is infinitely far, as in add(). fmax passes
            # over the NaN of a 0 / 0 in one pass (largest > 0: some quotient is not NaN).
            quotient = np.divide(error, magnitude, out=work.quotient[:size])
            rel = float(np.fmax.reduce(quotient))
            self.max_rel = max(self.max_rel, rel)
            allowed = np.add(np.multiply(magnitude, rtol, out=magnitude), atol, out=magnitude)
            ratio = np.divide(error, allowed, out=quotient)
            # a NaN (atol 0: 0 / 0 where both values are 0) is no error: fmax passes over it
            worst = float(np.fmax.reduce(ratio))
        self.ratio = max(self.ratio, worst)
        # Division is correctly rounded, so error > allowed gives a quotient of at least 1:
        # when the largest quotient is under 1, no value is beyond the tolerance.
        if worst < 1:
            return None
        beyond = np.greater(error, allowed)
        count = int(np.count_nonzero(beyond))
        self.beyond += count
        return beyond if count else None


class _Work:
    """The float64 arrays a finite comparison writes into, each of a block's size: fresh
    allocations of that size, per block and per step, cost page faults, and numpy's
    operations written in place cost about half of torch's allocating ones
    (benchmarks/verify.py). One set per thread is kept (:func:`_work`), 3.3 MB."""

    def __init__(self, size: int):
        self.size = size
        self.x, self.y, self.error, self.magnitude, self.quotient = (
            np.empty(size, dtype=np.float64) for _ in range(5)
        )
        # the float32 screen's (_screened): |x - y|, then |x| and the tolerance, a quotient
        self.error32, self.magnitude32, self.quotient32 = (
            np.empty(size, dtype=np.float32) for _ in range(3)
        )
        self.flags = np.empty(size, dtype=np.bool_)

    def load(self, a: torch.Tensor, b: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Two blocks as float64 arrays (each a view of this workspace, valid until the next
        load), their values exactly (every real floating dtype widens to float64 exactly)."""
        return self._widened(a, self.x), self._widened(b, self.y)

    @staticmethod
    def _widened(block: torch.Tensor, into: np.ndarray) -> np.ndarray:
        block = block.reshape(-1).resolve_neg()
        if block.dtype not in _NUMPY_FLOATS:  # bfloat16, float8: numpy has no such dtype
            block = block.to(torch.float64)
        out = into[: block.numel()]
        np.copyto(out, block.numpy())
        return out


# The float32 screen (_screened) of a block of float32 values all within the tolerance: its
# quotients are within 8 units in the last place of the float64 path's, unless one underflows
# or overflows, which these bounds on the figures and tolerances rule out.
_SCREEN_TINY, _SCREEN_HUGE = 2.0**-100, 2.0**100
# Around the largest rounded figure, the positions the largest exact one is among (2**-18 is
# 16 times the 8 units of the bound): few, recomputed in float64.
_SCREEN_MARGIN = 1 - 2.0**-18
# the values a leaf needs for the screen to pay: measured, about where the two paths cross
_SCREEN_LEAST = 2**14


def _screened(
    x: np.ndarray, y: np.ndarray, rtol: float, atol: float, work: _Work
) -> tuple[float, float, float, float] | None:
    """The figures of two float32 blocks, ``(max_abs, max_rel, ratio, scale)``, bit for bit
    what the float64 path (:meth:`_Tally.add_finite`) makes of them, from float32 passes
    (half the memory, no widening) and float64 on the few positions that can hold each
    maximum. None when the screen cannot tell: a value not finite, a quotient that
    underflows or overflows, or a value within a factor 2 of its tolerance or beyond it (the
    float64 path decides those, and counts and marks a mismatch).

    Why it is exact: rounding is monotonic, so the largest exact ``|x - y|`` is among the
    positions whose rounded one is the largest; each float32 quotient is within 8 units in
    the last place (2**-21) of the exact one, so the largest exact quotient is among those
    within 2**-18 of the largest float32 one. ``tests/test_verify.py`` checks it against the
    general path, which never uses it."""
    if not (_SCREEN_TINY <= atol <= _SCREEN_HUGE and 0 <= rtol <= 1):
        return None
    size = x.size
    error, magnitude = work.error32[:size], work.magnitude32[:size]
    quotient, flags = work.quotient32[:size], work.flags[:size]

    def exact(where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x_wide = x[where].astype(np.float64)
        return np.abs(x_wide - y[where]), np.abs(x_wide)

    with np.errstate(all="ignore"):  # overflow, 0 / 0 and d / 0 are read below
        np.abs(np.subtract(x, y, out=error), out=error)
        largest = float(error.max())
        if not math.isfinite(largest):
            return None
        scale = float(np.abs(x, out=magnitude).max())
        if largest == 0:
            return 0.0, 0.0, 0.0, scale
        if largest > 0.5 * (rtol * scale + atol):
            return None  # beyond half the largest tolerance anywhere: no need to look closer
        max_abs = float(exact(np.flatnonzero(np.equal(error, largest, out=flags)))[0].max())
        # fmax passes over NaN (0 / 0: no error there) in the one pass max makes, where
        # replacing the NaN first cost a pass of its own
        rel = float(np.fmax.reduce(np.divide(error, magnitude, out=quotient)))
        # (a NaN would fail this too; none comes: largest > 0 leaves a positive quotient)
        if not _SCREEN_TINY <= rel < math.inf:
            return None
        wide_error, wide_magnitude = exact(
            np.flatnonzero(np.greater_equal(quotient, rel * _SCREEN_MARGIN, out=flags))
        )
        # the candidates' float32 quotients are positive and finite: so are their exact ones
        max_rel = float((wide_error / wide_magnitude).max())
        allowed = np.multiply(magnitude, np.float32(rtol), out=magnitude)
        allowed = np.add(allowed, np.float32(atol), out=magnitude)
        worst = float(np.divide(error, allowed, out=quotient).max())
        if not _SCREEN_TINY <= worst < 0.5:
            return None
        wide_error, wide_magnitude = exact(
            np.flatnonzero(np.greater_equal(quotient, worst * _SCREEN_MARGIN, out=flags))
        )
        ratio = float((wide_error / (wide_magnitude * rtol + atol)).max())
    return max_abs, max_rel, ratio, scale


# the floating dtypes numpy reads as they are; the others are widened by torch first
_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)
_kept = threading.local()


def _work(size: int) -> _Work:
    """This thread's workspace, of at least ``size`` values (made again only to grow)."""
    work = getattr(_kept, "work", None)
    if work is None or work.size < size:
        work = _kept.work = _Work(size)
    return work


def _compare_close(
    path: str, a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float
) -> LeafCheck:
    """Floating point and complex: ``|a - b| <= atol + rtol * |a|``, NaN matching NaN.

    Complex values compare by the modulus where neither side has a NaN; a NaN is matched
    component by component (``nan+1j`` is not ``5+nanj``), and where both sides have the
    same NaN component the other components compare as real numbers (``nan+1j`` is not
    ``nan+2j``). The comparison runs block by block in double precision (complex128 for
    complex), so it needs a few MB beyond the two tensors, whatever their size. A block of
    float32 values all well within the tolerance (most gradients) is screened in float32
    first, with the same figures (:func:`_screened`).
    """
    wide = torch.complex128 if a.is_complex() else torch.float64
    tally = _Tally()
    nan_apart = False
    # where the finite path found values beyond the tolerance (made at the first such block);
    # once a block goes through the general path, a mismatch's pattern is made anew instead
    marks: _Marks | None = None
    general = False
    # real values on the CPU, the common case, go through numpy in place (see _Work); complex
    # values, and values on another device (numpy cannot read them), the general path below
    work = _work(min(a.numel(), _BLOCK)) if not a.is_complex() and a.device.type == "cpu" else None
    # float32 values all well within the tolerance, first; a leaf with a block the screen
    # cannot tell (most often one that differs) is not screened further: it would be wasted.
    # Nor is a small leaf: the screen's few dozen calls cost more than they save there.
    screen = a.dtype == torch.float32 and a.numel() >= _SCREEN_LEAST
    for index in _blocks(a.shape, _BLOCK):
        if work is None:
            x, y = a[index].reshape(-1).to(wide), b[index].reshape(-1).to(wide)
        else:
            if screen:
                x_values = a[index].reshape(-1).resolve_neg().numpy()
                figures = _screened(
                    x_values, b[index].reshape(-1).resolve_neg().numpy(), rtol, atol, work
                )
                if figures is not None:
                    tally.add_figures(x_values.size, *figures)
                    continue
                screen = False
            # then: x - y finite means no NaN and no infinity on either side
            x_values, y_values = work.load(a[index], b[index])
            error = work.error[: x_values.size]
            with np.errstate(all="ignore"):  # inf - inf is NaN, overflow inf: both read below
                np.abs(np.subtract(x_values, y_values, out=error), out=error)
            largest = float(error.max())  # NaN or infinite when any value is not finite
            if math.isfinite(largest):
                beyond = tally.add_finite(x_values, error, rtol, atol, largest, work)
                if beyond is not None and not general:
                    if marks is None:
                        marks = _Marks(a.shape)
                    marks.add(index, torch.from_numpy(beyond).view(a[index].shape))
                continue
            # the general path, in torch, on the workspace's arrays (it only reads them)
            x, y = torch.from_numpy(x_values), torch.from_numpy(y_values)
        general, marks = True, None
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
    where = (
        marks.pattern()
        if marks is not None
        else _pattern(a, b, _beyond_tolerance(wide, rtol, atol))
    )
    return LeafCheck(
        path,
        False,
        tally.max_abs,
        tally.max_rel,
        f"values differ beyond tolerance at {tally.beyond} of {a.numel()} positions",
        tolerance_ratio=tally.ratio,
        scale=tally.scale,
        **where,
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


class _Marks:
    """Where two tensors of one shape differ, one flag per index of each dimension, marked
    block by block (the blocks of :func:`_blocks`): what ``differing`` and ``by_axis`` of a
    :class:`LeafCheck` are made of."""

    def __init__(self, shape: torch.Size):
        self.shape = tuple(shape)
        self.flags = [torch.zeros(size, dtype=torch.bool) for size in self.shape]

    def add(self, index: tuple, bad: torch.Tensor) -> None:
        """Marks the block at ``index`` (one of :func:`_blocks`), ``bad`` shaped as the
        block, True where the values differ."""
        # the block's dimensions are the tensor's after those its index fixed to one position
        fixed = len(index) - 1 if index and isinstance(index[-1], slice) else len(index)
        for dim in range(len(self.shape)):
            if dim < fixed:
                self.flags[dim][index[dim]] = True
                continue
            inner = dim - fixed
            others = tuple(d for d in range(bad.dim()) if d != inner)
            along = bad.any(dim=others) if others else bad
            start = index[dim].start if dim == fixed and dim < len(index) else 0
            self.flags[dim][start : start + along.numel()] |= along

    def pattern(self) -> dict[str, Any]:
        if not self.shape:
            return {}
        differing = tuple(_ranges(f) for f in self.flags)
        return {"differing": differing, "by_axis": _axis_text(differing, self.shape)}


def _pattern(a: torch.Tensor, b: torch.Tensor, differs) -> dict[str, Any]:
    """``by_axis`` and ``differing`` of a :class:`LeafCheck` for two tensors of one shape.

    ``differs(block_a, block_b)`` says, element by element, where two blocks differ. It runs
    block by block (the blocks of :func:`_blocks`), so it needs a few MB beyond the tensors
    whatever their size, and keeps one flag per index of each dimension.
    """
    marks = _Marks(a.shape)
    if not marks.shape:
        return {}
    for index in _blocks(a.shape, _BLOCK):
        bad = differs(a[index], b[index])
        if bool(bad.any()):
            marks.add(index, bad)
    return marks.pattern()


def _ranges(flags: torch.Tensor) -> tuple[range, ...]:
    """The runs of True in a flag vector, as ranges: ``[T, T, F, T]`` -> ``(range(0, 2),
    range(3, 4))``.

    Example:
        >>> _ranges(torch.tensor([True, True, False, True]))
        (range(0, 2), range(3, 4))
    """
    if flags.numel() <= 256:  # a short vector: a loop costs less than a few tensor ops
        runs: list[range] = []
        for position, flag in enumerate(flags.tolist()):
            if not flag:
                continue
            if runs and runs[-1].stop == position:
                runs[-1] = range(runs[-1].start, position + 1)
            else:
                runs.append(range(position, position + 1))
        return tuple(runs)
    # where a run starts or stops: the flags, padded with False, change there
    padded = torch.zeros(flags.numel() + 2, dtype=torch.int8)
    padded[1:-1] = flags
    edges = (padded[1:] != padded[:-1]).nonzero().flatten().tolist()
    return tuple(range(start, stop) for start, stop in zip(edges[0::2], edges[1::2]))


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
