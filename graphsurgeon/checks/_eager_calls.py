"""What eager PyTorch passes a module, against what the exported program passes it.

A swap is checked against the eager model with the same replacement set on it (the *faithful*
verdict). When that check fails while the replacement computes what it replaced, the cause is
often not the replacement: eager calls the module with other arguments than the program does
(T5 calls its decoder self-attention with ``mask=None`` and relies on the attention's own
causal masking; the exported program passes the materialized bool mask). This module records
the eager calls of the swapped modules and says, argument by argument, where they differ from
the calls the program records (its preserved call signatures).

Example:
    >>> import torch, graphsurgeon as gs
    >>> class Inner(torch.nn.Module):
    ...     def forward(self, x, mask=None):
    ...         return x if mask is None else x * mask
    >>> class Outer(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.inner = Inner()
    ...     def forward(self, x):
    ...         mask = None if torch.compiler.is_exporting() else torch.ones_like(x)
    ...         return self.inner(x, mask)
    >>> x = torch.randn(2)
    >>> ep = gs.export(Outer(), (x,))
    >>> call_differences(ep, Outer(), {"inner": Inner()}, (x,), {})
    ("in eager, 'inner' gets mask=f32[2]; the program passes mask=None",)
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from .. import _meta
from ..partition import program_index, split_call_name
from ._exec import RandomState, clone_inputs, keep_state

__all__ = ["call_differences"]

# How many differences are said: the first few name the cause; more would bury it.
_SHOWN = 3


def call_differences(
    program: ExportedProgram,
    model: torch.nn.Module,
    replacements: Mapping[str, torch.nn.Module],
    args: tuple,
    kwargs: Mapping[str, Any],
) -> tuple[str, ...]:
    """Each swapped module whose eager call gets other arguments than the program's call, in
    words: ``"in eager, 'blk.attn' gets mask=None; the program passes mask=b8[1, 1, 6, 6]"``.

    The model runs once (under ``no_grad``, its state put back, from the caller's random state,
    which is left as it was), with a hook on each module named in ``replacements`` (every call of
    it: the k-th eager call is compared with the call ``name@k``). Arguments compare by the
    parameter names of the module's forward, defaults filled in: None against a tensor, a
    tensor's dtype or static sizes, a constant's value, a structure. Values of tensors are not
    compared (that is what compare does). Empty when every call agrees, or when the model cannot
    be run or hooked."""
    index = program_index(program)
    modules = dict(model.named_modules())
    seen: dict[str, list[tuple[tuple, dict]]] = {}
    handles = []
    for name in replacements:
        fqn, k = split_call_name(name)
        module = modules.get(fqn)
        if module is None or not fqn:
            continue

        def record(_module, call_args, call_kwargs, fqn=fqn):
            seen.setdefault(fqn, []).append((tuple(call_args), dict(call_kwargs)))

        handles.append(module.register_forward_pre_hook(record, with_kwargs=True))
    start = RandomState()
    try:
        with torch.no_grad(), keep_state([model]):
            model(*clone_inputs(tuple(args)), **clone_inputs(dict(kwargs)))
    except Exception:  # the faithful verdict stands; there is just nothing more to say
        return ()
    finally:
        start.restore()
        for handle in handles:
            handle.remove()
    said: list[str] = []
    for name in replacements:
        fqn, k = split_call_name(name)
        calls = index.calls_of.get(fqn, [])
        wanted = calls if k is None else [c for c in calls if split_call_name(c)[1] == k]
        for call in wanted:
            position = split_call_name(call)[1] or 0
            eager = seen.get(fqn, [])
            if position >= len(eager):
                continue
            difference = _first_difference(index, call, modules[fqn], *eager[position])
            if difference:
                said.append(difference)
                break  # one sentence per module
        if len(said) >= _SHOWN:
            break
    return tuple(said)


def _first_difference(index: Any, call: str, module: torch.nn.Module, args, kwargs) -> str:
    """How the eager call ``(args, kwargs)`` of ``module`` differs from the program's ``call``."""
    signature = index.signatures.get(call)
    if signature is None:
        return ""
    leaves = []
    for argument in signature.inputs:
        if _meta.is_constant(argument):
            leaves.append(getattr(argument, "value", None))
        else:
            node = index.by_name.get(argument.name)
            leaves.append(node.meta.get("val") if node is not None else None)
    try:
        program_args, program_kwargs = pytree.tree_unflatten(leaves, signature.in_spec)
        forward = inspect.signature(module.forward)
        eager = forward.bind(*args, **kwargs)
        exported = forward.bind(*program_args, **program_kwargs)
    except (TypeError, ValueError):
        return ""
    eager.apply_defaults()
    exported.apply_defaults()
    for parameter, value in eager.arguments.items():
        other = exported.arguments.get(parameter)
        if not _alike(value, other):
            shown = f"{parameter}={_text(value)}", f"{parameter}={_text(other)}"
            return f"in eager, {call!r} gets {shown[0]}; the program passes {shown[1]}"
    return ""


def _alike(eager: Any, exported: Any) -> bool:
    """Whether an eager argument is what the program passes: None and None, tensors of one
    dtype and static sizes (a symbolic size of the program takes any), equal constants, the
    same structure of such."""
    if isinstance(eager, torch.Tensor) or isinstance(exported, torch.Tensor):
        if not (isinstance(eager, torch.Tensor) and isinstance(exported, torch.Tensor)):
            return False
        if eager.dtype != exported.dtype or eager.dim() != exported.dim():
            return False
        return all(
            not isinstance(b, int) or int(a) == b for a, b in zip(eager.shape, exported.shape)
        )
    if isinstance(eager, (tuple, list)) and isinstance(exported, (tuple, list)):
        return len(eager) == len(exported) and all(map(_alike, eager, exported))
    if isinstance(eager, dict) and isinstance(exported, dict):
        return eager.keys() == exported.keys() and all(_alike(eager[k], exported[k]) for k in eager)
    if eager is None or exported is None:
        return eager is exported
    try:
        return bool(eager == exported)
    except Exception:  # a value without a plain ==: the structure is all that can be said
        return type(eager) is type(exported)


def _text(value: Any) -> str:
    if value is None:
        return "None"
    return _meta.value_text(value) or type(value).__name__
