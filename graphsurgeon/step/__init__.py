"""Stepper: run a program node by node, like a debugger, and look at every value on the way.

The cursor walks the graph the user sees: a :func:`graphsurgeon.swap` result, the original
program's unlifted graph (for an ExportedProgram: the graph of ``gs.swap(ep, {})``, with the
node names of ``ep.graph``), any other ``torch.fx.GraphModule``, or the ``.module`` of an
object that has one. Nodes run through ``torch.fx.Interpreter.run_node``, so the stepper sees
the true aten ops even where the generated code calls faster bindings, and a swapped call runs
its replacement eagerly, as one node.

Which module call a node belongs to (``"fqn"``, or ``"fqn@k"`` for the k-th repeated call) is
read from the one node -> call index of :mod:`graphsurgeon.partition`, which the pictures read
too: the stepper and the picture always agree on it.

Running to the end costs what ``torch.fx.Interpreter.run`` costs: with no conditional
breakpoint the stepper runs a plain loop over a precomputed node list up to the next
breakpoint position, found by bisection, with nothing allocated per node.

The package: :mod:`._stepper` (the :class:`Stepper` and what a move returns,
:class:`StepResult`), :mod:`._layout` (the graph's nodes, calls and stops, and what a name
stands for in it), :mod:`._breakpoints`, :mod:`._summary` (:class:`Summary`,
:func:`summary_table`) and :mod:`._frames` (the calls entered with ``step_into``). Nodes run
through the one node-by-node runner of :mod:`graphsurgeon.checks._exec`, as the overlays'.
"""

from __future__ import annotations

from ..errors import NodeError, StepError, UnknownNodeError
from ._breakpoints import Breakpoint, Breakpoints
from ._stepper import Stepper, StepResult
from ._summary import Summary, summary_table

__all__ = [
    "Breakpoint",
    "Breakpoints",
    "NodeError",
    "StepError",
    "StepResult",
    "Stepper",
    "Summary",
    "UnknownNodeError",
    "summary_table",
]
