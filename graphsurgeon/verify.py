"""verify(): do two programs compute the same thing? Output by output, pytree-aware."""

from __future__ import annotations

import cmath
import copy
import math
import numbers
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from ._exec import clone_inputs, keep_state, runnable_original
from ._meta import describe_spec
from .errors import GraphSurgeonError, VerifyError, a_type, did_you_mean
from .swap import check_module

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
    """

    path: str
    ok: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    problem: str = ""


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

    def __bool__(self) -> bool:
        return self.ok

    @property
    def mismatches(self) -> tuple[LeafCheck, ...]:
        return tuple(leaf for leaf in self.leaves if not leaf.ok)

    @property
    def max_abs(self) -> float:
        """The largest absolute error; NaN when a leaf's error could not be measured."""
        return _largest([leaf.max_abs for leaf in self.leaves])

    def __str__(self) -> str:
        head = "match" if self.ok else "MISMATCH"
        lines = [
            f"verify: {head} ({len(self.leaves)} output leaf{'' if len(self.leaves) == 1 else 's'}, rtol={self.rtol:g}, atol={self.atol:g})"
        ]
        if self.structure_problem:
            lines.append(f"  structure: {self.structure_problem}")
        for leaf in self.leaves:
            mark = "ok " if leaf.ok else "BAD"
            where = leaf.path or "(output)"
            detail = f"max abs {leaf.max_abs:.3g}, max rel {leaf.max_rel:.3g}"
            if leaf.problem:
                detail += f"; {leaf.problem}"
            lines.append(f"  {mark} {where}: {detail}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        from . import display as d

        verdict = d.badge("match", "ok") if self.ok else d.badge("MISMATCH", "bad")
        n = len(self.leaves)
        head = (
            f'<div class="gs-title">verify {verdict} <span class="gs-muted">{n} output '
            f"leaf{'s' if n != 1 else ''}, rtol={self.rtol:g}, atol={self.atol:g}</span></div>"
        )
        if self.structure_problem:
            head += f"<div>{d.badge('structure', 'bad')} {d.escape(self.structure_problem)}</div>"
        return head + leaf_table(self.leaves)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from . import display

        lines = str(self).splitlines()
        if len(lines) > 12:  # the plain form stays short; the table holds every leaf
            lines = [*lines[:11], f"  ... and {len(lines) - 11} more leaves"]
        return display.bundle(self._repr_html_(), "\n".join(lines), include, exclude)


def leaf_table(leaves: tuple[LeafCheck, ...], limit: int = 12) -> str:
    """Leaves as an HTML table, the worst first (mismatches, then the largest relative error);
    past ``limit`` rows the rest is folded."""
    from . import display as d

    def badness(leaf: LeafCheck) -> tuple:
        rel = leaf.max_rel if leaf.max_rel == leaf.max_rel else math.inf  # NaN: unmeasured
        return (leaf.ok, -rel)

    rows = [
        [
            d.badge("ok", "ok") if leaf.ok else d.badge("differs", "bad"),
            leaf.path or "(output)",
            d.number(leaf.max_abs),
            d.number(leaf.max_rel),
            leaf.problem,
        ]
        for leaf in sorted(leaves, key=badness)
    ]
    headers = ["", "leaf", "max abs", "max rel", ""]
    shown = d.table(headers, rows[:limit], numeric=(2, 3), raw=(0,))
    if len(rows) <= limit:
        return shown
    rest = d.table(headers, rows[limit:], numeric=(2, 3), raw=(0,))
    return shown + d.details(f"{len(rows) - limit} more leaves", rest)


def as_callable(program: Any) -> Any:
    """A runnable module for an eager model, a GraphModule or an ExportedProgram.

    An ExportedProgram runs as its one runnable original (``graphsurgeon._exec``), which holds
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
        # so its buffers (and a program's) are put back afterwards
        with torch.no_grad(), keep_state([module]):
            return module(*clone_inputs(args), **clone_inputs(dict(kwargs)))
    except Exception as error:
        raise VerifyError(
            f"verify: running the {which} ({type(program).__name__}) failed: "
            f"{type(error).__name__}: {error}"
        ) from error


def _check_tolerance(name: str, value: Any) -> float:
    """``value`` as a float when it is a usable tolerance; else a VerifyError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise VerifyError(
            f"{name}={value!r}: expected a finite number >= 0 such as {name}=1e-5, got "
            f"{a_type(value)}"
        )
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise VerifyError(
            f"{name}={value!r}: expected a finite number >= 0 such as {name}=1e-5 "
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
    return LeafCheck(
        path,
        not bad,
        _largest([c.max_abs for c in checks]),
        _largest([c.max_rel for c in checks]),
        problem,
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
        return LeafCheck(path, False, math.nan, math.nan, "; ".join(problems))
    if a.device.type == "meta":
        # meta tensors carry no values: say so instead of reporting an error of 0
        return LeafCheck(
            path,
            True,
            math.nan,
            math.nan,
            "meta tensors: shape and dtype agree, values not compared",
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


def _compare_exact(path: str, a: torch.Tensor, b: torch.Tensor) -> LeafCheck:
    """Integers and bools: equal or not, no tolerance, never through floating point."""
    x, y = _as_int64(a), _as_int64(b)
    differ = x != y
    count = int(differ.sum())
    if count == 0:
        return LeafCheck(path, True)
    x, y = x[differ], y[differ]
    gap = torch.maximum(x, y) - torch.minimum(x, y)
    # A gap of 2**63 or more wraps around to a negative int64: add 2**64 back, in Python ints.
    wrapped = gap < 0
    largest = int(gap[wrapped].max()) + 2**64 if bool(wrapped.any()) else int(gap.max())
    # The relative error is for the report only; the verdict above is exact.
    true_gap = gap.to(torch.float64) + wrapped.to(torch.float64) * 2.0**64
    # relative to the expected value; against an expected 0 (False) it is infinite, said so
    relative = true_gap / a[differ].to(torch.float64).abs()
    kind = "bools" if a.dtype == torch.bool else "integers"
    return LeafCheck(
        path,
        False,
        float(largest),
        float(relative.max()),
        f"{kind} differ at {count} of {a.numel()} positions (largest difference {largest})",
    )


def _compare_close(
    path: str, a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float
) -> LeafCheck:
    """Floating point and complex: ``|a - b| <= atol + rtol * |a|``, NaN matching NaN."""
    # Compare in double precision (complex in complex128, keeping the imaginary part).
    wide = torch.complex128 if a.is_complex() else torch.float64
    x, y = a.to(wide), b.to(wide)
    nan_a, nan_b = torch.isnan(x), torch.isnan(y)
    if not torch.equal(nan_a, nan_b):
        return LeafCheck(path, False, math.nan, math.nan, "NaN in different places")
    both = ~nan_a
    x, y = x[both], y[both]
    if x.numel() == 0:
        return LeafCheck(path, True)
    same_inf = (x == y) | ~(torch.isinf(x) | torch.isinf(y))
    diff = (x - y).abs()
    diff = torch.where(x == y, torch.zeros_like(diff), diff)  # inf == inf
    if not bool(same_inf.all()):
        return LeafCheck(path, False, math.inf, math.inf, "Inf in different places")
    max_abs = float(diff.max())
    # relative to the expected value: infinite where it is 0 and the candidate is not
    rel = diff / x.abs()
    max_rel = float(torch.where(diff == 0, torch.zeros_like(rel), rel).max())
    beyond = int((diff > atol + rtol * x.abs()).sum())
    if beyond == 0:
        return LeafCheck(path, True, max_abs, max_rel)
    return LeafCheck(
        path,
        False,
        max_abs,
        max_rel,
        f"values differ beyond tolerance at {beyond} of {a.numel()} positions",
    )


def _compare_nested(
    path: str, a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float
) -> LeafCheck:
    if not (a.is_nested and b.is_nested):
        kind = {True: "nested tensor", False: "tensor"}
        return LeafCheck(
            path, False, math.nan, math.nan, f"{kind[b.is_nested]} vs expected {kind[a.is_nested]}"
        )
    parts_a, parts_b = a.unbind(), b.unbind()
    if len(parts_a) != len(parts_b):
        return LeafCheck(
            path,
            False,
            math.nan,
            math.nan,
            f"nested tensor of {len(parts_b)} parts vs expected {len(parts_a)}",
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
) -> VerifyReport:
    """Run ``reference`` and ``candidate`` on the same inputs and compare every output leaf.

    ``reference`` and ``candidate`` may each be an eager model, an ExportedProgram or a
    GraphModule. Tensors must agree in layout, shape, dtype and device; floating-point and
    complex values then match when ``|a - b| <= atol + rtol * |a|`` (NaN matches NaN), while
    integers and bools must be equal, whatever the tolerances. :func:`compare_leaf` has the
    rules for other leaves. Each program runs once, under ``no_grad``, on its own copy of the
    inputs. A mismatch never raises: the report says what differs. If a program fails to run,
    or a tolerance is not a finite number >= 0, :class:`VerifyError` says which.
    """
    rtol, atol = _check_tolerance("rtol", rtol), _check_tolerance("atol", atol)
    if not isinstance(args, tuple):
        args = (args,)
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise VerifyError(
            f"kwargs: expected a mapping of keyword inputs such as {{'mask': mask}}, got "
            f"{a_type(kwargs)}; positional inputs go in args"
        )
    kwargs = dict(kwargs or {})
    expected = _run(reference, "reference", args, kwargs)
    actual = _run(candidate, "candidate", args, kwargs)
    return compare_outputs(expected, actual, rtol=rtol, atol=atol)


def compare_leaf(
    path: str, expected: Any, actual: Any, *, rtol: float = 1e-5, atol: float = 1e-5
) -> LeafCheck:
    """Compare one output leaf. A mismatch, or a leaf it cannot compare, is reported, not raised.

    Tensors must agree in layout, shape, dtype and device; floating-point and complex values
    then match when ``|a - b| <= atol + rtol * |a|`` (NaN matches NaN), integers and bools
    only when equal. Meta tensors compare by shape and dtype (the check says so). Sparse
    tensors compare by the values they stand for, quantized ones dequantized. numpy arrays
    follow the same rules; Python ints and bools compare exactly, floats and complex numbers
    with the tolerances; lists, tuples and dicts part by part; anything else by ``==``.

    Example:
        >>> import torch
        >>> compare_leaf("", torch.tensor([2**53]), torch.tensor([2**53 + 1])).problem
        'integers differ at 1 of 1 positions (largest difference 1)'
    """
    rtol, atol = _check_tolerance("rtol", rtol), _check_tolerance("atol", atol)
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
        return LeafCheck(path, False, _to_float(gap), relative, text)
    nan_expected, nan_actual = cmath.isnan(expected), cmath.isnan(actual)
    if nan_expected and nan_actual:
        return LeafCheck(path, True)  # as for tensors: NaN matches NaN
    if nan_expected or nan_actual:
        return LeafCheck(path, False, math.nan, math.nan, text)
    if expected == actual:
        return LeafCheck(path, True)  # also inf == inf
    if cmath.isinf(expected) or cmath.isinf(actual):
        return LeafCheck(path, False, math.inf, math.inf, text)  # no tolerance reaches infinity
    gap = abs(actual - expected)
    relative = gap / max(abs(expected), sys.float_info.min)
    ok = gap <= atol + rtol * abs(expected)
    return LeafCheck(path, ok, gap, relative, "" if ok else f"{text} (beyond tolerance)")


def _to_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _is_leaf(value: Any) -> bool:
    return pytree.tree_structure(value).is_leaf()


def _compare_parts(path: str, expected: Any, actual: Any, rtol: float, atol: float) -> LeafCheck:
    """A leaf that is itself a list, tuple or dict (when called directly): part by part."""
    expected_parts, expected_spec = pytree.tree_flatten_with_path(expected)
    actual_parts, actual_spec = pytree.tree_flatten_with_path(actual)
    if expected_spec != actual_spec:
        return LeafCheck(
            path,
            False,
            math.nan,
            math.nan,
            f"{describe_spec(actual_spec)} vs expected {describe_spec(expected_spec)}",
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
        return LeafCheck(path, False, math.nan, math.nan, "; ".join(problems))
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
            return LeafCheck(path, ok, math.nan, math.nan, "" if ok else "values differ")
    ok = bool(numpy.array_equal(a, b))
    return LeafCheck(
        path, ok, 0.0 if ok else math.nan, 0.0 if ok else math.nan, "" if ok else "values differ"
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
    rtol, atol = _check_tolerance("rtol", rtol), _check_tolerance("atol", atol)
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
