"""SurgeryWidget: the notebook app, an anywidget whose logic is the SurgeryModel's.

The class holds traits only: after every action it copies the model's fields into them, and it
routes the page's events (``{"event": "click", "id": ...}``) to the model's methods. An error
from a click shows in the widget (``w.error``); the same action called from code raises too.

Names travel to the page as data: ``selected`` holds the name itself; element ids and the
``data-gs-module`` / ``data-gs-call`` attributes of the panels hold it as ids do
(:func:`graphsurgeon.display.id_text`: ``a%00b`` for a module named ``"a\\x00b"``), and what the
page sends back from them is read the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import anywidget
import torch
import traitlets as t
from torch.export import ExportedProgram

from .. import display
from ..display import name_of_id_text
from ..errors import WidgetError, a_type
from ..surgery import Surgery
from ._model import SurgeryModel

__all__ = ["SurgeryWidget"]

_STATIC = Path(__file__).parent / "static"


def _user_namespace() -> Mapping[str, Any]:
    """The notebook's globals (where the picker looks for replacements), or nothing."""
    try:
        from IPython import get_ipython
    except ImportError:
        return {}
    shell = get_ipython()
    return shell.user_ns if shell is not None else {}


def _widget_css() -> str:
    """widget.css, after the styles of graphsurgeon's HTML (tables, badges, the module tree),
    which the panels show: one stylesheet, so the widget looks as the displays do."""
    shared = (display.STYLE + display._TREE_STYLE).replace("<style>", "").replace("</style>", "")
    return shared + (_STATIC / "widget.css").read_text()


