"""verify(): do two programs compute the same thing? Output by output, pytree-aware."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from ._exec import clone_inputs, keep_state, runnable_original
from ._meta import describe_spec
from .errors import GraphSurgeonError, VerifyError

__all__ = ["LeafCheck", "VerifyReport", "as_callable", "verify"]


@dataclass(frozen=True)
class LeafCheck:
    """One output leaf compared.

    Attributes:
        path: where the leaf sits in the output, e.g. ``"[0]['logits']"`` (``""`` for a bare tensor).
        ok: whether it matches.
        max_abs / max_rel: the largest absolute and relative errors (tensors only; NaN when
            shapes differ).
        problem: what differs when not ok ("shape [2, 3] vs [2, 4]", "values", ...).
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
        return max((leaf.max_abs for leaf in self.leaves), default=0.0)

    def __str__(self) -> str:
        head = "match" if self.ok else "MISMATCH"
        lines = [
            f"verify: {head} ({len(self.leaves)} output leaves, rtol={self.rtol:g}, atol={self.atol:g})"
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


def _compare_tensors(
    path: str, a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float
) -> LeafCheck:
    if a.shape != b.shape:
        return LeafCheck(
            path, False, math.nan, math.nan, f"shape {list(b.shape)} vs expected {list(a.shape)}"
        )
    if a.dtype != b.dtype:
        return LeafCheck(path, False, math.nan, math.nan, f"dtype {b.dtype} vs expected {a.dtype}")
    if a.device.type == "meta" or b.device.type == "meta":
        return LeafCheck(path, True, 0.0, 0.0, "meta tensors: shape and dtype only")
    if a.numel() == 0:
        return LeafCheck(path, True)
    # Compare in double precision (complex in complex128, keeping the imaginary part).
    wide = torch.complex128 if a.is_complex() else torch.float64
    x, y = a.detach().to(wide), b.detach().to(wide)
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
    rel = diff / x.abs().clamp_min(torch.finfo(torch.float64).tiny)
    max_rel = float(torch.where(diff == 0, torch.zeros_like(rel), rel).max())
    ok = bool((diff <= atol + rtol * x.abs()).all())
    return LeafCheck(path, ok, max_abs, max_rel, "" if ok else "values differ beyond tolerance")


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
    GraphModule. Tensors are compared by shape, dtype and ``|a - b| <= atol + rtol * |a|``
    (NaN matches NaN); other leaves by equality. Each program runs once, under ``no_grad``,
    on its own copy of the inputs. A mismatch never raises: the report says what differs.
    If a program fails to run, :class:`VerifyError` says which.
    """
    if not isinstance(args, tuple):
        args = (args,)
    kwargs = dict(kwargs or {})
    expected = _run(reference, "reference", args, kwargs)
    actual = _run(candidate, "candidate", args, kwargs)
    return compare_outputs(expected, actual, rtol=rtol, atol=atol)


def compare_leaf(
    path: str, expected: Any, actual: Any, *, rtol: float = 1e-5, atol: float = 1e-5
) -> LeafCheck:
    """Compare one output leaf: tensors by shape, dtype and tolerance, others by equality."""
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        return _compare_tensors(path, expected, actual, rtol, atol)
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        return LeafCheck(
            path,
            False,
            math.nan,
            math.nan,
            f"{type(actual).__name__} vs expected {type(expected).__name__}",
        )
    equal = bool(expected == actual)
    return LeafCheck(path, equal, 0.0, 0.0, "" if equal else f"{actual!r} vs expected {expected!r}")


def compare_outputs(
    expected: Any, actual: Any, *, rtol: float = 1e-5, atol: float = 1e-5
) -> VerifyReport:
    """Compare two outputs already computed, as :func:`verify` does (pytree-aware).

    Example:
        >>> import torch
        >>> bool(compare_outputs({"a": torch.ones(2)}, {"a": torch.ones(2) + 1e-7}))
        True
    """
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
    reference = copy.deepcopy(model)
    for name in sorted(replacements, key=lambda n: n.count(".")):
        if "@" in name:
            raise VerifyError(
                f"{name!r} swaps one call of a module; an eager model has no such reference"
            )
        parent_name, _, leaf = name.rpartition(".")
        parent = reference.get_submodule(parent_name) if parent_name else reference
        setattr(parent, leaf, copy.deepcopy(replacements[name]))
    return reference
