"""The backward half of a check: run a program forward with autograd on, then backward from
given upstream gradients, and keep the gradient of every floating input and parameter by name.

Every check that looks at gradients (``verify(backward=True)``, ``compare(backward=True)``,
``bisect(backward=True)``, the "grad error" overlays) reads them here, so the names
("grad of layers.3.norm.weight", "grad of input x"), the seeded upstream gradients and what is
not differentiated are decided once.

Gradients are taken with :func:`torch.autograd.grad`: nothing is accumulated into any
``.grad``, so the user's model, parameters and program are left as they were.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import GraphSurgeonError, VerifyError, a_type

__all__ = [
    "Backward",
    "differentiable",
    "gradient_label",
    "input_labels",
    "run_backward",
    "seeded_upstream",
    "upstream_leaves",
]

#: the seed of the upstream gradients when none are given: the same gradients every run, drawn
#: from a generator of their own (the caller's random stream is not touched)
UPSTREAM_SEED = 0


def differentiable(value: Any) -> bool:
    """Whether autograd can differentiate with respect to ``value``: a floating or complex
    tensor (integers, bools and everything else are not differentiated)."""
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())


def gradient_label(name: str) -> str:
    """The one name of a gradient in every report: ``"grad of layers.3.norm.weight"``."""
    return f"grad of {name}"


def input_labels(program: Any, args: tuple, kwargs: Mapping[str, Any]) -> list[str]:
    """A name for every leaf of ``(args, kwargs)``, in pytree order: ``"input x"`` from the
    forward's signature where it binds (``"input x[0]"`` inside a tuple), else
    ``"input args[0]"`` / ``"input kwargs['mask']"``.

    Example:
        >>> import torch
        >>> input_labels(torch.nn.Linear(2, 2), (torch.ones(2),), {})
        ['input input']
    """
    names = None
    try:
        forward = program.forward if isinstance(program, torch.nn.Module) else program
        bound = inspect.signature(forward).bind(*args, **kwargs)
        names = list(bound.arguments)
        kinds = {n: p.kind for n, p in bound.signature.parameters.items()}
        if any(
            kinds[n] in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            for n in names
        ):
            names = None  # *args or **kwargs: positions say more than the signature
    except (TypeError, ValueError):
        names = None
    labels = []
    positional = len(args)
    for index, value in enumerate([*args, *kwargs.values()]):
        if names is not None and index < len(names) and index < positional:
            base = f"input {names[index]}"
        elif index < positional:
            base = f"input args[{index}]"
        else:
            key = list(kwargs)[index - positional]
            base = f"input {key}" if names is not None else f"input kwargs[{key!r}]"
        paths, _ = pytree.tree_flatten_with_path(value)
        labels.extend(base + pytree.keystr(path) for path, _ in paths)
    return labels


@dataclass(frozen=True)
class Backward:
    """One program run forward with autograd on and then backward.

    Attributes:
        outputs: the forward's outputs, detached.
        upstream: the upstream gradient used for each output leaf (pytree order), None where
            the leaf needs no gradient.
        gradients: ``{label: gradient}`` for every floating input leaf and every parameter
            that requires grad (label from :func:`gradient_label`); None where no gradient
            flows (the value is not used by any output that needs one).
        skipped: what was not differentiated, in words ("input ids (torch.int64)",
            "2 buffers", "parameter rope.freq: requires_grad=False").
        problem: why backward could not run ('' when it did): no output needs a gradient,
            or autograd failed.
    """

    outputs: Any
    upstream: tuple[torch.Tensor | None, ...]
    gradients: dict[str, torch.Tensor | None]
    skipped: tuple[str, ...]
    problem: str = ""


def upstream_leaves(outputs: Any) -> list[bool]:
    """For each output leaf (pytree order), whether a gradient flows back from it."""
    return [differentiable(leaf) and leaf.requires_grad for leaf in pytree.tree_leaves(outputs)]


def seeded_upstream(outputs: Any, seed: int = UPSTREAM_SEED) -> tuple[torch.Tensor | None, ...]:
    """A standard-normal upstream gradient for each output leaf that needs one (None for the
    others), from a generator seeded with ``seed``: the same every run, for both sides.

    Example:
        >>> import torch
        >>> out = torch.ones(3, requires_grad=True) * 2
        >>> a, = seeded_upstream(out); b, = seeded_upstream(out)
        >>> bool(torch.equal(a, b)), tuple(a.shape)
        (True, (3,))
    """
    generator = torch.Generator().manual_seed(seed)
    upstream = []
    for leaf, flows in zip(pytree.tree_leaves(outputs), upstream_leaves(outputs)):
        if not flows:
            upstream.append(None)
            continue
        dtype = torch.complex64 if leaf.is_complex() else torch.float32
        drawn = torch.randn(leaf.shape, generator=generator, dtype=dtype)
        upstream.append(drawn.to(dtype=leaf.dtype, device=leaf.device))
    return tuple(upstream)


def given_upstream(
    grad_outputs: Any, outputs: Any, where: str, error: type[GraphSurgeonError] = VerifyError
) -> tuple[torch.Tensor | None, ...]:
    """The caller's ``grad_outputs`` as one tensor (or None) per output leaf, checked against
    the outputs: same structure (a lone tensor for a lone output), same shapes; ``error`` is
    what a mismatch raises (the verb's own error class)."""
    out_leaves = pytree.tree_leaves(outputs)
    if isinstance(grad_outputs, torch.Tensor) and len(out_leaves) == 1:
        given = [grad_outputs]
    else:
        given = pytree.tree_leaves(grad_outputs, is_leaf=lambda v: v is None)
        if len(given) != len(out_leaves):
            raise error(
                f"{where}grad_outputs has {len(given)} leaves, the reference returns "
                f"{len(out_leaves)}; pass one gradient (or None) per output leaf, in the "
                "structure of the outputs, or leave grad_outputs=None for seeded random ones"
            )
    upstream = []
    for index, (grad, leaf) in enumerate(zip(given, out_leaves)):
        if grad is None:
            upstream.append(None)
            continue
        if not isinstance(grad, torch.Tensor):
            raise error(
                f"{where}grad_outputs leaf {index}: expected a tensor or None, got {a_type(grad)}"
            )
        if not isinstance(leaf, torch.Tensor) or grad.shape != leaf.shape:
            shape = list(leaf.shape) if isinstance(leaf, torch.Tensor) else a_type(leaf)
            raise error(
                f"{where}grad_outputs leaf {index} has shape {list(grad.shape)}; the output "
                f"there is {shape}: pass a gradient of the output's shape"
            )
        upstream.append(grad.detach())
    return tuple(upstream)


def run_backward(
    module: Any,
    args: tuple,
    kwargs: Mapping[str, Any],
    labels: list[str],
    upstream: Any = None,
    *,
    parameters: Mapping[str, torch.Tensor] | None = None,
) -> Backward:
    """Run ``module(*args, **kwargs)`` with autograd on and backward from ``upstream``.

    ``args``/``kwargs`` are used as given (pass copies): their floating tensor leaves are
    detached and made to require grad, so each gets a gradient of its own. ``labels`` names
    the input leaves (:func:`input_labels`). ``upstream``: a tuple from
    :func:`seeded_upstream` or :func:`given_upstream`, a function of the outputs that
    returns one, or None for seeded ones.
    ``parameters``: ``{name: tensor}`` to differentiate besides the inputs (default: the
    module's ``named_parameters()``); those with ``requires_grad=False`` are skipped.
    The caller puts the module's state back (``keep_state``): buffers a training-mode forward
    writes are not this function's business.
    """
    flat, spec = pytree.tree_flatten((args, dict(kwargs)))
    skipped: list[str] = []
    leaves: list[Any] = []
    wanted: list[tuple[str, torch.Tensor]] = []
    for label, leaf in zip(labels, flat):
        if differentiable(leaf):
            leaf = leaf.detach().requires_grad_(True)
            wanted.append((label, leaf))
        elif isinstance(leaf, torch.Tensor):
            skipped.append(f"{label} ({leaf.dtype})")
        leaves.append(leaf)
    call_args, call_kwargs = pytree.tree_unflatten(leaves, spec)
    if parameters is None:
        parameters = dict(module.named_parameters()) if isinstance(module, torch.nn.Module) else {}
    seen: set[int] = {id(t) for _, t in wanted}
    for name, parameter in parameters.items():
        if not parameter.requires_grad:
            skipped.append(f"parameter {name}: requires_grad=False")
        elif id(parameter) not in seen:
            seen.add(id(parameter))
            wanted.append((name, parameter))
    buffers = len(list(module.buffers())) if isinstance(module, torch.nn.Module) else 0
    if buffers:
        skipped.append(f"{buffers} buffer{'s' if buffers != 1 else ''}")
    with torch.enable_grad():
        outputs = module(*call_args, **call_kwargs)
        out_leaves = pytree.tree_leaves(outputs)
        if upstream is None:
            upstream = seeded_upstream(outputs)
        elif callable(upstream):  # made from the outputs (the caller's, checked against them)
            upstream = upstream(outputs)
        pairs = [
            (leaf, grad)
            for leaf, grad in zip(out_leaves, upstream)
            if grad is not None and differentiable(leaf) and leaf.requires_grad
        ]
        detached = pytree.tree_map(
            lambda v: v.detach() if isinstance(v, torch.Tensor) else v, outputs
        )
        names = [gradient_label(name) for name, _ in wanted]
        if not pairs:
            return Backward(
                detached,
                tuple(upstream),
                dict.fromkeys(names),
                tuple(skipped),
                "no output needs a gradient (integer outputs, or computed under no_grad or "
                "detached): nothing to differentiate",
            )
        if not wanted:
            return Backward(
                detached,
                tuple(upstream),
                {},
                tuple(skipped),
                "no floating input or parameter requires grad: nothing to differentiate",
            )
        grads = torch.autograd.grad(
            [leaf for leaf, _ in pairs],
            [tensor for _, tensor in wanted],
            [grad for _, grad in pairs],
            allow_unused=True,
        )
    gradients = {name: None if grad is None else grad.detach() for name, grad in zip(names, grads)}
    return Backward(detached, tuple(upstream), gradients, tuple(skipped))
