"""locate(): inside the call that diverges, the first op of its replacement that computes
something the original call never computes.

:func:`graphsurgeon.compare` says *which* swapped call starts to compute something else;
``cmp.locate()`` goes inside that call and says *which line* of the replacement does. It
exports the replacement on the very inputs the call received in the swapped run and runs that
graph node by node; it runs the original call's own nodes (the cut compare runs) on the same
inputs, keeping every intermediate value, also those of its ops broken down into smaller ones
(a ``layer_norm`` into its mean, variance, ``rsqrt``...), so that a replacement written out
step by step still finds the steps of a fused original. Then each value of the replacement is
matched against the original's:

* a value *matches* when some value of the original has its shape and dtype and is close within
  the comparison's tolerances (``|r - o| <= atol + rtol * |o|``), or, for a tensor of several
  rows, equals one up to the same reordering of its last dimension in every row (a replacement
  that lays out a head's dimensions otherwise, as interleaved rotary embeddings do). Values are
  matched by exact shape: a value the replacement holds transposed or reshaped where the
  original never does matches nothing, and that is fine as long as the replacement comes back
  to the original's values later;
* a value *carries the difference* when it matches nothing and some path from it to an output
  that differs runs through values that match nothing;
* the culprit is the first op (in the replacement's order) that carries the difference while
  each of its inputs matches a value of the original, or is the call's input, a parameter or
  buffer of the replacement, or a value that is not a tensor: its inputs agree, its output
  does not. An op whose value also leads, elsewhere, back to values of the original (half a
  rotary table used for the queries, which match, and for the keys, which do not), or that
  equals such a value, is the replacement's own layout, not the culprit, unless every
  candidate is. A value the replacement makes without reading the call's inputs (a boolean
  mask where the original adds a float one) and that has no counterpart of its shape and dtype
  in the original counts as given, like a parameter; one that has a counterpart and differs
  (a mask off by one diagonal) stays a suspect.

Matching by value has its limits: a replacement that keeps a layout of its own until its very
output (every value transposed, say) has no value to match until then, and the first op to
leave the original's values is named; a step that changes nothing (a forgotten scale written
as ``/ 1.0``) leaves a value the original has, and the op after it is named; a wrong weight
set in ``__init__`` is named where it is used (its input text says it matches no value of the
original).

The op's source line comes from the replacement's own trace (``node.meta["stack_trace"]``): the
innermost frame in the user's code, not in torch or another installed library.

Example:
    >>> import torch, graphsurgeon as gs
    >>> class Scale(torch.nn.Module):
    ...     def forward(self, x):
    ...         return x * 2
    >>> class Bad(torch.nn.Module):
    ...     def forward(self, x):
    ...         y = x * 2
    ...         return y + 1
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 3), Scale())
    >>> x = torch.randn(2, 3)
    >>> ep = gs.export(model, (x,))
    >>> found = gs.compare(ep, gs.swap(ep, {"1": Bad()}), (x,)).locate()
    >>> found.call, found.op, found.line
    ('1', 'aten.add.Tensor(f32[2, 3], other=1)', 'return y + 1')
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import math
import os
import re
import sysconfig
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _meta
from ..errors import GraphSurgeonError
from ..export import export, quiet_export
from ..fuse import fused_call
from ._exec import (
    PrivateStateInterpreter,
    RandomState,
    bind_inputs,
    clone_inputs,
    keep_state,
    runnable_original,
)
from .verify import LeafCheck, compare_outputs

__all__ = ["Location"]


@dataclass(frozen=True, repr=False)
class Location:
    """Where, inside a diverging call, its replacement starts to compute something else.

    Made by :meth:`graphsurgeon.Comparison.locate`. Truthy when an op was found.

    Attributes:
        call: the call (``"layers.1.attn"``); ``""`` when no call diverges.
        found: whether an op was found; when not, ``reason`` says why.
        op: the op and its arguments, tensors as their shapes, the rest by name, defaults
            included for the scalar knobs (``"aten.scaled_dot_product_attention.default(f32[1,
            4, 16, 16], ..., is_causal=False, scale=None)"``).
        source: ``"file.py:LINE"`` in the replacement's code; ``""`` when the trace has none.
        line: the code text of that line.
        file: the full name of the source file, as the trace recorded it.
        stack: the frames of the user's code that led there, outermost first
            (``"my_kernels.py:40 in forward"``).
        node: the op's node in the replacement's traced graph.
        inputs: what each tensor input of the op is: ``"x: the call's input"``, ``"o.weight: a
            parameter or buffer of the replacement, matches no value"``, ``"getitem: = the
            original's 'transpose_5' (examples.py:44 q, k, v = ...)"`` (the original's node
            and the line that computes it), ``"variance: = a step of the original's 'layer_norm'
            (aten.var_mean.dim)"`` (a value inside one of its ops).
        nearest: the value of the original call of the same shape and dtype closest to the
            op's value (``"the original's 'div_1' (examples.py:45 scores = ...)"``), and
            ``max_abs`` the largest difference from it; ``""`` and None when the original has
            no value of that shape.
        replacement: the replacement's class name.
        reason: why nothing was found (no divergence, the replacement cannot be traced, no
            values on the meta device, every op's value matches...); ``""`` when found.
        backward: True when the op is one of the replacement's backward (the call's outputs
            match, its gradients do not): ``node`` is then the autograd node that ran it
            (``"MulBackward0"``, ``"MyNormFunctionBackward"``).
    """

    call: str
    found: bool
    op: str = ""
    source: str = ""
    line: str = ""
    file: str = ""
    stack: tuple[str, ...] = ()
    node: str = ""
    inputs: tuple[str, ...] = ()
    nearest: str = ""
    max_abs: float | None = None
    replacement: str = ""
    reason: str = ""
    backward: bool = False

    def __bool__(self) -> bool:
        return self.found

    @property
    def verdict(self) -> str:
        """``"first differs here, inputs agree"``, said of the backward when it is there."""
        if self.backward:
            return "the backward first differs here, inputs agree"
        return "first differs here, inputs agree"

    @property
    def where(self) -> str:
        """``"my_kernels.py:42 y = F.scaled_dot_product_attention(q, k, v)"``: the source and
        its line, or the op when the trace has no source line."""
        if self.source:
            return f"{self.source} {self.line}".rstrip()
        return f"{self.op} (node {self.node!r}; no source line recorded)"

    def __str__(self) -> str:
        head = f"{self.call}: " if self.call else ""
        if not self.found:
            return f"{head}{self.reason}"
        return f"{head}{self.where}: {self.verdict}"

    def __repr__(self) -> str:
        return f"<Location {self}>"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        from .. import display as d

        if not self.found:
            head = d.badge("not located", "warn")
            call = f" <code>{d.escape(self.call)}</code>" if self.call else ""
            return (
                f'<div class="gs-title">locate {head}{call}</div><div>{d.escape(self.reason)}</div>'
            )
        head = (
            f'<div class="gs-title">locate {d.badge(self.verdict, "bad")} '
            f"<code>{d.escape(self.call)}</code> "
            f'<span class="gs-muted">({d.escape(self.replacement)})</span></div>'
        )
        where = (
            f"<code>{d.escape(self.source)}</code> <code>{d.escape(self.line)}</code>"
            if self.source
            else '<span class="gs-muted">no source line recorded</span>'
        )
        rows = [
            ["source", where],
            ["op", f"<code>{d.escape(self.op)}</code>"],
            ["node", f"<code>{d.escape(self.node)}</code>"],
        ]
        if self.inputs:
            rows.append(["inputs", "<br>".join(d.escape(i) for i in self.inputs)])
        if self.nearest:
            rows.append(
                [
                    "closest original value",
                    f"{d.escape(self.nearest)}, max abs {_meta.number_text(self.max_abs)}",
                ]
            )
        else:
            rows.append(["closest original value", "none of that shape and dtype"])
        if len(self.stack) > 1:
            rows.append(["called from", "<br>".join(d.escape(s) for s in self.stack[:-1])])
        return head + d.table(["", ""], rows, raw=(1,))

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display

        return display.bundle(self._repr_html_(), str(self), include, exclude)


@dataclass(frozen=True, eq=False)
class CallRecord:
    """What :func:`locate_call` needs of one call that compare ran; a Comparison keeps it for
    its first diverging call."""

    program: ExportedProgram
    call: str
    replacement: torch.nn.Module
    signature: Any  # torch.export's ModuleCallSignature of the call
    inputs: tuple[tuple, dict]
    output: Any
    random: RandomState
    leaves: tuple[LeafCheck, ...]
    rtol: float
    atol: float
    cache: dict[str, Location] = field(default_factory=dict)
    partition: Any = None  # the call's partition (a region's has no module call to look up)
    # when the call diverges in its backward only: what its backward ran from
    # (graphsurgeon.checks._locate_backward.BackwardRecord)
    backward: Any = None


def not_located(call: str, reason: str, replacement: str = "") -> Location:
    return Location(call, False, replacement=replacement, reason=reason)


def locate_call(record: CallRecord, find: Any = None) -> Location:
    """Locate the op of ``record``'s replacement where the call starts to differ (computed
    once per record): by ``find`` (the backward's locator, for a backward divergence), else
    in its forward. The caller's random stream is left as it was."""
    if "location" not in record.cache:
        start = RandomState()
        try:
            record.cache["location"] = (find or _locate)(record)
        finally:
            start.restore()
    return record.cache["location"]


def _locate(record: CallRecord) -> Location:
    call, kind = record.call, type(record.replacement).__name__
    tensors = [t for t in pytree.tree_leaves(record.inputs) if isinstance(t, torch.Tensor)]
    if any(t.device.type == "meta" for t in tensors):
        return not_located(
            call,
            "the call ran on the meta device: its values hold no numbers, so no op's value can "
            "be told apart from the original's; run compare on real tensors",
            kind,
        )
    if not isinstance(record.replacement, torch.nn.Module):
        return not_located(call, f"the replacement is {kind}, not an nn.Module to trace", kind)
    args, kwargs = record.inputs
    try:
        with quiet_export(), _whole_stacks(), keep_state([record.replacement]):
            traced = export(
                record.replacement, *clone_inputs((tuple(args), dict(kwargs))), preserve="none"
            )
    except Exception as error:  # any reason a module does not export: say it
        return not_located(
            call,
            f"the replacement's forward ({kind}) cannot be traced on the call's inputs: "
            f"{_first_line(error)}",
            kind,
        )
    # the replacement's graph, node by node
    graph_module = runnable_original(traced)
    record.random.restore()
    replacement_run = _Recording(graph_module)
    with torch.no_grad():
        try:
            flat = replacement_run.run(
                *bind_inputs(graph_module, *clone_inputs((tuple(args), dict(kwargs)))),
                enable_io_processing=False,
            )
        except Exception as error:
            return not_located(
                call, f"the replacement's traced graph fails to run: {_first_line(error)}", kind
            )
    # leaf by leaf: the graph gives back fx's immutable containers where the module had its own
    rebuilt = pytree.tree_leaves(graph_module.graph.process_outputs(flat))
    returned = pytree.tree_leaves(record.output)
    if not compare_outputs(returned, rebuilt, rtol=record.rtol, atol=record.atol):
        return not_located(
            call,
            f"the trace of {kind} does not compute what it returned in the run (random ops, "
            "or code that depends on more than its inputs), so no line of it can be blamed",
            kind,
        )
    originals = _original_values(record)
    verdicts = _verdicts(graph_module, replacement_run.values, originals)
    given = {n for n in graph_module.graph.nodes if n.op in ("placeholder", "get_attr")}
    given |= _own_constants(graph_module, verdicts)
    differing_outputs = _differing_outputs(graph_module, record)
    carriers = _carriers(graph_module, verdicts, given, differing_outputs)
    roots = [
        n
        for n in graph_module.graph.nodes
        if n in carriers and not any(i in carriers for i in n.all_input_nodes)
    ]
    if not roots:
        return not_located(call, _arrangement(differing_outputs, verdicts, given), kind)
    # A value the replacement lays out its own way (half a rotary table, a fused qkv) matches
    # nothing, yet where it is used well the values come back to the original's: such a value,
    # or one equal to it (the same table cut again for the keys), is not to blame. The first
    # root that is neither is the culprit; when every root is, the first.
    returning = _returning(graph_module, verdicts, given)
    vouched = _Values(record.rtol, record.atol)
    for node in returning:
        vouched.add(node.name, None, replacement_run.values.get(node))
    culprit = next(
        (n for n in roots if n not in returning and not _vouched_for(n, replacement_run, vouched)),
        roots[0],
    )
    source, line, file, stack = _source_of(culprit, record.replacement)
    verdict = verdicts[culprit]
    return Location(
        call,
        True,
        op=_op_text(culprit, replacement_run.values),
        source=source,
        line=line,
        file=file,
        stack=stack,
        node=culprit.name,
        inputs=tuple(
            _input_text(n, verdicts, replacement_run.values)
            for n in culprit.all_input_nodes
            if _has_tensor(replacement_run.values.get(n))
        ),
        nearest=verdict.nearest,
        max_abs=verdict.nearest_error,
        replacement=kind,
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    if isinstance(error, GraphSurgeonError):
        return text.split("\n\n", 1)[0]
    lines = [line for line in text.splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


# -- running -----------------------------------------------------------------------------------


class _Recording(PrivateStateInterpreter):
    """Runs a graph node by node on private copies of its buffers and keeps every value."""

    def __init__(self, gm: GraphModule, finer: _Finer | None = None):
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict[Node, Any] = {}
        self.finer = finer

    def run_node(self, n: Node) -> Any:
        if self.finer is not None:
            self.finer.node = n.name
        try:
            result = super().run_node(n)
        finally:
            if self.finer is not None:
                self.finer.node = ""
        self.values[n] = result
        return result


class _Finer(TorchDispatchMode):
    """Breaks the ops the original runs into smaller ones where torch knows how, and keeps
    every value they compute: the steps of a fused ``layer_norm``, ``gelu``, ``softmax`` or
    attention, which a replacement may write out one by one.

    An op is broken down by its decomposition, or by its composite implementation when it
    has one; the steps of a step only by a decomposition of torch's own (the math of
    attention, softmax), not down to the primitives every elementwise op is made of.
    """

    DEPTH = 2

    def __init__(self, keep):
        super().__init__()
        self.keep = keep
        self.node = ""
        self.depth = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result: Any = NotImplemented
        breakdown = _breakdown(func, self.depth)
        if breakdown is not None:
            self.depth += 1
            try:
                with self:
                    result = breakdown(*args, **kwargs)
            except Exception:  # a decomposition that does not apply here: run the op itself
                result = NotImplemented
            finally:
                self.depth -= 1
        if result is NotImplemented:
            result = func(*args, **kwargs)
        if self.node:  # not what keep_state or the interpreter do around the nodes
            self.keep(f"a step of the original's {self.node!r} ({func})", None, result)
        return result


def _breakdown(func: Any, depth: int) -> Any:
    """How :class:`_Finer` breaks ``func`` down at ``depth``, or None."""
    if depth >= _Finer.DEPTH or func.namespace != "aten":
        return None
    decomposition = _decompositions().get(func)
    if decomposition is not None:
        # below the top, the reference implementations only lead to primitives
        if depth == 0 or not decomposition.__module__.startswith("torch._refs"):
            return decomposition
        return None
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return func.decompose
    return None


@functools.cache
def _decompositions() -> dict:
    from torch._decomp import decomposition_table

    return dict(decomposition_table)


def _original_values(record: CallRecord) -> _Values:
    """Every value the original call computes on the call's inputs: each node's, and those of
    the smaller ops its ops break down into."""
    module = fused_call(record.program, record.call, record.partition)
    values = _Values(record.rtol, record.atol)
    args, kwargs = record.inputs
    record.random.restore()
    plain = _Recording(module)
    with torch.no_grad(), keep_state([module]):
        plain.run(
            *bind_inputs(module, *clone_inputs((tuple(args), dict(kwargs)))),
            enable_io_processing=False,
        )
    for node, value in plain.values.items():
        if node.op != "output":
            values.add(f"the original's {node.name!r}", node, value)
    finer = _Finer(values.add)
    runner = _Recording(module, finer)  # made outside the mode: its copies are no steps
    inputs = bind_inputs(module, *clone_inputs((tuple(args), dict(kwargs))))
    record.random.restore()
    # the finer steps are a help, not a must: a run that fails leaves the node values alone
    with contextlib.suppress(Exception), torch.no_grad(), keep_state([module]), finer:
        runner.run(*inputs, enable_io_processing=False)
    return values


# -- matching values ---------------------------------------------------------------------------


def _key(value: torch.Tensor) -> tuple:
    return (tuple(value.shape), value.dtype, value.device)


def _comparable(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and not value.is_quantized
        and not value.is_nested
        and value.device.type != "meta"
    )


class _Values:
    """The original's values by shape, dtype and device, each with a label and its node."""

    def __init__(self, rtol: float, atol: float):
        self.rtol, self.atol = rtol, atol
        self.by_key: dict[tuple, list[tuple[str, Node | None, torch.Tensor]]] = {}

    def add(self, label: str, node: Node | None, value: Any) -> None:
        for leaf in _tensors(value):
            if _comparable(leaf):
                self.by_key.setdefault(_key(leaf), []).append((label, node, leaf.detach()))

    def match(self, value: torch.Tensor) -> _Verdict:
        candidates = self.by_key.get(_key(value), [])
        # the closest value, a node's rather than a step's inside one where there is one
        nearest, nearest_error = None, (True, math.inf)
        for label, node, candidate in candidates:
            close, error = _close(value, candidate, self.rtol, self.atol)
            if close:
                return _Verdict(True, _label(label, node))
            if (node is None, error) < nearest_error:
                nearest, nearest_error = (label, node), (node is None, error)
        for label, node, candidate in candidates:
            if _same_up_to_reordering(value, candidate, self.rtol, self.atol):
                return _Verdict(True, _label(label, node) + ", its last dimension reordered")
        if nearest is None:
            return _Verdict(False)
        return _Verdict(False, _label(*nearest), nearest_error[1])


@dataclass(frozen=True)
class _Verdict:
    matches: bool
    nearest: str = ""  # what it matches, or the closest original value when it matches none
    nearest_error: float | None = None
    compared: bool = True  # False for a value that is no tensor: neutral, it matches


_NEUTRAL = _Verdict(True, compared=False)


def _tensors(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]
    return []


def _has_tensor(value: Any) -> bool:
    return bool(_tensors(value))


def _judge(value: Any, originals: _Values) -> _Verdict:
    """Whether a value of the replacement matches one of the original; a value that is no
    tensor (a size, None) is neutral, a tuple of tensors matches when each of them does."""
    leaves = [leaf for leaf in _tensors(value) if _comparable(leaf)]
    if not leaves:
        return _NEUTRAL
    verdicts = [originals.match(leaf.detach()) for leaf in leaves]
    for verdict in verdicts:
        if not verdict.matches:
            return verdict
    return verdicts[0] if len(verdicts) == 1 else _Verdict(True)


def _verdicts(gm: GraphModule, values: dict[Node, Any], originals: _Values) -> dict[Node, _Verdict]:
    """Each value of the replacement judged against the original's, in graph order.

    A replacement that stacks values the original keeps apart (q and k rotated in one pass:
    ``torch.cat((q, k), dim=1)``) computes nothing the original has until it splits them
    again, so such a value is judged in its pieces: a ``cat`` of values that match carries its
    pieces (the dim and sizes), and every value computed from one with the same size along that
    dim (an elementwise op, a layout op along other dims) is split the same way and matches when
    each piece matches. The op that first makes a piece the original never has is then the one
    to blame, not the ``cat``."""
    verdicts: dict[Node, _Verdict] = {}
    pieces: dict[Node, list[tuple[int, tuple[int, ...]]]] = {}
    for node in gm.graph.nodes:
        if node not in values:
            continue
        value = values[node]
        verdict = _judge(value, originals)
        if node.op == "call_function":
            inherited = _inherited_pieces(node, value, pieces)
            stacked = _stacked(node, value, verdicts)
            specs = inherited + ([stacked] if stacked and stacked not in inherited else [])
            if specs:
                pieces[node] = specs
            if not verdict.matches and stacked is not None:
                verdict = _Verdict(True, "its inputs, stacked")
            elif not verdict.matches and inherited:
                verdict = _piecewise(value, inherited, originals) or verdict
        verdicts[node] = verdict
    return verdicts


def _stacked(
    node: Node, value: Any, verdicts: dict[Node, _Verdict]
) -> tuple[int, tuple[int, ...]] | None:
    """For ``cat`` of values that all match (or are inputs, weights: given), its pieces."""
    if node.target is not torch.ops.aten.cat.default or not isinstance(value, torch.Tensor):
        return None
    parts = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, Node) for p in parts):
        return None
    if not all(
        p.op in ("placeholder", "get_attr") or verdicts.get(p, _NEUTRAL).matches for p in parts
    ):
        return None
    sizes = tuple(p.meta["val"].shape[dim] if "val" in p.meta else None for p in parts)
    if any(not isinstance(size, int) for size in sizes):
        return None
    return dim % value.dim(), sizes


def _inherited_pieces(
    node: Node, value: Any, pieces: dict[Node, list[tuple[int, tuple[int, ...]]]]
) -> list[tuple[int, tuple[int, ...]]]:
    """The pieces of its inputs this value has too: the same size along their dim."""
    leaves = _tensors(value)
    found: list[tuple[int, tuple[int, ...]]] = []
    if not leaves:
        return found
    for source in node.all_input_nodes:
        for dim, sizes in pieces.get(source, ()):
            fits = all(leaf.dim() > dim and leaf.shape[dim] == sum(sizes) for leaf in leaves)
            if fits and (dim, sizes) not in found:
                found.append((dim, sizes))
    return found


def _piecewise(
    value: Any, specs: list[tuple[int, tuple[int, ...]]], originals: _Values
) -> _Verdict | None:
    """A match when, cut along one of ``specs`` (or along all of them), every piece of every
    tensor of ``value`` matches a value of the original."""
    cuts = [[spec] for spec in specs] + ([specs] if len(specs) > 1 else [])
    for cut in cuts:
        labels = []
        for leaf in _tensors(value):
            if not _comparable(leaf):
                return None
            parts = [leaf.detach()]
            for dim, sizes in cut:
                parts = [piece for part in parts for piece in part.split(list(sizes), dim=dim)]
            verdicts = [originals.match(part.contiguous()) for part in parts]
            if not all(v.matches for v in verdicts):
                labels = None
                break
            labels += [v.nearest for v in verdicts]
        if labels is not None:
            return _Verdict(True, ", ".join(labels[:2]) + (", ..." if len(labels) > 2 else ""))
    return None


def _close(
    value: torch.Tensor, other: torch.Tensor, rtol: float, atol: float
) -> tuple[bool, float]:
    """Whether ``value`` is within tolerance of ``other`` (NaN matching NaN), and the largest
    difference between them."""
    if value.numel() == 0:
        return True, 0.0
    if not (value.is_floating_point() or value.is_complex()):
        equal = torch.equal(value, other)
        return equal, 0.0 if equal else float((value.long() - other.long()).abs().max())
    if value.dtype in (torch.float16, torch.bfloat16):
        value, other = value.float(), other.float()
    close = bool(torch.isclose(value, other, rtol=rtol, atol=atol, equal_nan=True).all())
    if close:
        return True, 0.0
    gap = (value - other).abs()
    gap = torch.where(torch.isnan(gap), torch.full_like(gap, math.inf), gap)
    return False, float(gap.max())


def _same_up_to_reordering(
    value: torch.Tensor, other: torch.Tensor, rtol: float, atol: float
) -> bool:
    """Whether ``value`` is ``other`` with its last dimension reordered the same way in every
    row (a head's dimensions interleaved, say). The order is read off a row without ties."""
    if value.dim() == 0 or value.shape[-1] < 2 or not value.is_floating_point():
        return False
    width = value.shape[-1]
    rows_value, rows_other = value.reshape(-1, width), other.reshape(-1, width)
    if rows_value.shape[0] < 2:
        return False  # one row says nothing about a layout
    for row in (0, rows_value.shape[0] - 1):
        probe_value, probe_other = rows_value[row], rows_other[row]
        sorted_value, order_value = torch.sort(probe_value)
        if not bool(torch.isfinite(sorted_value).all()) or bool(
            (sorted_value[1:] == sorted_value[:-1]).any()
        ):
            continue  # ties: no one order to read
        order_other = torch.sort(probe_other).indices
        permutation = torch.empty_like(order_value)
        permutation[order_value] = order_other
        if bool((permutation == torch.arange(width)).all()):
            return False  # no reordering: the plain comparison already said no
        return bool(
            torch.isclose(
                rows_value, rows_other[:, permutation], rtol=rtol, atol=atol, equal_nan=True
            ).all()
        )
    return False


def _label(label: str, node: Node | None) -> str:
    """An original value for a reader: its node, and the source line that computes it."""
    if node is None:
        return label
    frames = _frames(node.meta.get("stack_trace"))
    if not frames:
        return label
    frame = frames[-1]
    code = _code_line(frame)
    return f"{label} ({frame.where}{' ' + code if code else ''})"


# -- which op --------------------------------------------------------------------------------


def _differing_outputs(gm: GraphModule, record: CallRecord) -> set[Node]:
    """The nodes that produce the replacement's outputs that compare found to differ (all
    output nodes when the two cannot be lined up)."""
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    flat = output.args[0]
    flat = list(flat) if isinstance(flat, (list, tuple)) else [flat]
    every = {n for n in flat if isinstance(n, Node)}
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is None or info.out_spec is None:
        return every
    try:
        structured = pytree.tree_unflatten(flat, info.out_spec)
        leaves = list(record.signature.out_spec.flatten_up_to(structured))
    except (TypeError, ValueError, RuntimeError):
        return every
    if len(leaves) != len(record.leaves):
        return every
    return {n for n, leaf in zip(leaves, record.leaves) if isinstance(n, Node) and not leaf.ok}


def _own_constants(gm: GraphModule, verdicts: dict[Node, _Verdict]) -> set[Node]:
    """Values the replacement makes without reading the call's inputs (a mask from
    ``torch.ones(...).tril()``, a weight it transposes) that have no counterpart of their
    shape and dtype in the original: its own way of doing what the original did otherwise (a
    boolean mask where the original adds a float one), given like its parameters. Such a value
    that has a counterpart and differs from it (a mask off by one diagonal) stays a suspect."""
    reads_inputs: set[Node] = set()
    own: set[Node] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder" or any(i in reads_inputs for i in node.all_input_nodes):
            reads_inputs.add(node)
            continue
        verdict = verdicts.get(node, _NEUTRAL)
        if node.op == "call_function" and not verdict.matches and not verdict.nearest:
            own.add(node)
    return own


def _carriers(
    gm: GraphModule, verdicts: dict[Node, _Verdict], given: set[Node], outputs: set[Node]
) -> set[Node]:
    """The nodes whose values match nothing of the original and reach a differing output
    through values that match nothing either."""
    carriers: set[Node] = set()
    for node in reversed(list(gm.graph.nodes)):
        if node in given or node.op == "output" or verdicts.get(node, _NEUTRAL).matches:
            continue
        if node in outputs or any(user in carriers for user in node.users):
            carriers.add(node)
    return carriers


def _returning(gm: GraphModule, verdicts: dict[Node, _Verdict], given: set[Node]) -> set[Node]:
    """The nodes whose values match nothing of the original but lead, through values that
    match nothing either, to one that matches again."""
    returning: set[Node] = set()
    for node in reversed(list(gm.graph.nodes)):
        if node in given or node.op == "output" or verdicts.get(node, _NEUTRAL).matches:
            continue
        for user in node.users:
            verdict = verdicts.get(user, _NEUTRAL)
            if user in returning or (verdict.matches and verdict.compared):
                returning.add(node)
                break
    return returning


def _vouched_for(node: Node, run: _Recording, vouched: _Values) -> bool:
    tensors = [t for t in _tensors(run.values.get(node)) if _comparable(t)]
    return bool(tensors) and all(vouched.match(t.detach()).matches for t in tensors)


def _arrangement(outputs: set[Node], verdicts: dict[Node, _Verdict], given: set[Node]) -> str:
    """Why no op is to blame: every value matches one of the original."""
    said = []
    for node in sorted(outputs, key=lambda n: n.name):
        if node in given:
            said.append(f"{node.name!r} is its own input or parameter, unchanged")
        elif verdicts.get(node, _NEUTRAL).nearest:
            said.append(f"{node.name!r} equals {verdicts[node].nearest}")
    detail = f" ({'; '.join(said[:3])})" if said else ""
    return (
        "every op of the replacement computes a value the original call computes too: the "
        "difference is in which values it returns, or how they are arranged" + detail
    )


def _input_text(node: Node, verdicts: dict[Node, _Verdict], values: dict[Node, Any]) -> str:
    if node.op == "placeholder":
        return f"{node.name}: the call's input"
    verdict = verdicts.get(node, _NEUTRAL)
    if node.op == "call_function" and not verdict.matches and not verdict.nearest:
        return f"{node.name}: made by the replacement alone, no value of that shape in the original"
    if node.op == "get_attr":
        # a weight of another layer, or transposed, is an input that agrees with nothing
        same = f"= {verdict.nearest}" if verdict.matches and verdict.nearest else "matches no value"
        return f"{node.target}: a parameter or buffer of the replacement, {same}"
    if verdict.nearest:
        return f"{node.name}: = {verdict.nearest}"
    return f"{node.name}: {_meta.describe_value(values.get(node))}"


def _op_text(node: Node, values: dict[Node, Any]) -> str:
    """The op with its arguments: tensors as their shapes, the rest as values, by name; for
    an aten op also the scalar knobs left at their defaults (``is_causal=False``)."""

    def shown(value: Any) -> str:
        if isinstance(value, Node):
            value = values.get(value)
        if isinstance(value, torch.Tensor):
            return _meta.tensor_text(value.shape, value.dtype)
        if isinstance(value, (list, tuple)):
            inner = ", ".join(shown(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner})"
        if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return str(value)
        return repr(value)

    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", str(target))
        module = getattr(target, "__module__", "") or ""
        if module in ("_operator", "operator"):
            name = f"operator.{name}"
        parts = [shown(a) for a in node.args] + [f"{k}={shown(v)}" for k, v in node.kwargs.items()]
        return _capped_op(f"{name}({', '.join(parts)})")
    parts = []
    for position, argument in enumerate(target._schema.arguments):
        if position < len(node.args) and not argument.kwarg_only:
            value, given = node.args[position], True
        elif argument.name in node.kwargs:
            value, given = node.kwargs[argument.name], True
        elif argument.has_default_value():
            value, given = argument.default_value, False
        else:
            continue
        tensor = isinstance(value, Node) and isinstance(values.get(value), torch.Tensor)
        if tensor and not argument.kwarg_only:
            parts.append(shown(value))  # a positional tensor: its shape says enough
        elif given or _knob(argument):
            parts.append(f"{argument.name}={shown(value)}")
    return _capped_op(f"{target}({', '.join(parts)})")


def _knob(argument: Any) -> bool:
    """Whether an argument left at its default is worth showing: a flag or a float that
    changes what the op computes (``is_causal=False``, ``scale=None``), or an optional tensor
    left out (``attn_mask=None``)."""
    kind = str(argument.type)  # "Optional[float]" or "float?" for an optional one
    if kind.startswith("Optional[") and kind.endswith("]"):
        kind = kind[len("Optional[") : -1]
    return kind.removesuffix("?") in ("bool", "float", "Tensor")


def _capped_op(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- source lines ------------------------------------------------------------------------------

_FRAME = re.compile(
    r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>[^\n]+)'
    r"(?:\n(?!\s*File \")(?P<code>[^\n]*))?"
)
_TORCH_DIR = os.path.dirname(torch.__file__)
_LIBRARY_DIRS = tuple(
    {
        os.path.normcase(p)
        for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "purelib", "platlib"))
        if p
    }
)


