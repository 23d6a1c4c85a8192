"""The assembly of a picture: :func:`to_dot`, :func:`to_svg` and :func:`graph_view` put the
stages together (the scene, its collapse plan, the writer, the picture) with one set of
:class:`DrawOptions`.

What a picture shows:

* one nested cluster per module call, from ``nn_module_stack``, labelled ``fqn: TypeName`` and
  filled with a pale color derived from the type's name (the same color on every run and
  machine, and for every layer of one type); a module call that holds a single node is drawn as
  that node, filled with the module's color;
* one node per fx node, labelled by op (``aten.linear``) and its output (``f32[1, 16, 64]``);
  user inputs, buffers and constants have their own shapes, parameters are folded into the
  node that uses them (``+ weight, bias``); pytree glue (``getitem`` chains, the swap's checks)
  is not drawn: its edges go straight from the value's producer, labelled with the index path;
* a swapped module call as one orange double-bordered box: the replacement's type and its call;
* a fused call (:func:`graphsurgeon.fuse`) as the program's own nodes it runs, in one box
  marked "fused" unless opened;
* a collapsed module call as one box with its node and parameter counts, its edges aggregated;
  a run of sibling calls of one type that feed each other (a decoder's layers) as one box
  (``layers.0 … layers.31: Block × 32``): only a chain, so that a box never closes a cycle;
* the ops a module call runs in its own forward from the program's inputs alone (a decoder's
  mask and position building, dozens of ops wide) as one box, ``LlamaModel: 45 ops``, that
  opens and closes like a module (``ops:<call>``; ``ops:`` for the top level);
* no run-time checks (``_assert_tensor_metadata``; ``show_checks=True`` draws them);
* with ``overlay=``, each node and box filled with its value's heat colour
  (:func:`graphsurgeon.checks.overlay.overlay_values`: error, own error, latency, or your own);
* a value used by more than 8 drawn nodes or boxes (rotary tables, masks fed to every layer)
  without its edges: it says ``→ 80 users`` and each user names it (``shared: slice_1``).

Every node, cluster and edge carries a stable ``id`` that graphviz copies into the SVG:
``node:<fx node name>``, ``cluster:<call name>`` (an open module call), ``module:<call name>``
(a collapsed one), ``modules:<first>..<last>`` (a run of collapsed siblings), ``ops:<call>``
(a call's own ops, folded) and
``edge:<tail>-><head>`` (tail and head are DOT node names: the fx node name, or the ``module:``
id of a box; a repeated pair gets ``:2``, ``:3`` ...). The two pictures of a side-by-side diff
prefix all of these with ``before/`` and ``after/``. A name that an id cannot carry as it is (NUL,
a newline, a control character) is written as :func:`graphsurgeon.display.id_text` writes it
(``module:a%00b``); labels show such characters visibly (``a␀b``) and shorten long names in the
middle (``…``). Tooltips carry the fx node name, the full op and the source line from
``stack_trace``.

Names given to ``highlight=``, ``show=`` and ``collapse=`` are read here as every entry point
reads them: :meth:`ProgramIndex.calls_covered <graphsurgeon.partition.ProgramIndex.calls_covered>`
(a module stands for its calls, a container such as ``"layers"`` for the outermost calls of its
submodules), ``"ops:<call>"`` for a call's own-ops box.

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
import dataclasses
import gc
import inspect
import math
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _meta, display
from .._program import as_program
from ..errors import RenderError, UnknownModuleError, did_you_mean
from ..partition import program_index, split_call_name
from . import _stack
from ._scene import (
    OPS_PREFIX,
    _analysis,
    _drawn,
    _Marks,
    _pictures,
    _plan,
    _Program,
    _program,
    _Scene,
    _split_runs,
    _state,
    ops_key,
)
from ._writer import _Context, _picture, _Writer
from .picture import EdgeRow, Heat, Picture

__all__ = [
    "AUTO_MAX_NODES",
    "DrawOptions",
    "GraphView",
    "analyze",
    "graph_view",
    "legend_html",
    "overlay_of",
    "to_dot",
    "to_svg",
]

#: How many nodes ``collapse="auto"`` draws at most (boxes included), unless told otherwise.
AUTO_MAX_NODES = 300


@dataclass(frozen=True)
class DrawOptions:
    """What a picture of a program shows: the keyword arguments of :func:`to_dot`,
    :func:`to_svg`, :func:`graph_view` and :func:`graphsurgeon.draw`, with their one set of
    defaults. Each of them reads its keywords into one DrawOptions (:meth:`given`).

    Attributes:
        highlight: module fqns or call names (``"layers.1"``, ``"shared@1"``) to make stand
            out: bold border, stronger fill. A container (``"layers"``) highlights its
            submodules; a swapped module highlights its box. Unknown names raise
            :class:`~graphsurgeon.errors.UnknownModuleError`.
        show: names opened as ``highlight`` opens them (on top of the view chosen without
            them, and their parents), without marking them: what a stepper is in, a match.
        collapse: which module calls are drawn as one box (node count, edges aggregated):

            * ``"auto"`` (default): as much detail as fits in ``max_nodes`` drawn nodes. The
              layer stack (the outermost runs of sibling calls of one type that feed each
              other: a decoder's layers, a ResNet's stages) is always visible: the calls around
              it are open, each layer at least a box. Then whole groups of modules of one type
              open at a time (every ``Block``, then every ``MLP``...; the own-ops boxes of one
              type of module are a group too), cheapest first, while the picture stays within
              budget. If those boxes alone are too many, runs of layers become one box each,
              and nothing else opens. Highlighted modules are opened with their parents on
              top of that view (the layer of a highlighted attention, and nothing else).
              Nodes that belong to no module are always drawn.
            * ``None``: nothing collapsed.
            * a depth ``d >= 1``: calls ``d`` levels deep are boxes (``1``: every top-level
              module), and the own ops of calls ``d - 1`` levels deep (``1``: the top level's);
              highlighted modules stay open.
            * a set of fqns or call names: exactly those are boxes; ``"ops:<call>"`` (``"ops:"``
              for the top level) names the own-ops box of a call.

        diff: compare a swapped program with the program it was made from:
            ``"merged"`` (or ``True``) draws one picture: the removed nodes greyed and dashed
            inside the swapped module's boundary (a dashed orange cluster), next to the added
            box marked ``+`` in green; the nodes the swap dropped outside every swapped call
            (size arithmetic only a swapped call read) are greyed where they were. ``"split"``
            draws two pictures side by side, ``before`` and ``after``, each node level with
            itself in the other, ids prefixed ``before/`` and ``after/``. Both keep the
            original node order, and draw what the swap says it removed, added and kept (its
            :class:`~graphsurgeon.rewrite.info.Diff`, as ``Surgery.diff()`` returns it).
            Swapped modules stay open.
        max_nodes: the budget of ``collapse="auto"`` (per picture). None (not told):
            :data:`AUTO_MAX_NODES` for a picture's text and :func:`to_svg`;
            :func:`graphsurgeon.draw` chooses, from it down, the most detailed view that fits
            a notebook.
        show_parameters: draw parameters as nodes of their own instead of folding them into
            the node that uses them.
        show_checks: draw the run-time checks torch.export records (``_assert_tensor_metadata``,
            ``sym_constrain_range``): they compute nothing, and are left out unless asked.
        overlay: paint values on the picture (:func:`graphsurgeon.checks.overlay.overlay_values`):
            ``"error"`` (the swapped program against the original, relative to the
            tolerance), ``"own error"`` (each node on the original's inputs), ``"grad error"``
            and ``"own grad error"`` (the same for the gradients), ``"latency"``
            (each node's share of a profiled forward), a mapping ``{node or module name:
            value}`` of your own, or values already computed (an ``OverlayValues``). Each node
            and box is filled with its value's heat colour and says it in its tooltip; a box
            (a collapsed call, a run of calls, an own-ops box) by the worst of its members for
            errors, their sum for latency. :attr:`GraphView.overlay` maps ids to values.
        args: the model's positional inputs, for the overlays that run the program (a
            Surgery brings its own).
        kwargs: its keyword inputs, likewise.
        fold_runs: with ``collapse=`` a set of names: the collapsed calls that repeat as
            layers (in a run of at least this many sibling calls of one type,
            :func:`~graphsurgeon.render.layer_calls`) are drawn a run of boxes to one box, as
            ``collapse="auto"`` draws a stack too tall for a box each: split around the layers
            left open (opening ``layers.200`` of 384 draws ``layers.0..199``, the open layer
            and ``layers.201..383``), a piece of one call its own box. None: every collapsed
            call is a box of its own. The widget opens layers this way, so that opening one
            costs the same at any depth of stack.
        unfolded: calls ``fold_runs`` leaves a box each (the runs a user opened into one box
            per call), read as ``collapse=`` reads names.

    Example:
        >>> from graphsurgeon.render import DrawOptions
        >>> options = DrawOptions.given({"highlight": "layers.1"}, "to_dot")
        >>> options.highlight, options.collapse, options.budget
        ('layers.1', 'auto', 300)
        >>> DrawOptions.given({"higlight": "layers.1"}, "to_dot")
        Traceback (most recent call last):
        TypeError: to_dot() got an unexpected keyword argument 'higlight'. Did you mean 'highlight'?
    """

    highlight: str | Iterable[str] = ()
    show: str | Iterable[str] = ()
    collapse: Any = "auto"
    diff: Any = None
    max_nodes: int | None = None
    show_parameters: bool = False
    show_checks: bool = False
    overlay: Any = None
    args: tuple | None = None
    kwargs: Mapping[str, Any] | None = None
    fold_runs: int | None = None
    unfolded: str | Iterable[str] = ()

    @classmethod
    def given(
        cls, keywords: Mapping[str, Any], verb: str, options: DrawOptions | None = None
    ) -> DrawOptions:
        """The options ``verb`` was called with (``verb(program, **keywords)``; on top of
        ``options`` when given); an unknown keyword raises TypeError, as a misspelt keyword
        of any function does."""
        for name in keywords:
            if name not in _OPTION_NAMES:
                raise TypeError(
                    f"{verb}() got an unexpected keyword argument {name!r}."
                    f"{did_you_mean(name, _OPTION_NAMES)}"
                )
        if options is None:
            return cls(**keywords)
        if not isinstance(options, DrawOptions):
            raise TypeError(
                f"{verb}(): options: expected DrawOptions, got {type(options).__name__}"
            )
        return dataclasses.replace(options, **keywords) if keywords else options

    @property
    def budget(self) -> int:
        """``max_nodes``, or :data:`AUTO_MAX_NODES` when not told."""
        return AUTO_MAX_NODES if self.max_nodes is None else self.max_nodes

    @classmethod
    def keywords(cls, function: Callable) -> Callable:
        """Give ``function(program, ..., **options)`` (a drawing entry point) the signature
        that ``help()`` and editors show: its own parameters, then these fields as keyword-only
        parameters with their defaults, written once, here."""
        signature = inspect.signature(function)
        own = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
        fields = [
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type
            )
            for f in dataclasses.fields(cls)
        ]
        function.__signature__ = signature.replace(parameters=own + fields)
        return function


_OPTION_NAMES = tuple(f.name for f in dataclasses.fields(DrawOptions))


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
        folded_ops: the own-ops boxes drawn (``"ops:model"``, ``"ops:"`` for the top level):
            the ops a module call runs in its own forward from the program's inputs alone
            (mask and position building), folded into one box; named in ``collapse=`` and
            ``highlight=`` as they are here.
        overlay: with ``overlay=``, each drawn node's and box's value by element id (a box:
            the worst of its members for errors, their sum for latency); empty without one.
        overlay_values: the :class:`graphsurgeon.checks.overlay.OverlayValues` drawn, or None.
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
    folded_ops: tuple[str, ...] = ()
    overlay: Mapping[str, float] = field(default_factory=dict, repr=False)
    overlay_values: Any = field(default=None, repr=False)

    def caption(self) -> str:
        """What the picture shows, in a line: ``57 of 349 fx nodes drawn, 1 swapped``."""
        text = f"{self.drawn_nodes:,} of {self.graph_nodes:,} fx nodes drawn"
        if self.swapped:
            text += f", {len(self.swapped)} swapped"
        if self.fused:
            text += f", {len(self.fused)} fused"
        return text

    def laid_out(self, format: str = "svg") -> bytes:
        """The picture laid out by graphviz, cached by the DOT text.

        A stack of many open layers is laid out a layer at a time
        (:mod:`graphsurgeon.render._stack`), anything else by ``dot`` whole.

        Args:
            format: ``"svg"``, ``"png"``, ``"pdf"``, or another format ``dot -T`` knows.

        Returns:
            The laid-out picture, as graphviz writes it.

        Raises:
            MissingDependencyError: graphviz's ``dot`` is not installed.
        """
        return _stack.layout(self.picture, self.dot, format)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        """Shown as its picture, laid out (as :func:`graphsurgeon.draw` shows it)."""
        name = self.picture.name
        svg = self.laid_out("svg").decode()
        html = display.picture_html(
            name, self.caption(), svg, len(self.collapsed), legend=legend_html(self.picture)
        )
        return display.bundle(html, f"<Drawing of {name}: {self.caption()}>", include, exclude)


def legend_html(picture: Picture) -> str:
    """The legend of a picture's overlay: its colours and what they mean.

    Args:
        picture: a picture, drawn with an overlay or without.

    Returns:
        The legend's HTML, or ``""`` for a picture without an overlay.
    """
    heat = picture.heat
    if heat is None:
        return ""
    return display.legend_html(f"{heat.kind} overlay", heat.legend(), _HEAT_NOTES.get(heat.kind))


_HEAT_NOTES = {
    "error": "the worst error against the original, relative to the tolerance; a box: the worst "
    "of its members",
    "own error": "each node's own error, on the original's inputs; a box: the worst of its members",
    "grad error": "the worst error of the gradients against the original's, relative to the "
    "tolerance; a wrong backward lights its call and everything before it; a box: the worst of "
    "its members",
    "own grad error": "each swapped call's own backward, on the original's inputs and upstream "
    "gradients; a box: the worst of its members",
    "latency": "each node's share of the forward, coloured against the largest drawn; a box: "
    "the sum of its members",
    "values": "your values; a box: the aggregate of its members",
}


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


@DrawOptions.keywords
def graph_view(program: Any, options: DrawOptions | None = None, /, **keywords: Any) -> GraphView:
    """Draw ``program`` as DOT text and say what the picture shows. See :func:`to_dot`.

    Args:
        program: what to draw, as :func:`to_dot` takes it.
        options: the :class:`DrawOptions` to draw with, read already (a view drawn at several
            budgets, the widget's pictures); ``keywords`` change some of its fields.
        **keywords: the fields of :class:`DrawOptions`.

    Returns:
        The picture's DOT text and what it shows.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.render import graph_view
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> view = graph_view(gs.export(model, (torch.randn(2, 4),)), collapse=1)
        >>> view.collapsed, view.drawn_nodes
        (('0', '1'), 4)
    """
    return _graph_view(program, DrawOptions.given(keywords, "graph_view", options), "graph_view")


def _graph_view(program: Any, options: DrawOptions, verb: str) -> GraphView:
    """``program`` drawn with ``options``: read through the one door, so that a wrong object
    or wrong inputs are refused as every entry point refuses them, naming ``verb``."""
    source = _program(as_program(program, options.args, options.kwargs, verb=verb))
    mode = _diff_mode(options.diff, source)
    _check_collapse(options.collapse)
    max_nodes = options.budget
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise RenderError(f"max_nodes: expected a positive int, got {max_nodes!r}")
    fold_runs = options.fold_runs
    if fold_runs is not None and (
        isinstance(fold_runs, bool) or not isinstance(fold_runs, int) or fold_runs < 2
    ):
        raise RenderError(f"fold_runs: expected an int of 2 or more, or None, got {fold_runs!r}")
    values = overlay_of(program, options.overlay, options.args, options.kwargs)
    with _without_cyclic_gc():
        return _view(source, mode, options, values)


def analyze(program: Any) -> None:
    """Work out now what every picture of ``program`` reads first: the analysis of its graph
    and of the program it was made from (for a swap or fuse result), with their call indexes.
    They are kept with the programs, so the first picture drawn costs its drawing only. The
    widget does this on a background thread for a swap it builds ahead
    (:meth:`graphsurgeon.Surgery.prepare_swap`): 0.08 s of the swap's picture at 384 layers.

    Args:
        program: what to draw, as :func:`to_dot` takes it.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.render import analyze
        >>> analyze(gs.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),)))
    """
    source = _program(as_program(program, None, None, verb="analyze"))
    with _without_cyclic_gc():
        state = _state(source.ep)
        before = _analysis(source.ep, state)
        if source.module is not None:
            _drawn(source, before, state)


def overlay_of(program: Any, overlay: Any, args: Any = None, kwargs: Any = None) -> Any:
    """The values ``overlay=`` asks for.

    Args:
        program: the program drawn, as :func:`to_dot` takes it.
        overlay: what :attr:`DrawOptions.overlay` takes: a kind, a mapping of one's own
            values, values computed already, or None.
        args: the model's positional inputs: ``"error"``, ``"own error"`` and ``"latency"``
            run the program on them (a Surgery brings its own).
        kwargs: its keyword inputs, likewise.

    Returns:
        The :class:`graphsurgeon.checks.overlay.OverlayValues` computed by
        :func:`graphsurgeon.checks.overlay.overlay_values` (or given already computed), or
        None without an overlay.
    """
    if overlay is None:
        return None
    from ..checks.overlay import OverlayValues, overlay_values  # runs programs: only when asked

    if isinstance(overlay, OverlayValues):
        return overlay
    return overlay_values(program, args, kwargs, kind=overlay)


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


def _view(source: _Program, mode: str | None, options: DrawOptions, values: Any) -> GraphView:
    collapse, max_nodes = options.collapse, options.budget
    show_parameters, show_checks = options.show_parameters, options.show_checks
    ep = source.ep
    state = _state(ep)
    before = _analysis(ep, state)
    after = _drawn(source, before, state) if source.module is not None else None
    swapped = tuple(source.swapped)
    marks = _Marks()
    scene, pictures = _pictures(mode, before, after, source, marks, show_parameters, show_checks)

    highlight_names = _names(options.highlight, "highlight")
    resolved = _resolve(highlight_names, scene, source, "highlight")
    marks.highlighted = {name for name in resolved if isinstance(name, str)}
    chosen_swaps = _swaps_named(highlight_names, swapped)
    if mode is None:  # the swapped module has no cluster here: its box stands out instead
        marks.highlighted_vertices = {source.swapped[c] for c in chosen_swaps}
    collapsed: set = set()
    if collapse is not None and not isinstance(collapse, (int, str)):
        collapsed = set(_resolve(_names(collapse, "collapse"), scene, source, "collapse"))
    # the collapsed layers drawn a run to a box (fold_runs=), but those the user unfolded
    fold_runs = None if collapse is None or isinstance(collapse, (int, str)) else options.fold_runs
    unfolded: set = set()
    if fold_runs is not None:
        unfolded = set(_resolve(_names(options.unfolded, "unfolded"), scene, source, "unfolded"))
    # a swapped call is opened in a diff; a region of ops (Surgery.replace) has no call of its
    # own in the original: the call that holds it is opened
    regions = source.info.regions if source.info is not None else {}
    holders = [regions[n].call if n in regions else n for n in swapped]
    forced = scene.ancestors(c for c in holders if mode is not None and c)
    # an own-ops box named in highlight is opened, in its module
    for key in resolved:
        if not isinstance(key, str):
            forced |= {key} | scene.ancestors([key[1]] if key[1] else [])
    # show=: opened as a highlight is, without its mark (the calls a stepper is in)
    opened = _resolve(_names(options.show, "show"), scene, source, "show")
    for key in opened:
        if not isinstance(key, str):
            forced |= {key} | scene.ancestors([key[1]] if key[1] else [])
    shown = set()
    if collapse == "auto" or isinstance(collapse, int):
        shown = marks.highlighted | {name for name in opened if isinstance(name, str)}
    marks.fused = set(source.fused)
    context = _Context(source, state, before.root_type)
    name = before.root_type.rsplit(".", 1)[-1] or "program"
    no_runs: set[str] = set()
    while True:
        open_, runs = _plan(scene, collapse, collapsed, forced, max_nodes, shown, no_runs)
        if fold_runs is not None:
            runs = _folded_runs(scene, open_, fold_runs, unfolded | no_runs)
        if collapse == "auto" or isinstance(collapse, int):
            # a fused call is one call now: one box, unless highlighted (or opened by name)
            open_ -= marks.fused - forced - scene.ancestors(shown)
        writers = [
            # in a split diff the overlay is the swapped program's: the "after" picture's
            _Writer(s, open_, runs, marks, context, p, e, values if p != "before/" else None)
            for s, p, e in pictures
        ]
        for writer in writers:
            writer.write()
        # Boxes never close a cycle (a run over siblings that are not a chain, a module whose
        # nodes interleave with the rest): a run found on one is drawn as its calls, any
        # other box is opened, and the picture is drawn again.
        cyclic, broken = set(), set()
        for writer in writers:
            boxes, runs_on_cycles = _boxes_on_cycles(writer)
            cyclic |= boxes - forced
            broken |= runs_on_cycles - no_runs
        if not cyclic and not broken:
            break
        no_runs |= broken
        forced |= cyclic | scene.ancestors(c for c in cyclic if isinstance(c, str))
    heat = _heat(values, writers) if values is not None else None
    picture = _picture(name, writers, scene.aliases, heat)

    graph_nodes = len(ep.graph.nodes)
    if source.module is not None:
        # the result's nodes, each fused call counted as the original nodes it runs
        drawn = len(source.module.graph.nodes)
        drawn += sum(len(source.info.partitions[c].nodes) - 1 for c in source.fused)
        graph_nodes = graph_nodes + drawn if mode is not None else drawn
    present = set(scene.present)
    boxes = {b for w in writers for b in w.boxes}
    clusters = {c for w in writers for c in w.clusters}
    folded = {o for w in writers for o in w.folded_ops}
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
        folded_ops=tuple(OPS_PREFIX + o for o in ["", *scene.present] if o in folded),
        overlay=types.MappingProxyType(dict(picture.overlay)),
        overlay_values=values,
    )


def _folded_runs(scene: _Scene, open_: set, fold_runs: int, kept: set) -> dict[str, list[str]]:
    """The runs ``{first call: members}`` drawn as one box each under ``fold_runs=``: the
    stacks of layers (:func:`_layer_runs`) in the containers drawn open, split around their
    members drawn open or ``kept`` a box each, in pieces of 2 or more (as ``collapse="auto"``
    splits its runs around what it shows). Planning a picture then costs what its stacks
    cost, not its layers one by one."""
    drawn_alone = open_ | kept
    runs: dict[str, list[str]] = {}
    for parent, stack in _layer_runs(scene, fold_runs):
        if parent == "" or parent in open_:
            runs.update(_split_runs({stack[0]: stack}, drawn_alone))
    return runs


def _layer_runs(scene: _Scene, fold_runs: int) -> list[tuple[str, list[str]]]:
    """(container, run) of every stack of at least ``fold_runs`` layers of the scene (the
    calls :func:`~graphsurgeon.render.layer_calls` counts, in chains that feed each other and
    are one box without a cycle, :meth:`~graphsurgeon.render._scene._Scene.chain_runs`),
    worked out once per program: a piece of such a chain is one box without a cycle too."""
    memo = scene.memo("layer runs")
    found = memo.get(fold_runs)
    if found is None:
        layers = _stack.layer_calls(scene.calls, fold_runs)
        calls = scene.calls
        parents = dict.fromkeys(calls[n].parent for n in scene.present if n in layers)
        found = []
        for parent in parents:
            siblings = scene.top if parent == "" else scene.children.get(parent, [])
            found += [(parent, r) for r in scene.chain_runs(siblings, layers.__contains__)]
        memo[fold_runs] = found
    return found


def _heat(values: Any, writers: list[_Writer]) -> Heat:
    """How the overlay is coloured: errors around their threshold (the tolerance); latency
    and values of one's own from the smallest to the largest drawn (latency: from 0, so each
    colour is a share of the hottest)."""
    drawn = [v for writer in writers for v in writer.overlay.values() if math.isfinite(v)]
    high = max(drawn, default=0.0)
    low = 0.0 if values.kind == "latency" else min(drawn, default=0.0)
    return Heat(values.kind, values.unit, values.threshold, low, high)


def _on_cycles(edges: list[EdgeRow]) -> set[str]:
    """The nodes that lie on a cycle of ``edges``: those in a strongly connected component of
    more than one node (Tarjan's algorithm, iteratively)."""
    heads: dict[str, list[str]] = {}
    for edge in edges:
        heads.setdefault(edge.tail, []).append(edge.head)
        heads.setdefault(edge.head, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[str] = set()
    for start in heads:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            successors = heads[node]
            if i < len(successors):
                work.append((node, i + 1))
                successor = successors[i]
                if successor not in index:
                    work.append((successor, 0))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.update(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def _boxes_on_cycles(writer: _Writer) -> tuple[set, set[str]]:
    """The boxes on a cycle of ``writer``'s edges: the calls (and own-ops keys) of boxes, and
    the calls of run boxes."""
    if not (writer.boxes or writer.folded_ops):
        return set(), set()
    on_cycles = _on_cycles(writer.edges)
    if not on_cycles:
        return set(), set()
    boxes: set = set()
    runs: set[str] = set()
    for element_id in on_cycles:
        row = writer.rows.get(element_id)
        if row is None or row.kind not in ("box", "ops"):
            continue
        if row.kind == "ops":
            boxes.add(ops_key(row.calls[0] if row.calls else ""))
        elif len(row.calls) > 1:
            runs.update(row.calls)
        else:
            boxes.update(row.calls)
    return boxes, runs


@DrawOptions.keywords
def to_dot(program: Any, **options: Any) -> str:
    """The DOT text of ``program`` drawn with its module partitions. Pure: no binary needed.

    Args:
        program: an ExportedProgram, a :func:`graphsurgeon.swap` or :func:`graphsurgeon.fuse`
            result, or a Surgery (its ``.module`` when something is swapped or fused, else its
            ``.program``). A fused call is drawn as what it runs, the program's own nodes: one
            box marked "fused" (blue border) that opens into them when asked (``collapse=None``,
            a set of names without it, or a highlight).
        **options: what the picture shows, the fields of :class:`DrawOptions` (``highlight``,
            ``show``, ``collapse``, ``diff``, ``max_nodes``, ``show_parameters``,
            ``show_checks``, ``overlay``, ``args``, ``kwargs``), with their defaults.

    Returns:
        The DOT text: the same program and options give the same text, ids and colours.

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
    return _graph_view(program, DrawOptions.given(options, "to_dot"), "to_dot").dot


@DrawOptions.keywords
def to_svg(program: Any, **options: Any) -> str:
    """The SVG of :func:`to_dot`'s picture, laid out by graphviz's ``dot``.

    Cached by DOT text; a stack of many open layers is laid out a layer at a time
    (:meth:`GraphView.laid_out`).

    Args:
        program: what to draw, as :func:`to_dot` takes it.
        **options: the fields of :class:`DrawOptions`, as :func:`to_dot` takes them.

    Returns:
        The SVG text.

    Raises:
        MissingDependencyError: graphviz's ``dot`` is not installed.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.render import to_svg
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> svg = to_svg(gs.export(model, (torch.randn(2, 4),)))
        >>> 'id="node:linear"' in svg and svg.rstrip().endswith("</svg>")
        True
    """
    view = _graph_view(program, DrawOptions.given(options, "to_svg"), "to_svg")
    return view.laid_out("svg").decode()


# -- names the caller gives ------------------------------------------------------------------


def _names(value: Any, argument: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, Mapping):
        names = list(value)
        for name in names:
            if not isinstance(name, str):
                raise RenderError(f"{argument}: expected module names (str), got {name!r}")
        return sorted(set(names)) if isinstance(value, (set, frozenset)) else names
    raise RenderError(
        f"{argument}: expected a module name or a collection of them, got {type(value).__name__}"
    )


def _resolve(names: list[str], scene: _Scene, program: _Program, argument: str) -> list:
    """Module or call names -> the calls of the picture they stand for, in model order.

    A name stands for the calls :meth:`ProgramIndex.calls_covered
    <graphsurgeon.partition.ProgramIndex.calls_covered>` gives, the one reading every view and
    verb shares: ``"blk@1"`` that call, ``"blk"`` (or ``"blk@0"``) each call of ``blk``, a
    container such as nn.ModuleList the outermost calls of its submodules. ``"ops:<name>"``
    stands for the own-ops box of each of those calls (``"ops:"``: the root's), as its key
    (:func:`~graphsurgeon.render._scene.ops_key`), after the calls.
    """
    index = program_index(program.ep)
    wanted: set[str] = set()
    owners: list[str] = []
    for name in names:
        if name.startswith(OPS_PREFIX):
            owner = name[len(OPS_PREFIX) :]
            owners += [""] if owner == "" else _resolve([owner], scene, program, argument)
            continue
        if name == "":
            raise RenderError(
                f"{argument}: the root module '' is the whole picture; name a submodule"
            )
        try:
            wanted.update(index.calls_covered(name))
        except UnknownModuleError as error:
            raise UnknownModuleError(f"{argument}: {error}") from None
    resolved = [name for name in scene.calls if name in wanted]
    return resolved + [ops_key(owner) for owner in dict.fromkeys(owners)]


def _swaps_named(names: list[str], swapped: Iterable[str]) -> list[str]:
    """The swapped calls that ``names`` point at: a call by its name, every call of a module
    (``"blk"``, ``"blk@0"``) or inside it (a parent's fqn)."""
    wanted = [(name, *split_call_name(name)) for name in names]
    return [
        call
        for call in swapped
        if any(
            name == call or (k in (None, 0) and _meta.inside(call, fqn)) for name, fqn, k in wanted
        )
    ]
