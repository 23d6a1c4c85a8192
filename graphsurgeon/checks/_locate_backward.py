"""locate() in a call's backward: the first op of the replacement's backward that computes
something the original's backward never computes, while its inputs agree.

When a call's outputs match and its gradients do not (``compare(..., backward=True)``), the
two backwards run again from the very inputs and upstream gradient the call had, each under a
dispatch mode that keeps every op it runs: every value of the original partition's forward
and backward is kept to match against (:class:`~graphsurgeon.checks.locate._Values`, as the
forward locate matches values: same shape and dtype, within the comparison's tolerances);
every op of the replacement's backward is kept with its inputs, its output and where it ran
from. Then, from the gradients that differ, the walk goes back through the ops that made them:

* an op of the replacement's backward *carries the difference* when it makes a gradient that
  differs, or its value matches no value of the original and one of its users carries it;
* the culprit is the first such op whose tensor inputs all agree: each matches a value of
  the original, or is the upstream gradient or a value saved from the forward (anything not
  made inside the backward).

The :class:`~graphsurgeon.checks.locate.Location` has the op (``.op``, its arguments as
shapes), its line (``.source``, ``.line``, ``.file``), what its inputs are (``.inputs``: the
upstream gradient, a value saved from the forward, a value of the backward and which value of
the original it equals) and, as ``.node``, the autograd node whose backward ran it
(``"PlantedRMSNormFunctionBackward"``, ``"MulBackward0"``).

Its line: in a ``torch.autograd.Function``, the line of its ``backward`` that runs the op (the
innermost frame of the user's code). For an op autograd runs on its own (the derivative of a
forward op), the forward line whose derivative it is, read from the autograd node's record of
where it was made (anomaly mode keeps it while the forward runs); when one of that op's inputs
was detached in the forward by the user's code, the line of the ``detach`` (the derivative is
right for what it is given; the gradient the detach keeps from flowing is what is missing), and
``.stack`` says both.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _meta
from ..fuse import fused_call
from ._compare_backward import call_parameters
from ._exec import clone_inputs, keep_state
from ._grad import run_backward
from .locate import (
    CallRecord,
    Location,
    _code_line,
    _comparable,
    _Finer,
    _first_line,
    _frames,
    _is_library,
    _is_torch,
    _judge,
    _SourceFrame,
    _tensors,
    _Values,
    _Verdict,
    locate_call,
    not_located,
)
from .verify import LeafCheck

__all__ = ["BackwardRecord", "locate_backward"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True, eq=False)
class BackwardRecord:
    """What a call's backward ran from in compare: the upstream gradient at the replacement's
    outputs (and the same, in the original's output order), the input labels, and the checks
    of its gradients."""

    upstream: tuple[torch.Tensor | None, ...]
    original_upstream: tuple[torch.Tensor | None, ...]
    labels: tuple[str, ...]
    gradients: tuple[LeafCheck, ...]
    note: str = ""  # the call's backward note (why its backward failed, when it did)


def locate_backward(record: CallRecord) -> Location:
    """The op of ``record``'s replacement's backward where its gradients start to differ
    (computed once per record, as :func:`~graphsurgeon.checks.locate.locate_call` keeps it).
    The caller's random stream is left as it was."""
    return locate_call(record, _locate)


@dataclass
class _Op:
    func: Any
    args: tuple
    kwargs: dict
    output: Any
    backward: bool  # run by autograd's backward (else by the forward)
    frame: _SourceFrame | None = None  # the user's frame that ran it, in a backward by hand
    node: Any = None  # the autograd node whose backward ran it


class _Ops(TorchDispatchMode):
    """Keeps every op run under it (with ``where``, also the user's frame that ran it and the
    autograd node whose backward it belongs to)."""

    def __init__(self, where: bool = False):
        super().__init__()
        self.ops: list[_Op] = []
        self.where = where

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        node = _current_autograd_node()
        op = _Op(func, args, kwargs, output, node is not None)
        if self.where and node is not None:
            op.frame, op.node = _user_frame(), node
        elif self.where and func is torch.ops.aten.detach.default:
            op.frame = _user_frame()  # a detach in the user's forward cuts a derivative
        self.ops.append(op)
        return output


# the autograd node whose backward is running now (None in a forward); a torch without it sees
# no backward ops, and locate then says it found none
_current_autograd_node = getattr(torch._C, "_current_autograd_node", lambda: None)


def _user_frame() -> _SourceFrame | None:
    """The innermost frame of the user's code running the current op, or None when the op is
    run by autograd on its own (the first frame outside torch is graphsurgeon's own call)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if path == __file__ or _is_torch(path):
            frame = frame.f_back
            continue
        if os.path.abspath(path).startswith(_PACKAGE_DIR + os.sep):
            return None
        return _SourceFrame(path, frame.f_lineno, frame.f_code.co_name, "")
    return None


def _forward_frame(node: Any) -> _SourceFrame | None:
    """Where the forward op an autograd node differentiates was run: the innermost frame of the
    user's code in the node's record (kept while the forward ran in anomaly mode)."""
    metadata = getattr(node, "metadata", None)
    trace = metadata.get("traceback_") if isinstance(metadata, dict) else None
    if isinstance(trace, list):
        trace = "".join(trace)
    frames = [
        f
        for f in _frames(trace)
        if not os.path.abspath(f.path).startswith(_PACKAGE_DIR + os.sep) and not _is_library(f.path)
    ]
    return frames[-1] if frames else None


def _key(tensor: torch.Tensor) -> tuple:
    """A tensor's identity that survives ``detach``: its memory, place in it and layout."""
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def _plain(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and _comparable(value)


def _locate(record: CallRecord) -> Location:
    call, kind = record.call, type(record.replacement).__name__
    part = record.backward
    tensors = [t for t in pytree.tree_leaves(record.inputs) if isinstance(t, torch.Tensor)]
    if any(t.device.type == "meta" for t in tensors):
        return not_located(
            call, "the call ran on the meta device: its gradients hold no numbers", kind
        )
    if not part.gradients:
        return not_located(
            call, f"its backward was not compared gradient by gradient: {part.note}", kind
        )
    args, kwargs = record.inputs
    labels = list(part.labels)
    # the original: every value of its forward and backward, to match against
    module = fused_call(record.program, record.call, record.partition)
    originals = _Values(record.rtol, record.atol)
    # every value, and the steps of the fused ops it runs (a layer norm's backward is one op,
    # native_layer_norm_backward, whose steps a hand-written backward writes out one by one)
    seen = _Finer(originals.add)
    seen.node = call
    record.random.restore()
    with keep_state([module]), seen:
        run_backward(
            module,
            *clone_inputs((tuple(args), dict(kwargs))),
            labels,
            part.original_upstream,
            parameters=call_parameters(call, module),
        )
    for grad in part.original_upstream:
        originals.add("the upstream gradient", None, grad)
    # the replacement: every op of its backward, where it ran from
    ran = _Ops(where=True)
    record.random.restore()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # anomaly mode says it is slow; it is, and brief
            with (
                keep_state([record.replacement]),
                torch.autograd.detect_anomaly(check_nan=False),
                ran,
            ):
                actual = run_backward(
                    record.replacement,
                    *clone_inputs((tuple(args), dict(kwargs))),
                    labels,
                    part.upstream,
                    parameters=call_parameters(call, record.replacement),
                )
    except Exception as error:
        return not_located(
            call, f"the replacement's backward fails to run again: {_first_line(error)}", kind
        )
    bad = {leaf.path for leaf in part.gradients if not leaf.ok}
    ops = [op for op in ran.ops if op.backward]
    producer: dict[tuple, int] = {}
    inputs: list[set[int]] = []
    users: list[set[int]] = [set() for _ in ops]
    for index, op in enumerate(ops):
        made = {
            producer[_key(t)]
            for t in pytree.tree_leaves((op.args, op.kwargs))
            if _plain(t) and _key(t) in producer
        }
        inputs.append(made)
        for source in made:
            users[source].add(index)
        for t in _tensors(op.output):
            if _plain(t):
                producer[_key(t)] = index
    differing = {
        producer[_key(grad)]
        for label, grad in actual.gradients.items()
        if label in bad and _plain(grad) and _key(grad) in producer
    }
    detaches = [o for o in ran.ops if not o.backward and o.frame is not None]
    if not differing and detaches:
        # the gradient that differs is passed on as it is (a straight-through trick): no op of
        # the backward makes it, the detach in the forward decides where it flows
        first = detaches[0]
        return Location(
            call,
            True,
            op=_op_text(first),
            source=first.frame.where,
            line=_code_line(first.frame),
            file=first.frame.path,
            stack=(
                f"{first.frame.where} in {first.frame.function} (detached: no gradient flows "
                "back through it; the gradients that differ are passed on unchanged)",
            ),
            replacement=kind,
            backward=True,
        )
    if not differing:
        return not_located(
            call,
            "no op of the replacement's backward makes the gradients that differ (they are "
            "its inputs or upstream gradient passed on, or made outside autograd's ops)",
            kind,
        )
    verdicts = [_judge(op.output, originals) for op in ops]
    carriers: set[int] = set()
    for index in reversed(range(len(ops))):
        if index in differing or (
            not verdicts[index].matches and any(u in carriers for u in users[index])
        ):
            carriers.add(index)
    roots = [i for i in sorted(carriers) if not any(j in carriers for j in inputs[i])]
    culprit = roots[0] if roots else min(differing)
    op = ops[culprit]
    frame, derivative, detached = op.frame, False, None
    if frame is None:
        frame, derivative = _forward_frame(op.node), True
        detached = _detached_input(op, ran.ops)
    verdict = verdicts[culprit]
    if verdict.matches:  # it makes a gradient that differs, from values the original has
        verdict = _Verdict(False)
    node = op.node.name() if op.node is not None and hasattr(op.node, "name") else ""
    where: dict[str, Any] = {}  # no frame recorded: the op alone
    if frame is not None:
        stack = (f"{frame.where} in {frame.function}",)
        if derivative:
            stack = (f"{frame.where} in {frame.function} (the derivative autograd takes of it)",)
        if detached is not None:
            # the derivative is right for what it is given; what it is given was cut from
            # the graph
            stack = (
                *stack,
                f"{detached.where} in {detached.function} (detached: no gradient flows back)",
            )
            frame = detached
        where = {"source": frame.where, "line": _code_line(frame), "file": frame.path}
        where["stack"] = stack
    return Location(
        call,
        True,
        op=_op_text(op),
        **where,
        node=node,
        inputs=_inputs_text(op, inputs[culprit], ops, verdicts, part),
        nearest=verdict.nearest,
        max_abs=verdict.nearest_error,
        replacement=kind,
        backward=True,
    )


def _detached_input(op: _Op, ops: list[_Op]) -> _SourceFrame | None:
    """The user's line that detached one of the op's inputs in the forward, if one did: the
    derivative autograd takes is then right for what it is given, and the gradient that the
    detach keeps from flowing is what is missing."""
    detaches = {
        _key(o.output): o.frame
        for o in ops
        if not o.backward and o.frame is not None and _plain(o.output)
    }
    for t in pytree.tree_leaves((op.args, op.kwargs)):
        if _plain(t) and _key(t) in detaches:
            return detaches[_key(t)]
    return None


def _inputs_text(
    op: _Op, made: set[int], ops: list[_Op], verdicts: list[_Verdict], part: BackwardRecord
) -> tuple[str, ...]:
    """What each tensor input of the op is: the upstream gradient, a value saved from the
    forward, or a value of the backward (and which value of the original it equals)."""
    upstream = {_key(g) for g in part.upstream if _plain(g)}
    by_key = {}
    for index in made:
        for t in _tensors(ops[index].output):
            if _plain(t):
                by_key[_key(t)] = index
    said = []
    for t in pytree.tree_leaves((op.args, op.kwargs)):
        if not isinstance(t, torch.Tensor):
            continue
        shape = _meta.tensor_text(t.shape, t.dtype)
        key = _key(t) if _plain(t) else None
        if key in by_key:
            verdict = verdicts[by_key[key]]
            same = f"= {verdict.nearest}" if verdict.matches and verdict.nearest else "matches"
            said.append(f"{shape}: made in the backward, {same}")
        elif key in upstream:
            said.append(f"{shape}: the upstream gradient")
        else:
            said.append(f"{shape}: saved from the forward (or a parameter)")
    return tuple(said)


def _op_text(op: _Op) -> str:
    def shown(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return _meta.tensor_text(value.shape, value.dtype)
        if isinstance(value, (list, tuple)):
            inner = ", ".join(shown(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner})"
        return repr(value) if not isinstance(value, torch.dtype) else str(value)

    parts = [shown(a) for a in op.args] + [f"{k}={shown(v)}" for k, v in op.kwargs.items()]
    text = f"{op.func}({', '.join(parts)})"
    return text if len(text) <= 240 else text[:239] + "…"
