"""draw(): a program's picture as an object that shows itself in a notebook.

``gs.to_dot`` and ``gs.to_svg`` give text, for files and tools. ``gs.draw`` gives a
:class:`Drawing`, which a notebook displays as inline SVG in the page (not an ``<img>``): the
tooltips (op, shapes, source line, swappable or why not) and the element ids stay, the picture
fits the width of the output, and a small vendored script (no network) zooms and pans it.

Left to itself (``collapse="auto"`` with no ``max_nodes``), draw picks the most detailed view
that still fits a notebook: it lays the picture out with the usual budget of nodes and, while
the picture scaled to the output's width is taller than about two screens, collapses further.

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

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import display
from .errors import RenderError
from .render import AUTO_MAX_NODES, GraphView, graph_view
from .render.graphviz import layout
from .render.picture import Picture

__all__ = ["Drawing", "draw"]

#: The width a notebook's output area gives a picture (JupyterLab at a 1280 px wide window).
FIT_WIDTH = 820
#: The height, once fitted to that width, past which draw() collapses more: about two screens.
MAX_HEIGHT = 1600
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
    def dot(self) -> str:
        return self.view.dot

    @property
    def picture(self) -> Picture:
        return self.view.picture

    def save(self, path: str | Path) -> Path:
        """Write the picture to ``path``: its suffix says how (.svg, .dot, .png, .pdf)."""
        path = Path(path)
        suffix = path.suffix.lower().lstrip(".")
        if suffix == "svg":
            path.write_text(self.svg)
        elif suffix in ("dot", "gv"):
            path.write_text(self.dot)
        elif suffix in ("png", "pdf"):
            path.write_bytes(layout(self.dot, suffix))
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
        return display.picture_html(self.name, self.caption(), self.svg, len(view.collapsed))

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        return display.bundle(self._repr_html_(), repr(self), include, exclude)


def draw(
    program: Any,
    *,
    highlight: str | Iterable[str] = (),
    collapse: Any = "auto",
    diff: Any = None,
    max_nodes: int | None = None,
    show_parameters: bool = False,
) -> Drawing:
    """Draw ``program`` as :func:`graphsurgeon.to_svg` does, as an object a notebook displays.

    The arguments are :func:`graphsurgeon.to_dot`'s. With ``collapse="auto"`` and no
    ``max_nodes``, the budget is chosen so the picture, fitted to a notebook's output width,
    is at most about two screens tall (collapsing more on larger programs). Needs graphviz's
    ``dot`` (:class:`~graphsurgeon.MissingDependencyError` otherwise).
    """
    options = dict(
        highlight=highlight, collapse=collapse, diff=diff, show_parameters=show_parameters
    )
    choose = collapse == "auto" and max_nodes is None
    budgets = _BUDGETS if choose else (max_nodes or AUTO_MAX_NODES,)
    view = svg = chosen = None
    for budget in budgets:
        candidate = graph_view(program, max_nodes=budget, **options)
        if view is not None and candidate.drawn_nodes >= view.drawn_nodes:
            continue  # this budget draws no less: try a smaller one
        view, chosen = candidate, budget
        svg = layout(view.dot, "svg").decode()
        width, height = display.svg_size(svg)
        if height * min(1.0, FIT_WIDTH / width) <= MAX_HEIGHT:
            break
    return Drawing(view, svg, view.picture.name, chosen if choose else None)
