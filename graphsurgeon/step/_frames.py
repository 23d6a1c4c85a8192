"""The calls a stepper enters with ``step_into``: the :class:`Frame` of each (a stepper of its
own over the call's graph) and, for a swapped call, the graph it steps through: the
replacement exported on the very inputs it receives (:class:`Replacements`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

from .._meta import describe_value
from ..checks._exec import runnable_original
from ..export import export, quiet_export
from ..partition import split_call_name

__all__ = ["Frame", "Replacements"]


@dataclass(frozen=True)
class Frame:
    """A call entered with ``step_into``: a stepper of its own over the call's graph."""

    stepper: Any  # the Stepper of the call's graph
    call: str  # the call name, "layers.1.attn"
    node: Node  # the call_module node of the outer graph whose value the call computes
    kind: str  # "fused" or "swapped"
    prefix: tuple[str, ...]  # the module calls around that node in the outer graph

    def outer_stack(self, inner: tuple[str, ...]) -> tuple[str, ...]:
        """The stack of a node of the call's graph, seen from the program."""
        if self.kind == "fused":  # the program's own module calls, below the call
            return self.prefix + inner
        # the replacement's own modules, named from where it is installed
        fqn = split_call_name(self.call)[0]
        return self.prefix + tuple(f"{fqn}.{name}" for name in inner)


class Replacements:
    """The replacements' graphs one stepper steps into: each exported once per replacement and
    input shapes (a replacement serving many calls, or one call run again after ``reset()``,
    is exported once), or why it has none."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, str], tuple[Any, GraphModule] | str] = {}

    def graph(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> GraphModule | str:
        """The replacement's aten graph for these inputs, or why it has none."""
        key = (id(module), describe_value((tuple(args), dict(kwargs))))
        if key not in self._made:
            self._made[key] = self._export(module, args, kwargs)
        made = self._made[key]
        return made[1] if isinstance(made, tuple) else made

    @staticmethod
    def _export(
        module: torch.nn.Module, args: tuple, kwargs: dict
    ) -> tuple[Any, GraphModule] | str:
        kind = type(module).__name__
        if isinstance(module, torch.jit.ScriptModule):
            origin = getattr(module, "original_name", "") or kind
            return (
                f"its replacement is a TorchScript module (scripted {origin}), which "
                "torch.export cannot trace; swap the eager module to step into it"
            )
        try:
            with quiet_export():  # the reason goes in the note, not to stderr
                program = export(module, tuple(args), dict(kwargs), preserve=())
        except Exception as problem:  # any reason a module does not export: say it, go on
            first = str(problem).strip().splitlines()[0] if str(problem).strip() else ""
            return (
                f"its replacement {kind} does not export on the inputs it received "
                f"({type(problem).__name__}: {first[:200]})"
            )
        # the program too: its runnable original refers to it without keeping it
        return program, runnable_original(program)
