"""graphsurgeon: swap modules of torch.export programs for eager code, and check the result.

The pipeline: ``export`` -> ``module_tree`` / ``partition`` -> ``swap`` -> ``verify`` /
``compare`` -> ``to_dot`` / ``to_svg`` -> ``Stepper``; ``Surgery`` keeps a program and its
swaps with undo/redo.

Example:
    >>> import torch, graphsurgeon as gs
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> x = torch.randn(2, 4)
    >>> ep = gs.export(model, (x,))
    >>> gm = gs.swap(ep, {"1": torch.nn.GELU()})
    >>> reference = gs.eager_reference(model, {"1": torch.nn.GELU()})
    >>> bool(gs.verify(reference, gm, (x,)))
    True
"""

from ._runtime import InputStructureError
from .compare import CallComparison, CompareError, Comparison, compare
from .errors import (
    ConflictError,
    ExportError,
    GraphSurgeonError,
    MissingDependencyError,
    NotPreservedError,
    NotSwappableError,
    PartitionError,
    ReplacementError,
    SwapError,
    UnknownModuleError,
    VerifyError,
)
from .export import ExportNotes, export, export_notes
from .partition import ModuleInfo, ModuleTree, Partition, module_tree, partition
from .render import GraphView, RenderError, graph_view, to_dot, to_svg
from .step import (
    Breakpoint,
    Breakpoints,
    NodeError,
    StepError,
    Stepper,
    StepResult,
    Summary,
    UnknownNodeError,
)
from .surgery import Diff, HistoryEntry, Surgery, SurgeryError
from .swap import SwapInfo, swap, swap_info
from .verify import LeafCheck, VerifyReport, eager_reference, verify

__version__ = "0.1.0"

__all__ = [
    # pipeline
    "export",
    "export_notes",
    "module_tree",
    "partition",
    "swap",
    "swap_info",
    "verify",
    "eager_reference",
    "compare",
    "to_dot",
    "to_svg",
    "graph_view",
    "Stepper",
    "Surgery",
    # results
    "ExportNotes",
    "ModuleTree",
    "ModuleInfo",
    "Partition",
    "SwapInfo",
    "VerifyReport",
    "LeafCheck",
    "HistoryEntry",
    "Diff",
    "GraphView",
    "Comparison",
    "CallComparison",
    "StepResult",
    "Summary",
    "Breakpoint",
    "Breakpoints",
    # errors
    "GraphSurgeonError",
    "ExportError",
    "PartitionError",
    "UnknownModuleError",
    "SwapError",
    "NotPreservedError",
    "NotSwappableError",
    "ConflictError",
    "ReplacementError",
    "InputStructureError",
    "VerifyError",
    "SurgeryError",
    "CompareError",
    "RenderError",
    "StepError",
    "NodeError",
    "UnknownNodeError",
    "MissingDependencyError",
]
