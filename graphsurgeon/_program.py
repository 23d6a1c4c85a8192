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

Inputs are read here once too (:func:`as_inputs`): ``args`` is a tuple of the model's positional
inputs (a lone tensor is the one input, ``(x,)``), ``kwargs`` a mapping; a list, a dict or
anything else where the tuple goes is refused with one
:class:`~graphsurgeon.errors.InputStructureError` that names the verb and what to pass, by every
entry point alike. :func:`as_program` with inputs gives both at once, and falls back on the
example inputs a Surgery keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule

from . import _meta
from .errors import InputStructureError, NotAProgramError, a_type

__all__ = ["Program", "as_inputs", "as_program", "not_a_program"]


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
    #: the inputs to run it on, as :func:`as_inputs` reads them (given, or the Surgery's
    #: example inputs), or None when none were given and none are known
    args: tuple | None = None
    kwargs: dict | None = None
    verb: str = ""

    def inputs(self) -> tuple[tuple, dict]:
        """``(args, kwargs)`` to run the program on; raises
        :class:`~graphsurgeon.errors.InputStructureError` when there are none."""
        if self.args is None:
            raise InputStructureError(_no_inputs(self.verb))
        return self.args, dict(self.kwargs or {})

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


def as_program(value: Any, args: Any = None, kwargs: Any = None, *, verb: str = "") -> Program:
    """What ``value`` means as a program to draw, step or check (see the module docstring),
    with the inputs to run it on: ``args`` and ``kwargs`` as :func:`as_inputs` reads them, or
    when ``args`` is None, the example inputs of a Surgery (``.args`` and ``.kwargs`` of the
    result are None when there are none: :meth:`Program.inputs` then says what to pass).

    A Surgery (or anything with its ``program`` and ``module``) with nothing swapped or fused
    is its ExportedProgram. ``verb`` names the entry point in the messages (``"compare"``).

    Example:
        >>> import torch, graphsurgeon as gs
        >>> ep = gs.export(torch.nn.Sequential(torch.nn.ReLU()), (torch.randn(2),))
        >>> as_program(ep).module is None, as_program(gs.swap(ep, {})).ep is ep
        (True, True)
        >>> as_program(ep, torch.ones(2)).args
        (tensor([1., 1.]),)
    """
    program = _program_of(value, verb)
    if args is None and kwargs is None and program.surgery is not None:
        args, kwargs = getattr(value, "args", None), getattr(value, "kwargs", None)
    if args is None:
        if kwargs is not None:
            as_inputs((), kwargs, verb=verb)  # refuses a kwargs that is no mapping, alike
        return dataclass_replace(program, verb=verb)
    args, kwargs = as_inputs(args, kwargs, verb=verb)
    return dataclass_replace(program, args=args, kwargs=kwargs, verb=verb)


def as_inputs(args: Any, kwargs: Any = None, *, verb: str = "") -> tuple[tuple, dict]:
    """``(args, kwargs)`` as every entry point reads inputs: ``args`` a tuple of the model's
    positional inputs (a lone tensor is ``(x,)``), ``kwargs`` a mapping or None. Anything else
    raises :class:`~graphsurgeon.errors.InputStructureError` naming ``verb`` and what to pass:
    a list may be the inputs or one input that is a list, so it is never guessed.

    Example:
        >>> import torch
        >>> as_inputs(torch.ones(1), {"mask": None})
        ((tensor([1.]),), {'mask': None})
        >>> as_inputs([torch.ones(1)], verb="verify")
        Traceback (most recent call last):
          ...
        graphsurgeon.errors.InputStructureError: verify: args is a list; ...
    """
    where = f"{verb}: " if verb else ""
    if args is None:
        raise InputStructureError(_no_inputs(verb))
    if isinstance(args, torch.Tensor):
        args = (args,)  # the one input
    elif isinstance(args, list):
        raise InputStructureError(
            f"{where}args is a list; the model's positional inputs are a tuple: pass "
            "tuple(args) when its items are the inputs, or (args,) when the model takes the "
            "list as its one input"
        )
    elif not isinstance(args, tuple):
        hint = " (keyword inputs go in kwargs)" if isinstance(args, Mapping) else ""
        raise InputStructureError(
            f"{where}args must be a tuple of the model's positional inputs, got {a_type(args)}"
            f"{hint}; wrap a single input as (x,)"
        )
    if kwargs is None:
        return args, {}
    if not isinstance(kwargs, Mapping):
        raise InputStructureError(
            f"{where}kwargs must be a mapping of the model's keyword inputs, such as "
            f"{{'mask': mask}}, got {a_type(kwargs)}"
        )
    return args, dict(kwargs)


def _no_inputs(verb: str) -> str:
    where = f"{verb}: " if verb else ""
    call = f"{verb}(..., args)" if verb else "it"
    return (
        f"{where}no inputs to run the program on: pass the model's example inputs as a tuple, "
        f"as in {call} with args=(x,), or start a Surgery with them "
        "(gs.Surgery.from_model(model, args), gs.Surgery(ep, args=(x,)))"
    )


def _program_of(value: Any, verb: str) -> Program:
    if isinstance(value, ExportedProgram):
        return Program(value)
    if isinstance(value, GraphModule):
        info = _info(value)
        if info is None:
            raise NotAProgramError(
                f"{verb + ': ' if verb else ''}expected a program, got {a_type(value)} that "
                "gs.swap or gs.fuse did not make: "
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
        return _program_of(module, verb)  # an object holding a swap result as its module
    raise not_a_program(value, verb)


def not_a_program(value: object, verb: str = "") -> NotAProgramError:
    """The error for an object given where an ExportedProgram is expected: what it is, and what
    to pass instead (``verb``: the entry point, named first)."""
    where = f"{verb}: " if verb else ""
    got = f"{where}expected a torch.export.ExportedProgram, got {a_type(value)}"
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
