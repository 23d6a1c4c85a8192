"""graphsurgeon: swap modules of torch.export programs for eager code, and check the result.

The pipeline: ``export`` -> ``module_tree`` / ``partition`` -> ``fuse`` / ``swap`` ->
``verify`` / ``compare`` -> ``to_dot`` / ``to_svg`` -> ``Stepper``; ``Surgery`` keeps a program
and its swaps with undo/redo. Result types are in :mod:`graphsurgeon.types`, every error in
:mod:`graphsurgeon.errors` (the common ones are here too).

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

from . import errors, types
from .compare import Comparison, compare
from .drawing import Drawing, draw
from .errors import (
    ExportError,
    GraphSurgeonError,
    GuardError,
    InputStructureError,
    MissingDependencyError,
    PartitionError,
    ReplacementError,
    SwapError,
)
from .export import export, export_notes
from .fuse import fuse
from .partition import ModuleInfo, ModuleTree, Partition, module_tree, partition
from .render import to_dot, to_svg
from .step import Stepper
from .surgery import Surgery
from .swap import swap, swap_info
from .verify import VerifyReport, eager_reference, verify

__version__ = "0.1.0"


def __getattr__(name: str):
    # The widget needs anywidget and ipywidgets: imported when first named, so that
    # ``import graphsurgeon`` stays cheap and works without them.
    if name == "SurgeryWidget":
        from .widget import SurgeryWidget

        return SurgeryWidget
    raise AttributeError(f"module 'graphsurgeon' has no attribute {name!r}")


__all__ = [
    # the pipeline
    "export",
    "export_notes",
    "module_tree",
    "partition",
    "fuse",
    "swap",
    "swap_info",
    "verify",
    "eager_reference",
    "compare",
    "to_dot",
    "to_svg",
    "draw",
    "Stepper",
    "Surgery",
    "SurgeryWidget",
    # results a user names most (the rest: graphsurgeon.types)
    "ModuleTree",
    "ModuleInfo",
    "Partition",
    "VerifyReport",
    "Comparison",
    "Drawing",
    # errors (every one: graphsurgeon.errors)
    "GraphSurgeonError",
    "ExportError",
    "PartitionError",
    "SwapError",
    "ReplacementError",
    "InputStructureError",
    "GuardError",
    "MissingDependencyError",
    # modules
    "errors",
    "types",
]
