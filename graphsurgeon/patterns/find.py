"""find(): where the ops of a function or a module occur in a program, and why not elsewhere.

The pattern is traced to aten ops the way ``gs.export`` traces a model (torch.export's training
IR, non-strict), with every tensor size symbolic, and looked for in the program's graph by
dataflow and op:

* an op matches an op with the same aten overload whose constant arguments are equal (numbers,
  bools, dtypes, dims, lists of ints); devices are not compared, so a pattern traced on the CPU
  matches a program on another device;
* a size is a wildcard: where the pattern read a size off a tensor (a symbol, or arithmetic on
  symbols: ``x.shape[-1] // 2``), the program may have any int or symbol, the same one for the
  same pattern size within one match. So a pattern traced at one shape matches at others
  (batch, sequence length, heads, head size);
* an input of the pattern matches any value of the program (an input used twice must be one
  value there); a parameter, buffer or tensor constant of a pattern module matches a parameter,
  buffer or constant of the program with the same shape and dtype;
* ``add`` and ``mul`` of two tensors match with their operands either way round;
* bookkeeping (``aten._assert_tensor_metadata``, the pattern's ``sym_size`` and size
  arithmetic) is not compared.

Matches do not overlap: the program is searched in graph order and the first match takes its
nodes. A match is only a match if it can be replaced as one call: a value inside it that the
rest of the program reads (other than the pattern's results), or a node outside it that both
reads its results and feeds it (not convex), makes it a near-miss with that reason. Where most
of the pattern is found but a constant or an op differs, the near-miss says where and how:
``23 of 24 ops match; differs at `mul_9` (aten.mul, other): constant 0.5, pattern 0.25``.

Example:
    >>> import torch, graphsurgeon as gs
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ...     def forward(self, x):
    ...         x = self.a(x)
    ...         x = x * torch.sigmoid(x)
    ...         x = self.b(x)
    ...         return x * torch.sigmoid(x)
    >>> from graphsurgeon.patterns.find import find  # also gs.find
    >>> ep = gs.export(Net(), (torch.randn(2, 4),))
    >>> matches = find(ep, lambda t: t * torch.sigmoid(t), (torch.randn(3, 5),))
    >>> len(matches), [m.outputs for m in matches]
    (2, [('mul',), ('mul_1',)])
"""

from __future__ import annotations

import contextlib
import inspect
import math
import operator
import re
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import Node

from .. import _meta
from .._program import as_inputs, not_a_program
from ..errors import PatternError, a_type
from ..export import quiet_export
from ..partition import call_index, returned_root

__all__ = ["Match", "Matches", "NearMiss", "find"]

