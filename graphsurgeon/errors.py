"""Every error graphsurgeon raises on purpose, in one place.

Each message names the object (a module fqn, a call name, a node, an argument), says what is
wrong and says what to do. Catch :class:`GraphSurgeonError` for all of them::

    GraphSurgeonError
    ├── ExportError              torch.export could not export the model (the cause is chained)
    ├── NotAProgramError         an object where a program was expected (also a TypeError)
    ├── UnknownNameError         a module, call or node name the program does not have (KeyError)
    │   ├── UnknownModuleError   ... a module or call name (also a PartitionError)
    │   └── UnknownNodeError     ... a node name (also a StepError)
    ├── PartitionError           the program's module structure cannot be read as asked
    ├── SwapError                a swap or fuse request that cannot be carried out
    │   ├── NotPreservedError    the module's call signature was not preserved at export
    │   ├── NotSwappableError    its nodes cannot be replaced as one unit (the reason says why)
    │   ├── ConflictError        two requests claim the same nodes (a module and its child)
    │   ├── ReplacementError     the replacement cannot take the call, or returned the wrong thing
    │   ├── ModeError            gm.train() / gm.eval() against the mode its nodes were exported in
    │   └── PatternError         a find/replace pattern that cannot be traced or used
    ├── InputError               a swapped or fused program called with inputs it refuses
    │   ├── InputStructureError  another structure than at export, or args not a tuple (TypeError)
    │   └── GuardError           a size outside the exported range, another constant (ValueError)
    ├── VerifyError              verify() could not run a program, or was asked wrongly
    ├── CompareError             compare() cannot compare these programs
    ├── DeployError              torch.compile or AOTInductor cannot compile or package a program
    ├── SurgeryError             an operation a Surgery cannot do in its state (nothing to undo)
    ├── RenderError              a drawing request that cannot be carried out
    ├── StepError                a stepper request that cannot be carried out
    │   └── NodeError            a node raised while the stepper ran it
    ├── WidgetError              a widget action that cannot be done (nothing selected, ...)
    └── MissingDependencyError   an optional package or program (graphviz's dot) is missing

Example:
    >>> import torch, graphsurgeon as gs
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> ep = gs.export(model, (torch.randn(2),))
    >>> try:
    ...     gs.swap(ep, {"relu": torch.nn.GELU()})
    ... except gs.GraphSurgeonError as error:
    ...     print(type(error).__name__, "-", error)
    UnknownModuleError - the program has no module 'relu'. gs.module_tree(ep) lists every module.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "CompareError",
    "ConflictError",
    "DeployError",
    "ExportError",
    "GraphSurgeonError",
    "GuardError",
    "InputError",
    "InputStructureError",
    "MissingDependencyError",
    "ModeError",
    "NotAProgramError",
    "NodeError",
    "NotPreservedError",
    "NotSwappableError",
    "PartitionError",
    "PatternError",
    "RenderError",
    "ReplacementError",
    "StepError",
    "SurgeryError",
    "SwapError",
    "UnknownModuleError",
    "UnknownNameError",
    "UnknownNodeError",
    "VerifyError",
    "WidgetError",
]


class GraphSurgeonError(Exception):
    """Base class of every error graphsurgeon raises on purpose."""


class ExportError(GraphSurgeonError):
    """export() was given arguments it cannot use, or torch.export failed (the cause chained)."""


class NotAProgramError(GraphSurgeonError, TypeError):
    """An object where a program was expected: the message says what the object is and what to
    pass instead (``gs.export(model, args)`` for a model; the ExportedProgram a swap result was
    made from, for a swap result). It is a TypeError too."""


class PartitionError(GraphSurgeonError):
    """The program's module structure cannot be read as asked."""


class UnknownNameError(GraphSurgeonError, KeyError):
    """A module, call or node name the program does not have: every entry point (swap, fuse,
    the pictures, the stepper, the widget) raises one for an unknown name, with the closest
    names ("did you mean"). :class:`UnknownModuleError` and :class:`UnknownNodeError` say which
    kind of name was looked for.

    It is a KeyError too, so ``gs.module_tree(ep).get(name)`` and ``except KeyError`` behave
    as for a dict.
    """

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class UnknownModuleError(UnknownNameError, PartitionError):
    """A module or call name that the program does not have (``"blk@0"`` is ``"blk"``)."""


class SwapError(GraphSurgeonError):
    """A swap or fuse request that cannot be carried out."""


class NotPreservedError(SwapError):
    """The module's call signature was not preserved at export time."""


