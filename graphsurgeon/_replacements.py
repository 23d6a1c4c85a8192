"""What can stand in for a module: the rules a picker of replacements reads.

A replacement is an ``nn.Module``: an instance, or a class built with no arguments or from the
original module (``FusedAttention(original)``). The building blocks of libraries (an
``nn.Linear``, a ``LlamaForCausalLM``) are classes of that kind too, but built bare or from
"the original" they are no replacement anyone means: :func:`is_library_class` tells them apart
from a user's own classes (graphsurgeon's examples are replacements).

Example:
    >>> import torch
    >>> from graphsurgeon.examples import GeluTanhMLP
    >>> is_library_class(torch.nn.Linear), is_library_class(GeluTanhMLP)
    (True, False)
    >>> required_arguments(torch.nn.Identity), required_arguments(GeluTanhMLP)
    (0, 1)
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["LIBRARIES", "is_library_class", "required_arguments"]

#: The top-level packages whose classes are building blocks, not replacements.
LIBRARIES = ("torch", "transformers", "torchvision", "timm", "graphsurgeon")


def is_library_class(cls: type) -> bool:
    """Whether ``cls`` is a library's own building block rather than a user's replacement
    (a class of :data:`LIBRARIES`; graphsurgeon's examples are replacements)."""
    module = getattr(cls, "__module__", "") or ""
    if module == "graphsurgeon.examples" or module.startswith("graphsurgeon.examples."):
        return False
    return module.split(".")[0] in LIBRARIES


def required_arguments(factory: Any) -> int | None:
    """How many positional arguments ``factory`` (a class) needs to be built: 0 (built bare),
    1 (built from the original module)...; None when it needs keyword-only ones. A factory
    without a readable signature counts as built bare."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no readable signature: built bare
        return 0
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [
        p
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if any(p.kind == inspect.Parameter.KEYWORD_ONLY for p in required):
        return None
    return sum(1 for p in required if p.kind in positional)