_aten = torch.ops.aten
# Nodes that check or record rather than compute: never compared, and a program's node of this
# kind that reads a value of a match goes with the match.
_BOOKKEEPING = frozenset(
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
_SIZE_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
# A search from one place of the program gives up after this many candidate nodes: a pattern
# whose parts connect only through an input used everywhere could otherwise try them all.
_BUDGET = 20_000
# The tolerant search (for near-misses) tries at most this many readers of a value per step.
_TOLERANT_CANDIDATES = 8


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """One place where the pattern occurs and can be replaced as one call.

    Attributes:
        index: its position in :attr:`Matches.matches` (graph order).
        call: the innermost module call that holds all its nodes (``"model.layers.0.self_attn"``;
            ``""`` at the top level).
        nodes: the program's nodes it covers, in graph order (the pattern's ops, and
            bookkeeping that reads them, such as ``_assert_tensor_metadata``).
        inputs: the program values bound to the pattern's inputs, in the pattern's argument
            order (flattened; ``None`` for an input the pattern does not read as a value, such
            as an int, which is traced as a constant).
        outputs: the program nodes that compute the pattern's results, in order.
        num_ops: how many ops of the pattern it matches (all of them).
        mapping: ``(pattern node, program node)`` for every op and input of the pattern.
        state: ``(pattern parameter or buffer, program node)`` for a pattern module's state.
        aliases: ``(node, input)`` for a node of the match that the program reads after it
            and that is, at run time, the match's input itself (a conversion to the dtype the
            tensor has, as LlamaRMSNorm's ``.to(float32)``): those reads are reads of the input.
    """

    index: int
    call: str
    nodes: tuple[str, ...]
    inputs: tuple[str | None, ...]
    outputs: tuple[str | None, ...]
    num_ops: int
    mapping: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    state: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    aliases: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    input_names: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def __str__(self) -> str:
        return f"{_call_text(self.call)}: {_count(self.num_ops, 'op')}, {self.signature()}"

    def signature(self) -> str:
        """``(q=transpose, k=transpose_1) → (add_4, add_5)``: what the match reads and makes."""
        names = self.input_names or tuple(f"arg{i}" for i in range(len(self.inputs)))
        inputs = ", ".join(
            f"{name}={value}" for name, value in zip(names, self.inputs) if value is not None
        )
        outputs = ", ".join("-" if o is None else o for o in self.outputs)
        return f"({inputs}) → ({outputs})"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display as d

        rows = [["call", _call_text(self.call)], ["inputs → outputs", self.signature()]]
        if self.state:
            rows.append(["state", ", ".join(f"{p}={g}" for p, g in self.state)])
        body = (
            f'<div class="gs-title">match {self.index} {d.badge(_count(self.num_ops, "op"), "ok")}'
            "</div>"
            + d.table(["", ""], rows)
            + d.details(_count(len(self.nodes), "node"), d.names(self.nodes))
        )
        return d.bundle(body, str(self), include, exclude)


@dataclass(frozen=True)
class NearMiss:
    """A place where the pattern almost occurs, and why it is not a match.

    Attributes:
        call: the innermost module call holding the nodes found (``""``: the top level).
        nodes: the program's nodes that correspond to ops of the pattern, in graph order.
        matched: how many of the pattern's ops match there; ``num_ops``: how many it has.
        kind: ``"differs"`` (an op, a constant, an input or a size differs),
            ``"read outside"`` (a value inside is read elsewhere than the pattern's results),
            ``"not convex"`` or ``"overlaps"`` (an earlier match took some of its nodes).
        reason: one sentence, e.g. ``23 of 24 ops match; differs at `mul_9` (aten.mul,
            other): constant 0.5, pattern 0.25``.
        differences: every difference found, one sentence each (``kind == "differs"``).
        inputs / outputs: as in :class:`Match`, where they were found (``None`` elsewhere).
    """

    call: str
    nodes: tuple[str, ...]
    matched: int
    num_ops: int
    kind: str
    reason: str
    differences: tuple[str, ...] = ()
    inputs: tuple[str | None, ...] = ()
    outputs: tuple[str | None, ...] = ()

    def __str__(self) -> str:
        return f"{_call_text(self.call)}: {self.reason}"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display as d

        rows = [["call", _call_text(self.call)], ["why not a match", self.reason]]
        rows += [["difference", text] for text in self.differences[1:]]
        badge = d.badge(f"{self.matched} of {_count(self.num_ops, 'op')}", "warn")
        body = (
            f'<div class="gs-title">near-miss ({d.escape(self.kind)}) {badge}</div>'
            + d.table(["", ""], rows)
            + d.details(_count(len(self.nodes), "node"), d.names(self.nodes))
        )
        return d.bundle(body, str(self), include, exclude)


@dataclass(frozen=True)
class Matches:
    """What :func:`find` found: every match, in graph order, and the near-misses with reasons.

    ``len(matches)``, ``for match in matches``, ``matches[0]`` go over the matches;
    ``matches.calls`` lists the module call of each. ``print(matches)`` writes a short report;
    in a notebook the result shows itself as a table.

    Attributes:
        pattern: the pattern's name (``"apply_rotary_pos_emb"``).
        num_ops: how many ops the traced pattern has (bookkeeping and size arithmetic left out).
        input_names: the pattern's inputs, as its signature names them, flattened.
        matches / near_misses: tuples of :class:`Match` / :class:`NearMiss`, in graph order.
        notes: how the pattern was traced, and searches that gave up, when worth saying.
        pattern_program: the pattern as traced (an ExportedProgram): its graph is what was
            looked for.
    """

    pattern: str
    num_ops: int
    input_names: tuple[str, ...]
    matches: tuple[Match, ...]
    near_misses: tuple[NearMiss, ...]
    notes: tuple[str, ...] = ()
    pattern_program: ExportedProgram | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.matches)

    def __iter__(self) -> Iterator[Match]:
        return iter(self.matches)

    def __getitem__(self, index: int) -> Match:
        return self.matches[index]

    @property
    def calls(self) -> tuple[str, ...]:
        """The module call of each match, in order (``""`` for the top level)."""
        return tuple(m.call for m in self.matches)

    def _head(self) -> str:
        found = _count(len(self.matches), "match")
        near = _count(len(self.near_misses), "near-miss")
        return f"find {self.pattern} ({_count(self.num_ops, 'op')}): {found}, {near}"

    def __str__(self) -> str:
        lines = [self._head()]
        lines += [f"  {m.index}. {m}" for m in self.matches[:20]]
        if len(self.matches) > 20:
            lines.append(f"  … and {len(self.matches) - 20} more matches")
        if self.near_misses:
            lines.append("near-misses:")
            lines += [f"  {n}" for n in self.near_misses[:10]]
            if len(self.near_misses) > 10:
                lines.append(f"  … and {len(self.near_misses) - 10} more")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<{self._head().replace('find ', 'Matches of ', 1)}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display as d

        count = len(self.matches)
        found = d.badge(f"{count} match{'es' if count != 1 else ''}", "ok" if count else "warn")
        near = len(self.near_misses)
        near_badge = d.badge(f"{near} near-miss{'es' if near != 1 else ''}", "warn") if near else ""
        inputs = ", ".join(self.input_names) or "none"
        body = (
            f'<div class="gs-title">find <code>{d.escape(self.pattern)}</code> {found} '
            f'{near_badge} <span class="gs-muted">{self.num_ops} ops; inputs '
            f"{d.escape(inputs)}</span></div>"
        )
        limit = 200
        if self.matches:
            rows = [
                [m.index, _call_text(m.call), m.num_ops, m.signature()]
                for m in self.matches[:limit]
            ]
            table = d.table(["#", "call", "ops", "inputs → outputs"], rows, numeric=(0, 2))
            if count > limit:
                table += f'<div class="gs-muted">… and {count - limit:,} more</div>'
            body += d.details(f"{count} match{'es' if count != 1 else ''}", table, open_=True)
        if self.near_misses:
            rows = [
                [_call_text(n.call), f"{n.matched} of {n.num_ops}", n.kind, n.reason]
                for n in self.near_misses[:limit]
            ]
            table = d.table(["call", "ops matched", "kind", "why not a match"], rows, numeric=(1,))
            if near > limit:
                table += f'<div class="gs-muted">… and {near - limit:,} more</div>'
            body += d.details(
                f"{near} near-miss{'es' if near != 1 else ''}", table, open_=count == 0
            )
        for note in self.notes:
            body += f'<div class="gs-muted">{d.escape(note)}</div>'
        return d.bundle(body, repr(self), include, exclude)


