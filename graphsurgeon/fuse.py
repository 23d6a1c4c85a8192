"""fuse(): each named module call becomes one call of a GraphModule holding its own nodes.

The program keeps computing exactly what it did (bit for bit: the same nodes run, in the same
order), but each fused call is now one ``call_module`` node, like a swapped one, of a small
GraphModule cut from the program: the form ``torch.export._swap`` builds and throws away. That
GraphModule takes the arguments the program passed the module and returns what the module
returned, so it runs on its own, prints as code, and exports again.

The same cut serves :func:`graphsurgeon.compare`, which runs a swapped call's original nodes
on the inputs the replacement received: :func:`fused_call`.

``graphsurgeon.fuse`` is the function; the module's helpers are imported by name, as in
``from graphsurgeon.fuse import fused_call``.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch.export import ExportedProgram
from torch.fx import GraphModule

from . import _derived
from .errors import SwapError
from .partition import Partition, program_index
from .rewrite import FUSE, cut_call, rewrite

__all__ = ["fuse", "fused_call"]


def fuse(
    ep: ExportedProgram, names: str | Iterable[str], *, interpret: bool = False
) -> GraphModule:
    """Fuse module calls of ``ep``: each becomes one ``call_module`` of its own nodes.

    Args:
        ep: any ExportedProgram whose named modules had their call signatures preserved. It
            is never modified.
        names: module names (``"blocks.0"``: every call of it) or call names (``"shared@1"``).
        interpret: run the result under ``torch.fx.Interpreter`` (slower; easier to debug).

    Returns:
        A runnable GraphModule that computes what ``ep`` computes, bit for bit, and refuses what
        it refuses. ``swap_info(gm).calls[name]`` (:func:`graphsurgeon.swap.swap_info`) is the fused call's GraphModule: runnable on
        its own with the module's arguments, printable (``.code``), and re-exportable.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> x = torch.randn(3, 4)
        >>> ep = gs.export(model, (x,))
        >>> gm = gs.fuse(ep, ["0"])
        >>> torch.equal(gm(x), ep.module()(x))
        True
        >>> from graphsurgeon.swap import swap_info
        >>> block = swap_info(gm).calls["0"]
        >>> [n.op for n in block.graph.nodes]
        ['placeholder', 'get_attr', 'get_attr', 'call_function', 'output']
    """
    program_index(ep, "fuse")  # the program first: a model is refused as by every verb
    if isinstance(names, str):
        names = [names]
    try:
        wanted = list(dict.fromkeys(names))
    except TypeError:
        raise SwapError(
            f"fuse: expected module names such as ['blocks.0'], got {type(names).__name__}"
        ) from None
    if not wanted:
        raise SwapError("fuse: no module named; pass the names of the modules to fuse")
    return rewrite(ep, dict.fromkeys(wanted, FUSE), interpret=interpret, verb="fuse")


def fused_call(ep: ExportedProgram, name: str, partition: Partition | None = None) -> GraphModule:
    """The nodes of call ``name`` of ``ep`` as a runnable GraphModule of their own, made once per
    program and call. It reads the program's parameters and its own copies of the buffers, so
    running it never changes ``ep``. ``partition``: for a call that is no module's (a region
    of ops ``Surgery.replace`` made one call), its partition, as ``SwapInfo.partitions`` has it.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.fuse import fused_call
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> ep = gs.export(model, (torch.randn(2, 4),))
        >>> fused_call(ep, "1")(torch.tensor([[-1.0, 2.0]]))
        tensor([[0., 2.]])
    """
    index = program_index(ep)
    cuts = _derived.cached(ep, "cuts", dict)  # made again when the graph changed
    if name not in cuts:
        cuts[name] = cut_call(index, name, partition=partition)
    return cuts[name]
