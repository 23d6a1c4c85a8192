"""The error tree. Every error a user can cause is a :class:`GraphSurgeonError`.

Messages name the object (module fqn, call name, node, argument), say what is wrong
and say what to do about it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "ConflictError",
    "ExportError",
    "GraphSurgeonError",
    "MissingDependencyError",
    "NotPreservedError",
    "NotSwappableError",
    "PartitionError",
    "ReplacementError",
    "SwapError",
    "UnknownModuleError",
    "VerifyError",
]


class GraphSurgeonError(Exception):
    """Base class of every error graphsurgeon raises on purpose."""


class ExportError(GraphSurgeonError):
    """export() was given arguments it cannot use, or torch.export failed (the cause chained)."""


class PartitionError(GraphSurgeonError):
    """The program's module structure cannot be read as asked."""


class UnknownModuleError(PartitionError):
    """A module or call name that the program does not have."""


class SwapError(GraphSurgeonError):
    """A swap request that cannot be carried out."""


class NotPreservedError(SwapError):
    """The module's call signature was not preserved at export time."""


class NotSwappableError(SwapError):
    """The module's nodes cannot be replaced as one unit (see the reason)."""


class ConflictError(SwapError):
    """Two requests claim the same nodes (a module and its child, or a call twice)."""


class ReplacementError(SwapError):
    """A replacement is not usable: not an nn.Module, or it returned the wrong structure."""


class VerifyError(GraphSurgeonError):
    """verify() was given arguments it cannot use, or could not run a model on the inputs."""


class MissingDependencyError(GraphSurgeonError):
    """An optional dependency (a package or a binary) is missing."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ' Did you mean 'x'?' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.6)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def a_type(value: object) -> str:
    """``value``'s type for a message: 'an int', 'a str', 'None'."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"
