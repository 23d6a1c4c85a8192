"""The result types of graphsurgeon, for annotations and ``isinstance`` checks.

Each is made by a verb (``gs.module_tree(ep)`` returns a :class:`ModuleTree`) and displays
itself; none is meant to be built by hand.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.types import VerifyReport
    >>> isinstance(gs.verify(torch.nn.ReLU(), torch.nn.ReLU(), (torch.randn(2),)), VerifyReport)
    True
"""

from .bisect import Bisection, BisectRun
from .compare import CallComparison, Comparison
from .drawing import Drawing
from .export import ExportNotes
from .find import Match, Matches, NearMiss
from .locate import Location
from .overlay import OverlayValues
from .partition import ModuleInfo, ModuleTree, Partition, Resolved
from .region import RegionPlan
from .render import GraphView
from .render.picture import Heat, Picture, PictureCluster, PictureEdge, PictureNode
from .rewrite import Region
from .step import Breakpoint, Breakpoints, StepResult, Summary
from .surgery import HistoryEntry
from .swap import Diff, SwapInfo
from .verify import LeafCheck, VerifyReport

__all__ = [
    "BisectRun",
    "Bisection",
    "Breakpoint",
    "Breakpoints",
    "CallComparison",
    "Comparison",
    "Diff",
    "Drawing",
    "ExportNotes",
    "GraphView",
    "Heat",
    "HistoryEntry",
    "LeafCheck",
    "Location",
    "Match",
    "Matches",
    "ModuleInfo",
    "ModuleTree",
    "NearMiss",
    "OverlayValues",
    "Partition",
    "Picture",
    "PictureCluster",
    "PictureEdge",
    "PictureNode",
    "Region",
    "RegionPlan",
    "Resolved",
    "StepResult",
    "Summary",
    "SwapInfo",
    "VerifyReport",
]