class NotSwappableError(SwapError):
    """The module's nodes cannot be replaced as one unit (see the reason)."""


class ConflictError(SwapError):
    """Two requests claim the same nodes (a module and its child, or a call twice)."""


class ReplacementError(SwapError):
    """A replacement is not usable: not an nn.Module, its forward cannot take the call's
    arguments, or it returned another structure, shape or dtype than the program expects."""


class ModeError(SwapError):
    """``gm.train()`` / ``gm.eval()`` on a swapped or fused program asked for another mode than
    its exported nodes keep (they were traced in one mode: batch norm, dropout)."""


class PatternError(SwapError):
    """A pattern for ``gs.find`` / ``s.replace`` cannot be used: it is not callable, cannot be
    traced on its example arguments, or computes nothing (the cause is chained)."""


class InputError(GraphSurgeonError):
    """A swapped or fused program was called with inputs its program refuses."""


class InputStructureError(InputError, TypeError):
    """The inputs have another structure than at export (a missing key, a short tuple), or
    are not given as every entry point reads them: ``args`` a tuple, ``kwargs`` a mapping
    (:func:`graphsurgeon._program.as_inputs`)."""


class GuardError(InputError, ValueError):
    """An input breaks what the program was exported for: a size outside the range its
    dynamic shapes allow (or other than the static size), or a constant input that differs."""


class VerifyError(GraphSurgeonError):
    """verify() was given arguments it cannot use, or could not run a program on the inputs."""


class CompareError(GraphSurgeonError):
    """compare() cannot compare these programs (the message says why and what to do)."""


class DeployError(GraphSurgeonError):
    """``torch.compile`` or AOTInductor could not compile or package a program
    (:mod:`graphsurgeon.deploy`): the message says which step failed, the replacement (or
    module) it failed in when it can tell, and torch's reason in one line (the cause chained)."""


class SurgeryError(GraphSurgeonError):
    """An operation a Surgery cannot do in its current state (nothing to undo, ...)."""


class RenderError(GraphSurgeonError):
    """A drawing request that cannot be carried out: an object that is not a program, a bad
    ``collapse``/``diff``/``highlight`` value, or graphviz failing on the layout."""


class StepError(GraphSurgeonError):
    """A stepper request that cannot be carried out (the message says what to do)."""


class AlreadyRanError(StepError):
    """A target the run has passed, or a run that has finished: only a run from the start
    (``reset()``; the widget's Restart run) reaches it. ``what`` says which, without the
    advice, for front ends that name their own way to start again."""

    def __init__(self, what: str, again: str = "to run from the start"):
        self.what, self.again = what, again
        super().__init__(f"{what}; reset() {again}")


class UnknownNodeError(UnknownNameError, StepError):
    """A node name the stepped graph does not have, or whose value is not available.

    It is a KeyError too, so ``st.env.get(name)`` and ``name in st.env`` behave as for a dict.
    """


class NodeError(StepError):
    """A node raised while the stepper ran it. The stepper stays at that node.

    Attributes:
        node: the node's name; ``call``: the innermost module call it belongs to ('' at the top
        level); ``position``: its position in the graph; ``cause``: the exception it raised
        (also chained as ``__cause__``).
    """

    def __init__(self, message: str, node: str, call: str, position: int, cause: BaseException):
        super().__init__(message)
        self.node = node
        self.call = call
        self.position = position
        self.cause = cause


class WidgetError(GraphSurgeonError):
    """A widget request that cannot be carried out: nothing selected, no replacement picked,
    no example inputs to verify or step with, an unknown name (the message says what to do)."""


class MissingDependencyError(GraphSurgeonError):
    """An optional dependency (a package or a binary such as graphviz's ``dot``) is missing."""


def unknown_name(
    name: object, choices: Iterable[str], *, kind: str = "module", where: str = "the program"
) -> str:
    """The one message for a name that is not there: ``the program has no module 'layers.7'.
    Did you mean 'layers.1'?``, plus where the names are listed."""
    listed = {
        "module": " gs.module_tree(ep) lists every module.",
        "node": "",
        "module or node": " gs.module_tree(ep) lists every module.",
    }.get(kind, "")
    text = str(name) if isinstance(name, str) else repr(name)
    return f"{where} has no {kind} {text!r}.{did_you_mean(text, choices)}{listed}"


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return `` Did you mean 'x'?`` for the closest choices, or ``''`` when nothing is close."""
    close = difflib.get_close_matches(name, [str(c) for c in choices], n=3, cutoff=0.6)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def a_type(value: object) -> str:
    """``value``'s type for a message: 'an int', 'a str', 'None'."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"
