"""The result types of graphsurgeon, for annotations and ``isinstance`` checks.

Each is made by a verb (``gs.module_tree(ep)`` returns a :class:`ModuleTree`) and displays
itself; none is meant to be built by hand.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.types import VerifyReport
    >>> isinstance(gs.verify(torch.nn.ReLU(), torch.nn.ReLU(), (torch.randn(2),)), VerifyReport)
    True
"""

from .compare import CallComparison, Comparison
from .export import ExportNotes
from .partition import ModuleInfo, ModuleTree, Partition
from .picture import Picture, PictureCluster, PictureEdge, PictureNode
from .render import GraphView
from .step import Breakpoint, Breakpoints, StepResult, Summary
from .surgery import HistoryEntry
from .swap import Diff, SwapInfo
from .verify import LeafCheck, VerifyReport

__all__ = [
    "Breakpoint",
    "Breakpoints",
    "CallComparison",
    "Comparison",
    "Diff",
    "ExportNotes",
    "GraphView",
    "HistoryEntry",
    "LeafCheck",
    "ModuleInfo",
    "ModuleTree",
    "Partition",
    "Picture",
    "PictureCluster",
    "PictureEdge",
    "PictureNode",
    "StepResult",
    "Summary",
    "SwapInfo",
    "VerifyReport",
]
