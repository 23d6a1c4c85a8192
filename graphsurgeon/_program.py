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

Inputs are read here once too (:func:`as_inputs`): ``args`` is a tuple of the model's
positional inputs (one value that is no tuple, a tensor or a number, is the one input,
``(x,)``), ``kwargs`` a mapping; a list, a dict, None, a string, a model or an iterator where the
tuple goes is more likely a mistake than one input, and is refused with one
:class:`~graphsurgeon.errors.InputStructureError` that names the verb and what to pass, by every
entry point alike. :func:`as_program` with inputs gives both at once, and falls back on the
example inputs a Surgery keeps.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule

from . import _meta
from .errors import InputStructureError, NotAProgramError, a_type

__all__ = ["Program", "as_inputs", "as_program", "is_surgery", "no_inputs", "not_a_program"]


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

    def inputs(self, error: type[Exception] = InputStructureError) -> tuple[tuple, dict]:
        """``(args, kwargs)`` to run the program on. When there are none, raises ``error``
        (the verbs of a Surgery keep the class they always raised for it) with the one message
        of :func:`no_inputs`."""
        if self.args is None:
            raise error(no_inputs(self.verb, surgery=self.surgery is not None))
        return self.args, dict(self.kwargs or {})

    @property
    def info(self) -> Any:
        """The ``SwapInfo`` of :attr:`module` (None for the ExportedProgram itself)."""
        if self.module is None:
            return None
        meta = getattr(self.module, "meta", None)
        return meta.get(_meta.INFO) if isinstance(meta, dict) else None


def is_surgery(value: Any) -> bool:
    """Whether ``value`` is a Surgery (or holds a program and a module as one does)."""
    # read by what it has, not by its class: this module sits below surgery.py. Its module is
    # looked for without reading it (a Surgery builds its current module when it is read).
    has_module = hasattr(type(value), "module") or "module" in getattr(value, "__dict__", {})
    return isinstance(getattr(value, "program", None), ExportedProgram) and has_module


def _info(module: Any) -> Any:
    meta = getattr(module, "meta", None)
    return meta.get(_meta.INFO) if isinstance(meta, dict) else None


def as_program(value: Any, args: Any = None, kwargs: Any = None, *, verb: str = "") -> Program:
    """What ``value`` means as a program to draw, step or check (see the module docstring),
    with the inputs to run it on: ``args`` and ``kwargs`` as :func:`as_inputs` reads them, or
    when ``args`` is None, the example inputs of a Surgery (its ``kwargs`` unless others are
    given); ``.args`` and ``.kwargs`` of the result are None when there are none
    (:meth:`Program.inputs` then says what to pass).

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
    if args is None and program.surgery is not None:
        args = getattr(value, "args", None)
        if kwargs is None:
            kwargs = getattr(value, "kwargs", None)
    if args is None:
        if kwargs is not None:
            as_inputs((), kwargs, verb=verb)  # refuses a kwargs that is no mapping, alike
        return dataclass_replace(program, verb=verb)
    args, kwargs = as_inputs(args, kwargs, verb=verb)
    return dataclass_replace(program, args=args, kwargs=kwargs, verb=verb)


# What ``args`` that are no tuple are refused as, by the type that came: each is more likely a
# mistake than the model's one input (a list may be the inputs or one input that is a list, so
# it is never guessed); ``{args}`` and ``{kwargs}`` are the names the verb gives its inputs.
_NOT_INPUTS = {
    type(None): "pass () for a model that takes no positional inputs",
    list: "pass tuple({args}) when the list holds the inputs, or ({args},) when the model takes "
    "one list",
    Mapping: "keyword inputs go in {kwargs}; pass ({args},) when the model takes one dict",
    str: "pass ({args},) when the model really takes a string",
    bytes: "pass ({args},) when the model really takes bytes",
    torch.nn.Module: "is the order of model and {args} swapped?",
    Iterator: "pass tuple({args})",
}


def as_inputs(
    args: Any,
    kwargs: Any = None,
    *,
    verb: str = "",
    names: tuple[str, str] = ("args", "kwargs"),
) -> tuple[tuple, dict]:
    """``(args, kwargs)`` as every entry point reads inputs: ``args`` a tuple of the model's
    positional inputs, ``kwargs`` a mapping or None. One value that is no tuple (a tensor, a
    number) is the one input, ``(x,)``; what is more likely a mistake (a list, a dict, None, a
    string, a model, an iterator) raises :class:`~graphsurgeon.errors.InputStructureError`
    naming ``verb`` and what to pass. ``names``: what the verb calls its two inputs
    (``("example_args", "example_kwargs")`` for a pattern's).

    Example:
        >>> import torch
        >>> as_inputs(torch.ones(1), {"mask": None})
        ((tensor([1.]),), {'mask': None})
        >>> as_inputs([torch.ones(1)], verb="verify")
        Traceback (most recent call last):
          ...
        graphsurgeon.errors.InputStructureError: verify: args: expected a tuple of positional ...
    """
    where = f"{verb}: " if verb else ""
    args_name, kwargs_name = names
    if not isinstance(args, tuple):
        for kind, advice in _NOT_INPUTS.items():
            if isinstance(args, kind):
                raise InputStructureError(
                    f"{where}{args_name}: expected a tuple of positional inputs such as (x,), "
                    f"got {a_type(args)}; {advice.format(args=args_name, kwargs=kwargs_name)}"
                )
        args = (args,)  # the one input
    if kwargs is None:
        return args, {}
    if not isinstance(kwargs, Mapping):
        raise InputStructureError(
            f"{where}{kwargs_name}: expected a mapping of keyword inputs such as "
            f"{{'mask': mask}}, got {a_type(kwargs)}; positional inputs go in {args_name}"
        )
    return args, dict(kwargs)


def no_inputs(verb: str, *, surgery: bool = False) -> str:
    """The one message for a verb that has no inputs to run a program on (none given, and
    none kept by a Surgery): how to pass them (``surgery``: to the Surgery's own verb)."""
    where = f"{verb}: " if verb else ""
    if surgery:
        call = f"s.{verb}((x,)) or s.{verb}(args, kwargs)" if verb else "s.verify((x,))"
        return (
            f"{where}no inputs: pass the example inputs, as in {call}, or give them when the "
            "Surgery starts: gs.Surgery.from_model(model, args) or gs.Surgery(ep, args=(x,))"
        )
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
    if is_surgery(value):
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
    got = f"{where}expected an ExportedProgram (torch.export), got {a_type(value)}"
    meta = getattr(value, "meta", None)
    if isinstance(meta, dict) and _meta.INFO in meta:
        return NotAProgramError(
            f"{got}, a program made by gs.swap or gs.fuse. Pass the ExportedProgram it was made "
            "from (graphsurgeon.swap.swap_info(gm).program) with every replacement in one "
            "mapping, or make the changes step by step with gs.Surgery(ep)"
        )
    if is_surgery(value):
        return NotAProgramError(f"{got}; its program is s.program (its current state: s.module)")
    if isinstance(value, torch.nn.Module):
        return NotAProgramError(
            f"{got}, a model: export it first, ep = gs.export(model, args), and pass ep "
            "(or start a Surgery from the model: gs.Surgery.from_model(model, args))"
        )
    if isinstance(value, (str, os.PathLike)):
        return NotAProgramError(
            f"{got}; load a saved program with torch.export.load(path), or make one with "
            "gs.export(model, args)"
        )
    return NotAProgramError(f"{got}; make one with gs.export(model, args)")