@dataclass(frozen=True)
class _SourceFrame:
    path: str
    line: int
    function: str
    code: str

    @property
    def where(self) -> str:
        return _meta.file_line_text(self.path, self.line)


def _is_torch(path: str) -> bool:
    normal = path.replace("\\", "/")
    return path.startswith(_TORCH_DIR) or "/site-packages/torch/" in normal


def _is_library(path: str) -> bool:
    normal = os.path.normcase(path)
    return (
        _is_torch(path)
        or "site-packages" in normal
        or "dist-packages" in normal
        or normal.startswith(_LIBRARY_DIRS)
    )


@functools.lru_cache(maxsize=4096)
def _frames(trace: Any) -> tuple[_SourceFrame, ...]:
    """The frames of a node's stack trace outside torch, outermost first."""
    if not isinstance(trace, str) or not trace:
        return ()
    frames = []
    for match in _FRAME.finditer(trace):
        path = match.group("path")
        if _is_torch(path):
            continue
        frames.append(
            _SourceFrame(
                path,
                int(match.group("line")),
                match.group("function").strip(),
                (match.group("code") or "").strip(),
            )
        )
    return tuple(frames)


def _code_line(frame: _SourceFrame) -> str:
    return linecache.getline(frame.path, frame.line).strip() or frame.code


