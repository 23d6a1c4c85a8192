"""swap(): replace module calls of an exported program with eager modules, in one pass.

The verb over :mod:`graphsurgeon.rewrite`, the one pass that swaps and fuses; what a result was
made from is its :class:`SwapInfo` (:func:`swap_info`), what it changed its :class:`Diff`.

``graphsurgeon.swap`` is the function; the module's helpers are imported by name, as in
``from graphsurgeon.swap import swap_info``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule

from .errors import SwapError
from .rewrite import FUSE, Diff, SwapInfo, rewrite, swap_info

__all__ = ["Diff", "SwapInfo", "swap", "swap_info"]


def swap(
    ep: ExportedProgram,
    modules: Mapping[str, torch.nn.Module],
    *,
    interpret: bool = False,
) -> GraphModule:
    """Replace module calls of ``ep`` with eager modules; return a runnable GraphModule.

    Args:
        ep: any ExportedProgram whose swapped modules had their call signatures preserved
            (:func:`graphsurgeon.export` preserves every module). It is never modified.
        modules: ``{name: replacement}``. ``"blocks.0"`` swaps every call of that module
            (one replacement serves them all); ``"shared@1"`` swaps only the second call,
            ``"shared@0"`` only the first. Replacements are used as given (not copied).
            Each replacement's ``forward`` must accept the arguments the program calls the
            module with: checked here, with the expected call in the error.
        interpret: run the graph under ``torch.fx.Interpreter`` instead of generated code
            (slower; easier to debug).

    Returns:
        A GraphModule taking and returning exactly what the original model does, and
        refusing what the program refuses (:class:`~graphsurgeon.GuardError` for a size
        outside the exported range or another constant, :class:`~graphsurgeon.InputStructureError`
        for another structure). What a replacement returns is checked at its call: another
        structure, dtype or static size is a :class:`~graphsurgeon.ReplacementError` naming
        the call. ``gm.meta["graphsurgeon"]`` holds a :class:`SwapInfo`. The result shares
        parameters with ``ep`` (as ``ep.module()`` does) and holds copies of its buffers;
        ``copy.deepcopy(gm)`` gives a fully independent program.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> x = torch.randn(2, 4)
        >>> gm = gs.swap(gs.export(model, (x,)), {"1": torch.nn.GELU()})
        >>> torch.allclose(gm(x), torch.nn.functional.gelu(model[0](x)))
        True
    """
    for name, module in modules.items() if isinstance(modules, Mapping) else ():
        if module is FUSE:
            raise SwapError(f"swap: {name!r} asks for a fused call; use gs.fuse(ep, [{name!r}])")
    return rewrite(ep, modules, interpret=interpret, verb="swap")
