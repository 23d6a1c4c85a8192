r"""SurgeryWidget: the notebook app, an anywidget over a :class:`SurgerySession`.

The class holds traits and one table of actions, :data:`ACTIONS`: each button's name (the one
name of the action: the session's method it calls and the widget's method that does the same),
label, tooltip, when it is enabled and its keyboard shortcut. The page's buttons
(``static/widget.js`` builds them from the ``actions`` trait), ``w.click(name)``,
:attr:`SurgeryWidget.BUTTONS` and the page's ``button`` messages all read that table. After
every action the widget copies what changed (:mod:`._panels`) into its traits. An error from a
click shows in the widget (``w.error``); the same action called from code raises too.

Names travel to the page as data: ``selected`` holds the name itself; element ids and the
``data-gs-module`` / ``data-gs-call`` attributes of the panels hold it as ids do
(:func:`graphsurgeon.display.id_text`: ``a%00b`` for a module named ``"a\x00b"``), and what the
page sends back from them is read the same way.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anywidget
import torch
import traitlets as t
from torch.export import ExportedProgram

from .. import display
from .._program import as_program, not_a_program
from ..errors import WidgetError, a_type
from ..rewrite import interactive
from ..surgery import Surgery
from . import _collector, _panels
from ._session import DEPTHS, OVERLAYS, SurgerySession

__all__ = ["ACTIONS", "Action", "SurgeryWidget"]

_STATIC = Path(__file__).parent / "static"

# A click in the page updates the static copy of the picture this long after the last change
# that drew a new picture: the copy is a second output of the same size as the picture, and
# JupyterLab rendering it at once made every layout from a click 50-70 ms slower (the 96-layer
# decoder's expand 0.08 -> 0.15 s). Two seconds: a copy landing during the next click costs that
# click the same, and clicks come about a second apart. A change made by code in a cell updates
# it at once, so a notebook run by nbval or nbclient stores the copy of each cell's picture.
STATIC_COPY_DELAY = 2.0

# Seconds without an action before the program is built in the background
# (Surgery.build_in_background: ~0.5 s of work at 384 layers, 0.1 s at 96), so that the first
# step or check does not build it and the first swap compiles only what it changes. It pauses
# for clicks, but some of its work (and the collector's passes it causes) cannot pause: it
# begins when the clicks pause, not while they go on. None: no background build.
WARM_UP_DELAY: float | None = 1.5

# Seconds after an action before the swap it set up (a replacement chosen for the selection:
# Swap is ready) is built in the background (SurgerySession.prepare_swap), so that Swap then
# costs its picture and not its build (0.2 s at 384 layers). Short: a Swap comes a second or
# so after the choice. The build pauses for clicks; what cannot pause (compiling the one part
# the swap changes, installing the modules: ~30 ms at 384 layers) is all a click can wait for.
# None: no swap built ahead.
PREPARE_DELAY: float | None = 0.05

# The traits that say something is selected (a module, a call or a node).
_SELECTION = ("selected", "selected_node")


@dataclass(frozen=True)
class Action:
    """One button of the widget.

    Attributes:
        name: the action's one name: the :class:`SurgerySession` method it calls (with no
            arguments) and the :class:`SurgeryWidget` method that does the same from code;
            what ``w.click(name)`` and the page's ``{"event": "button", "name": ...}`` say.
        label: the button's text.
        tooltip: what the button does (the shortcut is added to it in the page).
        panel: where the page shows the button: ``"toolbar"`` (above the picture),
            ``"replace"``, ``"check"`` or ``"stepper"``; ``""``: no button (``w.click`` and
            the page's messages only).
        enabled_by: the traits of which one must hold for the button to be enabled
            (``("can_undo",)``); empty: always enabled.
        key: its keyboard shortcut in the page (``"F10"``, ``"Shift+F11"``), or ``""``.
        runs_programs: it runs the program (a check), as often as it needs: Python's cyclic
            collector stays on while it does (other actions hold it until they have
            answered, see :mod:`._collector`).
    """

    name: str
    label: str
    tooltip: str
    panel: str
    enabled_by: tuple[str, ...] = ()
    key: str = ""
    runs_programs: bool = False

    @property
    def method(self) -> str:
        """The :class:`SurgerySession` method the action calls: its name."""
        return self.name


#: Every button of the widget, in the order the page shows them: name (the session's and the
#: widget's method), label, tooltip, its panel, the traits that enable it, its shortcut.
# fmt: off
ACTIONS: tuple[Action, ...] = (
    Action("expand", "open", "open the selected module", "toolbar", _SELECTION),
    Action("collapse", "collapse", "collapse the selected module", "toolbar", _SELECTION),
    Action("auto", "auto", "the default view: as much as fits", "toolbar"),
    Action("expand_all", "open all", "open every module (a large picture asks first)",
           "toolbar"),
    Action("confirm_layout", "Lay it out", "lay out the large picture anyway", "warning",
           ("pending",)),
    Action("cancel_layout", "Cancel", "keep the picture as it is", "warning", ("pending",)),
    Action("previous_match", "▲", "the previous match of the search", "search",
           ("has_matches",), "Shift+F3"),
    Action("next_match", "▼", "the next match of the search", "search", ("has_matches",), "F3"),
    Action("escape", "Esc", "close the search, or clear the selection", "", key="Escape"),
    Action("swap", "Swap", "swap the selected module for the chosen replacement", "replace",
           ("can_swap",)),
    Action("fuse", "Fuse", "make the selected module's nodes one call", "replace", _SELECTION),
    Action("undo", "Undo", "go back one step", "replace", ("can_undo",)),
    Action("redo", "Redo", "go forward again over an undone step", "replace", ("can_redo",)),
    Action("reset", "Reset surgery", "the Surgery back to the original program (redo still "
           "works)", "replace"),
    Action("fuse_region", "Fuse region", "make the region's ops one call of their own",
           "region", ("can_use_region",)),
    Action("swap_region", "Swap region", "replace the region by one call of the chosen "
           "replacement", "region", ("can_swap_region",)),
    Action("find_similar", "Find similar", "where else the program computes what the region "
           "does", "region", ("can_use_region",), runs_programs=True),
    Action("clear_region", "Clear region", "forget the region", "region", ("has_region",)),
    Action("verify", "Verify", "run the program and its eager reference on the example inputs",
           "check", runs_programs=True),
    Action("compare", "Compare", "each swapped call against the original, on the same inputs",
           "check", runs_programs=True),
    Action("find_culprits", "Find culprits", "the smallest set of swaps that explains a "
           "mismatch with the original", "check", ("can_diff",), runs_programs=True),
    Action("step", "Step", "run the next node", "stepper"),
    Action("step_over", "Step over", "run the next node, or the whole module call it starts",
           "stepper", key="F10"),
    Action("step_into", "Step into", "enter a fused or swapped call", "stepper", key="F11"),
    Action("step_out", "Step out", "run to the end of the current module call", "stepper",
           key="Shift+F11"),
    Action("run_to_selection", "Run to selection", "run until the selected node or module is "
           "next", "stepper", _SELECTION),
    Action("continue_", "Continue", "run to the next breakpoint or the end", "stepper",
           key="F8"),
    Action("reset_stepper", "Restart run", "run the program again from its first node (the "
           "Surgery stays as it is)", "stepper"),
    Action("toggle_breakpoint", "Breakpoint", "stop at the selection (press again to remove)",
           "stepper", _SELECTION),
)
# fmt: on
_ACTIONS = {action.name: action for action in ACTIONS}
#: The names some buttons had before each action had one name (its method's): still taken by
#: ``w.click`` and the page's messages, so notebooks and code written with them keep working.
OLD_NAMES = {
    "bisect": "find_culprits",
    "run_to": "run_to_selection",
    "continue": "continue_",
    "restart": "reset_stepper",
    "break": "toggle_breakpoint",
}

# The page's other messages: {"event": name, "id" | "value": ...} -> what the session does.
# The tree and the compare table send a name as ids carry it (display.id_text).
_EVENTS: dict[str, Callable[[SurgerySession, dict], Any]] = {
    "click": lambda session, content: session.click(content["id"]),
    "toggle": lambda session, content: session.toggle(content["id"]),
    "select": lambda session, content: session.select(_name_sent(content.get("value"))),
    "search": lambda session, content: session.search(content.get("value")),
    "view": lambda session, content: session.set_view(content.get("value")),
    "choose": lambda session, content: session.choose(content.get("value")),
    "expression": lambda session, content: session.choose_expression(content.get("value")),
    "nan": lambda session, content: session.set_break_on_nan(_boolean_sent(content, "nan")),
    "gradients": lambda session, content: session.set_gradients(
        _boolean_sent(content, "gradients")
    ),
    "depth": lambda session, content: session.expand_to_depth(content.get("value")),
    "overlay": lambda session, content: session.set_overlay(content.get("value")),
    "match": lambda session, content: session.go_to_match(content.get("value")),
    "click_inside": lambda session, content: session.click_inside(content["id"]),
    "candidates": lambda session, content: session.refresh_candidates(),
    "region": lambda session, content: session.toggle_region(content["id"]),
    "region_add": lambda session, content: session.add_to_region(content.get("ids") or []),
}


def _runs_programs(content: dict) -> bool:
    """Whether a page message's action runs programs (see SurgeryWidget._run): a button whose
    action does (:attr:`Action.runs_programs`), or the overlay's menu."""
    if content.get("event") == "overlay":
        return True
    return content.get("event") == "button" and _button_runs_programs(content.get("name"))


def _button_runs_programs(button: Any) -> bool:
    action = _ACTIONS.get(OLD_NAMES.get(button, button)) if isinstance(button, str) else None
    return action is not None and action.runs_programs


def _name_sent(value: Any) -> Any:
    return display.name_of_id_text(value) if isinstance(value, str) else value


def _boolean_sent(content: dict, event: str) -> bool:
    """The value of a boolean event (a checkbox), as every boolean event reads it: a JSON
    ``true`` or ``false``. Anything else is refused, the strings ``"true"`` and ``"false"``
    too: read as Python reads a value (``bool("false")``), they would turn the option on."""
    value = content.get("value")
    if not isinstance(value, bool):
        raise WidgetError(f"{event}: expected true or false, got {a_type(value)}: {value!r}")
    return value


def _user_namespace() -> Mapping[str, Any]:
    """The notebook's globals (where the picker looks for replacements), or nothing."""
    try:
        from IPython import get_ipython
    except ImportError:
        return {}
    shell = get_ipython()
    return shell.user_ns if shell is not None else {}


def _widget_css() -> str:
    """widget.css, after the styles of graphsurgeon's HTML (tables, badges), which the panels
    show: one stylesheet, so the widget looks as the displays do (the module tree's HTML
    carries its own)."""
    shared = display.STYLE.replace("<style>", "").replace("</style>", "")
    return shared + (_STATIC / "widget.css").read_text()


def _page_actions() -> list[dict[str, Any]]:
    """:data:`ACTIONS` as the page reads them (the ``actions`` trait)."""
    return [
        {
            "name": a.name,
            "label": a.label,
            "tooltip": a.tooltip,
            "panel": a.panel,
            "enabled_by": list(a.enabled_by),
            "key": a.key,
        }
        for a in ACTIONS
    ]


class SurgeryWidget(anywidget.AnyWidget):
    """Pick a module in the picture of a program, swap it, see before/after, verify, step.

    ``gs.SurgeryWidget(program_or_surgery, args=None)`` (or ``s.widget()``) shows, in one
    output laid out for a 1280x900 window: the module tree (filter by name or type, counts,
    swappable or why not, an overlay's values), the program drawn by module (click selects,
    double-click opens or collapses a module, shift-click or a shift-drag rectangle chooses a
    region of ops, zoom, pan, fit, open to a depth, search by name, type, op, initials or
    regex, an error or latency overlay with its legend, save as SVG or DOT), and beside it the
    panels: the stepper (F10 step over, F11 into, Shift+F11 out, F8 continue; stepping into a
    swapped call draws its replacement beside the program), the selection's details (an op
    with its arguments), a replacement picker with a preview of what the swap removes and the
    call the replacement must accept, Swap / Fuse / Undo / Redo / Reset surgery, a region's
    Fuse / Swap / Find similar, and verify, compare (where the replacement first differs) and
    find culprits. The stepper opens only the call it is in (at most its layer) and closes it
    after; a picture of more than ``LARGE_LAYOUT`` nodes waits for a confirmation. Shown in a
    notebook it is two outputs: the live widget, and its picture as static HTML, which a saved
    notebook shows once the kernel is gone (a click updates it once the clicks pause for
    ``STATIC_COPY_DELAY`` seconds, a change from code at once).

    Everything a button does is a method too, of the button's name (``w.click("step_over")``
    is ``w.step_over()``; ``w.select(name)``, ``w.swap(module)``...), and the live objects are
    ``w.surgery``, ``w.stepper`` and ``w.selected``: the next cell goes on in code.
    ``w.session`` is the :class:`~graphsurgeon.widget.SurgerySession` behind it all. A method
    returns the widget, so calls chain (``w.select("1").swap(module)``), unless it says what it
    returns (a check's report, a stepper move's StepResult). An action that cannot run (nothing
    selected, no region, nothing to undo, the program finished) raises a
    :class:`~graphsurgeon.errors.GraphSurgeonError` that says what to do (mostly
    :class:`~graphsurgeon.errors.WidgetError`), and ``w.error`` shows it as it shows a click's.

    Args:
        program: an ExportedProgram (``gs.export(model, args)``) or a
            :class:`~graphsurgeon.Surgery`; anything else is refused as every entry point
            refuses it (:class:`~graphsurgeon.errors.NotAProgramError`).
        args, kwargs: the example inputs verify, compare, the overlays and the stepper run on,
            read as every entry point reads inputs (a tuple; a list is refused); default: the
            Surgery's own, from ``gs.Surgery.from_model``. Given with a Surgery, they are the
            widget's own: the Surgery's example inputs are not changed.
        namespace: where the picker finds replacements and evaluates expressions (default:
            the notebook's globals).

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> w = gs.SurgeryWidget(gs.export(model, (torch.randn(2, 4),)), args=(torch.randn(2, 4),))
        >>> w.select("1").selected
        '1'
        >>> w.swap(torch.nn.GELU()).surgery.replacements
        {'1': GELU(approximate='none')}
        >>> w.step().ran[0], w.stepper.current.name  # runs the input checks too
        ('input_1', 'linear')
    """

    _esm = _STATIC / "widget.js"
    _css = _widget_css()

    #: The buttons' names (:data:`ACTIONS`): what ``w.click(name)`` takes.
    BUTTONS: ClassVar[tuple[str, ...]] = tuple(_ACTIONS)
    #: The traits the page may set: the selection, read as ``w.select`` reads a name.
    PAGE_INPUTS: ClassVar[frozenset[str]] = frozenset({"selected"})
    #: The traits only the kernel writes, which the page only reads: every other synced trait
    #: of the widget (what the panels copy out of the session, the buttons, the error and busy
    #: lines) and anywidget's script and style. Set below the class, from its traits, so a
    #: trait added later is the kernel's unless it is made a page input.
    OUTPUT_TRAITS: ClassVar[frozenset[str]] = frozenset()

    # -- what the page shows (written by _panels from the session) --
    actions = t.List(_page_actions()).tag(sync=True)  # the buttons the page builds
    menus = t.Dict({"depths": list(DEPTHS), "overlays": list(OVERLAYS)}).tag(sync=True)
    # The picture's SVG text and what a click on each element marks: the page gets them packed
    # (_view.packed), with one key, a digest of both, that names them among those it keeps.
    svg = t.Unicode("")
    svg_key = t.Unicode("").tag(sync=True)
    svg_packed = t.Bytes(b"").tag(sync=True)  # the text, deflated (zlib)
    view = t.Unicode("program").tag(sync=True)
    caption = t.Unicode("").tag(sync=True)
    can_diff = t.Bool(False).tag(sync=True)
    marks = t.Dict().tag(sync=True)  # {"selected": ids, "focus": id, "producers", ...}
    # what a click on each element marks (Selection.click_marks): the page marks it at once
    clicks = t.Dict()
    clicks_packed = t.Bytes(b"").tag(sync=True)  # its JSON, deflated
    selected = t.Unicode(None, allow_none=True).tag(sync=True)
    selected_node = t.Unicode(None, allow_none=True).tag(sync=True)
    legend = t.Unicode("").tag(sync=True)  # the overlay's colours and what they mean
    overlay = t.Unicode("").tag(sync=True)  # the overlay painted: "", "error", ...
    details = t.Unicode("").tag(sync=True)
    tree = t.Unicode("")  # the module tree's HTML; the page gets it deflated, with its key:
    tree_key = t.Unicode("").tag(sync=True)
    tree_packed = t.Bytes(b"").tag(sync=True)
    module_types = t.List().tag(sync=True)  # the tree's type filter
    search_text = t.Unicode("").tag(sync=True)
    search_html = t.Unicode("").tag(sync=True)  # the matches, one row each
    has_matches = t.Bool(False).tag(sync=True)
    warning = t.Unicode("").tag(sync=True)  # a large layout waiting for a confirmation
    pending = t.Bool(False).tag(sync=True)
    swapped = t.List().tag(sync=True)
    candidates = t.List().tag(sync=True)
    choice = t.Unicode("").tag(sync=True)  # the chosen replacement's label
    choice_key = t.Unicode("").tag(sync=True)  # its picker key; "" when nothing is chosen
    can_swap = t.Bool(False).tag(sync=True)  # a selection and a replacement chosen for it
    preview = t.Unicode("").tag(sync=True)
    history = t.Unicode("").tag(sync=True)
    can_undo = t.Bool(False).tag(sync=True)
    can_redo = t.Bool(False).tag(sync=True)
    verify_html = t.Unicode("").tag(sync=True)
    compare_html = t.Unicode("").tag(sync=True)
    culprits_html = t.Unicode("").tag(sync=True)
    gradients = t.Bool(False).tag(sync=True)  # Verify, Compare, Find culprits: backward too
    stepper_html = t.Unicode("").tag(sync=True)
    stepping = t.Bool(False).tag(sync=True)
    break_on_nan = t.Bool(False).tag(sync=True)
    current = t.Unicode("").tag(sync=True)  # the element id of the node about to run
    scroll = t.Int(0).tag(sync=True)  # bumped: scroll the selection into view
    scroll_current = t.Int(0).tag(sync=True)  # bumped: scroll the current node into view
    region_html = t.Unicode("").tag(sync=True)  # the region: its nodes, its call, similar
    has_region = t.Bool(False).tag(sync=True)
    can_use_region = t.Bool(False).tag(sync=True)  # its nodes can be one call
    can_swap_region = t.Bool(False).tag(sync=True)  # ... and a replacement is chosen for it
    inside_svg = t.Unicode("").tag(sync=True)  # the swapped call the stepper is inside
    inside_caption = t.Unicode("").tag(sync=True)
    inside_current = t.Unicode("").tag(sync=True)  # its node about to run
    error = t.Dict().tag(sync=True)  # {"type", "message", "details"}, or {}
    busy = t.Unicode("").tag(sync=True)

    def __init__(
        self,
        program: ExportedProgram | Surgery,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        namespace: Mapping[str, Any] | None = None,
    ):
        surgery = _surgery(program, args, kwargs)
        own = surgery is program  # a Surgery given: the inputs given are the widget's own
        super().__init__()
        self._syncing = False
        # No progress while the widget is made: no page shows it yet, and a busy line sent
        # now could reach a page after the first picture (shown dimmed until a click).
        self._constructing = True
        self._static_copies: list[Any] = []  # the displays of the static copy, updated
        self._static_lock = threading.Lock()
        self._static_timer: threading.Timer | None = None
        self._static_pending: dict[str, str] | None = None
        self._page_state = False  # inside set_state: a trait set by the page
        self._warming = None  # the background build of the program (build_in_background)
        self._session = SurgerySession(
            surgery,
            namespace=(lambda: namespace) if namespace is not None else _user_namespace,
            on_busy=self._show_busy,
            on_early=self._show_early,
            args=args if own else None,
            kwargs=kwargs if own else None,
        )
        self._constructing = False
        self._publish(busy="")
        # the program built in the background once the clicks pause: the first step takes it
        # (1.1 s -> 0.12 s at 384 layers) and the first swap compiles only what it changes
        if WARM_UP_DELAY is not None:
            self._warming = surgery.build_in_background(delay=WARM_UP_DELAY)
        self.observe(self._selected_from_page, names=["selected"])
        self.on_msg(self._on_page_message)

    # -- session -> traits ----------------------------------------------------------------

    def _publish(self, *, from_page: bool = False, **also: Any) -> None:
        """Copy what the last action changed (and ``also``: error, busy) into the traits, in
        one message to the page; then the static copy of a new picture (``from_page``: a
        moment later, see :data:`STATIC_COPY_DELAY`)."""
        changes = self._session.take_changes()
        values = _panels.page(self._session, changes)
        values.update(also)
        self._syncing = True
        try:
            with self.hold_sync():
                for trait in sorted(values):
                    setattr(self, trait, values[trait])
        finally:
            self._syncing = False
        if "picture" in changes and self._static_copies:
            # the saved notebook shows the picture last shown
            with contextlib.suppress(Exception):
                bundle = self._static_bundle()  # read here, in the kernel's own thread
                if from_page:
                    self._update_static_copies_later(bundle)
                else:
                    self._update_static_copies(bundle)

    def _update_static_copies_later(self, bundle: dict[str, str]) -> None:
        with self._static_lock:
            self._static_pending = bundle
            if self._static_timer is not None:
                self._static_timer.cancel()
            self._static_timer = threading.Timer(STATIC_COPY_DELAY, self._update_static_copies)
            self._static_timer.daemon = True
            self._static_timer.start()

    def _update_static_copies(self, bundle: dict[str, str] | None = None) -> None:
        """Send ``bundle`` (default: the one waiting) to every static copy. Under the lock, so
        a copy sent late never overtakes a newer one."""
        with self._static_lock:
            if self._static_timer is not None:
                self._static_timer.cancel()
                self._static_timer = None
            bundle = bundle if bundle is not None else self._static_pending
            self._static_pending = None
            if bundle is None:
                return
            with contextlib.suppress(Exception):  # the static copy is a courtesy
                for handle in self._static_copies:
                    handle.update(bundle, raw=True)

    def _show_busy(self, text: str) -> None:
        if not self._constructing:
            # sent at once: the page shows it while the work runs (a name in it shortened)
            self.busy = _panels.page_text(text)

    def _show_early(self, text: str) -> None:
        if not self._constructing:
            # what the action decided so far, in one message, with the line of what follows
            self._publish(busy=_panels.page_text(text))

    def _run(
        self,
        action: Callable[[], Any],
        *,
        catch: bool = False,
        from_page: bool = False,
        runs_programs: bool = False,
    ) -> Any:
        """Run ``action`` as one step of the widget: first catch up with a Surgery changed
        from code, afterwards publish what changed; an error is published as a message (type,
        first line, details) and, unless ``catch``, raised again (a call from code sees the
        error; a click in the page only the message). A background build of the program
        pauses meanwhile (:func:`interactive`), and one that has not begun is put off. The
        cyclic collector waits until the answer is out (:func:`._collector.held`), unless the
        action ``runs_programs`` (a check, an overlay: as many runs as it needs)."""
        hold = contextlib.nullcontext() if runs_programs else _collector.held()
        try:
            with interactive(), hold:
                return self._run_now(action, catch=catch, from_page=from_page)
        finally:
            warming = self._warming
            if warming is not None and not warming.begun and WARM_UP_DELAY is not None:
                # put off while the clicks go on
                self._warming = self._session.surgery.build_in_background(WARM_UP_DELAY)
            if PREPARE_DELAY is not None:
                # a head start only: what is wrong with the swap, Swap says when pressed
                with contextlib.suppress(Exception):
                    self._session.prepare_swap(PREPARE_DELAY)

    def _run_now(self, action: Callable[[], Any], *, catch: bool, from_page: bool) -> Any:
        try:
            self._session.sync()
            result = action()
        except Exception as error:
            self._publish(error=_error_fields(error), busy="", from_page=from_page)
            if catch:
                return None
            raise
        self._publish(error={}, busy="", from_page=from_page)
        return result

    def set_state(self, sync_data: dict) -> None:
        """State sent by the page (ipywidgets' entry point), told apart from ``w.x = ...``.
        Of the widget's own traits the page sets only :attr:`PAGE_INPUTS`: an update of one
        the kernel writes (:attr:`OUTPUT_TRAITS`: ``swapped``, ``can_undo``...) is refused, the
        kernel's value sent back so that the page shows it again, and the refusal shown as an
        error (ipywidgets' own traits, such as ``layout``, are ipywidgets' business)."""
        refused = sorted(name for name in sync_data if name in self.OUTPUT_TRAITS)
        taken = {name: value for name, value in sync_data.items() if name not in refused}
        self._page_state = True
        try:
            if taken:
                super().set_state(taken)
        finally:
            self._page_state = False
        if refused:
            self.send_state(refused)
            names = ", ".join(repr(name) for name in refused)
            error = WidgetError(
                f"the page set {names}, which only the kernel writes (the page shows it): "
                "the kernel's value is kept"
            )
            self._publish(error=_error_fields(error), from_page=True)

    def _selected_from_page(self, change: dict) -> None:
        """``selected`` set by the page (or ``w.selected = name``): select it. A name the
        program does not have shows the error, and the trait, in the kernel and in the page,
        snaps back to the selection the next action uses."""
        if self._syncing:
            return
        session = self._session
        self._run(lambda: session.select(change["new"]), catch=True, from_page=self._page_state)
        if self.selected != session.selected:
            self._syncing = True
            try:
                self.selected = session.selected
            finally:
                self._syncing = False

    # -- page -> session ------------------------------------------------------------------

    def _on_page_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """One event from the page. Errors go to ``error`` (ipywidgets would swallow them)."""
        if not isinstance(content, dict) or "event" not in content:
            return
        self._run(
            lambda: self._dispatch(content),
            catch=True,
            from_page=True,
            runs_programs=_runs_programs(content),
        )

    def _dispatch(self, content: dict) -> Any:
        event = content["event"]
        if event == "button":
            return self._press(content.get("name", ""))
        if event == "save":
            name, text = self._session.picture_text(content.get("format", "svg"))
            self.send({"event": "download", "name": name, "text": text})
            return None
        if event not in _EVENTS:
            raise WidgetError(f"the page sent an unknown event {event!r}")
        return _EVENTS[event](self._session, content)

    def _press(self, button: str) -> Any:
        action = _ACTIONS.get(OLD_NAMES.get(button, button)) if isinstance(button, str) else None
        if action is None:
            raise WidgetError(
                f"the widget has no button {button!r}; its buttons: {', '.join(self.BUTTONS)}"
            )
        return getattr(self._session, action.method)()

    # -- the Python API -------------------------------------------------------------------

    def click(self, button: str) -> Any:
        """Press a button by its name, as the page does (``w.click("undo")`` is ``w.undo()``).

        Args:
            button: one of :attr:`BUTTONS`, or a name a button had before (``"bisect"``).

        Returns:
            What the action's method returns.

        Raises:
            WidgetError: the widget has no such button.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> x = torch.ones(1, 2)
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> w = gs.SurgeryWidget(gs.export(model, (x,)), args=(x,))
            >>> w.click("step").ran[-1], w.stepper.current.name
            ('p_0_bias', 'linear')
        """
        return self._run(lambda: self._press(button), runs_programs=_button_runs_programs(button))

    @property
    def session(self) -> SurgerySession:
        """The state and actions behind the page."""
        return self._session

    @property
    def surgery(self) -> Surgery:
        """The live Surgery behind the buttons."""
        return self._session.surgery

    @property
    def stepper(self):
        """The live Stepper (None until the first step; a new one after each swap)."""
        return self._session.stepper

    def refresh(self) -> SurgeryWidget:
        """Show ``w.surgery`` as it is now; any action does this first after a change from code."""
        self._run(self._session.refresh)
        return self

    def select(self, name: str | None) -> SurgeryWidget:
        """Select a module, a call or an fx node, as a click in the picture does.

        Args:
            name: a module (``"1"``), a call (``"shared@1"``) or an fx node name; None clears.

        Raises:
            UnknownNameError: the program has no such module or node.
        """
        self._run(lambda: self._session.select(name))
        return self

    def search(self, text: str) -> SurgeryWidget:
        r"""Find modules and nodes, mark every match and select the first, opening what hides it.

        Args:
            text: a name, a type (``"LayerNorm"``), an op (``"aten.gelu"``), initials (``"sdpa"``)
                or a regex (``r"layers\.\d+\.mlp"``).

        Raises:
            WidgetError: nothing matches.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> x = torch.ones(1, 2)
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> w = gs.SurgeryWidget(gs.export(model, (x,)), args=(x,))
            >>> [(m.name, m.kind) for m in w.search("ReLU").matches]
            [('1', 'module'), ('relu', 'node')]
            >>> w.selected, w.next_match().selected_node, w.previous_match().selected
            ('1', 'relu', '1')
        """
        self._run(lambda: self._session.search(text))
        return self

    @property
    def matches(self):
        """The last search's matches (:class:`~graphsurgeon.widget.Match`), in order."""
        return list(self._session.matches)

    def next_match(self) -> SurgeryWidget:
        """Select the next match of the last :meth:`search` (after the last, the first)."""
        self._run(self._session.next_match)
        return self

    def previous_match(self) -> SurgeryWidget:
        """Select the previous match of the last :meth:`search` (before the first, the last)."""
        self._run(self._session.previous_match)
        return self

    def close_search(self) -> SurgeryWidget:
        """Close the search: its matches are no longer marked; the selection stays."""
        self._run(self._session.close_search)
        return self

    def escape(self) -> SurgeryWidget:
        """What Esc does: close the search if one is open, else clear the selection."""
        self._run(self._session.escape)
        return self

    def toggle(self, name: str) -> SurgeryWidget:
        """Open a collapsed module, or collapse an open one, as a double-click does.

        Args:
            name: a module name, or the element id the picture gives it.
        """
        self._run(lambda: self._session.toggle(name))
        return self

    def expand(self, name: str | None = None, *, force: bool = False) -> SurgeryWidget:
        """Open a module, and the modules around it, in the picture.

        Args:
            name: the module (default: the selection).
            force: lay out a picture of more nodes than ``graphsurgeon.widget.LARGE_LAYOUT`` at
                once; without it the picture waits for :meth:`confirm_layout` (``w.pending``).

        Example:
            >>> import torch, graphsurgeon as gs
            >>> inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> model, x = torch.nn.Sequential(inner, torch.nn.Tanh()), torch.ones(1, 2)
            >>> w = gs.SurgeryWidget(gs.export(model, (x,)), args=(x,))
            >>> w.collapse("0").caption
            '4 nodes drawn · the program: 7 fx nodes, 4 module calls'
            >>> w.expand("0").caption
            '5 nodes drawn · the program: 7 fx nodes, 4 module calls'
        """
        self._run(lambda: self._session.expand(name, force))
        return self

    def collapse(self, name: str | None = None) -> SurgeryWidget:
        """Draw a module as one box again (see :meth:`expand`).

        Args:
            name: the module (default: the selection).
        """
        self._run(lambda: self._session.collapse(name))
        return self

    def expand_all(self, *, force: bool = False) -> SurgeryWidget:
        """Open every module (``w.warning`` says when a large picture waits).

        Args:
            force: lay out a picture of more nodes than ``graphsurgeon.widget.LARGE_LAYOUT`` at
                once; without it the picture waits for :meth:`confirm_layout` (``w.pending``).
        """
        self._run(lambda: self._session.expand_all(force))
        return self

    def expand_to_depth(self, depth: int | str, *, force: bool = False) -> SurgeryWidget:
        """Open every module down to a depth.

        Args:
            depth: the levels opened (1: the top-level modules are boxes); ``"all"`` or ``"auto"``.
            force: lay out a picture of more nodes than ``graphsurgeon.widget.LARGE_LAYOUT`` at
                once; without it the picture waits for :meth:`confirm_layout` (``w.pending``).
        """
        self._run(lambda: self._session.expand_to_depth(depth, force))
        return self

    def confirm_layout(self) -> SurgeryWidget:
        """Lay out the large picture waiting for a confirmation."""
        self._run(self._session.confirm_layout)
        return self

    def cancel_layout(self) -> SurgeryWidget:
        """Keep the picture as it is instead of the large layout waiting (``w.pending``)."""
        self._run(self._session.cancel_layout)
        return self

    def show_overlay(self, kind: str | None) -> SurgeryWidget:
        """Paint the picture and the tree with an overlay, recomputed after every edit.

        Args:
            kind: ``"error"``, ``"own error"``, ``"grad error"``, ``"own grad error"`` or
                ``"latency"``; None or ``""``: none.
        """
        self._run(lambda: self._session.set_overlay(kind), runs_programs=True)
        return self

    def find_culprits(self, *, backward: bool | None = None):
        """The smallest set of swaps that explains a mismatch, marked in the picture.

        Args:
            backward: also count a mismatch of the gradients (``Surgery.bisect(backward=True)``);
                True or False sets the Check panel's "gradients" toggle, None uses it.

        Returns:
            The :class:`~graphsurgeon.checks.bisect.Bisection`, as
            :meth:`graphsurgeon.Surgery.bisect` gives it.
        """
        return self._run(
            lambda: self._checked(backward, self._session.find_culprits),
            runs_programs=_ACTIONS["find_culprits"].runs_programs,
        )

    def _checked(self, backward: bool | None, check: Callable[[], Any]) -> Any:
        if backward is not None:
            if not isinstance(backward, bool):
                raise WidgetError(f"backward={backward!r}: expected True, False or None")
            self._session.set_gradients(backward)
        return check()

    def auto(self) -> SurgeryWidget:
        """Back to the default view: as much detail as fits the width."""
        self._run(self._session.auto)
        return self

    def show(self, view: str) -> SurgeryWidget:
        """Show ``"program"``, or the program before and after: ``"merged"`` or ``"split"``.

        Args:
            view: ``"program"``, ``"merged"`` (one picture) or ``"split"`` (side by side).
        """
        self._run(lambda: self._session.set_view(view))
        return self

    def choose(self, key: str | None) -> SurgeryWidget:
        """Pick a replacement for the selection, as the picker does; another selection clears it.

        Args:
            key: ``"copy"``, ``"identity"``, ``"ns:<name>"`` (a module of the namespace); ``""``
                or None: none.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> x = torch.ones(1, 2)
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> w = gs.SurgeryWidget(gs.export(model, (x,)), args=(x,))
            >>> w.select("1").choose("identity").swap().surgery.replacements
            {'1': Identity()}
        """
        self._run(lambda: self._session.choose(key))
        return self

    def choose_expression(self, text: str) -> SurgeryWidget:
        """Evaluate an expression in the namespace: the module it makes is the choice.

        Args:
            text: Python code that makes a ``torch.nn.Module`` (``"MyNorm(64)"``).
        """
        self._run(lambda: self._session.choose_expression(text))
        return self

    def swap(self, module: torch.nn.Module | None = None, name: str | None = None):
        """Swap a module for a replacement, as the Swap button does. The module swapped is
        then the one selected, and the picture brings it into view.

        Args:
            module: the replacement (default: the picker's choice, :meth:`choose`).
            name: the module or call swapped (default: the selection).

        Raises:
            SwapError: the swap is refused (the message says why); the Surgery stays as it was.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> x = torch.ones(1, 2)
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> w = gs.SurgeryWidget(gs.export(model, (x,)), args=(x,))
            >>> w.swap(torch.nn.Sigmoid(), "1").swapped
            ['1']
            >>> w.undo().can_redo, w.redo().surgery.replacements
            (True, {'1': Sigmoid()})
        """
        self._run(lambda: self._session.swap(module, name))
        return self

    def fuse(self, name: str | None = None) -> SurgeryWidget:
        """Fuse a module: its nodes become one call (:meth:`graphsurgeon.Surgery.fuse`). The
        module fused is then the one selected, and the picture brings it into view.

        Args:
            name: the module or call fused (default: the selection).
        """
        self._run(lambda: self._session.fuse(name))
        return self

    def undo(self) -> SurgeryWidget:
        """Go back one step of the Surgery (see :meth:`swap`).

        Raises:
            SurgeryError: nothing to undo.
        """
        self._run(self._session.undo)
        return self

    def redo(self) -> SurgeryWidget:
        """Go forward again over a step :meth:`undo` went back.

        Raises:
            SurgeryError: nothing to redo.
        """
        self._run(self._session.redo)
        return self

    def reset(self) -> SurgeryWidget:
        """The Surgery back to the original program ("Reset surgery"; the stepper's restart
        is :meth:`reset_stepper`)."""
        self._run(self._session.reset)
        return self

    def region(self, nodes) -> SurgeryWidget:
        """Make fx nodes the region, as shift-clicks do (``w.can_use_region``: one call?).

        Args:
            nodes: fx node names of the program, as the picture names them; ``[]`` forgets it.

        Raises:
            UnknownNodeError: a name the program has no node of (the region stays as it was).
                Nodes that cannot be one call are no error: ``w.region_html`` says why.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> x = torch.ones(1, 2)
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> w = gs.SurgeryWidget(gs.export(model, (x,)), args=(x,))
            >>> w.region(["linear", "relu"]).can_use_region, len(w.find_similar())
            (True, 1)
            >>> [step.name for step in w.fuse_region().surgery.steps]
            ['region:(top)']
        """
        self._run(lambda: self._session.set_region(nodes))
        return self

    def fuse_region(self) -> SurgeryWidget:
        """Make the region one call of its own nodes (:meth:`graphsurgeon.Surgery.fuse_region`)."""
        self._run(self._session.fuse_region)
        return self

    def clear_region(self) -> SurgeryWidget:
        """Forget the region (and what Find similar found)."""
        self._run(self._session.clear_region)
        return self

    def swap_region(self, module: torch.nn.Module | None = None) -> SurgeryWidget:
        """Replace the region by one call of a module (:meth:`graphsurgeon.Surgery.swap_region`).

        Args:
            module: the replacement (default: the picker's choice, :meth:`choose`).
        """
        self._run(lambda: self._session.swap_region(module))
        return self

    def find_similar(self):
        """Where else the program computes what the region does, marked and listed.

        Returns:
            The :class:`graphsurgeon.patterns.find.Matches` (see :meth:`region`).
        """
        return self._run(
            self._session.find_similar, runs_programs=_ACTIONS["find_similar"].runs_programs
        )

    def verify(self, *, backward: bool | None = None):
        """Verify the current program on the widget's inputs, as :meth:`Surgery.verify` does.

        Args:
            backward: check the gradients too (``Surgery.verify(backward=True)``); True or
                False sets the Check panel's "gradients" toggle, None uses it.

        Returns:
            The :class:`~graphsurgeon.VerifyReport`, shown in the check panel too.
        """
        return self._run(
            lambda: self._checked(backward, self._session.verify),
            runs_programs=_ACTIONS["verify"].runs_programs,
        )

    def compare(self, *, backward: bool | None = None):
        """Compare each swapped call with the original it replaced, on the same inputs.

        Args:
            backward: compare each call's gradients too (``Surgery.compare(backward=True)``);
                True or False sets the Check panel's "gradients" toggle, None uses it.

        Returns:
            The :class:`~graphsurgeon.Comparison`, shown in the check panel too.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> x = torch.ones(1, 2)
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> w = gs.SurgeryWidget(gs.export(model, (x,)), args=(x,))
            >>> print(w.swap(torch.nn.Sigmoid(), "1").verify().against)  # no model was given
            the original program
            >>> w.verify().ok, w.compare().first_divergence  # a Sigmoid is no ReLU
            (False, '1')
        """
        return self._run(
            lambda: self._checked(backward, self._session.compare),
            runs_programs=_ACTIONS["compare"].runs_programs,
        )

    def step(self):
        """Run to the next node the picture shows: the :class:`~graphsurgeon.types.StepResult`."""
        return self._run(self._session.step)

    def step_over(self):
        """Run the next node, or the whole module call it starts (F10): the StepResult."""
        return self._run(self._session.step_over)

    def step_into(self):
        """Enter the swapped or fused call next (F11), drawn beside: the StepResult.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> x = torch.ones(1, 2)
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> w = gs.SurgeryWidget(gs.export(model, (x,)), args=(x,))
            >>> w.swap(torch.nn.Sigmoid(), "1").select("1").run_to_selection().reason
            'target'
            >>> w.step_into().note, w.stepper.current.name
            ("entered swapped call '1'", 'sigmoid')
            >>> w.step_out().note
            "left swapped call '1'"
        """
        return self._run(self._session.step_into)

    def step_out(self):
        """Run to the end of the current module call (Shift+F11): the StepResult."""
        return self._run(self._session.step_out)

    def run_to_selection(self):
        """Run until the selected node or module is next: the StepResult."""
        return self._run(self._session.run_to_selection)

    def continue_(self):
        """Run to the next breakpoint, or to the end (F8): the StepResult."""
        return self._run(self._session.continue_)

    def reset_stepper(self) -> SurgeryWidget:
        """Run the program again from its first node ("Restart run")."""
        self._run(self._session.reset_stepper)
        return self

    def toggle_breakpoint(self) -> SurgeryWidget:
        """Stop before the selected node, or the selected module's first op.

        Pressed again, it removes the breakpoint.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> x = torch.ones(1, 2)
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> w = gs.SurgeryWidget(gs.export(model, (x,)), args=(x,))
            >>> print(w.select("1").toggle_breakpoint().continue_())
            ran 6 nodes (input_1 .. linear); stopped: break on entering '1'
        """
        self._run(self._session.toggle_breakpoint)
        return self

    def save(self, path: str | Path) -> Path:
        """Write the picture shown to a file, as the page's save button does.

        Args:
            path: where to write it; its suffix is the format, ``.svg`` or ``.dot``.

        Returns:
            ``path`` as a ``pathlib.Path``.
        """
        path = Path(path)
        _name, text = self._run(lambda: self._session.picture_text(path.suffix.lstrip(".")))
        path.write_text(text)
        return path

    # -- display --------------------------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs: Any):
        """The live widget, and a static picture (HTML) for front ends without widgets."""
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        # the static copy is a courtesy: the widget shows without it
        with contextlib.suppress(Exception):
            data["text/html"] = self._repr_html_()
        return bundle

    def _ipython_display_(self, **kwargs: Any) -> None:
        """Shown in a notebook as two outputs: the live widget, then its picture as static
        HTML. JupyterLab and Notebook 7 render a widget output with the widget manager only,
        which says "model not found" once the kernel is gone (it does not fall back to
        another type of the output): the second output is what a saved notebook shows then.
        While the widget is live, its style sheet hides that copy."""
        from IPython.display import display

        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
        display(data, metadata=metadata, raw=True)
        with contextlib.suppress(Exception):  # the static copy is a courtesy
            handle = display(self._static_bundle(), raw=True, display_id=True)
            if handle is not None:
                self._static_copies.append(handle)

    def _static_bundle(self) -> dict[str, str]:
        return {"text/html": self.static_html(), "text/plain": repr(self)}

    def static_html(self) -> str:
        """The picture shown now as static HTML, for a saved notebook whose kernel is gone."""
        return _panels.static(self._session, self.model_id)

    def _repr_html_(self) -> str:
        """The static picture of the Surgery (history, last verify, before/after)."""
        return self.surgery._repr_mimebundle_()["text/html"]

    def __repr__(self) -> str:
        return f"<SurgeryWidget of {self.surgery!r}, selected {self.selected!r}>"


SurgeryWidget.OUTPUT_TRAITS = frozenset(
    {"_esm", "_css"}
    | {
        name
        for name in SurgeryWidget.class_own_traits(sync=True)
        if name not in SurgeryWidget.PAGE_INPUTS
    }
)


def _error_fields(error: BaseException) -> dict[str, str]:
    """An error as the page shows it: its type, first line and details (the rest, then the
    traceback). The names in it are shortened (:func:`._panels.page_text`): an id the page
    sent, of any length, comes back as a line the page can show."""
    text = str(error).strip() or type(error).__name__
    first, _, rest = text.partition("\n")
    details = (rest + "\n\n" if rest else "") + "".join(
        traceback.format_exception(type(error), error, error.__traceback__)
    )
    return {
        "type": type(error).__name__,
        "message": _panels.page_text(first),
        "details": _panels.page_text(details),
    }


def _surgery(program: Any, args: Any, kwargs: Any) -> Surgery:
    """The Surgery the widget works on, read through the one door every entry point reads
    programs and inputs through (:func:`graphsurgeon._program.as_program`: a model, a list of
    inputs... are refused as everywhere else): the Surgery given (its example inputs left as
    they are: the widget keeps its own), or a new one on the ExportedProgram given, with the
    inputs given as its example inputs."""
    read = as_program(program, args, kwargs, verb="SurgeryWidget")
    if read.surgery is not None:
        return read.surgery
    if read.module is not None:  # a swap or fuse result: its swaps are no Surgery's steps
        raise not_a_program(program, "SurgeryWidget")
    return Surgery(read.ep, args=read.args, kwargs=kwargs)