def _source_of(node: Node, replacement: torch.nn.Module) -> tuple[str, str, str, tuple[str, ...]]:
    """(``file.py:LINE``, its code, the file, the user's frames) of the op: the innermost frame
    of the user's own code; failing that, of the file of the replacement's forward (an installed
    library's module); failing that, the innermost frame outside torch."""
    frames = _frames(node.meta.get("stack_trace"))
    if not frames:
        return "", "", "", ()
    own = [f for f in frames if not _is_library(f.path)]
    if not own:
        forward = getattr(getattr(type(replacement), "forward", None), "__code__", None)
        own = [f for f in frames if forward is not None and f.path == forward.co_filename]
    frame = (own or frames)[-1]
    callers = frames[: frames.index(frame) + 1]
    stack = tuple(f"{f.where} in {f.function}" for f in callers)
    return frame.where, _code_line(frame), frame.path, stack


@contextlib.contextmanager
def _whole_stacks() -> Iterator[None]:
    """While locate exports a replacement, record each node's whole stack from the
    replacement's ``forward`` down, helpers included: torch.export keeps only the frames of
    ``forward`` methods, which would name the line that calls a helper (``self.rope(k)``), not
    the helper's line that computes the value. torch's tracer makes this its one place to
    choose frames (``TracerBase._filter_traceback_frames``); where it has none, the traces
    stay as torch.export records them."""
    tracer = getattr(torch.fx.proxy, "TracerBase", None)
    original = getattr(tracer, "_filter_traceback_frames", None)
    if original is None:
        yield
        return

    def from_the_first_forward(self, summary: traceback.StackSummary) -> traceback.StackSummary:
        for position, frame in enumerate(summary):
            if frame.name == "forward":
                return traceback.StackSummary.from_list(list(summary)[position:])
        return traceback.StackSummary.from_list([])

    tracer._filter_traceback_frames = from_the_first_forward
    try:
        yield
    finally:
        tracer._filter_traceback_frames = original