class SurgeryWidget(anywidget.AnyWidget):
    """Pick a module in the picture of a program, swap it, see before/after, verify, step.

    ``gs.SurgeryWidget(program_or_surgery, args=None)`` (or ``s.widget()``) shows, in one
    output: the module tree (filter, counts, swappable or why not), the program drawn by
    module (click selects, double-click opens or collapses a module, zoom, pan, fit, search,
    save as SVG or DOT), the details of the selection, a replacement picker with a preview of
    what the swap removes and the call the replacement must accept, Swap / Fuse / Undo / Redo /
    Reset with a before/after picture, verify and compare panels, and a stepper that marks the
    node about to run in the picture.

    Everything a button does is a method too (``w.select(name)``, ``w.swap(module)``,
    ``w.step()``...), and the live objects are ``w.surgery``, ``w.stepper`` and
    ``w.selected``: the next cell goes on in code.

    Args:
        program: an ExportedProgram (``gs.export(model, args)``) or a :class:`~graphsurgeon.Surgery`.
        args, kwargs: the example inputs verify, compare and the stepper run on (default: the
            Surgery's own, from ``gs.Surgery.from_model``).
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

    # -- what the page shows (published by the model) --
    svg = t.Unicode("").tag(sync=True)
    view = t.Unicode("program").tag(sync=True)
    caption = t.Unicode("").tag(sync=True)
    can_diff = t.Bool(False).tag(sync=True)
    marks = t.Dict().tag(sync=True)  # {"selected": ids, "producers", "consumers", "edges"}
    selected = t.Unicode(None, allow_none=True).tag(sync=True)
    selected_node = t.Unicode(None, allow_none=True).tag(sync=True)
    details = t.Unicode("").tag(sync=True)
    tree = t.Unicode("").tag(sync=True)
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
    stepper_html = t.Unicode("").tag(sync=True)
    stepping = t.Bool(False).tag(sync=True)
    break_on_nan = t.Bool(False).tag(sync=True)
    current = t.Unicode("").tag(sync=True)  # the element id of the node about to run
    scroll = t.Int(0).tag(sync=True)  # bumped: scroll the selection into view
    scroll_current = t.Int(0).tag(sync=True)  # bumped: scroll the current node into view
    error = t.Dict().tag(sync=True)  # {"type", "message", "details"}, or {}
    busy = t.Unicode("").tag(sync=True)

    # model field -> trait, where the names differ
    _TRAITS: ClassVar[dict[str, str]] = {
        "verify": "verify_html",
        "compare": "compare_html",
        "stepper": "stepper_html",
    }

    def __init__(
        self,
        program: ExportedProgram | Surgery,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        namespace: Mapping[str, Any] | None = None,
    ):
        surgery = _surgery(program, args, kwargs)
        super().__init__()
        self._syncing = False
        self.model = SurgeryModel(
            surgery,
            namespace=(lambda: namespace) if namespace is not None else _user_namespace,
            on_change=self._copy_fields,
            on_busy=self._show_busy,
        )
        self._copy_fields(set(self.model.fields))
        self.observe(self._selected_from_page, names=["selected"])
        self.on_msg(self._on_page_message)

    # -- model -> traits ------------------------------------------------------------------

    def _copy_fields(self, changed: set[str]) -> None:
        if not hasattr(self, "model"):
            return  # the model's first fields are copied once it exists (__init__)
        fields = self.model.fields
        self._syncing = True
        try:
            with self.hold_sync():
                for name in sorted(changed):
                    trait = self._TRAITS.get(name, name)
                    if self.has_trait(trait):
                        setattr(self, trait, fields[name])
        finally:
            self._syncing = False

    def _show_busy(self, text: str) -> None:
        self.busy = text  # sent at once: the page shows it while the work runs

    def _selected_from_page(self, change: dict) -> None:
        """``selected`` set by the page (or ``w.selected = name``): select it. A name the
        program does not have shows the error, and the trait, in the kernel and in the page,
        snaps back to the selection the next action uses."""
        if self._syncing:
            return
        self.model.run(lambda: self.model.select(change["new"]), catch=True)
        if self.selected != self.model.selected:
            self._syncing = True
            try:
                self.selected = self.model.selected
            finally:
                self._syncing = False

    # -- page -> model --------------------------------------------------------------------

    def _on_page_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """One event from the page. Errors go to ``error`` (ipywidgets would swallow them)."""
        if not isinstance(content, dict) or "event" not in content:
            return
        event = content["event"]
        if event == "save":
            self.model.run(lambda: self._download(content.get("format", "svg")), catch=True)
            return
        self.model.run(lambda: self._dispatch(event, content), catch=True)

    def _download(self, format_: str) -> None:
        name, text = self.model.picture_text(format_)
        self.send({"event": "download", "name": name, "text": text})

    def _dispatch(self, event: str, content: dict) -> Any:
        m = self.model
        value = content.get("value")
        handlers = {
            "click": lambda: m.click(content["id"]),
            "toggle": lambda: m.toggle(content["id"]),
            # the tree and the compare table send a name as ids carry it
            "select": lambda: m.select(name_of_id_text(value) if isinstance(value, str) else value),
            "search": lambda: m.search(value),
            "view": lambda: m.set_view(value),
            "choose": lambda: m.choose(value),
            "expression": lambda: m.choose_expression(value),
            "nan": lambda: m.set_break_on_nan(bool(value)),
        }
        if event in handlers:
            return handlers[event]()
        if event == "button":
            return self.click(content.get("name", ""), _from_page=True)
        raise WidgetError(f"the page sent an unknown event {event!r}")

    # -- the buttons, from code -----------------------------------------------------------

    BUTTONS = (
        "swap", "fuse", "undo", "redo", "reset", "verify", "compare",
        "step", "step_over", "step_into", "step_out", "run_to", "continue", "restart",
        "break", "expand", "collapse", "expand_all", "auto",
    )  # fmt: skip

    def click(self, button: str, *, _from_page: bool = False) -> Any:
        """Press a button of the widget by its name (one of ``SurgeryWidget.BUTTONS``)."""
        m = self.model
        actions = {
            "swap": m.swap,
            "fuse": m.fuse,
            "undo": m.undo,
            "redo": m.redo,
            "reset": m.reset,
            "verify": m.verify,
            "compare": m.compare,
            "step": m.step,
            "step_over": m.step_over,
            "step_into": m.step_into,
            "step_out": m.step_out,
            "run_to": m.run_to_selection,
            "continue": m.continue_,
            "restart": m.reset_stepper,
            "break": m.toggle_breakpoint,
            "expand": lambda: m.expand(m._target(None, "expand")),
            "collapse": lambda: m.collapse(m._target(None, "collapse")),
            "expand_all": m.expand_all,
            "auto": m.auto,
        }
        if button not in actions:
            raise WidgetError(
                f"the widget has no button {button!r}; its buttons: {', '.join(self.BUTTONS)}"
            )
        if _from_page:
            return actions[button]()
        return m.run(actions[button])

    # -- the Python API -------------------------------------------------------------------

    @property
    def surgery(self) -> Surgery:
        """The live Surgery behind the buttons."""
        return self.model.surgery

    @property
    def stepper(self):
        """The live Stepper (None until the first step; a new one after each swap)."""
        return self.model.stepper

    def refresh(self) -> SurgeryWidget:
        """Show ``w.surgery`` as it is now. Any action does this first when the Surgery was
        changed from code (``w.surgery.swap(...)`` in a cell)."""
        self.model.run(self.model.refresh)
        return self

    def select(self, name: str | None) -> SurgeryWidget:
        """Select a module, a call (``"shared@1"``) or an fx node; None clears."""
        self.model.run(lambda: self.model.select(name))
        return self

    def search(self, text: str) -> SurgeryWidget:
        """Find a module or node by (part of) its name, open what hides it, select it."""
        self.model.run(lambda: self.model.search(text))
        return self

    def toggle(self, name: str) -> SurgeryWidget:
        """Open a collapsed module, or collapse an open one (a name or an element id)."""
        self.model.run(lambda: self.model.toggle(name))
        return self

    def expand(self, name: str) -> SurgeryWidget:
        self.model.run(lambda: self.model.expand(name))
        return self

    def collapse(self, name: str) -> SurgeryWidget:
        self.model.run(lambda: self.model.collapse(name))
        return self

    def expand_all(self) -> SurgeryWidget:
        """Open every module (a large program makes a large picture)."""
        self.model.run(self.model.expand_all)
        return self

    def auto(self) -> SurgeryWidget:
        """Back to the default view: as much detail as fits the width."""
        self.model.run(self.model.auto)
        return self

    def show(self, view: str) -> SurgeryWidget:
        """Show ``"program"``, or before/after ``"merged"`` or ``"split"``."""
        self.model.run(lambda: self.model.set_view(view))
        return self

    def choose(self, key: str | None) -> SurgeryWidget:
        """Pick a replacement for the selection as the picker does: ``"copy"``, ``"identity"``,
        ``"ns:<name>"``; ``""`` or None: none. Selecting another module clears it."""
        self.model.run(lambda: self.model.choose(key))
        return self

    def choose_expression(self, text: str) -> SurgeryWidget:
        """Evaluate ``text`` in the namespace; the module it makes is the next replacement."""
        self.model.run(lambda: self.model.choose_expression(text))
        return self

    def swap(self, module: torch.nn.Module | None = None, name: str | None = None):
        """Swap the selection (or ``name``) for ``module`` (default: the picker's choice)."""
        self.model.run(lambda: self.model.swap(module, name))
        return self

    def fuse(self, name: str | None = None) -> SurgeryWidget:
        self.model.run(lambda: self.model.fuse(name))
        return self

    def undo(self) -> SurgeryWidget:
        self.model.run(self.model.undo)
        return self

    def redo(self) -> SurgeryWidget:
        self.model.run(self.model.redo)
        return self

    def reset(self) -> SurgeryWidget:
        self.model.run(self.model.reset)
        return self

    def verify(self):
        """Verify against the eager reference: the :class:`~graphsurgeon.VerifyReport`."""
        return self.model.run(self.model.verify)

    def compare(self):
        """Compare each swapped call with the original: the :class:`~graphsurgeon.Comparison`."""
        return self.model.run(self.model.compare)

    def step(self):
        """Run to the next node the picture shows: the :class:`~graphsurgeon.types.StepResult`."""
        return self.model.run(self.model.step)

    def step_over(self):
        return self.model.run(self.model.step_over)

    def step_into(self):
        return self.model.run(self.model.step_into)

    def step_out(self):
        return self.model.run(self.model.step_out)

    def run_to_selection(self):
        return self.model.run(self.model.run_to_selection)

    def continue_(self):
        return self.model.run(self.model.continue_)

    def reset_stepper(self) -> SurgeryWidget:
        self.model.run(self.model.reset_stepper)
        return self

    def save(self, path: str | Path) -> Path:
        """Write the picture shown to ``path`` (``.svg`` or ``.dot``)."""
        path = Path(path)
        _name, text = self.model.run(lambda: self.model.picture_text(path.suffix.lstrip(".")))
        path.write_text(text)
        return path

    # -- display --------------------------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs: Any):
        """The live widget, and a static picture (HTML) for front ends without widgets and
        for saved notebooks."""
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        # the static copy is a courtesy: the widget shows without it
        with contextlib.suppress(Exception):
            data["text/html"] = self._repr_html_()
        return bundle

    def _repr_html_(self) -> str:
        """The static picture of the Surgery (history, last verify, before/after)."""
        return self.surgery._repr_mimebundle_()["text/html"]

    def __repr__(self) -> str:
        s = self.surgery
        return f"<SurgeryWidget of {s!r}, selected {self.selected!r}>"


def _surgery(program: Any, args: Any, kwargs: Any) -> Surgery:
    if isinstance(program, Surgery):
        if args is not None:
            program.args = (args,) if isinstance(args, torch.Tensor) else tuple(args)
        if kwargs is not None:
            program.kwargs = dict(kwargs)
        return program
    if isinstance(program, ExportedProgram):
        if isinstance(args, torch.Tensor):
            args = (args,)
        return Surgery(program, args=args, kwargs=kwargs)
    hint = (
        "use gs.Surgery.from_model(model, args).widget(), or export it first with "
        "gs.export(model, args)"
        if isinstance(program, torch.nn.Module)
        else "pass gs.export(model, args) or a gs.Surgery"
    )
    raise WidgetError(
        f"SurgeryWidget: expected an ExportedProgram or a Surgery, got {a_type(program)}; {hint}"
    )
