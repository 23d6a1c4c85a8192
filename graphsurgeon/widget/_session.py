"""The SurgeryWidget's session: its state and its actions, in plain Python, without HTML.

:class:`SurgerySession` holds a :class:`~graphsurgeon.Surgery` and the example inputs, makes
every edit of it (swap, fuse, undo, redo, reset, a region's fuse and swap), runs the checks,
and after an edit brings every other concern up to date (:meth:`SurgerySession._after_change`).
Each concern is a small object that owns its slice of the state:

* :class:`~._view.View` (``session.viewer``): the picture shown, what is open, the pictures
  kept laid out, a large layout waiting for a confirmation, the overlay;
* :class:`~._selection.Selection` (``session.selection``): the selection and the marks;
* :class:`~._search.Searcher` (``session.searcher``): the search and its matches;
* :class:`~._picker.Picker` (``session.picker``): the replacement chosen, and for what;
* :class:`~._regions.Regions` (``session.regions``): ops chosen by hand to be one call;
* :class:`~._stepping.Stepping` (``session.stepping``): the stepper, and where it is.

The session's own methods and attributes reach them (``session.select(name)`` is
``session.selection.select(name)``); :attr:`~SurgerySession.changed` says which parts of the
page an action touched. What the page shows of the state (the panels' HTML) is written by
:mod:`graphsurgeon.widget._panels`, and :class:`~graphsurgeon.SurgeryWidget` only routes the
page's events here and copies the panels into its traits, so tests drive every control without
a browser. Nothing here imports ipywidgets or IPython, or writes HTML.

The view is the user's (``auto``: as much as fits, or the calls they opened) with, on top, what
the stepper and the search need to show: the call being stepped (at most its layer) and the
modules around a match are opened for as long as they are needed, and closed again after.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.widget import SurgerySession
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> session = SurgerySession(gs.Surgery.from_model(model, (torch.randn(2, 4),)))
    >>> session.select("1")
    >>> session.selected, session.marks["selected"]
    ('1', ['node:relu'])
    >>> session.choose("identity")
    >>> session.swap()
    >>> session.surgery.replacements
    {'1': Identity()}
    >>> session.verify().ok  # the program is faithful to the eager model with Identity in it
    True
    >>> session.compare().first_divergence  # but Identity is not ReLU
    '1'
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._program import as_inputs, no_inputs
from ..checks.compare import Comparison
from ..checks.verify import VerifyReport
from ..errors import GraphSurgeonError, InputStructureError, WidgetError
from ..partition import Partition, partition
from ..patterns.search import Match
from ..render import analyze
from ..surgery import Surgery
from . import _collector
from ._picker import REGION, Candidate, Picker, module_from
from ._regions import Regions
from ._search import Searcher
from ._selection import Selection
from ._stepping import Stepping
from ._view import DEPTHS, OVERLAYS, VIEWS, PendingLayout, Scene, View

__all__ = [
    "DEPTHS",
    "LARGE_LAYOUT",
    "OVERLAYS",
    "PARTS",
    "REGION",
    "VIEWS",
    "Candidate",
    "Match",
    "PendingLayout",
    "Scene",
    "SurgerySession",
]

#: The parts of the page an action can change (:attr:`SurgerySession.changed`): the picture,
#: the marks in it (selection, producers, consumers, matches, culprits), the selection's
#: details, the module tree, the replacement chosen (picker and preview), the history, the
#: checks, the stepper, the stepper's current node, a request to scroll the selection into
#: view, the search and its results, a layout waiting for a confirmation, the picture of
#: the call the stepper is inside, and the region (its nodes, its call, what is similar).
PARTS = (
    "picture",
    "marks",
    "selection",
    "tree",
    "choice",
    "history",
    "checks",
    "stepper",
    "current",
    "scroll",
    "search",
    "warning",
    "inside",
    "region",
)
#: Drawn nodes past which a layout the user asks for (open all, a depth, a big module) waits
#: for a confirmation: about a second of graphviz on a laptop.
LARGE_LAYOUT = 1_500
# How the widget names itself where its inputs are missing or malformed.
_VERB = "SurgeryWidget"


def _delegated(part: str, method: Callable) -> Callable:
    """``method`` of the concern ``part`` (``"viewer"``...), as a method of the session."""
    name = method.__name__

    @functools.wraps(method)
    def delegated(self: SurgerySession, *args: Any, **kwargs: Any) -> Any:
        return getattr(getattr(self, part), name)(*args, **kwargs)

    return delegated


def _state(part: str, name: str) -> property:
    """Attribute ``name`` of the concern ``part``, read through the session."""
    return property(
        lambda self: getattr(getattr(self, part), name), doc=f"``session.{part}.{name}``."
    )


class SurgerySession:
    """The state and the actions of a :class:`~graphsurgeon.SurgeryWidget`, without a widget.

    Args:
        surgery: the live Surgery every action works on (the widget's ``w.surgery``); its
            example inputs are never changed.
        namespace: returns the user's namespace (the notebook's globals), where the picker
            looks for replacements and evaluates expressions; None: no namespace.
        on_busy: called with a line of progress before slow work (layout, verify, compare,
            stepping); the caller clears it when the action is over.
        on_early: called with a line of progress where an action can show what it decided
            before its slow rest (:meth:`show_early`): the caller shows the parts changed so
            far (:meth:`take_changes`) and the line; default: ``on_busy``.
        args, kwargs: the example inputs verify, compare, the overlays and the stepper run on,
            read as every entry point reads inputs (a list is refused); default: the
            Surgery's own.

    State: :attr:`surgery`, :attr:`tree`, :attr:`partitions`, :attr:`report`,
    :attr:`comparison`, :attr:`bisection`, :attr:`changed`; each concern's state is read
    through the session too (``session.selected`` is ``session.selection.selected``).
    """

    def __init__(
        self,
        surgery: Surgery,
        namespace: Callable[[], Mapping[str, Any]] | None = None,
        on_busy: Callable[[str], None] | None = None,
        *,
        on_early: Callable[[str], None] | None = None,
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
    ):
        if not isinstance(surgery, Surgery):
            raise WidgetError(
                f"SurgerySession: expected a gs.Surgery, got {type(surgery).__name__}; "
                "use gs.SurgeryWidget(program_or_surgery, args=...)"
            )
        self.surgery = surgery
        # the widget's own inputs (None: the Surgery's, read when they are needed)
        self._args = None if args is None else as_inputs(args, kwargs, verb=_VERB)[0]
        self._kwargs = None if kwargs is None else as_inputs((), kwargs, verb=_VERB)[1]
        self._on_busy = on_busy or (lambda text: None)
        self._on_early = on_early or self._on_busy
        #: The parts of the page (:data:`PARTS`) changed since :meth:`take_changes`.
        self.changed: set[str] = set(PARTS)
        #: texts of the page kept by the panels that make them, by part: (what a text was
        #: made from, the text, or what the page gets of it); a part made from the same objects
        #: again reads it here
        self.kept_pages: dict[str, tuple[Any, Any]] = {}
        self.comparison: Comparison | None = None
        self.bisection: Any = None
        self.report: VerifyReport | None = surgery.last_verify
        #: whether Verify, Compare and Find culprits check the gradients too (backward=True)
        self.gradients = False
        self.partitions: dict[str, Partition] = partition(surgery.program)
        self.tree = surgery.tree
        self._seen = surgery.version
        self.viewer = View(self)
        self.selection = Selection(self)
        self.searcher = Searcher(self)
        self.picker = Picker(self, namespace or dict)
        self.regions = Regions(self)
        self.stepping = Stepping(self)
        self.viewer.render()
        # read here, where the user waits for the widget anyway, not in the first search
        self.searcher.prepare()

    # -- what changed, and what the concerns share ------------------------------------------

    def touch(self, *parts: str) -> None:
        """Note that an action changed ``parts`` of the page (:data:`PARTS`)."""
        self.changed.update(parts)

    def take_changes(self) -> set[str]:
        """The parts of the page changed since the last call (:data:`PARTS`), and forget them."""
        changed, self.changed = self.changed, set()
        return changed

    def busy(self, text: str) -> None:
        """Say what slow work is about to run (the widget's busy line)."""
        self._on_busy(text)

    def show_early(self, text: str) -> None:
        """Show what the action decided so far (the parts it changed) before its slow rest,
        which ``text`` says: a search's matches, listed and marked in the picture shown,
        before the picture that opens the first is laid out."""
        self._on_early(text)

    def inputs(self) -> tuple[tuple, dict]:
        """The example inputs the checks and the stepper run on: the widget's own, else the
        Surgery's; without any, raises :class:`~graphsurgeon.errors.InputStructureError`
        saying how to give them."""
        args = self._args if self._args is not None else self.surgery.args
        kwargs = self._kwargs if self._kwargs is not None else self.surgery.kwargs
        if args is None:
            raise InputStructureError(no_inputs(_VERB))
        return as_inputs(args, kwargs, verb=_VERB)

    @property
    def large_layout(self) -> int:
        """Drawn nodes past which a layout asked for waits for a confirmation
        (:data:`LARGE_LAYOUT`, read when it is needed)."""
        return LARGE_LAYOUT

    def sync(self) -> None:
        """Catch up with the Surgery when it was changed from code (``w.surgery.swap(...)``
        in a cell): every action of the widget starts with this."""
        if self.surgery.version != self._seen:
            self._after_change()

    def refresh(self) -> None:
        """Show the Surgery as it is now (after it was changed from code, not by the widget)."""
        self._after_change()

    def prepare_swap(self, delay: float) -> None:
        """Build the swap set up in the picker (a module chosen for the selection) on a
        background thread, ``delay`` seconds from now, so that Swap only draws it; anything
        else drops a swap built ahead (:meth:`graphsurgeon.Surgery.prepare_swap`). The
        build holds the collector (:data:`._collector.AHEAD_DELAY`), and works out what the
        swap's picture reads once it has built the program (:func:`graphsurgeon.render.analyze`)."""
        ahead = self.picker.swap_ahead
        if ahead is None:
            self.surgery.drop_prepared()
        else:
            hold = functools.partial(_collector.held, _collector.AHEAD_DELAY)
            self.surgery.prepare_swap(*ahead, delay=delay, hold=hold, then=analyze)

    def escape(self) -> None:
        """What Esc does: close the search if one is open, else clear the selection."""
        if self.searcher.search_text:
            self.searcher.close_search()
        else:
            self.selection.select(None)

    # -- edits --------------------------------------------------------------------------------

    def swap(self, module: torch.nn.Module | None = None, name: str | None = None) -> None:
        """Swap the selected module (or ``name``) for ``module``, or for the replacement
        chosen in the picker for it; the before/after picture is shown."""
        name = self.selection.target(name, "swap")
        if module is not None:
            replacement = module_from(module, type(module).__name__)
        else:
            replacement = self.picker.for_swap(name)
        self.busy(f"swapping {name}…")
        self.surgery.swap(name, replacement)
        self._after_change(show="merged")
        self._bring_into_view(name)
        if module is not None:  # the picker shows it, for the module now selected
            self.picker.set(replacement, type(replacement).__name__, "module")

    def fuse(self, name: str | None = None) -> None:
        """Fuse the selected module (or ``name``): its nodes become one call."""
        name = self.selection.target(name, "fuse")
        self.busy(f"fusing {name}…")
        self.surgery.fuse(name)
        self._after_change()
        self._bring_into_view(name)

    def _bring_into_view(self, name: str, *, found: bool = False) -> None:
        """``name`` is selected and the picture brings it into view: the module just swapped
        or fused, the region just swapped, the step just undone or redone, or what a check
        ``found`` (the first divergence, the first culprit). An edit made from code
        (``w.swap(m, name)``) or a check may be far from what the picture showed, which left
        the user looking at an empty corner of a wider picture. What a check found is also
        opened, as a search opens its match: a module inside a layer drawn as one box would
        be marked as that box, and the module the check names not shown (it stays open until
        the next edit or check). A name the selection cannot take leaves the selection as it
        was: the edit or the check stands."""
        if found:
            viewer = self.viewer
            calls = viewer.calls_of(name)
            viewer.reveal("check", {a for c in calls for a in viewer.ancestors(c)})
        selection = self.selection
        if selection.selected != name or selection.selected_node is not None:
            try:
                selection.select(name)
            except GraphSurgeonError:
                return
        selection.scroll_into_view()

    def undo(self) -> None:
        """Go back one step of the Surgery; the module of the step undone is selected and
        brought into view, as an editor shows the change it undid."""
        self.surgery.undo()
        self._after_change()
        self._bring_into_view(self.surgery.steps[self.surgery.position].name)

    def redo(self) -> None:
        """Go forward again over an undone step; its module is selected and brought into
        view."""
        self.surgery.redo()
        self._after_change()
        self._bring_into_view(self.surgery.steps[self.surgery.position - 1].name)

    def reset(self) -> None:
        """The Surgery back to the original program (the history is kept: redo still
        works). The stepper's restart is :meth:`reset_stepper`."""
        self.surgery.reset()
        self._after_change()

    def fuse_region(self) -> None:
        """Make the region one call of the program's own nodes (drawn as one box)."""
        plan = self.regions.plan("fuse region")
        self.busy(f"fusing {plan.region.name}…")
        self.surgery.fuse_region(list(self.regions.region))
        # (its ops are drawn as they were, where the user just shift-clicked them: nothing
        # to bring into view, and no one element to select)
        self._after_change()

    def swap_region(self, module: torch.nn.Module | None = None) -> None:
        """Replace the region by one call of ``module`` (default: the replacement chosen in
        the picker for it), which takes the region's inputs and returns its results (the
        preview shows the call)."""
        plan = self.regions.plan("swap region")
        if module is not None:
            replacement = module_from(module, type(module).__name__)
        else:
            replacement = self.picker.for_region(plan.call_text)
        self.busy(f"swapping {plan.region.name}…")
        self.surgery.swap_region(list(self.regions.region), replacement)
        self._after_change(show="merged")
        self._bring_into_view(plan.region.name)

    def _after_change(self, show: str | None = None) -> None:
        """The Surgery changed (here, or from code): every concern catches up, the
        before/after picture is ``show``n (when the program was shown), and the page is
        drawn again whole."""
        self._seen = self.surgery.version
        self.stepping.after_change()  # the stepper goes: so does the call it was inside
        self.viewer.after_change(show)
        self.comparison = None
        self.bisection = None
        self.report = self.surgery.last_verify
        self.regions.after_change()
        self.searcher.after_change()  # the same search, in the new program
        self.touch(*PARTS)
        self.viewer.render()

    # -- checks -------------------------------------------------------------------------------

    def set_gradients(self, on: bool) -> None:
        """Whether Verify, Compare and Find culprits check the gradients too: both sides run
        backward from the same seeded upstream gradients (``backward=True``)."""
        self.gradients = bool(on)
        self.touch("checks")

    def _passes(self) -> str:
        return "outputs and gradients" if self.gradients else "outputs"

    def verify(self) -> VerifyReport:
        """Verify the current program against its eager reference on the example inputs
        (faithful), and against the original model (equal to the original); with
        :attr:`gradients`, the gradients too."""
        args, kwargs = self.inputs()
        self.busy(f"verifying the {self._passes()} against the eager reference…")
        self.report = self.surgery.verify(args, kwargs, backward=self.gradients)
        self.touch("checks")
        return self.report

    def compare(self) -> Comparison:
        """Compare each swapped call with the original on the same captured inputs; inside
        the first that diverges, find the first op of the replacement that differs."""
        args, kwargs = self.inputs()
        if not self.surgery.replacements:
            raise WidgetError("compare: nothing is swapped; swap a module first")
        self.busy(f"comparing each swapped call's {self._passes()} with the original…")
        self.comparison = self.surgery.compare(args, kwargs, backward=self.gradients)
        first = self.comparison.first_divergence
        if first:
            self.busy("finding the first op that differs…")
            self.comparison.locate()  # computed once; the panel reads it
            self._bring_into_view(first, found=True)
        else:
            self.viewer.reveal("check", ())  # what an earlier check found closes
        self.touch("checks")
        return self.comparison

    def find_culprits(self) -> Any:
        """Find the smallest set of the Surgery's swaps that explains its mismatch against
        the original (:meth:`graphsurgeon.Surgery.bisect`): marked in the tree and the
        picture, with the number of program runs it took."""
        args, kwargs = self.inputs()
        if not self.surgery.replacements:
            raise WidgetError("find culprits: nothing is swapped; swap a module first")
        self.busy(f"bisecting the swaps on their {self._passes()}…")
        self.bisection = self.surgery.bisect(args, kwargs, backward=self.gradients)
        self.touch("checks", "tree")
        culprits = self.bisection.culprits
        if culprits:
            self._bring_into_view(culprits[0], found=True)
        else:
            self.viewer.reveal("check", ())  # what an earlier check found closes
        self.selection.mark()
        return self.bisection

    # -- each concern's state and actions, through the session -------------------------------

    view = _state("viewer", "view")
    scene = _state("viewer", "scene")
    overlay = _state("viewer", "overlay")
    pending = _state("viewer", "pending")
    can_diff = _state("viewer", "can_diff")
    opened_by_user = _state("viewer", "opened_by_user")
    revealed = _state("viewer", "revealed")
    drawn_program = _delegated("viewer", View.drawn_program)
    in_drawn_program = _delegated("viewer", View.in_drawn_program)
    calls_of = _delegated("viewer", View.calls_of)
    call_nodes = _delegated("viewer", View.call_nodes)
    call_node = _delegated("viewer", View.call_node)
    inner_call = _delegated("viewer", View.inner_call)
    chain_of_node = _delegated("viewer", View.chain_of_node)
    set_view = _delegated("viewer", View.set_view)
    set_overlay = _delegated("viewer", View.set_overlay)
    overlay_values = _delegated("viewer", View.overlay_values)
    expand = _delegated("viewer", View.expand)
    collapse = _delegated("viewer", View.collapse)
    expand_all = _delegated("viewer", View.expand_all)
    expand_to_depth = _delegated("viewer", View.expand_to_depth)
    auto = _delegated("viewer", View.auto)
    toggle = _delegated("viewer", View.toggle)
    confirm_layout = _delegated("viewer", View.confirm_layout)
    cancel_layout = _delegated("viewer", View.cancel_layout)
    picture_text = _delegated("viewer", View.picture_text)

    selected = _state("selection", "selected")
    selected_node = _state("selection", "selected_node")
    marks = _state("selection", "marks")
    scroll = _state("selection", "scroll")
    select = _delegated("selection", Selection.select)
    click = _delegated("selection", Selection.click)
    click_inside = _delegated("selection", Selection.click_inside)
    node = _delegated("selection", Selection.node)
    removed_by = _delegated("selection", Selection.removed_by)
    module_info = _delegated("selection", Selection.module_info)
    call_text = _delegated("selection", Selection.call_text)
    source_of = _delegated("selection", Selection.source_of)

    search_text = _state("searcher", "search_text")
    matches = _state("searcher", "matches")
    match_index = _state("searcher", "match_index")
    search = _delegated("searcher", Searcher.search)
    next_match = _delegated("searcher", Searcher.next_match)
    previous_match = _delegated("searcher", Searcher.previous_match)
    go_to_match = _delegated("searcher", Searcher.go_to_match)
    close_search = _delegated("searcher", Searcher.close_search)

    replacement = _state("picker", "replacement")
    replacement_label = _state("picker", "replacement_label")
    replacement_key = _state("picker", "replacement_key")
    replacement_for = _state("picker", "replacement_for")
    replacement_module = _state("picker", "replacement_module")
    can_swap = _state("picker", "can_swap")
    can_swap_region = _state("picker", "can_swap_region")
    candidates = _delegated("picker", Picker.candidates)
    refresh_candidates = _delegated("picker", Picker.refresh_candidates)
    choose = _delegated("picker", Picker.choose)
    choose_expression = _delegated("picker", Picker.choose_expression)
    use = _delegated("picker", Picker.use)

    region = _state("regions", "region")
    region_plan = _state("regions", "region_plan")
    region_problem = _state("regions", "region_problem")
    similar = _state("regions", "similar")
    toggle_region = _delegated("regions", Regions.toggle_region)
    add_to_region = _delegated("regions", Regions.add_to_region)
    set_region = _delegated("regions", Regions.set_region)
    clear_region = _delegated("regions", Regions.clear_region)
    find_similar = _delegated("regions", Regions.find_similar)

    stepper = _state("stepping", "stepper")
    last_step = _state("stepping", "last_step")
    breakpoints = _state("stepping", "breakpoints")
    break_on_nan = _state("stepping", "break_on_nan")
    current = _state("stepping", "current")
    scroll_current = _state("stepping", "scroll_current")
    inside = _state("stepping", "inside")
    inside_current = _state("stepping", "inside_current")
    step = _delegated("stepping", Stepping.step)
    step_over = _delegated("stepping", Stepping.step_over)
    step_into = _delegated("stepping", Stepping.step_into)
    step_out = _delegated("stepping", Stepping.step_out)
    continue_ = _delegated("stepping", Stepping.continue_)
    run_to_selection = _delegated("stepping", Stepping.run_to_selection)
    reset_stepper = _delegated("stepping", Stepping.reset_stepper)
    toggle_breakpoint = _delegated("stepping", Stepping.toggle_breakpoint)
    set_break_on_nan = _delegated("stepping", Stepping.set_break_on_nan)
    counterpart = _delegated("stepping", Stepping.counterpart)
    counterpart_summary = _delegated("stepping", Stepping.counterpart_summary)
    summaries = _delegated("stepping", Stepping.summaries)