def _call_text(call: str) -> str:
    return call or "(top level)"


def _count(number: int, word: str) -> str:
    """``1 op``, ``2 ops``, ``1 match``, ``3 near-misses``."""
    plural = word + ("es" if word.endswith(("ch", "ss")) else "s")
    return f"{number} {word if number == 1 else plural}"


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


class _Pattern:
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
        self.args = {n: _arguments(n) for n in self.ops}
        self.variants = {n: _variants(n, self.args[n]) for n in self.ops}
        self.output_ops = [o for o in self.outputs if isinstance(o, Node) and self.kind[o] == "op"]
        self.plan = self._plan()
        self.anchor = self.plan[0].node

    def _kind(self, node: Node) -> str:
        if node.op == "placeholder":
            if node in self.state:
                return "state"
            return "size" if isinstance(node.meta.get("val"), _SIZE_TYPES) else "input"
        if node.op == "get_attr":
            self.state.setdefault(node, str(node.target))
            return "state"
        if node.op != "call_function":
            return "other"  # the output node
        if node.target in _BOOKKEEPING:
            return "skip"
        value = node.meta.get("val")
        if isinstance(value, (*_SIZE_TYPES, int, float)) and not isinstance(value, bool):
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
            lambda m: self.symbols.get(m.group(0), m.group(0)), _size_expression(node)
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
                self.text(v) if isinstance(v, Node) else _constant_text(v) for v in value
            )
            return f"[{inner}]"
        return _constant_text(value)


_getitem = operator.getitem
_SYMBOL = re.compile(r"\b[su]\d+\b")  # torch's names of sizes: s0, s33, u1


def _size_expression(node: Node) -> str:
    value = node.meta.get("val")
    return str(value) if value is not None else node.name


