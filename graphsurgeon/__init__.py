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
    >>> reference = torch.nn.Sequential(model[0], torch.nn.GELU())  # what the swap should compute
    >>> bool(gs.verify(reference, gm, (x,)))
    True
"""

from . import errors, types
from ._derived import forget
from .checks.compare import Comparison, compare
from .checks.verify import VerifyReport, verify
from .drawing import draw
from .errors import (
    ExportError,
    GraphSurgeonError,
    GuardError,
    InputStructureError,
    ReplacementError,
    SwapError,
    UnknownNameError,
)
from .export import export
from .fuse import fuse
from .partition import ModuleInfo, ModuleTree, Partition, module_tree, partition
from .patterns.find import find
from .render import to_dot, to_svg
from .step import Stepper
from .surgery import Surgery
from .swap import swap

__version__ = "0.1.0"

from . import _moved

_moved.install()

# Names that lived here once, and where they are now (the top level keeps to what a user calls
# most: every result type is in graphsurgeon.types, every error in graphsurgeon.errors).
_MOVED = {
    "export_notes": "from graphsurgeon.export import export_notes",
    "swap_info": "from graphsurgeon.swap import swap_info",
    "eager_reference": "from graphsurgeon.checks.verify import eager_reference",
    "Drawing": "from graphsurgeon.types import Drawing",
    "PartitionError": "gs.errors.PartitionError",
    "MissingDependencyError": "gs.errors.MissingDependencyError",
}


def __getattr__(name: str):
    # The widget needs anywidget and ipywidgets: imported when first named, so that
    # ``import graphsurgeon`` stays cheap and works without them.
    if name == "SurgeryWidget":
        from .widget import SurgeryWidget

        return SurgeryWidget
    if name in _MOVED:
        raise AttributeError(f"graphsurgeon.{name} has moved: {_MOVED[name]}")
    raise AttributeError(f"module 'graphsurgeon' has no attribute {name!r}")


__all__ = [
    # the pipeline
    "export",
    "module_tree",
    "partition",
    "find",
    "fuse",
    "swap",
    "verify",
    "compare",
    "to_dot",
    "to_svg",
    "draw",
    "forget",
    "Stepper",
    "Surgery",
    "SurgeryWidget",
    # results a user names most (the rest: graphsurgeon.types)
    "ModuleTree",
    "ModuleInfo",
    "Partition",
    "VerifyReport",
    "Comparison",
    # errors (every one: graphsurgeon.errors)
    "GraphSurgeonError",
    "UnknownNameError",
    "ExportError",
    "SwapError",
    "ReplacementError",
    "InputStructureError",
    "GuardError",
    # modules
    "errors",
    "types",
]
