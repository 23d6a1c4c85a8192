"""draw(): a program's picture as an object that shows itself in a notebook.

``gs.to_dot`` and ``gs.to_svg`` give text, for files and tools. ``gs.draw`` gives a
:class:`Drawing`, which a notebook displays as inline SVG in the page (not an ``<img>``): the
tooltips (op, shapes, source line, swappable or why not) and the element ids stay, the picture
fits the width of the output, and a small vendored script (no network) zooms and pans it.

Left to itself (``collapse="auto"`` with no ``max_nodes``), draw picks the most detailed view
that still fits a notebook: it lays the picture out with the usual budget of nodes and, while
the picture fitted to the output's width (never below :data:`MIN_SCALE` of its size: a wider
one scrolls inside its frame) is taller than about two screens, or wider than
:data:`MAX_WIDTH`, collapses further. The layer stack always stays in view (every layer a box,
or a run of layers one box), and a view that gives each repeated block its own box (the
layers of an encoder and a decoder, the blocks inside a vision model's stages) is kept up to
:data:`MAX_STACK_HEIGHT` tall rather than fold them away.

Example:
    >>> import torch, graphsurgeon as gs
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> drawing = gs.draw(gs.export(model, (torch.randn(2, 4),)))
    >>> drawing
    <Drawing of Sequential: 4 of 6 fx nodes drawn>
    >>> html = drawing._repr_mimebundle_()["text/html"]
    >>> "<svg" in html and "<img" not in html and "<title>" in html
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import display
from ._program import as_program
from .errors import RenderError
from .partition import call_index
from .render import (
    AUTO_MAX_NODES,
    DrawOptions,
    GraphView,
    graph_view,
    layer_calls,
    legend_html,
    overlay_of,
)
from .render.picture import Picture

__all__ = ["Drawing", "draw"]

#: The width a notebook's output area gives a picture (JupyterLab at a 1280 px wide window).
FIT_WIDTH = 820
#: The height, once fitted to that width, past which draw() collapses more: about two screens.
MAX_HEIGHT = 1600
#: The smallest scale a picture is shown at: a wider one scrolls rather than shrink its text.
MIN_SCALE = 0.6
#: The height up to which draw() keeps a stack of layers one box each rather than fold runs of
#: them into one box: about four screens (32 layers of a decoder). The same holds for any
#: repeated block (the blocks inside a vision model's stages).
MAX_STACK_HEIGHT = 3200
#: The widest a picture is shown (once fitted, so at :data:`MIN_SCALE` at least), in pixels:
#: about three output widths, scrolled sideways (an encoder beside a decoder).
MAX_WIDTH = 3 * FIT_WIDTH
# The budgets draw() tries, most detailed first, when it chooses the view itself.
_BUDGETS = (AUTO_MAX_NODES, 200, 120, 80, 50, 30, 20)


class Drawing:
    """A picture of a program, laid out, that displays itself inline in a notebook.

    Made by :func:`draw`. ``view`` is the :class:`~graphsurgeon.types.GraphView` (DOT text,
    what is open, collapsed, highlighted), ``picture`` the drawing as data (every id to the fx
    node or module call it draws), ``svg`` the laid-out SVG, ``dot`` the DOT text;
    ``save(path)`` writes ``.svg``, ``.dot``, ``.png`` or ``.pdf``.
    """

    def __init__(self, view: GraphView, svg: str, name: str, max_nodes: int | None):
        self.view = view
        self.svg = svg
        self.name = name
        self.max_nodes = max_nodes  # the budget draw() chose, or None when told the view
        self.width, self.height = display.svg_size(svg)

    @property
    def scale(self) -> float:
        """The scale the picture is shown at in an output :data:`FIT_WIDTH` pixels wide: fitted
        to the width, never below :data:`MIN_SCALE` (a wider picture scrolls)."""
        return fitted_scale(self.width)

    @property
    def dot(self) -> str:
        """The DOT text of the picture."""
        return self.view.dot

    @property
    def picture(self) -> Picture:
        """The semantic picture drawn (its named nodes, clusters and edges)."""
        return self.view.picture

    @property
    def overlay(self) -> Mapping[str, float]:
        """With ``overlay=``: each drawn node's and box's value by element id (``node:add_3``,
        ``module:layers.2``, ``ops:model``); a box's is the worst of its members (errors) or
        their sum (latency). Empty without an overlay."""
        return self.view.overlay

    @property
    def overlay_values(self) -> Any:
        """The :class:`graphsurgeon.checks.overlay.OverlayValues` drawn (every node's and call's
        value, its kind, unit and tolerance), or None."""
        return self.view.overlay_values

    def save(self, path: str | Path) -> Path:
        """Write the picture to ``path``: its suffix says how (.svg, .dot, .png, .pdf)."""
        path = Path(path)
        suffix = path.suffix.lower().lstrip(".")
        if suffix == "svg":
            path.write_text(self.svg)
        elif suffix in ("dot", "gv"):
            path.write_text(self.dot)
        elif suffix in ("png", "pdf"):
            path.write_bytes(self.view.laid_out(suffix))
        else:
            raise RenderError(
                f"cannot save a drawing as {path.name!r}: name a .svg, .dot, .png or .pdf file"
            )
        return path

    def caption(self) -> str:
        """What the picture shows, in a line (:meth:`GraphView.caption`)."""
        return self.view.caption()

    def __repr__(self) -> str:
        return f"<Drawing of {self.name}: {self.caption()}>"

    def _repr_html_(self) -> str:
        view = self.view
        return display.picture_html(
            self.name,
            self.caption(),
            self.svg,
            len(view.collapsed),
            min_scale=MIN_SCALE,
            legend=legend_html(view.picture),
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        return display.bundle(self._repr_html_(), repr(self), include, exclude)


@DrawOptions.keywords
def draw(program: Any, **options: Any) -> Drawing:
    """Draw ``program`` as :func:`graphsurgeon.to_svg` does, as an object a notebook displays.

    The arguments are :func:`graphsurgeon.to_dot`'s (the fields of
    :class:`~graphsurgeon.render.DrawOptions`). With ``collapse="auto"`` and no ``max_nodes``,
    the budget is chosen so the picture, fitted to a notebook's output width, is at most about
    two screens tall and its text at least :data:`MIN_SCALE` of its size (collapsing more on
    larger programs, never below the layer stack). Needs graphviz's ``dot``
    (:class:`~graphsurgeon.errors.MissingDependencyError` otherwise).

    ``overlay=`` paints values on the picture, with a legend: ``"error"``, ``"own error"``,
    ``"grad error"``, ``"own grad error"`` (the gradients: a wrong backward), ``"latency"``
    (these run the program: pass ``args``/``kwargs``, or draw a Surgery, which
    has its inputs) or ``{node or module name: value}``; :attr:`Drawing.overlay` maps the
    drawn ids to values.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> x = torch.randn(2, 4)
        >>> s = gs.Surgery.from_model(model, (x,)).swap("1", torch.nn.Sigmoid())
        >>> pic = gs.draw(s, overlay="error")
        >>> pic.overlay["node:linear"], pic.overlay["node:swapped_1"] > 1
        (0.0, True)
    """
    told = DrawOptions.given(options, "draw")
    # read through the one door first: a wrong object or wrong inputs are refused naming draw
    as_program(program, told.args, told.kwargs, verb="draw")
    # the overlay's values computed once, drawn at each budget
    told = dataclasses.replace(
        told, overlay=overlay_of(program, told.overlay, told.args, told.kwargs)
    )
    choose = told.collapse == "auto" and told.max_nodes is None
    budgets = _BUDGETS if choose else (told.max_nodes,)
    view = svg = chosen = None
    blocks: frozenset[str] = frozenset()
    if choose:  # the calls that repeat (layers, a stage's blocks), by the stacks' rule
        blocks = layer_calls(call_index(as_program(program, verb="draw").ep).calls, at_least=2)
    for budget in budgets:
        candidate = graph_view(program, dataclasses.replace(told, max_nodes=budget))
        if view is not None and candidate.drawn_nodes >= view.drawn_nodes:
            continue  # this budget draws no less: try a smaller one
        if (  # the next step folds repeated blocks away (into runs, or into their parent's
            # box): one box a block is worth a longer picture
            view is not None
            and _blocks_shown(candidate, blocks) < _blocks_shown(view, blocks)
            and _fits(*display.svg_size(svg), height_limit=MAX_STACK_HEIGHT)
        ):
            break
        view, chosen = candidate, budget
        svg = view.laid_out("svg").decode()
        if _fits(*display.svg_size(svg)):
            break
    return Drawing(view, svg, view.picture.name, chosen if choose else None)


def _blocks_shown(view: GraphView, blocks: frozenset[str]) -> int:
    """How many of ``blocks`` (repeated calls) a view draws with a box or a cluster of their
    own (not in a run of boxes, nor inside their parent's box)."""
    own = {n.calls[0] for n in view.picture.nodes if n.kind == "box" and len(n.calls) == 1}
    return len((own | set(view.clusters)) & blocks)


def fitted_scale(width: float) -> float:
    """The scale a picture ``width`` pixels wide is shown at in an output :data:`FIT_WIDTH`
    wide: fitted to it, but never below :data:`MIN_SCALE`.

    Example:
        >>> fitted_scale(410), fitted_scale(1025), fitted_scale(4000)
        (1.0, 0.8, 0.6)
    """
    return max(MIN_SCALE, min(1.0, FIT_WIDTH / width))


def _fits(width: float, height: float, *, height_limit: float = MAX_HEIGHT) -> bool:
    """Whether a picture shows in a notebook's output: once fitted to the width (its text at
    least :data:`MIN_SCALE` of its size), at most :data:`MAX_WIDTH` wide (a wider one than the
    output scrolls sideways) and ``height_limit`` (about two screens) tall."""
    scale = fitted_scale(width)
    return width * scale <= MAX_WIDTH and height * scale <= height_limit