def _constant_text(value: Any) -> str:
    if isinstance(value, Node):
        return f"`{value.name}`"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_constant_text(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    return _meta.shorten(repr(value), 40)


# argument kinds, by schema: "device" (not compared), "size" (a SymInt), "" (the rest)
_KINDS: dict[Any, tuple[str, ...]] = {}


def _argument_kinds(target: Any) -> tuple[str, ...]:
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


def _arguments(node: Node) -> tuple[Any, ...]:
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
_TRACES: dict[tuple, tuple[Any, _Pattern]] = {}
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


def _traced(pattern: Any, args: Any, kwargs: Any) -> _Pattern:
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
    traced = _Pattern(_pattern_name(pattern), program, _input_names(pattern, args, kwargs), mode)
    if key is not None:
        if len(_TRACES) >= _TRACES_KEPT:
            _TRACES.pop(next(iter(_TRACES)))
        _TRACES[key] = (weakref.ref(pattern), traced)
    return traced


# -- the program ----------------------------------------------------------------------------------


class _ProgramView:
    """What the search needs of a program's graph, built once per graph (cached): node order,
    nodes by op, each node's arguments in schema order."""

    def __init__(self, graph: torch.fx.Graph):
        self.nodes = list(graph.nodes)
        self.size = len(self.nodes)
        self.order = {n: i for i, n in enumerate(self.nodes)}
        self.by_target: dict[Any, list[Node]] = {}
        for node in self.nodes:
            if node.op == "call_function":
                self.by_target.setdefault(node.target, []).append(node)
        self._args: dict[Node, tuple[Any, ...]] = {}

    def args(self, node: Node) -> tuple[Any, ...]:
        found = self._args.get(node)
        if found is None:
            found = self._args[node] = _arguments(node)
        return found

    def users(self, node: Node, target: Any) -> list[Node]:
        found = [u for u in node.users if u.op == "call_function" and u.target is target]
        if len(found) > 1:
            found.sort(key=self.order.__getitem__)
        return found


_VIEWS: weakref.WeakKeyDictionary[torch.fx.Graph, _ProgramView] = weakref.WeakKeyDictionary()


def _view(graph: torch.fx.Graph) -> _ProgramView:
    view = _VIEWS.get(graph)
    if view is None or view.size != len(graph.nodes):
        view = _VIEWS[graph] = _ProgramView(graph)
    return view


def _program_size_key(value: Any) -> Any:
    """A program value as a size (``("i", 8)``, a symbol's expression), or None if it is not
    one: an int, a float or a node computing one."""
    if isinstance(value, Node):
        value = value.meta.get("val")
        if isinstance(value, _SIZE_TYPES):
            return ("s", str(value))
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        return ("i", value)
    if isinstance(value, float):
        return ("f", value)
    return None


def _same_constant(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # an == that does not answer True or False
        return False


# -- the search -------------------------------------------------------------------------------


class _GaveUp(Exception):
    pass


class _Search:
    """Matches the pattern from one program node, by the pattern's plan.

    The strict search backtracks over the choices (readers of a value, the operand order of
    ``add``/``mul``) and fails at the first difference; the tolerant one makes the best local
    choice, writes every difference down and goes on, to say why a near-miss is one."""

    def __init__(self, pattern: _Pattern, view: _ProgramView, state: dict[Node, tuple]):
        self.pattern = pattern
        self.view = view
        self.program_state = state  # program state node -> (shape, dtype)
        self.static = pattern.mode == "static"  # sizes are ints in the pattern's graph
        self.claimed: dict[Node, int] = {}  # program node -> the match that took it
        self.ignore_claimed = False
        self.reset()

    def reset(self) -> None:
        self.m: dict[Node, Node] = {}  # pattern op -> program node
        self.rev: dict[Node, Node] = {}  # program node -> pattern op
        self.bind: dict[Node, Node] = {}  # pattern input or state -> program value
        self.sizes: dict[Any, Any] = {}  # pattern size expression -> program size key
        self.trail: list[tuple[dict, Any]] = []
        self.budget = _BUDGET

    # strict ---------------------------------------------------------------------------------

    def run(self, anchor: Node, ignore_claimed: bool = False) -> bool:
        self.reset()
        self.ignore_claimed = ignore_claimed
        return self._step(0, anchor)

    def _set(self, table: dict, key: Any, value: Any) -> None:
        table[key] = value
        self.trail.append((table, key))

    def _undo(self, mark: int) -> None:
        trail = self.trail
        while len(trail) > mark:
            table, key = trail.pop()
            del table[key]

    def _taken(self, node: Node) -> bool:
        return node in self.rev or (not self.ignore_claimed and node in self.claimed)

    def _step(self, index: int, anchor: Node | None = None) -> bool:
        plan = self.pattern.plan
        if index == len(plan):
            return self._inputs_outside()
        step = plan[index]
        p = step.node
        if step.how == "arg":
            g = self.m[p]  # set by the op that reads it
            if g.target is not p.target:
                return False
            if not self.ignore_claimed and g in self.claimed:
                return False
            for args in self.pattern.variants[p]:
                mark = len(self.trail)
                if self._strict(p, args, g) and self._step(index + 1):
                    return True
                self._undo(mark)
            return False
        if step.how == "anchor":
            candidates: list[Node] = [anchor]
        elif step.how == "user":
            found = self.m.get(step.ref) or self.bind.get(step.ref)
            candidates = self.view.users(found, p.target) if found is not None else []
        else:
            candidates = self.view.by_target.get(p.target, [])
        for g in candidates:
            self.budget -= 1
            if self.budget < 0:
                raise _GaveUp
            if self._taken(g) or g.op != "call_function" or g.target is not p.target:
                continue
            for args in self.pattern.variants[p]:
                mark = len(self.trail)
                self._set(self.m, p, g)
                self._set(self.rev, g, p)
                if self._strict(p, args, g) and self._step(index + 1):
                    return True
                self._undo(mark)
        return False

    def _inputs_outside(self) -> bool:
        """An input of the pattern cannot be a value the match itself computes."""
        return not any(value in self.rev for value in self.bind.values())

    def _strict(self, p: Node, pattern_args: tuple, g: Node) -> bool:
        program_args = self.view.args(g)
        if len(pattern_args) != len(program_args):
            return False
        kinds = _argument_kinds(p.target)
        for position, (pv, gv) in enumerate(zip(pattern_args, program_args)):
            if position < len(kinds) and kinds[position] == "device":
                continue
            sized = self.static and position < len(kinds) and kinds[position] == "size"
            if self._value(pv, gv, True, sized) is not None:
                return False
        return True

    # both -------------------------------------------------------------------------------------

    def _value(self, pv: Any, gv: Any, strict: bool, sized: bool = False) -> tuple | None:
        """None when the program value ``gv`` matches the pattern value ``pv`` (binding what
        the pattern names), else a difference: ``(kind, pattern value, program value, ...)``.
        ``sized``: ``pv`` is an int where the op takes a size, in a pattern traced at fixed
        sizes, so it may have been read off a tensor: it matches any size."""
        if isinstance(pv, Node):
            kind = self.pattern.kind.get(pv)
            if kind == "op":
                if not isinstance(gv, Node):
                    return ("value", pv, gv)
                have = self.m.get(pv)
                if have is not None:
                    return None if have is gv else ("elsewhere", pv, gv, have)
                if gv.op != "call_function" or (strict and gv.target is not pv.target):
                    return ("op", pv, gv)
                if gv in self.rev:
                    return ("twice", pv, gv, self.rev[gv])
                if not self.ignore_claimed and gv in self.claimed:
                    return ("claimed", pv, gv, self.claimed[gv])
                self._set(self.m, pv, gv)
                self._set(self.rev, gv, pv)
                return None
            if kind in ("input", "state"):
                if not isinstance(gv, Node) or gv.op == "output":
                    return ("value", pv, gv)
                have = self.bind.get(pv)
                if have is not None:
                    return None if have is gv else ("input", pv, gv, have)
                expected = pv.meta.get("val")
                found = gv.meta.get("val")
                if isinstance(expected, torch.Tensor) and not isinstance(
                    found, (torch.Tensor, type(None))
                ):
                    return ("value", pv, gv)
                if kind == "state":
                    shape = self.program_state.get(gv)
                    if shape is None or (
                        isinstance(expected, torch.Tensor)
                        and shape != (tuple(expected.shape), expected.dtype)
                    ):
                        return ("state", pv, gv)
                self._set(self.bind, pv, gv)
                return None
            if kind == "size":
                found = _program_size_key(gv)
                if found is None:
                    return ("size", pv, gv)
                key = _size_expression(pv)
                have = self.sizes.get(key)
                if have is None:
                    self._set(self.sizes, key, found)
                    return None
                return None if have == found else ("resize", pv, gv, have)
            return ("value", pv, gv)
        if isinstance(pv, (list, tuple)):
            if not isinstance(gv, (list, tuple)) or len(gv) != len(pv):
                return ("constant", pv, gv)
            first = None
            for p_item, g_item in zip(pv, gv):
                difference = self._value(p_item, g_item, strict, sized)
                if difference is not None:
                    if strict:
                        return difference
                    if first is None:
                        first = difference
            if first is not None and first[0] in ("constant", "value", "size"):
                return ("constant", pv, gv)  # said of the whole list: [1, 8, -1, 8]
            return first
        if sized and isinstance(pv, int) and not isinstance(pv, bool):
            found = _program_size_key(gv)
            if found is not None and found[0] in ("i", "s"):
                return None
        if isinstance(gv, Node):
            return ("value", pv, gv)
        if _same_constant(pv, gv):
            return None
        return ("constant", pv, gv)

    # tolerant ---------------------------------------------------------------------------------

    def tolerant(self, anchor: Node) -> tuple[dict[Node, str], list[tuple]]:
        """The pattern matched from ``anchor`` as far as it goes: each pattern op's status
        (``"match"``, ``"differs"``, ``"op"``: another op there, ``"missing"``) and the
        differences, ``(pattern node, program node, argument, difference)``."""
        self.reset()
        self.ignore_claimed = False
        status: dict[Node, str] = {}
        differences: list[tuple] = []
        origin = self.view.order[anchor]
        for step in self.pattern.plan:
            p = step.node
            if step.how == "anchor":
                g = anchor
                self._set(self.m, p, g)
                self._set(self.rev, g, p)
            elif step.how == "arg":
                g = self.m.get(p)
                if g is None:
                    status[p] = "missing"
                    continue
            elif step.how == "user":
                found = self.m.get(step.ref) or self.bind.get(step.ref)
                if found is None or status.get(step.ref, "match") in ("missing", "op"):
                    status[p] = "missing"
                    continue
                candidates = [
                    u
                    for u in self.view.users(found, p.target)
                    if u not in self.rev and u not in self.claimed
                ]
                candidates.sort(key=lambda u: abs(self.view.order[u] - origin))
                g = self._best(p, candidates[:_TOLERANT_CANDIDATES])
                if g is None:
                    status[p] = "missing"
                    differences.append((p, found, None, ("unread", p, found)))
                    continue
                self._set(self.m, p, g)
                self._set(self.rev, g, p)
            else:
                status[p] = "missing"
                continue
            if g.op != "call_function" or g.target is not p.target:
                status[p] = "op"
                differences.append((p, g, None, ("op", p, g)))
                continue
            found_differences = self._compare(p, g)
            status[p] = "differs" if found_differences else "match"
            differences.extend((p, g, name, d) for name, d in found_differences)
        return status, differences

    def _best(self, p: Node, candidates: list[Node]) -> Node | None:
        """The reader that matches ``p`` with the fewest differences (the first on a tie)."""
        best, fewest = None, None
        for g in candidates:
            saved = (dict(self.m), dict(self.rev), dict(self.bind), dict(self.sizes))
            self._set(self.m, p, g)
            self._set(self.rev, g, p)
            count = len(self._compare(p, g))
            self.m, self.rev, self.bind, self.sizes = saved
            self.trail = []
            if fewest is None or count < fewest:
                best, fewest = g, count
                if count == 0:
                    break
        return best

    def _compare(self, p: Node, g: Node) -> list[tuple[str, tuple]]:
        """The differences between ``p``'s arguments and ``g``'s (``(argument name,
        difference)``), binding as it goes; the operand order with fewer differences wins."""
        best: list[tuple[str, tuple]] = []
        saved = (self.m, self.rev, self.bind, self.sizes)
        for number, args in enumerate(self.pattern.variants[p]):
            before = (dict(self.m), dict(self.rev), dict(self.bind), dict(self.sizes))
            found = self._differences(p, args, self.view.args(g))
            if number == 0 or len(found) < len(best):
                best, saved = found, (self.m, self.rev, self.bind, self.sizes)
            self.m, self.rev, self.bind, self.sizes = before
            if not found:
                break
        self.m, self.rev, self.bind, self.sizes = saved
        self.trail = []
        return best

    def _differences(self, p: Node, pattern_args: tuple, program_args: tuple) -> list:
        names = _argument_names(p.target, len(pattern_args))
        kinds = _argument_kinds(p.target)
        if len(pattern_args) != len(program_args):
            return [("", ("arity", p, len(program_args)))]
        found = []
        for position, (pv, gv) in enumerate(zip(pattern_args, program_args)):
            if position < len(kinds) and kinds[position] == "device":
                continue
            sized = self.static and position < len(kinds) and kinds[position] == "size"
            difference = self._value(pv, gv, False, sized)
            if difference is not None:
                found.append((names[position], difference))
        return found


def _argument_names(target: Any, count: int) -> list[str]:
    if isinstance(target, torch._ops.OpOverload):
        names = [a.name for a in target._schema.arguments]
        return names + [f"arg{i}" for i in range(len(names), count)]
    return [f"arg{i}" for i in range(count)]


# -- what the search found, in words ----------------------------------------------------------


def _program_text(value: Any) -> str:
    if isinstance(value, Node):
        if value.op == "placeholder":
            return f"value `{value.name}` (an input)"
        return f"value `{value.name}`"
    return f"constant {_constant_text(value)}"


def _difference_text(pattern: _Pattern, p: Node, g: Node, argument: str | None, d: tuple) -> str:
    """One difference as a sentence: ``differs at `mul_9` (aten.mul, other): constant 0.5,
    pattern 0.25``."""
    kind = d[0]
    if kind == "op" and argument is None:
        return f"differs at `{g.name}`: op {_meta.op_text(g)}, pattern {_meta.op_text(p)}"
    if kind == "unread":
        return f"no {_meta.op_text(p)} reads `{g.name}` as the pattern's `{p.name}` does"
    where = f"differs at `{g.name}` ({_meta.op_text(g)}{', ' + argument if argument else ''})"
    pv, gv = d[1], d[2]
    if kind == "constant":
        return f"{where}: constant {_constant_text(gv)}, pattern {pattern.text(pv)}"
    if kind in ("value", "op"):
        return f"{where}: {_program_text(gv)}, pattern {pattern.text(pv)}"
    if kind == "input":
        return (
            f"{where}: the pattern's {pattern.text(pv)} is `{d[3].name}` elsewhere in this "
            f"match, but `{gv.name}` here"
        )
    if kind == "state":
        expected = pv.meta.get("val")
        shape = _meta.value_text(expected) if expected is not None else "?"
        return (
            f"{where}: {_program_text(gv)} is not a parameter, buffer or constant {shape} "
            f"like the pattern's {pattern.text(pv)}"
        )
    if kind == "size":
        return f"{where}: {_program_text(gv)}, pattern {pattern.text(pv)}"
    if kind == "resize":
        have = d[3][1] if isinstance(d[3], tuple) else d[3]
        return (
            f"{where}: size {_constant_text(gv)}, but the pattern's size "
            f"({pattern.size_text(pv)}) is {have} elsewhere in this match"
        )
    if kind == "elsewhere":
        return (
            f"{where}: reads `{gv.name}` where the pattern reads its `{pv.name}`, found "
            f"as `{d[3].name}`"
        )
    if kind == "twice":
        return f"{where}: `{gv.name}` would be both the pattern's `{pv.name}` and `{d[3].name}`"
    if kind == "claimed":
        return f"{where}: `{gv.name}` is already in match {d[3]}"
    if kind == "arity":
        return f"{where}: {d[2]} arguments, pattern {len(pattern.args[p])}"
    return f"{where}: {kind}"  # pragma: no cover - every kind is written above


class _Finder:
    """One find(): the program scanned in graph order from each node of the pattern's first op."""

    def __init__(self, ep: ExportedProgram, pattern: _Pattern):
        self.ep = ep
        self.pattern = pattern
        self.view = _view(ep.graph)
        self.calls = call_index(ep)
        by_name = {n.name: n for n in self.view.nodes if n.op in ("placeholder", "get_attr")}
        state: dict[Node, tuple] = {}
        for spec in ep.graph_signature.input_specs:
            node = by_name.get(getattr(spec.arg, "name", ""))
            if spec.kind.name != "USER_INPUT" and node is not None:
                state[node] = _shape_of(node)
        for node in by_name.values():
            if node.op == "get_attr":
                state[node] = _shape_of(node)
        self.search = _Search(pattern, self.view, state)
        self.matches: list[Match] = []
        self.near: list[tuple[set[Node], NearMiss]] = []
        self.near_nodes: set[Node] = set()
        self.gave_up: list[str] = []

    def run(self) -> Matches:
        pattern = self.pattern
        search = self.search
        for anchor in self.view.by_target.get(pattern.anchor.target, []):
            # a node of a near-miss may still start a match; it starts no second near-miss
            known = anchor in self.near_nodes
            try:
                if anchor in search.claimed:
                    if not known:
                        self._overlap(anchor)
                    continue
                if search.run(anchor):
                    self._found()
                    continue
                if known or (search.claimed and self._overlap(anchor)):
                    continue
            except (_GaveUp, RecursionError):  # too many choices, or a pattern of thousands of ops
                self.gave_up.append(anchor.name)
                continue
            self._tolerant(anchor)
        claimed = set(search.claimed)
        near = [
            miss
            for nodes, miss in self.near
            if miss.kind != "overlaps" or nodes - claimed  # a later match took the rest
        ]
        notes = []
        if pattern.mode != "symbolic":
            notes.append(_MODE_NOTES[pattern.mode])
        if self.gave_up:
            notes.append(
                f"the search from {len(self.gave_up)} node(s) ({', '.join(self.gave_up[:3])}"
                f"{', …' if len(self.gave_up) > 3 else ''}) gave up after {_BUDGET:,} "
                "candidates (or at Python's recursion limit): the pattern's parts connect only "
                "through values read in many places, or it is very large; a smaller pattern, "
                "or one whose parts share more than their inputs, is found faster"
            )
        return Matches(
            pattern=pattern.name,
            num_ops=pattern.num_ops,
            input_names=tuple(pattern.input_names),
            matches=tuple(self.matches),
            near_misses=tuple(miss for miss in near),
            notes=tuple(notes),
            pattern_program=pattern.program,
        )

    # a structural match ---------------------------------------------------------------------

    def _found(self) -> None:
        search, pattern = self.search, self.pattern
        ops = set(search.rev)
        region = set(ops)
        call_of = self.calls.call_of
        for node in ops:
            for user in node.users:
                # a check the module call of the op made goes with it; one another call made
                # (a norm's cast of its input checks the dtype of what it was given) is that
                # call's read of a result, not part of the match
                bookkeeping = user.op == "call_function" and user.target in _BOOKKEEPING
                if bookkeeping and call_of(user.name) == call_of(node.name):
                    region.add(user)
        inputs, outputs = self._ends()
        order = self.view.order
        results = {search.m[o] for o in pattern.output_ops}
        total = pattern.num_ops
        aliases = []
        for node in sorted(ops - results, key=order.__getitem__):
            outside = [u for u in node.users if u not in region]
            root = returned_root(node, ops)
            if outside and root not in ops:
                # at run time this node is the match's input itself (a conversion to the
                # dtype it has: LlamaRMSNorm's .to(float32)); torch.export records later reads
                # of that input as reads of it, and they stay reads of the input
                aliases.append((node.name, root.name))
                continue
            if outside:
                reader = min(outside, key=order.__getitem__)
                reader_text = (
                    "the program's output" if reader.op == "output" else f"`{reader.name}`"
                )
                reason = (
                    f"all {_count(total, 'op')} match, but `{node.name}` (the pattern's "
                    f"`{search.rev[node].name}`) is also read by {reader_text} outside the "
                    "match and is not one of the pattern's results, so the match cannot be "
                    "replaced as one call (return it from the pattern to make it a result)"
                )
                self._near_miss(region, "read outside", reason, total, inputs, outputs)
                return
        blocker = self._convexity_breaker(region)
        if blocker is not None:
            reason = (
                f"all {_count(total, 'op')} match, but the match is not convex: "
                f"`{blocker.name}` outside it reads its results and feeds it, so it cannot "
                "become one call"
            )
            self._near_miss(region, "not convex", reason, total, inputs, outputs)
            return
        index = len(self.matches)
        for node in region:
            search.claimed[node] = index
        self.matches.append(
            Match(
                index=index,
                call=self._call(ops),
                nodes=self._names(region),
                inputs=inputs,
                outputs=outputs,
                num_ops=total,
                mapping=self._mapping(),
                state=tuple(
                    (pattern.state[p], g.name) for p, g in search.bind.items() if p in pattern.state
                ),
                aliases=tuple(aliases),
                input_names=tuple(pattern.input_names),
            )
        )

    def _overlap(self, anchor: Node) -> bool:
        """Whether the pattern occurs from ``anchor`` if earlier matches are ignored: then a
        near-miss that says which match took its nodes (dropped at the end when later matches
        cover the rest)."""
        search = self.search
        if not search.run(anchor, ignore_claimed=True):
            return False
        ops = set(search.rev)
        taken = sorted((n for n in ops if n in search.claimed), key=self.view.order.__getitem__)
        if not taken or not ops - set(search.claimed):
            return bool(taken)
        first = taken[0]
        index = search.claimed[first]
        inputs, outputs = self._ends()
        total = self.pattern.num_ops
        reason = (
            f"all {_count(total, 'op')} match, but `{first.name}` is already in match {index} "
            f"({_call_text(self.matches[index].call)}): matches do not overlap, the first in "
            "graph order takes its nodes"
        )
        self._near_miss(ops, "overlaps", reason, total, inputs, outputs)
        return True

    def _tolerant(self, anchor: Node) -> None:
        pattern = self.pattern
        status, differences = self.search.tolerant(anchor)
        counted = [p for p in pattern.ops if p.target is not _getitem]
        matched = sum(1 for p in counted if status.get(p) == "match")
        present = sum(1 for p in counted if status.get(p) in ("match", "differs"))
        if not differences or present * 2 <= pattern.num_ops:
            return
        texts = []
        for p, g, argument, d in differences:
            text = _difference_text(pattern, p, g, argument, d)
            if text not in texts:
                texts.append(text)
        more = f"; and {len(texts) - 1} more difference{'s' if len(texts) > 2 else ''}"
        reason = (
            f"{matched} of {_count(pattern.num_ops, 'op')} "
            f"{'matches' if pattern.num_ops == 1 else 'match'}; {texts[0]}"
            f"{more if len(texts) > 1 else ''}"
        )
        search = self.search
        nodes = {g for p, g in search.m.items() if status.get(p) in ("match", "differs", "op")}
        inputs, outputs = self._ends()
        self._near_miss(
            nodes, "differs", reason, matched, inputs, outputs, differences=tuple(texts)
        )

    def _near_miss(
        self,
        nodes: set[Node],
        kind: str,
        reason: str,
        matched: int,
        inputs: tuple,
        outputs: tuple,
        differences: tuple[str, ...] = (),
    ) -> None:
        if any(nodes == seen for seen, _ in self.near):
            return  # the same place, found again from another of its nodes
        miss = NearMiss(
            call=self._call(nodes),
            nodes=self._names(nodes),
            matched=matched,
            num_ops=self.pattern.num_ops,
            kind=kind,
            reason=reason,
            differences=differences,
            inputs=inputs,
            outputs=outputs,
        )
        self.near.append((set(nodes), miss))
        self.near_nodes |= nodes

    # helpers --------------------------------------------------------------------------------

    def _ends(self) -> tuple[tuple[str | None, ...], tuple[str | None, ...]]:
        search, pattern = self.search, self.pattern
        inputs = tuple(search.bind[p].name if p in search.bind else None for p in pattern.inputs)
        outputs: list[str | None] = []
        for value in pattern.outputs:
            found = (
                search.m.get(value) or search.bind.get(value) if isinstance(value, Node) else None
            )
            outputs.append(found.name if found is not None else None)
        return inputs, tuple(outputs)

    def _mapping(self) -> tuple[tuple[str, str], ...]:
        search, pattern = self.search, self.pattern
        pairs = [(p.name, search.m[p].name) for p in pattern.ops if p in search.m]
        names = dict(zip(pattern.inputs, pattern.input_names))
        pairs += [(names.get(p, p.name), g.name) for p, g in search.bind.items() if p in names]
        return tuple(pairs)

    def _names(self, nodes: set[Node]) -> tuple[str, ...]:
        return tuple(n.name for n in sorted(nodes, key=self.view.order.__getitem__))

    def _call(self, nodes: set[Node]) -> str:
        """The innermost module call around every node (``""``: the top level)."""
        chains = [self.calls.chain(n.name) for n in nodes if n.op == "call_function"]
        if not chains:
            return ""
        common = chains[0]
        for chain in chains[1:]:
            length = 0
            for a, b in zip(common, chain):
                if a != b:
                    break
                length += 1
            common = common[:length]
            if not common:
                return ""
        return common[-1] if common else ""

    def _convexity_breaker(self, region: set[Node]) -> Node | None:
        """A node outside ``region`` that depends on it and that it depends on, if any."""
        order = self.view.order
        positions = [order[n] for n in region]
        tainted: set[Node] = set()
        for node in self.view.nodes[min(positions) : max(positions) + 1]:
            inputs = node.all_input_nodes
            if node in region:
                for value in inputs:
                    if value in tainted:
                        return value
            elif any(value in region or value in tainted for value in inputs):
                tainted.add(node)
        return None


_MODE_NOTES = {
    "symbolic (size-1 dims fixed)": (
        "the pattern was traced with its example's size-1 dims fixed at 1 (torch could not keep "
        "them symbolic): where it passes such a size to an op, it matches only 1; trace it on "
        "examples whose sizes are all 2 or more to match any"
    ),
    "static": (
        "the pattern could not be traced with symbolic sizes, only at the example's sizes: an "
        "int where an op takes a size is taken as a size (it matches any int)"
    ),
}


def _shape_of(node: Node) -> tuple | None:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    return None


def find(
    ep: ExportedProgram,
    pattern: Callable,
    example_args: tuple,
    example_kwargs: Mapping[str, Any] | None = None,
) -> Matches:
    """Where the ops of ``pattern`` occur in ``ep``, and where they almost do, and why not.

    Args:
        ep: the program to search (any ExportedProgram: from ``gs.export`` or
            ``torch.export.export``). It is not modified.
        pattern: a function or an ``nn.Module``, traced to aten on the example arguments as
            ``gs.export`` traces a model. A module's parameters and buffers match the
            program's of the same shape.
        example_args, example_kwargs: what to call the pattern with when tracing it. Any
            shapes will do: sizes read off tensors match any size in the program. An int or
            a float is traced as a constant, and compared as one.

    Returns:
        :class:`Matches`: every match in graph order (its nodes, inputs, outputs and module
        call) and the near-misses with their reasons.

    Raises:
        NotAProgramError: ``ep`` is not an ExportedProgram.
        InputStructureError: ``example_args`` is not a tuple (a list: ``tuple(args)``), or
            ``example_kwargs`` not a mapping.
        PatternError: the pattern is not callable, cannot be traced on the example arguments,
            or computes nothing.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU())
        >>> ep = gs.export(model, (torch.randn(2, 4),))
        >>> from graphsurgeon.patterns.find import find  # also gs.find
        >>> found = find(ep, torch.nn.functional.silu, (torch.randn(8),))
        >>> found[0].call, found[0].inputs, found[0].outputs
        ('1', ('linear',), ('silu',))
    """
    if not isinstance(ep, ExportedProgram):
        raise not_a_program(ep, "find")
    traced = _traced(pattern, example_args, example_kwargs)
    return _Finder(ep, traced).run()
