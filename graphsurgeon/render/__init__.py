"""to_dot() and to_svg(): a program drawn with its module partitions, before and after a swap.

What a picture shows:

* one nested cluster per module call, from ``nn_module_stack``, labelled ``fqn: TypeName`` and
  filled with a pale color derived from the fqn (the same color on every run and machine);
  a module call that holds a single node is drawn as that node, filled with the module's color;
* one node per fx node, labelled by op (``aten.linear``) and its output (``f32[1, 16, 64]``);
  user inputs, buffers and constants have their own shapes, parameters are folded into the
  node that uses them (``+ weight, bias``); pytree glue (``getitem`` chains, the swap's checks)
  is not drawn: its edges go straight from the value's producer, labelled with the index path;
* a swapped module call as one orange double-bordered box: the replacement's type and its call;
* a fused call (:func:`graphsurgeon.fuse`) as the program's own nodes it runs, in one box
  marked "fused" unless opened;
* a collapsed module call as one box with its node and parameter counts, its edges aggregated;
* a value used by more than 8 drawn nodes or boxes (rotary tables, masks fed to every layer)
  without its edges: it says ``→ 80 users`` and each user names it (``shared: slice_1``).

Every node, cluster and edge carries a stable ``id`` that graphviz copies into the SVG:
``node:<fx node name>``, ``cluster:<call name>`` (an open module call), ``module:<call name>``
(a collapsed one), ``modules:<first>..<last>`` (a run of collapsed siblings) and
``edge:<tail>-><head>`` (tail and head are DOT node names: the fx node name, or the ``module:``
id of a box; a repeated pair gets ``:2``, ``:3`` ...). The two pictures of a side-by-side diff
prefix all of these with ``before/`` and ``after/``. A name that an id cannot carry as it is (NUL,
a newline, a control character) is written as :func:`graphsurgeon.display.id_text` writes it
(``module:a%00b``); labels show such characters visibly (``a␀b``) and shorten long names in the
middle (``…``). Tooltips carry the fx node name, the full op and the source line from
``stack_trace``.

The stages, one module each: ``_scene`` (the graph's analysis, the scene, the collapse plan
and the names a caller gives), ``_writer`` (scene -> a semantic
:class:`~graphsurgeon.render.picture.Picture`), ``picture`` (the records, their lookups, and
the lowering to DOT that owns every DOT style) and ``graphviz`` (the one ``dot`` runner).

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.render import graph_view
    >>> from torch.nn import Linear, ReLU, Sequential
    >>> model = Sequential(Sequential(Linear(4, 4), ReLU()), Linear(4, 2))
    >>> ep = gs.export(model, (torch.randn(2, 4),))
    >>> view = graph_view(ep)  # "0" holds two nodes: a cluster; "1" one node: drawn as it
    >>> view.drawn_nodes, view.clusters, view.collapsed
    (5, ('0',), ())
    >>> graph_view(ep, collapse=1).collapsed
    ('0', '1')
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import display
from ..errors import RenderError
from ._scene import (
    _analysis,
    _drawn,
    _Marks,
    _names,
    _pictures,
    _plan,
    _Program,
    _program,
    _resolve,
    _state,
    _swaps_named,
)
from ._writer import _Context, _picture, _Writer
from .graphviz import layout
from .picture import Picture

__all__ = ["AUTO_MAX_NODES", "GraphView", "RenderError", "graph_view", "to_dot", "to_svg"]

#: How many nodes ``collapse="auto"`` draws at most (boxes included), unless told otherwise.
AUTO_MAX_NODES = 300

@dataclass(frozen=True)
class GraphView:
    """One picture of a program: its DOT text and what it shows.

    Attributes:
        dot: the graphviz DOT text (what :func:`to_dot` returns).
        picture: the same drawing as data (:class:`graphsurgeon.types.Picture`): every
            node, cluster and edge by its id, with the fx node or module call it stands for.
        graph_nodes: fx nodes of the program drawn (of both programs, for a diff; a fused
            call counts as the nodes it runs).
        drawn_nodes: node statements in the DOT: fx nodes drawn, plus one per collapsed box.
        clusters: module calls drawn as clusters, in model order (a call holding a single
            node is drawn as that node, and is in neither this nor ``collapsed``).
        collapsed: module calls drawn as one box (each member of a run box is listed).
        highlighted: module calls drawn highlighted.
        swapped: the swapped calls of the program (empty for an ExportedProgram).
        fused: the fused calls of the program (:func:`graphsurgeon.fuse`): each is drawn as
            the program's own nodes, one box marked "fused" unless opened.
    """

    dot: str = field(repr=False)
    picture: Picture = field(repr=False)
    graph_nodes: int
    drawn_nodes: int
    clusters: tuple[str, ...]
    collapsed: tuple[str, ...]
    highlighted: tuple[str, ...]
    swapped: tuple[str, ...]
    fused: tuple[str, ...] = ()

    def caption(self) -> str:
        """What the picture shows, in a line: ``57 of 349 fx nodes drawn, 1 swapped``."""
        text = f"{self.drawn_nodes:,} of {self.graph_nodes:,} fx nodes drawn"
        if self.swapped:
            text += f", {len(self.swapped)} swapped"
        if self.fused:
            text += f", {len(self.fused)} fused"
        return text

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        """Shown as its picture, laid out (as :func:`graphsurgeon.draw` shows it)."""
        name = self.picture.name
        svg = layout(self.dot, "svg").decode()
        html = display.picture_html(name, self.caption(), svg, len(self.collapsed))
        return display.bundle(html, f"<Drawing of {name}: {self.caption()}>", include, exclude)


# -- arguments -------------------------------------------------------------------------------


def _check_collapse(collapse: Any) -> None:
    if collapse is None or collapse == "auto":
        return
    expected = "collapse: expected 'auto', None, a depth (1, 2, ...) or a set of module names"
    if isinstance(collapse, str):
        raise RenderError(
            f"{expected}, got {collapse!r}; to collapse one module pass {{{collapse!r}}}"
        )
    if isinstance(collapse, bool):
        raise RenderError(f"{expected}, got {collapse!r}")
    if isinstance(collapse, int) and collapse < 1:
        raise RenderError(
            f"collapse: a depth is 1 or more (1 draws every top-level module as a box), got "
            f"{collapse}; use collapse=None to collapse nothing"
        )


def _diff_mode(diff: Any, program: _Program) -> str | None:
    if diff is None or diff is False:
        return None
    mode = "merged" if diff is True else diff
    if mode not in ("merged", "split"):
        raise RenderError(f"diff: expected None, True, 'merged' or 'split', got {diff!r}")
    if not program.comparable:
        raise RenderError(
            "diff: this program has no swaps to compare; draw a gs.swap result (or a Surgery "
            "with swaps), and the picture compares it with the program it was made from"
        )
    return mode


# -- putting it together ---------------------------------------------------------------------


def graph_view(
    program: Any,
    *,
    highlight: str | Iterable[str] = (),
    collapse: Any = "auto",
    diff: Any = None,
    max_nodes: int = AUTO_MAX_NODES,
    show_parameters: bool = False,
) -> GraphView:
    """Draw ``program`` as DOT text and say what the picture shows. See :func:`to_dot`.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.render import graph_view
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> view = graph_view(gs.export(model, (torch.randn(2, 4),)), collapse=1)
        >>> view.collapsed, view.drawn_nodes
        (('0', '1'), 4)
    """
    source = _program(program)
    mode = _diff_mode(diff, source)
    _check_collapse(collapse)
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise RenderError(f"max_nodes: expected a positive int, got {max_nodes!r}")
    with _without_cyclic_gc():
        return _view(source, mode, highlight, collapse, max_nodes, show_parameters)


@contextlib.contextmanager
def _without_cyclic_gc():
    """Drawing allocates many small objects and no cycles: without this, the cyclic garbage
    collector walks the whole heap (the program, torch) several times per picture."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _view(
    source: _Program,
    mode: str | None,
    highlight: Any,
    collapse: Any,
    max_nodes: int,
    show_parameters: bool,
) -> GraphView:
    ep = source.ep
    state = _state(ep)
    before = _analysis(ep, state)
    after = _drawn(source, before, state) if source.module is not None else None
    swapped = tuple(source.swapped)
    marks = _Marks()
    scene, pictures = _pictures(mode, before, after, source, marks, show_parameters)

    highlight_names = _names(highlight, "highlight")
    marks.highlighted = set(_resolve(highlight_names, scene, source, "highlight"))
    chosen_swaps = _swaps_named(highlight_names, swapped)
    if mode is None:  # the swapped module has no cluster here: its box stands out instead
        marks.highlighted_vertices = {source.swapped[c] for c in chosen_swaps}
    collapsed: set[str] = set()
    if collapse is not None and not isinstance(collapse, (int, str)):
        collapsed = set(_resolve(_names(collapse, "collapse"), scene, source, "collapse"))
    forced = scene.ancestors(n for n in swapped if mode is not None)
    if collapse == "auto" or isinstance(collapse, int):
        forced |= scene.ancestors(marks.highlighted)
    open_, runs = _plan(scene, collapse, collapsed, forced, max_nodes)
    marks.fused = set(source.fused)
    if collapse == "auto" or isinstance(collapse, int):
        # a fused call is one call now: one box, unless highlighted (or opened by name)
        open_ -= marks.fused - forced

    context = _Context(source, state)
    writers = [_Writer(s, open_, runs, marks, context, p, e) for s, p, e in pictures]
    for writer in writers:
        writer.write()
    name = before.root_type.rsplit(".", 1)[-1] or "program"
    picture = _picture(name, writers, scene.aliases)

    graph_nodes = len(ep.graph.nodes)
    if source.module is not None:
        # the result's nodes, each fused call counted as the original nodes it runs
        drawn = len(source.module.graph.nodes)
        drawn += sum(len(source.info.partitions[c].nodes) - 1 for c in source.fused)
        graph_nodes = graph_nodes + drawn if mode is not None else drawn
    present = set(scene.present)
    boxes = {b for w in writers for b in w.boxes}
    clusters = {c for w in writers for c in w.clusters}
    return GraphView(
        dot=picture.to_dot(),
        picture=picture,
        graph_nodes=graph_nodes,
        drawn_nodes=sum(w.drawn for w in writers),
        clusters=tuple(n for n in scene.present if n in clusters),
        collapsed=tuple(n for n in scene.present if n in boxes),
        highlighted=tuple(
            n
            for n in before.calls
            if (n in marks.highlighted and n in present) or n in chosen_swaps
        ),
        swapped=swapped,
        fused=tuple(source.fused),
    )


