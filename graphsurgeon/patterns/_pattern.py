"""The pattern of a find: a function or a module traced to aten ops as ``gs.export`` traces a
model (sizes symbolic), and the plan the search follows through its ops.

:func:`traced_pattern` traces it once per function and example shapes; :class:`Pattern` says
what each of its nodes is (an input, a constant, an op, bookkeeping), how its sizes and
constants read, and in which order the search meets its ops.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import re
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import Node

from .. import _meta
from .._program import as_inputs
from ..errors import PatternError, a_type
from ..export import quiet_export

__all__ = [
    "BOOKKEEPING",
    "SIZE_TYPES",
    "Pattern",
    "argument_kinds",
    "constant_text",
    "node_arguments",
    "size_expression",
    "traced_pattern",
]

_aten = torch.ops.aten
# Nodes that check or record rather than compute: never compared, and a program's node of this
# kind that reads a value of a match goes with the match.
BOOKKEEPING = frozenset(
    {
        _aten._assert_tensor_metadata.default,
        _aten._assert_scalar.default,
        _aten.sym_constrain_range.default,
        _aten.sym_constrain_range_for_size.default,
        _aten._assert_async.msg,
    }
)
# Ops whose two tensor operands may come either way round (with alpha left at 1 for add).
_COMMUTATIVE = frozenset({_aten.add.Tensor, _aten.mul.Tensor})
SIZE_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


# -- the pattern --------------------------------------------------------------------------------


class _PatternCall(torch.nn.Module):
    """What is exported: a call of the pattern on ``(args, kwargs)``. A module pattern is a
    child, so its parameters and buffers are lifted as state (``pattern.weight``)."""

    def __init__(self, pattern: Callable):
        super().__init__()
        if isinstance(pattern, torch.nn.Module):
            self.pattern = pattern
        else:
            self._function = pattern

    def forward(self, args, kwargs):
        function = self.pattern if hasattr(self, "pattern") else self._function
        return function(*args, **kwargs)


@dataclass(frozen=True)
class _Step:
    """One step of the search: the pattern op ``node``, found ``how``: ``"anchor"`` (where a
    search starts), ``"arg"`` (an argument of an op found before), ``"user"`` (a reader of
    ``ref``, found before) or ``"any"`` (an op not connected to the rest)."""

    node: Node
    how: str
    ref: Node | None = None


class Pattern:
    """A traced pattern, prepared once: each node's kind, each op's arguments, the search plan."""

    def __init__(self, name: str, program: ExportedProgram, input_names: list[str], mode: str):
        self.name = name
        self.program = program
        self.mode = mode  # "symbolic", "symbolic (size-1 dims fixed)" or "static"
        graph = program.graph
        self.nodes = list(graph.nodes)
        self.order = {n: i for i, n in enumerate(self.nodes)}
        by_name = {n.name: n for n in self.nodes}
        signature = program.graph_signature
        self.inputs: list[Node] = []
        self.state: dict[Node, str] = {}  # placeholder -> the pattern's own name of it
        for spec in signature.input_specs:
            node = by_name.get(getattr(spec.arg, "name", ""))
            if node is None:
                continue
            if spec.kind.name == "USER_INPUT":
                self.inputs.append(node)
            else:
                self.state[node] = str(spec.target or node.name).removeprefix("pattern.")
        self.input_names = (
            input_names
            if len(input_names) == len(self.inputs)
            else [f"arg{i}" for i in range(len(self.inputs))]
        )
        self.outputs: list[Any] = []  # a node, or a constant the pattern returns
        for spec in signature.output_specs:
            if spec.kind.name != "USER_OUTPUT":
                continue
            name = getattr(spec.arg, "name", None)
            self.outputs.append(
                by_name[name] if name in by_name else getattr(spec.arg, "value", None)
            )
        # torch's symbol of each size -> where the pattern reads it: "q.shape[3]"
        self.symbols: dict[str, str] = {}
        for node, label in zip(self.inputs, self.input_names):
            value = node.meta.get("val")
            for dim, size in enumerate(getattr(value, "shape", ())):
                if isinstance(size, torch.SymInt):
                    self.symbols.setdefault(str(size), f"{label}.shape[{dim}]")
        self.kind: dict[Node, str] = {}
        for node in self.nodes:
            self.kind[node] = self._kind(node)
        self.ops = [n for n in self.nodes if self.kind[n] == "op"]
        if not self.ops:
            raise PatternError(
                f"the pattern {name!r} computes nothing when traced (no aten op: it returns its "
                "inputs, or constants), so there is nothing to find. Pass a function or module "
                "whose result is computed from its inputs"
            )
        self.num_ops = sum(1 for n in self.ops if n.target is not _getitem)
        self.args = {n: node_arguments(n) for n in self.ops}
        self.variants = {n: _variants(n, self.args[n]) for n in self.ops}
        self.output_ops = [o for o in self.outputs if isinstance(o, Node) and self.kind[o] == "op"]
        self.plan = self._plan()
        self.anchor = self.plan[0].node

    def _kind(self, node: Node) -> str:
        if node.op == "placeholder":
            if node in self.state:
                return "state"
            return "size" if isinstance(node.meta.get("val"), SIZE_TYPES) else "input"
        if node.op == "get_attr":
            self.state.setdefault(node, str(node.target))
            return "state"
        if node.op != "call_function":
            return "other"  # the output node
        if node.target in BOOKKEEPING:
            return "skip"
        value = node.meta.get("val")
        if isinstance(value, (*SIZE_TYPES, int, float)) and not isinstance(value, bool):
            return "size"
        if isinstance(value, torch.SymBool):
            return "size"
        return "op"

    def _plan(self) -> list[_Step]:
        """The order in which the search meets the pattern's ops: from the first op, every op
        it reads (found for free: an argument of a found node), then a reader of something
        found, and so on. Readers are the only choices the search makes."""
        steps: list[_Step] = []
        planned: set[Node] = set()
        known: list[Node] = []  # ops and inputs found, in the order the search finds them

        def back(node: Node) -> None:
            for value in _arg_nodes(self.args[node]):
                kind = self.kind.get(value)
                if kind == "op" and value not in planned:
                    planned.add(value)
                    steps.append(_Step(value, "arg", node))
                    known.append(value)
                    back(value)
                elif kind in ("input", "state") and value not in known:
                    known.append(value)

        def add(node: Node, how: str, ref: Node | None) -> None:
            planned.add(node)
            steps.append(_Step(node, how, ref))
            known.append(node)
            back(node)

        add(self.ops[0], "anchor", None)
        while len(planned) < len(self.ops):
            # a reader of an op found before (the most recent first: stay local), else of an
            # input (an input is read in more places than an op's result)
            refs = [n for n in reversed(known) if self.kind[n] == "op"]
            refs += [n for n in reversed(known) if self.kind[n] != "op"]
            for ref in refs:
                user = next(
                    (
                        u
                        for u in sorted(ref.users, key=self.order.__getitem__)
                        if self.kind.get(u) == "op" and u not in planned
                    ),
                    None,
                )
                if user is not None:
                    add(user, "user", ref)
                    break
            else:
                add(next(n for n in self.ops if n not in planned), "any", None)
        return steps

    def size_text(self, node: Node) -> str:
        """A size of the pattern by where it reads it: ``q.shape[3]//2``, not ``s40//2``."""
        return _SYMBOL.sub(
            lambda m: self.symbols.get(m.group(0), m.group(0)), size_expression(node)
        )

    def text(self, value: Any) -> str:
        """A pattern value in a message: a size by its expression, a node by its name."""
        if isinstance(value, Node):
            kind = self.kind.get(value)
            if kind == "size":
                return f"a size ({self.size_text(value)})"
            if kind == "input":
                index = self.inputs.index(value) if value in self.inputs else -1
                return f"input `{self.input_names[index]}`" if index >= 0 else f"`{value.name}`"
            if kind == "state":
                return f"state `{self.state[value]}`"
            return f"`{value.name}` ({_meta.op_text(value)})"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(
                self.text(v) if isinstance(v, Node) else constant_text(v) for v in value
            )
            return f"[{inner}]"
        return constant_text(value)


