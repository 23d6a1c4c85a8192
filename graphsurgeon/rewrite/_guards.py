"""The input checks of a swapped or fused program: what ``ep.module()`` refuses, it refuses.

A program is exported for inputs of a given structure, given sizes (static, or dynamic within a
range), and given values of its Python constants (``n=5`` is baked into the graph). torch
checks these when ``ep.module()`` runs; a program made by :func:`graphsurgeon.swap` checks the
same, at its first node, and says which input is wrong, what it got and what it expected:

* each tensor input: its number of dimensions, each static size, each dynamic size within the
  range of its symbol, and sizes that share a symbol equal to each other;
* each Python constant input (int, float, bool, str): equal to the value at export;
* each dynamic int input: within its range;
* the relations torch's tracer recorded between inputs (``ep._guards_code``), whichever way
  the tracer named the inputs (:func:`tracer_sources`).

The check is generated as one small Python function per program (a handful of comparisons per
input), so it costs well under a microsecond per input. When it fails, the same checks run again
slowly to explain the first one that fails.
"""

from __future__ import annotations

import ast
import builtins
import math
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from .._meta import describe_spec, format_structure, leaf_keystrs, tensor_text
from ..errors import GuardError, InputStructureError, SwapError

__all__ = ["InputGuard", "tracer_sources"]

