"""The input checks of a swapped or fused program: what ``ep.module()`` refuses, it refuses.

A program is exported for inputs of a given structure, given sizes (static, or dynamic within a
range), and given values of its Python constants (``n=5`` is baked into the graph). torch
checks these when ``ep.module()`` runs; a program made by :func:`graphsurgeon.swap` checks the
same, at its first node, and says which input is wrong, what it got and what it expected:

* each tensor input: its number of dimensions, each static size, each dynamic size within the
  range of its symbol, and sizes that share a symbol equal to each other;
* each Python constant input (int, float, bool, str): equal to the value at export;
* each dynamic int input: within its range;
* the relations torch's tracer recorded between inputs (``ep._guards_code``).

The check is generated as one small Python function per program (a handful of comparisons per
input), so it costs well under a microsecond per input. When it fails, the same checks run again
slowly to explain the first one that fails.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from ._meta import describe_spec, format_structure
from .errors import GuardError, InputStructureError

__all__ = ["InputGuard"]


class _Check:
    """One condition on the inputs, with the words that explain it when it fails."""

    __slots__ = ("code", "explain")

    def __init__(self, code: str, explain):
        self.code = code  # a Python expression over a0, a1, ... that must be true
        self.explain = explain  # (leaves) -> message, called only when it failed


class InputGuard:
    """Checks a program's inputs as the program receives them: ``guard(*arguments)``.

    ``arguments`` describes each top-level argument: ``(name, spec, leaves)``, where ``spec`` is
    its pytree structure at export (a leaf for a plain tensor) and ``leaves`` lists each leaf as
    ``(path, value at export)``: the path as the user names it (``x``, ``d['a']``) and the value
    the placeholder's ``meta["val"]`` (a fake tensor, a SymInt, or a Python constant). A
    structured argument is flattened and its structure checked first
    (:class:`~graphsurgeon.InputStructureError`), then every leaf
    (:class:`~graphsurgeon.GuardError`).
    """

    def __init__(
        self,
        arguments: Sequence[tuple[str, Any, Sequence[tuple[str, Any]]]],
        range_constraints: dict,
        tracer_guards: Sequence[str] = (),
        sources: dict[str, int] | None = None,
    ):
        self.arguments = [(name, spec) for name, spec, _ in arguments]
        leaves = [leaf for _, _, argument_leaves in arguments for leaf in argument_leaves]
        self.paths = [path for path, _ in leaves]
        self.checks: list[_Check] = []
        self.symbols: dict[Any, tuple[int, int | None]] = {}  # symbol -> (leaf, dim) first seen
        deferred = []
        for i, (path, value) in enumerate(leaves):
            deferred += self._leaf(i, path, value, range_constraints)
        for i, dim, expr in deferred:
            self._derived(i, dim, expr)
        for guard in tracer_guards or ():
            self._tracer_guard(guard, sources or {})
        self.source = self._source()
        namespace: dict[str, Any] = {
            "Tensor": torch.Tensor,
            "math": math,
            "_fail": self._fail,
            "_flatten": pytree.tree_flatten,
            "_structure": self._structure_fail,
            "_specs": [spec for _, spec in self.arguments],
        }
        exec(compile(self.source, "<graphsurgeon input guard>", "exec"), namespace)
        self._run = namespace["check"]

    def __call__(self, *arguments: Any) -> None:
        self._run(*arguments)

    def __repr__(self) -> str:
        return f"<InputGuard: {len(self.checks)} checks on {len(self.paths)} inputs>"

    # -- building --------------------------------------------------------------------------

    def _leaf(self, i: int, path: str, value: Any, ranges: dict) -> list:
        a = f"a{i}"
        deferred = []
        if isinstance(value, torch.Tensor):
            shape = list(value.shape)
            rank = len(shape)
            self.checks.append(
                _Check(
                    f"isinstance({a}, Tensor) and {a}.dim() == {rank}",
                    lambda v, p=path, s=shape: _describe_tensor_mismatch(p, v[i], s),
                )
            )
            static = [d for d in shape if isinstance(d, int)]
            if len(static) == rank:
                self.checks.append(
                    _Check(
                        f"{a}.shape == {tuple(shape)!r}",
                        lambda v, p=path, s=shape: _describe_sizes(p, v[i], s),
                    )
                )
                return deferred
            for dim, size in enumerate(shape):
                if isinstance(size, int):
                    self.checks.append(
                        _Check(
                            f"{a}.shape[{dim}] == {size}",
                            lambda v, p=path, d=dim, n=size: (
                                f"input {p!r}: dimension {d} is {v[i].shape[d]}, the program "
                                f"was exported for {n} (a static size). Export with "
                                "dynamic_shapes to accept other sizes."
                            ),
                        )
                    )
                    continue
                deferred += self._symbolic(i, dim, f"{a}.shape[{dim}]", path, size, ranges)
            return deferred
        if isinstance(value, torch.SymInt):
            self.checks.append(
                _Check(
                    f"type({a}) is int",
                    lambda v, p=path: f"input {p!r} is {_what(v[i])}; the program takes an int",
                )
            )
            return self._symbolic(i, None, a, path, value, ranges)
        if isinstance(value, (bool, int, float, str)):
            if isinstance(value, float) and math.isnan(value):
                code = f"type({a}) is float and {a} != {a}"
            else:
                code = f"type({a}) is {type(value).__name__} and {a} == {value!r}"
            self.checks.append(
                _Check(
                    code,
                    lambda v, p=path, c=value: (
                        f"input {p!r} is {_what(v[i])}, but the program was exported with "
                        f"{p}={c!r}: a Python constant is baked into the graph. Export again "
                        "with that value, or pass it as a tensor."
                    ),
                )
            )
        return deferred

    def _symbolic(self, i, dim, code, path, size, ranges) -> list:
        expr = size.node.expr
        where = f"dimension {dim} of {path!r}" if dim is not None else repr(path)
        free = getattr(expr, "free_symbols", set())
        if len(free) != 1 or expr != next(iter(free)):
            return [(i, dim, expr)] if len(free) == 1 else []
        first = self.symbols.get(expr)
        if first is not None:
            j, other_dim = first
            other = f"a{j}.shape[{other_dim}]" if other_dim is not None else f"a{j}"
            other_where = (
                f"dimension {other_dim} of {self.paths[j]!r}"
                if other_dim is not None
                else repr(self.paths[j])
            )
            self.checks.append(
                _Check(
                    f"{code} == {other}",
                    lambda v, c=code, o=other: (
                        f"{where} is {_eval(c, v)} but must equal {other_where} "
                        f"({_eval(o, v)}): the program was exported with both the same "
                        f"dynamic size ({expr})"
                    ),
                )
            )
            return []
        self.symbols[expr] = (i, dim)
        low, high = _range(ranges.get(expr))
        # As torch does: 0 and 1 are specialized by the tracer, so a lower bound of 2 or less
        # is not checked (ep.module() accepts those sizes too).
        if low is not None and low > 2:
            self.checks.append(
                _Check(
                    f"{code} >= {low}",
                    lambda v, c=code: (
                        f"{where} is {_eval(c, v)}, below the smallest size the program was "
                        f"exported for ({low}; dynamic size {expr} in {_range_text(low, high)})"
                    ),
                )
            )
        if high is not None:
            self.checks.append(
                _Check(
                    f"{code} <= {high}",
                    lambda v, c=code: (
                        f"{where} is {_eval(c, v)}, above the largest size the program was "
                        f"exported for ({high}; dynamic size {expr} in {_range_text(low, high)})"
                    ),
                )
            )
        return []

    def _derived(self, i: int, dim: int | None, expr) -> None:
        """A size that is an expression of another input's size (``2 * batch``)."""
        free = next(iter(expr.free_symbols))
        first = self.symbols.get(free)
        if first is None:
            return  # defined by nothing we can read: torch cannot check it either
        j, other_dim = first
        value = f"a{j}.shape[{other_dim}]" if other_dim is not None else f"a{j}"
        try:
            import sympy
            from torch.utils._sympy.printers import PythonPrinter

            text = PythonPrinter().doprint(expr.subs(free, sympy.Symbol(value, integer=True)))
        except Exception:  # an expression the printer cannot write: leave it to the graph
            return
        code = f"a{i}.shape[{dim}]" if dim is not None else f"a{i}"
        path = self.paths[i]
        where = f"dimension {dim} of {path!r}" if dim is not None else repr(path)
        self.checks.append(
            _Check(
                f"{code} == ({text})",
                lambda v, c=code, t=text: (
                    f"{where} is {_eval(c, v)}, but the program was exported with it equal to "
                    f"{expr} ({_eval(t, v)} for these inputs)"
                ),
            )
        )

    def _tracer_guard(self, guard: str, sources: dict[str, int]) -> None:
        code = guard
        # longest first: L['x'] must not replace the start of L['x']['a']
        for source in sorted(sources, key=len, reverse=True):
            code = code.replace(source, f"a{sources[source]}")
        if "L[" in code:
            return  # names something that is not an input leaf
        try:
            compile(code, "<guard>", "eval")
        except SyntaxError:
            return
        shown = guard
        for source, i in sources.items():
            shown = shown.replace(source, self.paths[i])
        self.checks.append(
            _Check(code, lambda v, s=shown: f"the inputs break a condition of the program: {s}")
        )

    def _source(self) -> str:
        names = [f"p{k}" for k in range(len(self.arguments))]
        lines = [f"def check({', '.join(names)}):"]
        leaf = 0
        for k, (_, spec) in enumerate(self.arguments):
            if spec is None or spec.is_leaf():
                lines.append(f"    a{leaf} = p{k}")
                leaf += 1
                continue
            lines.append(f"    leaves, spec = _flatten(p{k})")
            lines.append(f"    if spec != _specs[{k}]:")
            lines.append(f"        _structure({k}, spec)")
            for i in range(spec.num_leaves):
                lines.append(f"    a{leaf} = leaves[{i}]")
                leaf += 1
        values = ", ".join(f"a{i}" for i in range(leaf))
        for k, check in enumerate(self.checks):
            lines.append(f"    if not ({check.code}):")
            lines.append(f"        _fail({k}, ({values}{',' if leaf == 1 else ''}))")
        lines.append("    return None")
        return "\n".join(lines) + "\n"

    def _structure_fail(self, k: int, actual) -> None:
        from ._runtime import structure_difference

        name, expected = self.arguments[k]
        raise InputStructureError(
            f"input {name!r} has the structure {describe_spec(actual)}, but the program was "
            f"exported with {describe_spec(expected)}: "
            f"{structure_difference(actual, expected, name)}. Call it with inputs structured as "
            "at export."
        )

    def _fail(self, k: int, leaves: tuple) -> None:
        # The first failing check explains itself; an earlier one may have failed in a way the
        # later ones depend on (a non-tensor has no shape), so look from the start.
        for check in self.checks[: k + 1]:
            try:
                ok = bool(_eval(check.code, leaves))
            except Exception:
                ok = False
            if not ok:
                raise _error(check.explain(leaves))
        raise _error(self.checks[k].explain(leaves))  # pragma: no cover