_getitem = operator.getitem
_SYMBOL = re.compile(r"\b[su]\d+\b")  # torch's names of sizes: s0, s33, u1


def size_expression(node: Node) -> str:
    value = node.meta.get("val")
    return str(value) if value is not None else node.name


def constant_text(value: Any) -> str:
    if isinstance(value, Node):
        return f"`{value.name}`"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(constant_text(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    return _meta.shorten(repr(value), 40)


# argument kinds, by schema: "device" (not compared), "size" (a SymInt), "" (the rest)
_KINDS: dict[Any, tuple[str, ...]] = {}


def argument_kinds(target: Any) -> tuple[str, ...]:
    kinds = _KINDS.get(target)
    if kinds is None:
        kinds = ()
        if isinstance(target, torch._ops.OpOverload):
            # the schema's text keeps "SymInt" where its parsed types say "int"
            types = [text.split(" ", 1)[0] for text in _schema_arguments(str(target._schema))]
            found = ["device" if "Device" in t else "size" if "SymInt" in t else "" for t in types]
            if len(found) == len(target._schema.arguments):
                kinds = tuple(found)
        _KINDS[target] = kinds
    return kinds


def _schema_arguments(schema: str) -> list[str]:
    """``aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)`` -> ``["Tensor(a) self",
    "SymInt[] size"]`` (the ``*`` that starts keyword-only arguments left out)."""
    start = schema.index("(") + 1
    parts, depth, current = [], 0, []
    for char in schema[start:]:
        if char in "([" or (char == ")" and depth > 0) or char == "]":
            depth += 1 if char in "([" else -1
        elif char == ")":
            break
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    parts.append("".join(current).strip())
    return [part for part in parts if part and part != "*"]


_MAX_INDEX = sys.maxsize  # what ``x[a:]`` records as the end of a slice


def node_arguments(node: Node) -> tuple[Any, ...]:
    """An op node's arguments in its schema's order, defaults filled in, so that two nodes of
    one op compare position by position however they were called. Without a schema (getitem):
    its positional arguments, then its keyword arguments by name."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return tuple(node.args) + tuple(v for _, v in sorted(node.kwargs.items()))
    values = []
    args, kwargs = node.args, node.kwargs
    for position, argument in enumerate(target._schema.arguments):
        if argument.name in kwargs:
            value = kwargs[argument.name]
        elif not argument.kwarg_only and position < len(args):
            value = args[position]
        else:
            value = argument.default_value if argument.has_default_value() else None
        values.append(value)
    if target is _aten.slice.Tensor and len(values) == 5:
        # x[:n] is recorded with start None or 0, x[n:] with end None or the largest index
        if values[2] is None:
            values[2] = 0
        if values[3] is None:
            values[3] = _MAX_INDEX
    return tuple(values)


def _variants(node: Node, args: tuple[Any, ...]) -> tuple[tuple[Any, ...], ...]:
    """The argument orders a node matches with: its own, and for ``a + b`` or ``a * b`` of two
    tensors (alpha 1), the swapped one."""
    if node.target not in _COMMUTATIVE or len(args) < 2:
        return (args,)
    if not (isinstance(args[0], Node) and isinstance(args[1], Node)):
        return (args,)
    if node.target is _aten.add.Tensor and args[2] != 1:
        return (args,)
    return (args, (args[1], args[0], *args[2:]))


def _arg_nodes(args: Any) -> Iterator[Node]:
    for value in args:
        if isinstance(value, Node):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _arg_nodes(value)


def _input_names(pattern: Callable, args: tuple, kwargs: dict) -> list[str]:
    """The name of each input leaf: ``q``, ``cos``, ``pair[0]``, ``mask`` (a keyword)."""
    target = pattern.forward if isinstance(pattern, torch.nn.Module) else pattern
    try:
        parameters = [
            p.name
            for p in inspect.signature(target).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):  # a builtin without a signature
        parameters = []
    names = []
    leaves, _ = pytree.tree_flatten_with_path((args, kwargs))
    for path, _ in leaves:
        top, rest = path[1], path[2:]
        key = getattr(top, "idx", getattr(top, "key", None))
        if path[0].idx == 0:
            base = (
                parameters[key] if isinstance(key, int) and key < len(parameters) else f"arg{key}"
            )
        else:
            base = str(key)
        names.append(base + pytree.keystr(rest) if rest else base)
    return names


def _pattern_name(pattern: Any) -> str:
    if isinstance(pattern, torch.nn.Module):
        return _function_it_stands_for(type(pattern)) or type(pattern).__name__
    function = getattr(pattern, "func", pattern)  # functools.partial
    return getattr(function, "__name__", None) or type(pattern).__name__


def _function_it_stands_for(cls: type) -> str | None:
    """The name of the one function a module class made inside a function runs: Hugging
    Face's hub kernels turn ``apply_rotary_pos_emb`` into an instance of such a class, named
    ``Func``, whose forward calls the function it closes over."""
    if "<locals>" not in cls.__qualname__:
        return None
    forward = cls.__dict__.get("forward")
    cells = zip(
        getattr(getattr(forward, "__code__", None), "co_freevars", ()),
        getattr(forward, "__closure__", None) or (),
    )
    functions = []
    for _, cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        if inspect.isfunction(value):
            functions.append(value.__name__)
    return functions[0] if len(functions) == 1 else None


def _export_pattern(pattern: Callable, args: tuple, kwargs: dict) -> tuple[ExportedProgram, str]:
    """The pattern traced to aten: with every size symbolic where torch can (size-1 dims too,
    then with them fixed), else at the example's sizes."""
    from torch.export import Dim

    wrapper = _PatternCall(pattern)
    dynamic = pytree.tree_map(
        lambda v: {i: Dim.AUTO for i in range(v.dim())} if isinstance(v, torch.Tensor) else None,
        (args, kwargs),
    )
    try:
        from torch.fx.experimental import _config as fx_config

        oblivious = fx_config.patch(backed_size_oblivious=True)
    except (ImportError, AttributeError):  # pragma: no cover - an older torch
        oblivious = None
    attempts: list[tuple[str, Any, Any]] = []
    if oblivious is not None:
        attempts.append(("symbolic", dynamic, oblivious))
    attempts.append(("symbolic (size-1 dims fixed)", dynamic, contextlib.nullcontext()))
    attempts.append(("static", None, contextlib.nullcontext()))
    error: BaseException | None = None
    # torch logs, warns and prints the partial graph of each failed attempt (63 lines on a
    # data-dependent pattern): the tracing is ours, not the user's; the error says it in one
    with quiet_export():
        for mode, shapes, context in attempts:
            try:
                with context:
                    program = torch.export.export(
                        wrapper, (args, kwargs), dynamic_shapes=shapes, strict=False
                    )
                return program, mode
            except Exception as failure:  # the next attempt, or the error below
                error = failure
    shapes_text = _meta.describe_value(args)
    first = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else ""
    raise PatternError(
        f"the pattern {_pattern_name(pattern)!r} could not be traced to aten ops on the example "
        f"arguments {shapes_text}: {type(error).__name__}: {_meta.shorten(first, 300)}. Check "
        "that pattern(*example_args) runs, and that it has no data-dependent control flow"
    ) from error


# Traced patterns, by pattern object (weakly) and example arguments' shapes and constants.
_TRACES: dict[tuple, tuple[Any, Pattern]] = {}
_TRACES_KEPT = 32


def _example_key(value: Any) -> Any:
    leaves, spec = pytree.tree_flatten(value)
    key: list[Any] = [str(spec)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            key.append(("tensor", tuple(leaf.shape), leaf.dtype, leaf.device.type))
        elif isinstance(leaf, (int, float, bool, str, type(None), torch.dtype)):
            key.append((type(leaf).__name__, leaf))
        else:
            return None
    return tuple(key)


def traced_pattern(pattern: Any, args: Any, kwargs: Any) -> Pattern:
    if isinstance(pattern, ExportedProgram):
        raise PatternError(
            "find: the pattern is an ExportedProgram; pass the function or module it was "
            "exported from, with example arguments (find traces it itself)"
        )
    if not callable(pattern):
        raise PatternError(
            f"find: the pattern must be a function or an nn.Module, got {a_type(pattern)}. "
            "Pass e.g. lambda x: x * torch.sigmoid(x), with example arguments to trace it on"
        )
    # the pattern's inputs, read as every entry point reads a model's (one value is the one
    # input; a list is refused, never guessed)
    args, kwargs = as_inputs(args, kwargs, verb="find", names=("example_args", "example_kwargs"))
    # A plain function's trace is kept for its next call on examples of the same shapes (a
    # module is not: changing one of its attributes, such as eps, would leave a stale trace).
    key = None
    if inspect.isfunction(pattern):
        example = _example_key((args, kwargs))
        key = None if example is None else (id(pattern), example)
    if key is not None:
        cached = _TRACES.get(key)
        if cached is not None and cached[0]() is pattern:
            return cached[1]
    program, mode = _export_pattern(pattern, args, kwargs)
    traced = Pattern(_pattern_name(pattern), program, _input_names(pattern, args, kwargs), mode)
    if key is not None:
        if len(_TRACES) >= _TRACES_KEPT:
            _TRACES.pop(next(iter(_TRACES)))
        _TRACES[key] = (weakref.ref(pattern), traced)
    return traced
