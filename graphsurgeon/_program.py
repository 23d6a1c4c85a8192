"""What any object a user hands graphsurgeon means, decided here once.

Every entry point that draws, steps or checks "a program" takes the same objects and reads
them the same way: an ``ExportedProgram``; a ``GraphModule`` made from one by
:func:`graphsurgeon.swap` or :func:`graphsurgeon.fuse` (it carries its ``SwapInfo``); a
``Surgery`` (its current state). Anything else is refused with one error,
:class:`~graphsurgeon.errors.NotAProgramError`, that says what the object is and what to pass
instead (an eager model: export it first; a GraphModule made elsewhere: the ExportedProgram it
came from).

The verbs that change a program (``swap``, ``fuse``) and the views of its modules
(``module_tree``, ``partition``) take the ExportedProgram itself: :func:`not_a_program` is their
refusal, worded the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule

from . import _meta
from .errors import NotAProgramError, a_type

__all__ = ["Program", "as_program", "not_a_program"]


@dataclass(frozen=True)
class Program:
    """A program as graphsurgeon reads it.

    Attributes:
        ep: the ExportedProgram (for a swap or fuse result, or a Surgery: the one it was made
            from).
        module: the swap or fuse result being looked at (a Surgery's current ``module``), or
            None for the ExportedProgram itself (nothing swapped or fused).
        surgery: the Surgery it came from, or None.
    """

    ep: ExportedProgram
    module: GraphModule | None = None
    surgery: Any = None

    @property
    def info(self) -> Any:
        """The ``SwapInfo`` of :attr:`module` (None for the ExportedProgram itself)."""
        if self.module is None:
            return None
        meta = getattr(self.module, "meta", None)
        return meta.get(_meta.INFO) if isinstance(meta, dict) else None


def _is_surgery(value: Any) -> bool:
    # read by what it has, not by its class: this module sits below surgery.py
    return isinstance(getattr(value, "program", None), ExportedProgram) and hasattr(value, "module")


def _info(module: Any) -> Any:
    meta = getattr(module, "meta", None)
    return meta.get(_meta.INFO) if isinstance(meta, dict) else None


def as_program(value: Any) -> Program:
    """What ``value`` means as a program to draw, step or check (see the module docstring).

    A Surgery (or anything with its ``program`` and ``module``) with nothing swapped or fused
    is its ExportedProgram.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> ep = gs.export(torch.nn.Sequential(torch.nn.ReLU()), (torch.randn(2),))
        >>> as_program(ep).module is None, as_program(gs.swap(ep, {})).ep is ep
        (True, True)
    """
    if isinstance(value, ExportedProgram):
        return Program(value)
    if isinstance(value, GraphModule):
        info = _info(value)
        if info is None:
            raise NotAProgramError(
                f"expected a program, got {a_type(value)} that gs.swap or gs.fuse did not make: "
                "graphsurgeon reads a GraphModule only together with the ExportedProgram it "
                "came from. Pass that program (or gs.swap(ep, {...}) of it)"
            )
        return Program(info.program, value)
    if _is_surgery(value):
        replacements = getattr(value, "replacements", None)
        if (
            isinstance(replacements, Mapping)
            and not replacements
            and not getattr(value, "fused", ())
        ):
            return Program(value.program, None, value)  # nothing to build: the program itself
        module = value.module
        info = _info(module)
        if info is None or not info.calls:
            return Program(value.program, None, value)
        return Program(info.program, module, value)
    module = getattr(value, "module", None)
    if isinstance(module, GraphModule) and _info(module) is not None:
        return as_program(module)  # an object holding a swap result as its current module
    raise not_a_program(value)


def not_a_program(value: object) -> NotAProgramError:
    """The error for an object given where an ExportedProgram is expected: what it is, and what
    to pass instead."""
    got = f"expected a torch.export.ExportedProgram, got {a_type(value)}"
    meta = getattr(value, "meta", None)
    if isinstance(meta, dict) and _meta.INFO in meta:
        return NotAProgramError(
            f"{got}, a program made by gs.swap or gs.fuse. Pass the ExportedProgram it was made "
            "from (graphsurgeon.swap.swap_info(gm).program) with every replacement in one mapping, or make the "
            "changes step by step with gs.Surgery(ep)"
        )
    if _is_surgery(value):
        return NotAProgramError(f"{got}; its program is s.program (its current state: s.module)")
    if isinstance(value, torch.nn.Module):
        return NotAProgramError(
            f"{got}, a model: export it first, ep = gs.export(model, args), and pass ep"
        )
    return NotAProgramError(f"{got}; make one with gs.export(model, args)")