def _error(explained: str | Exception) -> Exception:
    # A check explains itself with words (a GuardError) or with the error it amounts to.
    return explained if isinstance(explained, Exception) else GuardError(explained)


def _eval(code: str, leaves: tuple) -> Any:
    names = {f"a{i}": v for i, v in enumerate(leaves)}
    return eval(code, {"Tensor": torch.Tensor, "math": math}, names)


def _range(value_range) -> tuple[int | None, int | None]:
    if value_range is None:
        return None, None
    low, high = value_range.lower, value_range.upper
    low = int(low) if _finite(low) else None
    high = int(high) if _finite(high) else None
    return low, high


def _finite(bound) -> bool:
    try:
        return math.isfinite(float(bound))
    except (TypeError, ValueError):
        return False


def _range_text(low: int | None, high: int | None) -> str:
    return f"[{low if low is not None else 0}, {high if high is not None else 'inf'}]"


def _what(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    leaves, spec = pytree.tree_flatten(value)
    if not spec.is_leaf():
        # A container: its structure says what came; its tensors' contents would not help.
        shown = format_structure(spec, [_leaf_text(leaf) for leaf in leaves])
        return f"a {type(value).__name__} {shown if len(shown) <= 80 else shown[:77] + '...'}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _leaf_text(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "tensor[" + ", ".join(str(d) for d in value.shape) + "]"
    text = repr(value)
    return text if len(text) <= 12 else text[:9] + "..."


def _describe_tensor_mismatch(path: str, value: Any, shape: list) -> str:
    expected = "[" + ", ".join(str(d) for d in shape) + "]"
    if not isinstance(value, torch.Tensor):
        message = f"input {path!r} is {_what(value)}; the program takes a tensor {expected}"
        if not pytree.tree_flatten(value)[1].is_leaf():
            return InputStructureError(message + ". Call it with inputs structured as at export.")
        return message
    return (
        f"input {path!r} has {value.dim()} dimensions {list(value.shape)}; the program was "
        f"exported with {len(shape)}: {expected}"
    )


def _describe_sizes(path: str, value: torch.Tensor, shape: list) -> str:
    for dim, (got, want) in enumerate(zip(value.shape, shape)):
        if got != want:
            return (
                f"input {path!r}: dimension {dim} is {got}, the program was exported for {want} "
                f"(shape {list(value.shape)}, expected {shape}: static sizes). Export with "
                "dynamic_shapes to accept other sizes."
            )
    return f"input {path!r} has shape {list(value.shape)}, expected {shape}"  # pragma: no cover