def to_dot(
    program: Any,
    *,
    highlight: str | Iterable[str] = (),
    collapse: Any = "auto",
    diff: Any = None,
    max_nodes: int = AUTO_MAX_NODES,
    show_parameters: bool = False,
) -> str:
    """The DOT text of ``program`` drawn with its module partitions. Pure: no binary needed.

    Args:
        program: an ExportedProgram, a :func:`graphsurgeon.swap` or :func:`graphsurgeon.fuse`
            result, or a Surgery (its ``.module`` when something is swapped or fused, else its
            ``.program``). A fused call is drawn as what it runs, the program's own nodes: one
            box marked "fused" (blue border) that opens into them when asked (``collapse=None``,
            a set of names without it, or a highlight).
        highlight: module fqns or call names (``"layers.1"``, ``"shared@1"``) to make stand out:
            bold border, stronger fill. A container (``"layers"``) highlights its submodules;
            a swapped module highlights its box. Unknown names raise
            :class:`~graphsurgeon.UnknownModuleError`.
        collapse: which module calls are drawn as one box (node count, edges aggregated):

            * ``"auto"`` (default): as much detail as fits in ``max_nodes`` drawn nodes. Starts
              with every top-level module collapsed, then opens whole groups of modules of one
              type at a time (every ``Block``, then every ``MLP``...), cheapest first, while the
              picture stays within budget. Highlighted modules (and their parents) stay open.
              If the top-level boxes alone are too many, runs of sibling modules of one type
              become one box. Nodes that belong to no module are always drawn.
            * ``None``: nothing collapsed.
            * a depth ``d >= 1``: calls ``d`` levels deep are boxes (``1``: every top-level
              module); highlighted modules stay open.
            * a set of fqns or call names: exactly those are boxes.

        diff: compare a swapped program with the program it was made from:
            ``"merged"`` (or ``True``) draws one picture: the removed nodes greyed and dashed
            inside the swapped module's boundary (a dashed orange cluster), next to the added
            box marked ``+`` in green. ``"split"`` draws two pictures side by side, ``before``
            and ``after``, each node level with itself in the other, ids prefixed ``before/``
            and ``after/``. Both keep the original node order. Swapped modules stay open.
        max_nodes: the budget of ``collapse="auto"`` (per picture).
        show_parameters: draw parameters as nodes of their own instead of folding them into
            the node that uses them.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.render import to_dot
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> ep = gs.export(model, (torch.randn(2, 4),))
        >>> dot = to_dot(ep, highlight="1")
        >>> [line.strip()[:61] for line in dot.splitlines() if "highlighted" in line]
        ['"relu" [id="node:relu", class="op module highlighted", label=']
        >>> to_dot(ep) == to_dot(ep)
        True
    """
    return graph_view(
        program,
        highlight=highlight,
        collapse=collapse,
        diff=diff,
        max_nodes=max_nodes,
        show_parameters=show_parameters,
    ).dot


def to_svg(
    program: Any,
    *,
    highlight: str | Iterable[str] = (),
    collapse: Any = "auto",
    diff: Any = None,
    max_nodes: int = AUTO_MAX_NODES,
    show_parameters: bool = False,
) -> str:
    """The SVG of :func:`to_dot`'s picture, laid out by graphviz's ``dot`` (cached by DOT text).

    Raises :class:`~graphsurgeon.MissingDependencyError` when ``dot`` is not installed.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.render import to_svg
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> svg = to_svg(gs.export(model, (torch.randn(2, 4),)))
        >>> 'id="node:linear"' in svg and svg.rstrip().endswith("</svg>")
        True
    """
    dot = to_dot(
        program,
        highlight=highlight,
        collapse=collapse,
        diff=diff,
        max_nodes=max_nodes,
        show_parameters=show_parameters,
    )
    return layout(dot, "svg").decode()