# What a printed guard may call besides the inputs (torch evaluates them with the same).
_GUARD_NAMES: dict[str, Any] = {"Tensor": torch.Tensor, "math": math, "torch": torch}
try:
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    _GUARD_NAMES = {**SYMPY_INTERP, "inf": math.inf, **_GUARD_NAMES}
except ImportError:  # pragma: no cover - an older torch
    pass


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

    ``tracer_guards`` are torch's own conditions on the inputs (``ep._guards_code``); each input
    leaf is found in them by every name torch gives it (:func:`tracer_sources`), and
    ``sources`` (name -> leaf position) adds names of the caller's own.
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
        self._values = [value for _, value in leaves]
        self._shape_guards: list | None = None  # (printed, expr) of the shape env, when needed
        names = {**tracer_sources(self.arguments), **(sources or {})}
        table = _source_table(names)
        for guard in tracer_guards or ():
            self._tracer_guard(guard, table)
        self._values, self._shape_guards = [], None  # needed only while building
        self.source = self._source()
        namespace: dict[str, Any] = {
            **_GUARD_NAMES,
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

    def _tracer_guard(self, guard: str, table: dict[str, int]) -> None:
        """One condition torch's tracer recorded, checked on the leaves it names.

        The leaves are found by the names torch gives them. A condition that names something
        else (a form of naming this torch version does not use, or a program whose argument
        names were lost) is not dropped: its symbols are sizes of input leaves, which the
        check reads anyway, so it is written over those instead (:meth:`_guard_from_symbols`).
        When even that is impossible (a loaded program keeps the conditions as text only),
        the program is refused: running it unchecked could compute something other than the
        program, silently, on inputs ``ep.module()`` refuses."""
        renamed = _rename(guard, table)
        if renamed is None:
            renamed = self._guard_from_symbols(guard)
        if renamed is None:
            raise SwapError(
                f"cannot check the program's input condition {guard!r} (recorded by torch's "
                f"tracer in ep._guards_code): it names something that is not one of the "
                f"program's inputs ({', '.join(repr(p) for p in self.paths) or 'none'}), and "
                "the program keeps no symbolic form of it. Export the model again in this "
                "process (gs.export), so the condition can be read from the export."
            )
        code, reads = renamed
        if code is None:
            return  # the condition holds whatever the inputs (it names no input at all)
        paths = {f"a{i}": path for i, path in enumerate(self.paths)}
        shown = _show(code, paths)
        shown_reads = [(_show(read, paths), read) for read in reads]
        self.checks.append(
            _Check(
                code,
                lambda v, s=shown, r=shown_reads: (
                    f"the inputs break a condition of the program: {s} ({_arrived(r, v)})"
                ),
            )
        )

    def _guard_from_symbols(self, guard: str) -> tuple[str | None, list[str]] | None:
        """``guard`` written over the input sizes that define its symbols, or None.

        torch printed each condition of its shape environment with its own names for the
        inputs; the same expression, printed with each symbol as the input size it stands for
        (``a0.shape[0]``), says the same of the inputs as they arrive."""
        if self._shape_guards is None:
            self._shape_guards = _shape_guards(self._values)
        expr = next((e for printed, e in self._shape_guards if printed == guard), None)
        if expr is None:
            return None
        try:
            import sympy
            from torch.utils._sympy.printers import PythonPrinter

            reads, substitutions = [], {}
            for symbol in expr.free_symbols:
                first = self.symbols.get(symbol)
                if first is None:
                    return None  # a symbol no input size defines
                j, dim = first
                read = f"a{j}.shape[{dim}]" if dim is not None else f"a{j}"
                reads.append(read)
                substitutions[symbol] = sympy.Symbol(read, integer=True)
            written = expr.xreplace(substitutions)
            if written is sympy.true:
                return None, []
            code = PythonPrinter().doprint(written)
            if not _runnable(ast.parse(code, mode="eval")):
                return None
        except Exception:  # an expression the printer cannot write
            return None
        return code, sorted(reads)

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
    return eval(code, dict(_GUARD_NAMES), names)


# -- torch's names for the inputs ----------------------------------------------------------


def tracer_sources(arguments: Sequence[tuple[str, Any]]) -> dict[str, int]:
    """Every name torch's tracers give each input leaf in ``ep._guards_code`` -> its position.

    ``arguments`` are the program's top-level arguments ``(name, spec)`` in order (a leaf spec,
    or None, for a plain value); leaves are numbered across all of them, as flattened. torch
    names a leaf:

    * by its argument and key path (non-strict export): ``L['x']``, ``L['d']['a']``,
      ``L['t'][0]``;
    * inside a ``*args`` tuple, which the program takes as arguments ``args_0``, ``args_1``:
      ``L['args'][0]``;
    * by its position among all flattened inputs (strict export, and export's newer tracer):
      ``L['flat_args'][3]``.

    A real argument's name comes first: a program whose argument is called ``flat_args`` or
    ``args`` reads those names as that argument (non-strict export writes them so).

    Example:
        >>> import torch.utils._pytree as pytree
        >>> tracer_sources([("x", None), ("d", pytree.tree_structure({"a": 0}))])
        {"L['x']": 0, "L['d']['a']": 1, "L['flat_args'][0]": 0, "L['flat_args'][1]": 1}
    """
    own: dict[str, int] = {}
    aliases: dict[str, int] = {}
    leaf = 0
    for name, spec in arguments:
        keys = [""] if spec is None or spec.is_leaf() else leaf_keystrs(spec)
        varargs = re.fullmatch(r"(.+)_(\d+)", name)
        for keys_text in keys:
            own[f"L[{name!r}]{keys_text}"] = leaf
            if varargs is not None:
                alias = f"L[{varargs.group(1)!r}][{int(varargs.group(2))}]{keys_text}"
                aliases.setdefault(alias, leaf)
            leaf += 1
    for position in range(leaf):
        aliases.setdefault(f"L['flat_args'][{position}]", position)
    for alias, position in aliases.items():
        own.setdefault(alias, position)
    return own


def _source_table(sources: dict[str, int]) -> dict[str, int]:
    """``sources`` keyed by the parsed form of each name (its ``ast.dump``), so a name is
    found in a guard however it is spaced, and never inside a longer one."""
    table: dict[str, int] = {}
    for text, position in sources.items():
        try:
            table.setdefault(ast.dump(ast.parse(text, mode="eval").body), position)
        except SyntaxError:
            continue
    return table


class _Renamer(ast.NodeTransformer):
    """Replaces each input named in a guard by its leaf (``a0``); outermost names first."""

    def __init__(self, table: dict[str, int]):
        self.table = table

    def _named(self, node: ast.AST) -> ast.AST:
        position = self.table.get(ast.dump(node))
        if position is not None:
            return ast.copy_location(ast.Name(id=f"a{position}", ctx=ast.Load()), node)
        return self.generic_visit(node)

    visit_Subscript = visit_Attribute = visit_Name = _named


def _rename(guard: str, table: dict[str, int]) -> tuple[str | None, list[str]] | None:
    """``guard`` as code over the leaves ``a0, a1...`` and what it reads of them (``a0.size()[0]``),
    or None when it names anything else torch's tracer has a name for (``L[...]``)."""
    try:
        tree = ast.parse(guard.strip(), mode="eval")
    except SyntaxError:
        return None
    tree = ast.fix_missing_locations(_Renamer(table).visit(tree))
    if not _runnable(tree):
        return None
    return ast.unparse(tree), _reads(tree)


def _runnable(tree: ast.AST) -> bool:
    """Whether every name ``tree`` reads is a leaf (``a0``) or one the check defines: an
    input torch names otherwise (``L[...]``) would fail the check on every call."""
    return all(
        re.fullmatch(r"a\d+", node.id) or node.id in _GUARD_NAMES or hasattr(builtins, node.id)
        for node in ast.walk(tree)
        if isinstance(node, ast.Name)
    )


def _reads(tree: ast.AST) -> list[str]:
    """The largest expressions of ``tree`` that only read a leaf (``a0.size()[0]``, ``a1``)."""

    def reads_leaf(node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return re.fullmatch(r"a\d+", node.id) is not None
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            return reads_leaf(node.value) and (
                isinstance(node, ast.Attribute) or isinstance(node.slice, ast.Constant)
            )
        if isinstance(node, ast.Call):  # a0.size(), a0.stride(0)
            return (
                isinstance(node.func, ast.Attribute)
                and reads_leaf(node.func)
                and not node.keywords
                and all(isinstance(a, ast.Constant) for a in node.args)
            )
        return False

    found: list[str] = []

    def walk(node: ast.AST) -> None:
        if reads_leaf(node):
            text = ast.unparse(node)
            if text not in found:
                found.append(text)
            return
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return found


def _show(code: str, paths: dict[str, str]) -> str:
    """``code`` with each leaf ``a0`` written as the user names it (``x``, ``d['a']``)."""
    tree = ast.parse(code, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in paths:
            node.id = paths[node.id]
    return ast.unparse(tree)


def _arrived(reads: list[tuple[str, str]], leaves: tuple) -> str:
    """What the inputs a failed condition reads were: ``x.size()[0] is 5``."""
    parts = []
    for shown, code in reads:
        try:
            value = _eval(code, leaves)
        except Exception:
            continue
        if isinstance(value, torch.Tensor):
            text = f"a tensor {tensor_text(value.shape, value.dtype)}"
        elif isinstance(value, torch.Size):
            text = str(list(value))
        else:
            text = repr(value)
        parts.append(f"{shown} is {text}")
    return ", ".join(parts) or "with these inputs"


def _shape_guards(values: Sequence[Any]) -> list:
    """Each condition of the shape environment the fake input ``values`` belong to, as
    ``(printed as in ep._guards_code, expression)``; empty without one."""
    shape_env = None
    for value in values:
        sizes = value.shape if isinstance(value, torch.Tensor) else (value,)
        for size in sizes:
            if isinstance(size, torch.SymInt):
                shape_env = size.node.shape_env
                break
        if shape_env is not None:
            break
    if shape_env is None:
        return []
    try:
        from torch.fx.experimental.symbolic_shapes import ShapeGuardPythonPrinter

        printer = ShapeGuardPythonPrinter(
            shape_env.var_to_sources, lambda source: source.name, shape_env.var_to_sources
        )
        found = []
        for guard in shape_env.guards:
            try:
                found.append((printer.doprint(guard.expr), guard.expr))
            except Exception:
                continue
        return found
    except Exception:  # a shape environment of another torch version
        return []


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
