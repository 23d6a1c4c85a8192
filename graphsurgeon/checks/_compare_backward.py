"""The backward half of ``compare(..., backward=True)``.

The swapped program runs forward with autograd on and backward from the seeded upstream
gradients at its outputs (:func:`graphsurgeon.checks._grad.seeded_upstream`); a hook on each
swapped call's outputs keeps the gradient that reaches them. Each call is then run twice more,
the original partition and the replacement, forward with autograd on from the inputs the call
received and backward from that same upstream gradient; the gradients of the call's inputs and
parameters are compared by name as :func:`graphsurgeon.verify` compares a program's
(:func:`~graphsurgeon.checks.verify.compare_gradients`). Every backward runs through
:func:`~graphsurgeon.checks._grad.run_backward`: nothing is accumulated into any ``.grad``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx import GraphModule

from ..fuse import fused_call
from ._exec import RandomState, bind_inputs, clone_inputs, keep_state
from ._grad import Backward, differentiable, input_labels, run_backward
from .verify import LeafCheck, _first_line, compare_gradients, in_order_of

# what a call's backward note says when nothing downstream needs its gradient
NO_UPSTREAM = "no gradient reaches its outputs (nothing downstream needs one): not differentiated"


def detached_copy(value: Any) -> Any:
    """A copy of ``value`` with every tensor detached and cloned (a tensor that appears twice
    stays one tensor): what a call received, cut from the run's autograd graph."""
    seen: dict[int, torch.Tensor] = {}

    def detach(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if id(leaf) not in seen:
            seen[id(leaf)] = leaf.detach()
        return seen[id(leaf)]

    return clone_inputs(pytree.tree_map(detach, value))


def catch_upstream(output: Any, into: list[torch.Tensor | None]) -> None:
    """Hook every output leaf that needs a gradient so that the gradient reaching it in the
    run's backward lands in ``into`` (one slot per leaf, pytree order; None where none does)."""
    leaves = pytree.tree_leaves(output)
    into[:] = [None] * len(leaves)
    for position, leaf in enumerate(leaves):
        if differentiable(leaf) and leaf.requires_grad:

            def keep(grad: torch.Tensor, position: int = position) -> None:
                into[position] = grad.detach().clone()

            leaf.register_hook(keep)


def program_backward(
    recorder: torch.fx.Interpreter,
    gm: GraphModule,
    args: tuple,
    kwargs: Mapping[str, Any],
    labels: list[str],
    upstream: Any,
) -> Backward:
    """Run ``gm`` through ``recorder`` (an Interpreter on private state) with autograd on and
    backward from ``upstream`` (None: seeded): the gradients of the program's floating inputs
    and of its parameters, named as verify names them."""

    def forward(*call_args: Any, **call_kwargs: Any) -> Any:
        flat = recorder.run(*bind_inputs(gm, call_args, call_kwargs), enable_io_processing=False)
        return gm.graph.process_outputs(flat)

    run = run_backward(
        forward,
        clone_inputs(args),
        clone_inputs(dict(kwargs)),
        labels,
        upstream,
        parameters=dict(gm.named_parameters()),
    )
    buffers = len(list(gm.buffers()))  # said as run_backward says it of a module
    if buffers:
        run = dataclasses.replace(
            run, skipped=(*run.skipped, f"{buffers} buffer{'s' if buffers != 1 else ''}")
        )
    return run


@dataclass(frozen=True)
class CallBackward:
    """A call's two backward runs compared: ``ok`` None when nothing was checked."""

    ok: bool | None
    leaves: tuple[LeafCheck, ...] = ()
    note: str = ""
    # what locate needs to run the two backwards again
    upstream: tuple[torch.Tensor | None, ...] = ()
    original_upstream: tuple[torch.Tensor | None, ...] = ()
    labels: tuple[str, ...] = ()


def call_parameters(call: str, module: Any) -> dict[str, torch.Tensor]:
    """A call's parameters by their full name: ``call + "." + name`` inside the module."""
    if not isinstance(module, torch.nn.Module):
        return {}
    return {f"{call}.{name}": p for name, p in module.named_parameters()}


def compare_call_backward(
    ep: Any,
    name: str,
    part: Any,
    replacement: Any,
    inputs: tuple[tuple, dict],
    output: Any,
    original_output: Any,
    upstream: list[torch.Tensor | None] | None,
    random: RandomState,
    rtol: float,
    atol: float,
) -> CallBackward:
    """The original partition and the replacement, each forward from ``inputs`` and backward
    from ``upstream`` (the gradient that reached the call's outputs in the swapped run)."""
    if not upstream or all(grad is None for grad in upstream):
        return CallBackward(None, note=NO_UPSTREAM)
    args, kwargs = inputs
    labels = input_labels(replacement, tuple(args), dict(kwargs))
    # the original's outputs may hold a dict's keys in another order than the replacement's
    structured = pytree.tree_unflatten(list(upstream), pytree.tree_structure(output))
    ordered = in_order_of(original_output, structured)
    original_upstream = tuple(pytree.tree_leaves(ordered, is_leaf=lambda v: v is None))
    if len(original_upstream) != len(pytree.tree_leaves(original_output)):
        original_upstream = tuple(upstream)
    module = fused_call(ep, name, part)
    random.restore()
    try:
        with keep_state([module]):
            expected = run_backward(
                module,
                *clone_inputs((tuple(args), dict(kwargs))),
                labels,
                original_upstream,
                parameters=call_parameters(name, module),
            )
    except Exception as error:
        return CallBackward(
            None,
            note=f"the original's backward could not run: {type(error).__name__}: "
            f"{_first_line(error)}",
        )
    if expected.problem:
        return CallBackward(None, note=f"the original: {expected.problem}")
    random.restore()
    try:
        with keep_state([replacement]):
            actual = run_backward(
                replacement,
                *clone_inputs((tuple(args), dict(kwargs))),
                labels,
                tuple(upstream),
                parameters=call_parameters(name, replacement),
            )
    except Exception as error:  # a backward that fails is one that differs: say how
        return CallBackward(
            False,
            note=f"the replacement's forward and backward failed: {type(error).__name__}: "
            f"{_first_line(error)}",
        )
    checks, notes = compare_gradients(expected, actual, rtol=rtol, atol=atol)
    if actual.problem:
        notes = (f"the replacement: {actual.problem}", *notes)
    return CallBackward(
        all(check.ok for check in checks),
        checks,
        "; ".join(notes),
        tuple(upstream),
        original_upstream,
        tuple(labels),
    )
