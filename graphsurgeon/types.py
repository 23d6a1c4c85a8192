"""The result types of graphsurgeon, for annotations and ``isinstance`` checks.

Each is made by a verb (``gs.module_tree(ep)`` returns a :class:`ModuleTree`) and displays
itself; none is meant to be built by hand.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.types import VerifyReport
    >>> isinstance(gs.verify(torch.nn.ReLU(), torch.nn.ReLU(), (torch.randn(2),)), VerifyReport)
    True
"""

from .checks.bisect import Bisection, BisectRun
from .checks.compare import CallComparison, Comparison
from .checks.locate import Location
from .checks.overlay import OverlayValues
from .checks.verify import LeafCheck, VerifyReport
from .drawing import Drawing
from .export import ExportNotes
from .partition import ModuleInfo, ModuleTree, Partition, Resolved
from .patterns.find import Match, Matches, NearMiss
from .patterns.region import RegionPlan
from .render import GraphView
from .render.picture import Heat, Picture, PictureCluster, PictureEdge, PictureNode
from .rewrite import Region
from .step import Breakpoint, Breakpoints, StepResult, Summary
from .surgery import HistoryEntry
from .swap import Diff, SwapInfo

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
