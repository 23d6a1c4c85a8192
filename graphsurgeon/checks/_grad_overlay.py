"""The gradient overlays: ``"grad error"`` and ``"own grad error"`` (see
:mod:`graphsurgeon.checks.overlay`).

Both programs run forward with autograd on, node by node, keeping every value, and then
backward once from the same seeded upstream gradients at their outputs
(:func:`graphsurgeon.checks._grad.seeded_upstream`), which gives the gradient at every value.

* ``"grad error"``: each kept node's gradient (the gradient of the outputs, weighted by the
  upstream gradients, with respect to its value) against the original's at the node of the
  same name; a swapped call: the worst of the gradients of its parameters and of the values it
  reads. A wrong backward shows at its call and at everything *before* it (gradients flow
  from the outputs to the inputs), as a wrong forward shows at everything after it.
* ``"own grad error"``: each swapped call's own backward: the original nodes of the call and
  the replacement run on the original's values at the call's inputs, backward from the
  original's gradient at the call's outputs; the worst of the gradients of its inputs and
  parameters. Kept nodes give 0 (autograd differentiates the same op on both sides), so the
  calls whose backward is wrong are the only ones lit.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx import GraphModule, Node

from .. import _meta
from ..errors import CompareError, GraphSurgeonError
from ..partition import split_call_name
from ._compare_backward import NO_UPSTREAM, compare_call_backward
from ._exec import (
    NodeRunner,
    RandomState,
    bind_inputs,
    clone_inputs,
    original_nodes,
    runnable_original,
)
from ._grad import differentiable, seeded_upstream
from .verify import _first_line, in_order_of

__all__ = ["grad_errors"]


class _GradRun:
    """One program run forward with autograd on, every value kept by node name (a fused
    call's nodes by their own names), then backward: the gradient at every value."""

    def __init__(self, gm: GraphModule, args: tuple, kwargs: dict, which: str, expand=()):
        self.which = which
        self.values: dict[str, Any] = {}
        leaves, spec = pytree.tree_flatten((clone_inputs(args), clone_inputs(kwargs)))
        leaves = [
            leaf.detach().requires_grad_(True) if differentiable(leaf) else leaf for leaf in leaves
        ]
        call_args, call_kwargs = pytree.tree_unflatten(leaves, spec)
        runner = NodeRunner(gm, bind_inputs(gm, call_args, call_kwargs, CompareError))
        self.runner = runner
        self.parameters = {
            name: p for name, p in gm.named_parameters(remove_duplicate=False) if p.requires_grad
        }
        node = None
        try:
            with torch.enable_grad():
                for node in runner.nodes:
                    if node.name in expand:
                        value = runner.env[node] = self._run_inside(node)
                    else:
                        value = runner.run(node)
                    self.values[node.name] = value
        except GraphSurgeonError:
            raise
        except Exception as error:
            cause = str(error).split("\n\n", 1)[0]
            raise CompareError(
                f"overlay: running the {which} with autograd on failed at node "
                f"{getattr(node, 'name', '?')!r}: {type(error).__name__}: {cause}"
            ) from error
        self.output = self.values[runner.nodes[-1].name]
        self.gradients: dict[str, Any] = {}
        self.parameter_gradients: dict[str, torch.Tensor | None] = {}

    def _run_inside(self, node: Node) -> Any:
        module, args, kwargs = self.runner.call(node)
        inner = self.runner.inner(node, module, bind_inputs(module, args, kwargs, CompareError))
        result = None
        for each in inner.nodes:
            value = inner.run(each)
            if each.op == "output":
                result = value
            else:
                self.values[each.name] = value
        return result

    def backward(self, upstream: tuple) -> None:
        """Backward from ``upstream`` (one tensor or None per output leaf): fills
        :attr:`gradients` (node name -> gradients of its tensor leaves) and
        :attr:`parameter_gradients` (fqn -> gradient)."""
        outs = pytree.tree_leaves(self.output)
        pairs = [
            (leaf, grad)
            for leaf, grad in zip(outs, upstream)
            if grad is not None and differentiable(leaf) and leaf.requires_grad
        ]
        wanted: list[torch.Tensor] = []
        slots: list[tuple[str, int]] = []
        for name, value in self.values.items():
            for position, leaf in enumerate(pytree.tree_leaves(value)):
                if differentiable(leaf) and leaf.requires_grad:
                    wanted.append(leaf)
                    slots.append((name, position))
        params = list(self.parameters.items())
        wanted.extend(p for _, p in params)
        if not pairs or not wanted:
            return
        try:
            grads = torch.autograd.grad(
                [leaf for leaf, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True
            )
        except Exception as error:
            raise CompareError(
                f"overlay: the backward of the {self.which} failed: {type(error).__name__}: "
                f"{_first_line(error)}"
            ) from error
        for (name, position), grad in zip(slots, grads):
            self.gradients.setdefault(name, {})[position] = grad
        for (name, _), grad in zip(params, grads[len(slots) :]):
            self.parameter_gradients[name] = grad

    def gradient_leaves(self, name: str) -> list[torch.Tensor | None]:
        """The gradient at each tensor leaf of node ``name``'s value (None where none flows)."""
        value = self.values.get(name)
        found = self.gradients.get(name, {})
        return [found.get(i) for i in range(len(pytree.tree_leaves(value)))]


def _pairs_ratio(actual: list, expected: list, ratio, rtol: float, atol: float) -> float | None:
    """The worst ratio over paired gradients; a gradient flowing on one side only is compared
    with zeros; None when no gradient flows on either side."""
    found = []
    for a, e in zip(actual, expected):
        if a is None and e is None:
            continue
        if a is None:
            a = torch.zeros_like(e)
        elif e is None:
            e = torch.zeros_like(a)
        found.append(ratio(a.detach(), e.detach(), rtol, atol))
    measured = [v for v in found if v is not None]
    return max(measured) if measured else None


def grad_errors(
    target: Any, args: tuple, kwargs: dict, rtol: float, atol: float, own: bool, ratio
) -> dict[str, float]:
    """The value of every drawn node for ``"grad error"`` (``own`` False) or
    ``"own grad error"``. ``target``: the overlay's ``_Target`` (a swap result and its
    original); ``ratio``: the overlay's error measure of two tensors."""
    ep, module, info = target.ep, target.module, target.info
    original, same = runnable_original(ep), original_nodes(ep)
    fused = target.fused
    start = RandomState()
    try:
        reference = _GradRun(original, args, kwargs, "original program")
        start.restore()
        swapped = _GradRun(module, args, kwargs, "swapped program", expand=fused)
    finally:
        start.restore()
    upstream = seeded_upstream(reference.output)
    reference.backward(upstream)
    holders: dict[str, list[str]] = {}
    for old, new in info.node_map.items():
        if old in same:
            holders.setdefault(new, []).append(same[old].name)
    swapped_calls = {info.call_nodes[c]: c for c in info.calls if c not in info.fused}
    graph_nodes = {node.name: node for node in module.graph.nodes}
    values: dict[str, float] = {}
    if own:
        for name in swapped.values:
            values[name] = 0.0
        for node_name, call in swapped_calls.items():
            found = _own_call(
                target, call, graph_nodes[node_name], reference, swapped, holders, same, rtol, atol
            )
            if found is not None:
                values[node_name] = found
        return values
    start.restore()
    swapped.backward(upstream)
    for name in swapped.values:
        node = graph_nodes.get(name)
        if name in swapped_calls:
            continue
        # a fused call's nodes carry the original's names; kept nodes their holders'
        counterparts = holders.get(name) or (
            [name] if node is None and name in reference.values else []
        )
        if not counterparts:
            continue
        worst = _pairs_ratio(
            swapped.gradient_leaves(name),
            reference.gradient_leaves(counterparts[0]),
            ratio,
            rtol,
            atol,
        )
        if worst is not None:
            values[name] = worst
    for node_name, call in swapped_calls.items():
        node = graph_nodes[node_name]
        found = [values[n.name] for n in node.all_input_nodes if n.name in values]
        fqn = split_call_name(call)[0]
        prefix = f"{fqn}." if fqn else ""
        for name, grad in swapped.parameter_gradients.items():
            if name.startswith(prefix) and name in reference.parameter_gradients:
                worst = _pairs_ratio(
                    [grad], [reference.parameter_gradients[name]], ratio, rtol, atol
                )
                if worst is not None:
                    found.append(worst)
        if found:
            values[node_name] = max(found)
    return values


def _own_call(target, call, node, reference, swapped, holders, same, rtol, atol):
    """A swapped call's own backward error: the original nodes of the call and the
    replacement, on the original's values at the call's inputs, backward from the original's
    gradient at the call's outputs; the worst tolerance ratio of their gradients."""
    info = target.info

    def original_value(arg: Any) -> Any:
        if not isinstance(arg, Node):
            return arg
        found = holders.get(arg.name)
        value = reference.values[found[0]] if found else swapped.values[arg.name]
        return pytree.tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, value)

    args = tuple(
        pytree.tree_map(original_value, tuple(node.args), is_leaf=lambda v: isinstance(v, Node))
    )
    kwargs = dict(
        pytree.tree_map(original_value, dict(node.kwargs), is_leaf=lambda v: isinstance(v, Node))
    )
    part = info.partitions[call]
    signature = part.signature
    upstream, expected_leaves = [], []
    for argument in signature.outputs:
        original = None if _meta.is_constant(argument) else same.get(argument.name)
        grads = reference.gradient_leaves(original.name) if original is not None else []
        upstream.append(grads[0] if len(grads) == 1 else None)
        expected_leaves.append(
            getattr(argument, "value", None)
            if original is None
            else reference.values[original.name]
        )
    # the upstream gradients, in the order of the replacement's outputs (a dict's keys may
    # come in another order), and the call's two backwards compared as compare compares them
    output = swapped.values[node.name]
    in_original_order = pytree.tree_unflatten(upstream, signature.out_spec)
    reordered = in_order_of(output, in_original_order)
    found = compare_call_backward(
        target.ep,
        call,
        part,
        target.module.get_submodule(str(node.target)),
        (args, kwargs),
        output,
        pytree.tree_unflatten(expected_leaves, signature.out_spec),
        pytree.tree_leaves(reordered, is_leaf=lambda v: v is None),
        RandomState(),
        rtol,
        atol,
    )
    if found.ok is None and not found.leaves:
        if found.note == NO_UPSTREAM:
            return None  # nothing downstream needs a gradient of this call
        raise CompareError(f"overlay: the backward of call {call!r} could not run: {found.note}")
    if found.ok is False and not found.leaves:  # the replacement's backward failed
        return math.inf
    ratios = [
        c.tolerance_ratio if c.values_compared else (0.0 if c.ok else math.inf)
        for c in found.leaves
    ]
    return max(ratios, default=None)
