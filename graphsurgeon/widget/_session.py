"""The SurgeryWidget's session: its state and its actions, in plain Python, without HTML.

:class:`SurgerySession` holds a :class:`~graphsurgeon.Surgery`, the view (which calls are open,
which picture is shown, laid out), the selection, the replacement being chosen and a
:class:`~graphsurgeon.Stepper`. Each action (a click, a button) is a method that calls the
Surgery, the renderer or the stepper and updates that state; :attr:`~SurgerySession.changed`
says which parts of the page it touched. What the page shows of the state (the panels' HTML) is
written by :mod:`graphsurgeon.widget._panels`, and :class:`~graphsurgeon.SurgeryWidget` only
routes the page's events here and copies the panels into its traits, so tests drive every
control without a browser. Nothing here imports ipywidgets or IPython, or writes HTML.

It reads the other stages through their public faces only: the Surgery's state (``version``,
``position``, ``steps``, ``replacements``...), the Picture's lookups (what draws a call, what
is inside a cluster, what feeds an element), ``program_index(ep).resolve(name)`` for names
and ``.call_text(call)`` for how a call is made, :mod:`graphsurgeon._meta` for every printed
value, and :func:`graphsurgeon.render.graphviz.layout` to lay a picture out.

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

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .. import _meta, display
from .._meta import split_call_name
from ..compare import Comparison
from ..drawing import draw
from ..errors import (
    GraphSurgeonError,
    UnknownModuleError,
    UnknownNameError,
    WidgetError,
    did_you_mean,
    unknown_name,
)
from ..partition import ModuleInfo, Partition, call_index, partition, program_index
from ..render import GraphView, graph_view
from ..render.graphviz import layout
from ..render.picture import Picture, PictureNode
from ..rewrite import swap_info
from ..step import Stepper, StepResult, Summary
from ..surgery import Surgery
from ..verify import VerifyReport

__all__ = ["PARTS", "VIEWS", "Candidate", "Scene", "SurgerySession"]

#: The pictures the graph panel can show: the current program, or before/after.
VIEWS = ("program", "merged", "split")
#: The parts of the page an action can change (:attr:`SurgerySession.changed`): the picture,
#: the marks in it (selection, producers, consumers), the selection's details, the module
#: tree, the replacement chosen (picker and preview), the history, the checks, the stepper,
#: the stepper's current node, and a request to scroll the selection into view.
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
)
# Pictures kept laid out, so that undo/redo and switching views back cost no new layout.
_KEPT_PICTURES = 12
# How many values the stepper panel summarizes (the next node's inputs, the last value).
_SUMMARIES = 12


@dataclass(frozen=True)
class Candidate:
    """A replacement the picker offers: ``key`` identifies it, ``label`` is what is shown."""

    key: str
    label: str


class Scene:
    """One laid-out picture: what it shows (:attr:`view`), its SVG as the page shows it, and
    where the current program is drawn in it (``prefix``: ``"after/"`` in a split diff).
    Every question about it is one of the Picture's lookups."""

    def __init__(self, view: GraphView, svg: str, prefix: str, module: Any):
        self.view = view
        self.svg = svg
        self.prefix = prefix
        self.module = module  # keeps id(module), part of the cache key, from being reused

    @property
    def picture(self) -> Picture:
        return self.view.picture

    def elements(self, calls: list[str]) -> list[str]:
        """The ids drawing any of ``calls`` (a cluster, a box, a call's one node), in order."""
        picture = self.picture
        found = [e for call in calls for e in picture.elements_of_call(call)]
        return list(dict.fromkeys(found))

    def node_element(self, node: str) -> PictureNode | None:
        """Where fx node ``node`` is drawn: in the current program's picture, else (a node
        that only the original has, in a split diff) in the other one; None: not drawn."""
        element = self.picture.element_of_node(node, self.prefix)
        if element is None and self.prefix:
            element = self.picture.element_of_node(node)
        return element

    def flow(self, selected: list[str]) -> dict[str, list[str]]:
        """The selection's producers and consumers, and the edges between them and it."""
        picture = self.picture
        nodes: set[str] = set()
        for element_id in selected:
            nodes.update(picture.inside(element_id) or (element_id,))
        producers, consumers, edges = set(), set(), set()
        for node in nodes:
            for edge in picture.edges_in(node):
                if edge.tail not in nodes:
                    producers.add(edge.tail)
                    edges.add(edge.id)
            for edge in picture.edges_out(node):
                if edge.head not in nodes:
                    consumers.add(edge.head)
                    edges.add(edge.id)
        return {
            "producers": sorted(producers),
            "consumers": sorted(consumers),
            "edges": sorted(edges),
        }


class SurgerySession:
    """The state and the actions of a :class:`~graphsurgeon.SurgeryWidget`, without a widget.

    Args:
        surgery: the live Surgery every action works on (the widget's ``w.surgery``).
        namespace: returns the user's namespace (the notebook's globals), where the picker
            looks for replacements and evaluates expressions; None: no namespace.
        on_busy: called with a line of progress before slow work (layout, verify, compare,
            stepping); the caller clears it when the action is over.

    State read by the panels: :attr:`surgery`, :attr:`tree`, :attr:`partitions`,
    :attr:`view`, :attr:`scene`, :attr:`selected` (a call or module name),
    :attr:`selected_node` (an fx node), :attr:`marks`, the replacement chosen
    (:attr:`replacement_label`, :attr:`replacement_key`, :attr:`can_swap`), :attr:`report`,
    :attr:`comparison`, :attr:`stepper`, :attr:`last_step`, :attr:`breakpoints`,
    :attr:`break_on_nan`, :attr:`current` (the element id of the stepper's node), and the
    scroll requests :attr:`scroll` and :attr:`scroll_current` (counters: bumped, scroll).
    """

    def __init__(
        self,
        surgery: Surgery,
        namespace: Callable[[], Mapping[str, Any]] | None = None,
        on_busy: Callable[[str], None] | None = None,
    ):
        if not isinstance(surgery, Surgery):
            raise WidgetError(
                f"SurgerySession: expected a gs.Surgery, got {type(surgery).__name__}; "
                "use gs.SurgeryWidget(program_or_surgery, args=...)"
            )
        self.surgery = surgery
        self._namespace = namespace or dict
        self._on_busy = on_busy or (lambda text: None)
        #: The parts of the page (:data:`PARTS`) changed since :meth:`take_changes`.
        self.changed: set[str] = set(PARTS)
        self.view = "program"
        self._open: set[str] | None = None  # None: the renderer chooses ("auto")
        self._pictures: OrderedDict[tuple, Scene] = OrderedDict()
        self.scene: Scene | None = None
        self.selected: str | None = None  # a call or module name
        self.selected_node: str | None = None  # an fx node, when a node was picked
        self._selected_elements: list[str] = []
        self.marks: dict[str, Any] = {}
        # The replacement the next swap uses belongs to the selection it was chosen for:
        # selecting another module clears it, so a second Swap never reuses the first's.
        self.replacement: Any = None  # the module (or _COPY), or None: nothing chosen
        self.replacement_label = ""  # what the picker and the preview call it
        self.replacement_key = ""  # its picker key ("copy", "ns:fast"), "expression", "module"
        self.replacement_for: str | None = None  # the selection it was chosen for
        self.stepper: Stepper | None = None
        self._stepper_module: Any = None
        self.last_step: StepResult | None = None
        self.breakpoints: list[tuple[str, str]] = []  # ("node" | "enter", name), to re-apply
        self.break_on_nan = False
        self._budget: int | None = None  # the node budget of the default view, once chosen
        self._stepper_opened: set[str] = set()  # calls opened to show the stepper's node
        self.current = ""
        self.scroll = 0
        self.scroll_current = 0
        self.comparison: Comparison | None = None
        self.report: VerifyReport | None = surgery.last_verify
        self.partitions: dict[str, Partition] = partition(surgery.program)
        self.tree = surgery.tree
        self._seen = surgery.version
        self._render()

    # -- what changed ---------------------------------------------------------------------

    def _touch(self, *parts: str) -> None:
        self.changed.update(parts)

    def take_changes(self) -> set[str]:
        """The parts of the page changed since the last call (:data:`PARTS`), and forget them."""
        changed, self.changed = self.changed, set()
        return changed

    def sync(self) -> None:
        """Catch up with the Surgery when it was changed from code (``w.surgery.swap(...)``
        in a cell): every action of the widget starts with this."""
        if self.surgery.version != self._seen:
            self._after_change()

    def refresh(self) -> None:
        """Show the Surgery as it is now (after it was changed from code, not by the widget)."""
        self._after_change()

    def _busy(self, text: str) -> None:
        self._on_busy(text)

    # -- the picture ----------------------------------------------------------------------

    @property
    def can_diff(self) -> bool:
        """Whether a before/after picture can be shown: something is swapped (a fused call
        computes the program's own nodes)."""
        return bool(self.surgery.replacements)

    def _collapse(self) -> Any:
        if self._open is None:
            return "auto"
        return {name for name in self.partitions if name not in self._open}

    def _render(self) -> None:
        surgery = self.surgery
        view = self.view if self.can_diff else "program"
        module = self._drawn_program()
        key = (view, id(module), None if self._open is None else frozenset(self._open))
        scene = self._pictures.get(key)
        if scene is None:
            self._busy("laying out the picture…")
            diff = None if view == "program" else view
            if self._open is None:  # as much detail as fits the width, as gs.draw chooses
                # the budget is chosen once (draw tries several layouts to choose it); the
                # next pictures of this program are drawn with it, in one layout each
                drawing = draw(surgery, diff=diff, max_nodes=self._budget)
                if self._budget is None:
                    self._budget = drawing.max_nodes
                graph, svg = drawing.view, drawing.svg
            else:
                graph = graph_view(surgery, collapse=self._collapse(), diff=diff)
                svg = layout(graph.dot, "svg").decode()
            prefix = "after/" if view == "split" else ""
            scene = Scene(graph, display.inline_svg(svg), prefix, module)
            self._pictures[key] = scene
            while len(self._pictures) > _KEPT_PICTURES:
                self._pictures.popitem(last=False)
        self._pictures.move_to_end(key)
        self.scene = scene
        self.view = view
        self._touch("picture")
        # the selection and the stepper's node are marked again in the new picture
        self._mark_selection()
        self._mark_current()

    def set_view(self, view: str) -> None:
        """Show ``"program"`` (the current program), or before/after: ``"merged"`` (one
        picture, removed nodes greyed) or ``"split"`` (side by side)."""
        if view not in VIEWS:
            raise WidgetError(f"view: expected one of {', '.join(VIEWS)}, got {view!r}")
        if view != "program" and not self.can_diff:
            raise WidgetError(
                "before/after: nothing is swapped yet (a fused call computes what it did); "
                "swap a module first"
            )
        self.view = view
        self._render()

    def calls_of(self, name: str) -> list[str]:
        """The calls a module or call name stands for, read as every entry point reads it
        (``"blk@0"`` is ``"blk"``); [] for a name the program does not have."""
        try:
            return list(program_index(self.surgery.program).resolve(name).calls)
        except UnknownModuleError:
            return []

    def _opened(self) -> set[str]:
        if self._open is None:  # take over what the renderer chose
            return set(self.scene.view.clusters)
        return set(self._open)

    def _ancestors(self, call: str) -> list[str]:
        """The calls around ``call``, outermost first (from the program's one call index)."""
        part = self.partitions.get(call)
        if part is None or not part.nodes:
            return []
        chain = call_index(self.surgery.program).chains.get(part.nodes[0], ())
        return list(chain[: chain.index(call)]) if call in chain else list(chain)

    def expand(self, name: str | None = None) -> None:
        """Open module (or call) ``name`` (default: the selection), and the modules around
        it, in the picture."""
        calls = self._calls_or_raise(self._target(name, "expand"))
        opened = self._opened()
        for call in calls:
            opened.update(self._ancestors(call))
            opened.add(call)
        self._stepper_opened -= opened  # what the user opens stays open
        self._open = opened
        self._render()

    def collapse(self, name: str | None = None) -> None:
        """Draw module (or call) ``name`` (default: the selection) as one box again."""
        calls = self._calls_or_raise(self._target(name, "collapse"))
        opened = self._opened()
        for call in calls:  # the call and everything inside it
            inside = self.partitions[call].fqn + "."
            opened = {
                c for c in opened if c != call and not self.partitions[c].fqn.startswith(inside)
            }
        self._open = opened
        self._render()

    def expand_all(self) -> None:
        """Open every module (can be slow on a large program)."""
        self._open = set(self.partitions)
        self._render()

    def auto(self) -> None:
        """Back to the view the renderer chooses: as much detail as fits."""
        self._open = None
        self._render()

    def toggle(self, element_or_name: str) -> None:
        """Open a collapsed box (a run of boxes becomes one box per call), or collapse an open
        cluster: what a double-click in the picture does. Takes an element id or a name."""
        picture = self.scene.picture
        if element_or_name in picture:
            element = picture[element_or_name]
            if getattr(element, "kind", None) == "box":
                opened = self._opened()
                # a run of boxes opens into one box per call (nothing opened); a box, its call
                if len(element.calls) <= 1:
                    for call in element.calls:
                        opened.update(self._ancestors(call))
                        opened.add(call)
                self._open = opened
                self._render()
                return
            call = getattr(element, "call", None)
            if call is None:
                calls = getattr(element, "calls", ())
                call = calls[0] if calls else None
            if call is None:
                node = getattr(element, "node", None)
                chain = self.chain_of_node(node) if node else ()
                call = chain[-1] if chain else None
            if call is None:
                raise WidgetError(f"{element_or_name!r} is not in a module: nothing to collapse")
            self.collapse(call)
            return
        calls = self._calls_or_raise(element_or_name)
        if any(c in self._opened() for c in calls):
            self.collapse(element_or_name)
        else:
            self.expand(element_or_name)

    def _calls_or_raise(self, name: str) -> list[str]:
        resolved = program_index(self.surgery.program).resolve(name)  # unknown: raises
        if not resolved.calls:
            raise WidgetError(
                f"module {resolved.fqn!r} is never called (a container such as nn.ModuleList): "
                "open or collapse its children"
            )
        return list(resolved.calls)

    def chain_of_node(self, node: str) -> tuple[str, ...]:
        """The calls around fx node ``node`` of the program drawn, outermost first."""
        return call_index(self._drawn_program()).chains.get(node, ())

    def _drawn_program(self) -> Any:
        s = self.surgery
        return s.module if (s.replacements or s.fused) else s.program

    # -- selection ------------------------------------------------------------------------

    def click(self, element_id: str) -> None:
        """Select what a click in the picture hit: a cluster or box selects its module call,
        a node selects that node (and the call it belongs to)."""
        picture = self.scene.picture
        if element_id not in picture:
            raise WidgetError(f"the picture has no element {element_id!r}")
        element = picture[element_id]
        call = getattr(element, "call", None)
        calls = getattr(element, "calls", ())
        if call:
            self._select_call(call, [element_id])
        elif calls:
            self._select_call(calls[0], [element_id])
        elif getattr(element, "node", None):
            self._select_node(element.node, element_id)
        else:
            raise WidgetError(f"{element_id!r} is not a module or a node")

    def select(self, name: str | None) -> None:
        """Select a module or call (``"layers.1"``, ``"shared@1"``), an fx node, or nothing
        (None). A module inside a collapsed box stays in its box; :meth:`search` opens it.
        Selecting another module clears the replacement chosen for the previous one. A name
        the program does not have raises, and the selection stays what it was."""
        if name is None or name == "":
            self._selection_is(None, None, [])
            return
        if not isinstance(name, str):
            raise WidgetError(f"select: expected a module or node name, got {name!r}")
        if name in self.tree or self.calls_of(name):
            if name not in self.tree:  # a call: as every view names it ("blk@0" is "blk")
                name = program_index(self.surgery.program).resolve(name).name
            self._select_call(name, None)
        elif name in self._node_names():
            self._select_node(name, None)
        else:
            choices = dict.fromkeys([*self.tree.keys(), *self.partitions])
            raise UnknownNameError(unknown_name(name, choices, kind="module or node"))

    def search(self, text: str) -> None:
        """Find a module or node by name (exactly, else the first whose name contains the
        text), open the modules around it and select it; the page scrolls to it."""
        text = (text or "").strip()
        if not text:
            raise WidgetError("search: type a module or node name")
        name = self._find(text)
        calls = self.calls_of(name)
        if calls:
            wanted = {a for c in calls for a in self._ancestors(c)}
        else:
            wanted = set(self.chain_of_node(name))
        if wanted - self._opened():
            self._open = self._opened() | wanted
            self._render()
        self.select(name)
        self.scroll += 1
        self._touch("scroll")

    def _find(self, text: str) -> str:
        names = [*self.tree.keys(), *self.partitions]
        nodes = self._node_names()
        if text in names or text in nodes:
            return text
        lowered = text.lower()
        for name in [*names, *nodes]:
            if lowered in name.lower():
                return name
        raise WidgetError(f"search: no module or node matches {text!r}.{did_you_mean(text, names)}")

    def _node_names(self) -> dict[str, None]:
        return {n.name: None for n in self._drawn_program().graph.nodes}

    def _select_call(self, name: str, elements: list[str] | None) -> None:
        self._selection_is(name, None, elements or [])

    def _select_node(self, node: str, element: str | None) -> None:
        chain = self.chain_of_node(node)
        self._selection_is(chain[-1] if chain else None, node, [element] if element else [])

    def _selection_is(self, name: str | None, node: str | None, elements: list[str]) -> None:
        """The one place the selection changes: a replacement chosen for another module is
        dropped, then the selection, the picker and the preview change together."""
        self.selected, self.selected_node = name, node
        self._selected_elements = elements
        if self.replacement_for != name:
            self._choose(None, "", "")
        self._touch("selection", "choice")
        self._mark_selection()

    def _mark_selection(self) -> None:
        scene = self.scene
        if self.selected_node is not None:
            element = scene.node_element(self.selected_node)
            ids = [element.id] if element is not None else []
        elif self.selected is not None:
            ids = [e for e in self._selected_elements if e in scene.picture]
            ids = (
                ids
                or scene.elements(self.calls_of(self.selected))
                or self._box_holding(self.selected)
            )
        else:
            ids = []
        # "module": the tree row to mark, as its data-gs-module attribute carries the name
        module = (
            display.id_text(split_call_name(self.selected)[0]) if self.selected is not None else ""
        )
        self.marks = {"selected": ids, **scene.flow(ids), "module": module}
        self._touch("marks")

    def _box_holding(self, name: str) -> list[str]:
        """The box a collapsed call is drawn in (a parent's box, or a run of boxes)."""
        scene = self.scene
        for call in self.calls_of(name):
            for node in self.partitions[call].nodes:
                element = scene.picture.element_of_node(node, scene.prefix)
                if element is not None:
                    return [element.id]
        return []

    # -- what the panels read about the selection ------------------------------------------

    def module_info(self, name: str) -> ModuleInfo | None:
        """The module tree's row of the module that ``name`` (a module or a call) names."""
        return self.tree.get(split_call_name(name)[0])

    def call_text(self, call: str, replacement: torch.nn.Module | None = None) -> str:
        """How the program makes ``call``: ``(x: f32[1, 16, 64]) → f32[1, 16, 64]``, the
        arguments named as ``replacement``'s forward names them (default: the original's);
        '' when the call's signature was not preserved."""
        if self.partitions[call].signature is None:
            return ""
        return program_index(self.surgery.program).call_text(call, module=replacement, wrap=48)

    def source_of(self, call: str) -> str:
        """Where the first op of ``call`` comes from (``model.py:12``), or ''."""
        by_name = program_index(self.surgery.program).by_name
        for name in self.partitions[call].nodes:
            node = by_name.get(name)
            if node is not None and node.op == "call_function":
                text = _meta.source_text(node)
                if text:
                    return text
        return ""

    # -- replacements ---------------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """What the picker offers for the selection: a copy of the original, identity, then
        every nn.Module instance and class in the user's namespace."""
        found = [
            Candidate("copy", "a copy of the original"),
            Candidate("identity", "identity (nn.Identity)"),
        ]
        try:
            namespace = dict(self._namespace())
        except Exception:  # a namespace that cannot be read offers nothing, it is not an error
            namespace = {}
        for key, value in namespace.items():
            if key.startswith("_"):
                continue
            if isinstance(value, torch.nn.Module) and not isinstance(value, torch.fx.GraphModule):
                found.append(Candidate(f"ns:{key}", f"{key}: {type(value).__name__} (instance)"))
            elif (
                isinstance(value, type)
                and issubclass(value, torch.nn.Module)
                and not value.__module__.startswith(("torch.", "graphsurgeon."))
            ):
                found.append(Candidate(f"ns:{key}", f"{key}: class, built as {key}()"))
        return found

    @property
    def can_swap(self) -> bool:
        """Whether Swap has what it needs: a selection and a replacement chosen for it."""
        return self.selected is not None and self.replacement is not None

    @property
    def replacement_module(self) -> torch.nn.Module | None:
        """The module chosen, as the preview names its arguments (None: a copy of the
        original, or nothing chosen)."""
        return None if self.replacement is _COPY else self.replacement

    def _choose(self, replacement: Any, label: str, key: str) -> None:
        self.replacement, self.replacement_label, self.replacement_key = replacement, label, key
        self.replacement_for = self.selected if replacement is not None else None
        self._touch("choice")

    def _for_selection(self, verb: str) -> str:
        if self.selected is None:
            raise WidgetError(
                f"{verb}: select a module first (click it, or w.select(name)); a replacement "
                "is chosen for the module it replaces"
            )
        return self.selected

    def choose(self, key: str | None) -> None:
        """Pick the replacement the next :meth:`swap` of the selection uses: ``"copy"`` (a
        deep copy of the original module), ``"identity"``, or ``"ns:<name>"`` from the
        namespace; ``""`` (the picker's first line) or None chooses nothing. It belongs to
        the selection: selecting another module clears it."""
        if key is None or key == "":
            self._choose(None, "", "")
            return
        self._for_selection("choose")
        if key == "copy":
            self._choose(_COPY, "a copy of the original", key)
        elif key == "identity":
            self._choose(torch.nn.Identity(), "identity", key)
        elif isinstance(key, str) and key.startswith("ns:"):
            name = key[3:]
            namespace = dict(self._namespace())
            if name not in namespace:
                raise WidgetError(f"the namespace has no {name!r} (any more): pick again")
            self._choose(_module_from(namespace[name], name), name, key)
        else:
            raise WidgetError(f"choose: unknown replacement {key!r}")

    def choose_expression(self, text: str) -> None:
        """Evaluate ``text`` (``MyAttn(dim=64)``) in the user's namespace: the module (or
        class, then built with no arguments) is the replacement the next swap of the
        selection uses."""
        self._for_selection("expression")
        text = (text or "").strip()
        if not text:
            raise WidgetError("expression: type one, such as MyAttn(dim=64)")
        namespace = dict(self._namespace())
        try:
            value = eval(text, namespace)  # the user's own expression, in their own kernel
        except Exception as error:
            raise WidgetError(
                f"the expression {text!r} failed: {type(error).__name__}: {error}"
            ) from error
        self._choose(_module_from(value, text), text, "expression")

    def use(self, module: torch.nn.Module, label: str | None = None) -> None:
        """Make ``module`` the replacement the next swap of the selection uses."""
        self._for_selection("use")
        label = label or type(module).__name__
        self._choose(_module_from(module, label), label, "module")

    def _resolved_replacement(self, name: str) -> torch.nn.Module:
        if self.replacement is None:
            raise WidgetError(
                f"swap {name!r}: pick a replacement first (the picker, or w.swap(module))"
            )
        if self.replacement_for != name:  # chosen for the selection; swapping another name
            raise WidgetError(
                f"swap {name!r}: the replacement {self.replacement_label!r} was chosen for "
                f"{self.replacement_for!r}, not for {name!r}; select {name!r} and pick one "
                f"for it, or pass it: w.swap(module, name={name!r})"
            )
        if self.replacement is _COPY:
            return self._original(name)
        return self.replacement

    def _original(self, name: str) -> torch.nn.Module:
        if self.surgery.model is None:
            self._busy("rebuilding the program's modules…")  # once: the Surgery keeps them
        return self.surgery.original(name)

    # -- operations -----------------------------------------------------------------------

    def _target(self, name: str | None, verb: str) -> str:
        name = name if name is not None else self.selected
        if name is None:
            raise WidgetError(f"{verb}: select a module first (click it, or w.select(name))")
        return name

    def swap(self, module: torch.nn.Module | None = None, name: str | None = None) -> None:
        """Swap the selected module (or ``name``) for ``module``, or for the replacement
        chosen in the picker for it; the before/after picture is shown."""
        name = self._target(name, "swap")
        if module is not None:
            replacement = _module_from(module, type(module).__name__)
        else:
            replacement = self._resolved_replacement(name)
        self._busy(f"swapping {name}…")
        self.surgery.swap(name, replacement)
        if module is not None and name == self.selected:  # the picker shows what it swapped in
            self._choose(replacement, type(replacement).__name__, "module")
        self._after_change(show="merged")

    def fuse(self, name: str | None = None) -> None:
        """Fuse the selected module (or ``name``): its nodes become one call."""
        name = self._target(name, "fuse")
        self._busy(f"fusing {name}…")
        self.surgery.fuse(name)
        self._after_change()

    def undo(self) -> None:
        """Go back one step of the Surgery."""
        self.surgery.undo()
        self._after_change()

    def redo(self) -> None:
        """Go forward again over an undone step."""
        self.surgery.redo()
        self._after_change()

    def reset(self) -> None:
        """Back to the original program (the history is kept: redo still works)."""
        self.surgery.reset()
        self._after_change()

    def _after_change(self, show: str | None = None) -> None:
        self._seen = self.surgery.version
        if show is not None and self.view == "program":
            self.view = show
        if not self.can_diff:
            self.view = "program"
        self.comparison = None
        self.report = self.surgery.last_verify
        self.stepper = None
        self.last_step = None
        self._touch(*PARTS)
        self._render()

    # -- checks ---------------------------------------------------------------------------

    def _inputs(self, verb: str) -> tuple[tuple, dict]:
        s = self.surgery
        if s.args is None:
            raise WidgetError(
                f"{verb}: the widget has no example inputs: pass them, as in "
                "gs.SurgeryWidget(program, args=(x,))"
            )
        return s.args, dict(s.kwargs)

    def verify(self) -> VerifyReport:
        """Verify the current program against its eager reference on the example inputs."""
        self._inputs("verify")
        self._busy("verifying against the eager reference…")
        self.report = self.surgery.verify()
        self._touch("checks")
        return self.report

    def compare(self) -> Comparison:
        """Compare each swapped call with the original on the same captured inputs."""
        args, kwargs = self._inputs("compare")
        s = self.surgery
        if not s.replacements:
            raise WidgetError("compare: nothing is swapped; swap a module first")
        self._busy("comparing each swapped call with the original…")
        self.comparison = s.compare(args, kwargs)
        self._touch("checks")
        return self.comparison

    # -- stepping -------------------------------------------------------------------------

    def _ensure_stepper(self) -> Stepper:
        module = self._drawn_program()
        if self.stepper is None or self._stepper_module is not module:
            args, kwargs = self._inputs("step")
            self._busy("preparing the stepper…")
            self.stepper = Stepper(self.surgery.module, *args, **kwargs)
            self._stepper_module = module
            self.last_step = None
            self._sync_breakpoints()
        return self.stepper

    def _drawn(self) -> Callable[[Any], bool]:
        scene = self.scene

        def drawn(node: Any) -> bool:
            return scene.picture.element_of_node(node.name, scene.prefix) is not None

        return drawn

    def _move(self, move: Callable[[Stepper], StepResult], verb: str) -> StepResult:
        stepper = self._ensure_stepper()
        if stepper.done:
            raise WidgetError(f"{verb}: the program has finished; press reset to run it again")
        self._busy(f"{verb}…")
        result = move(stepper)
        if (
            result.reason in ("step", "target")
            and not stepper.done
            and not stepper.frames
            and not self._drawn()(stepper.current)
        ):
            # glue (input checks, flattening) is not drawn: run on to the next node that is
            rest = stepper.run_to(self._drawn())
            result = StepResult(
                ran=result.ran + rest.ran,
                position=rest.position,
                reason=rest.reason if rest.reason != "target" else result.reason,
                breakpoints=rest.breakpoints,
                trigger=rest.trigger,
                note=result.note or rest.note,
            )
        self.last_step = result
        self._reveal_current()
        self._touch("stepper")
        return result

    def step(self) -> StepResult:
        """Run the next node the picture shows (and the glue before it)."""
        return self._move(lambda st: st.step(), "step")

    def step_over(self) -> StepResult:
        """Run the next node, or the whole module call it starts."""
        return self._move(lambda st: st.step_over(), "step over")

    def step_into(self) -> StepResult:
        """Enter the fused or swapped call about to run."""
        return self._move(lambda st: st.step_into(), "step into")

    def step_out(self) -> StepResult:
        """Run to the end of the current module call."""
        return self._move(lambda st: st.step_out(), "step out")

    def continue_(self) -> StepResult:
        """Run to the next breakpoint or the end."""
        return self._move(lambda st: st.continue_(), "continue")

    def run_to_selection(self) -> StepResult:
        """Run until the selected node or module is next (a breakpoint may stop it first)."""
        if self.selected_node is not None:
            node = self.selected_node
            return self._move(lambda st: st.run_to(node=node), f"run to {node}")
        name = self._target(None, "run to")
        return self._move(lambda st: st.run_to(module=name), f"run to {name}")

    def reset_stepper(self) -> None:
        """Start stepping again from the first node."""
        stepper = self._ensure_stepper()
        stepper.reset()
        self.last_step = None
        self._mark_current()
        self._touch("stepper")

    def toggle_breakpoint(self) -> None:
        """Stop before the selected node, or on entering the selected module; again: remove."""
        if self.selected_node is not None:
            wanted = ("node", self.selected_node)
        else:
            wanted = ("enter", self._target(None, "breakpoint"))
        if wanted in self.breakpoints:
            self.breakpoints.remove(wanted)
        else:
            self.breakpoints.append(wanted)
        if self.stepper is not None:
            self._sync_breakpoints()
        self._touch("stepper")

    def set_break_on_nan(self, on: bool) -> None:
        """Stop after any node whose value holds a NaN or an Inf."""
        self.break_on_nan = bool(on)
        if self.stepper is not None:
            self._sync_breakpoints()
        self._touch("stepper")

    def _sync_breakpoints(self) -> None:
        breakpoints = self.stepper.breakpoints
        breakpoints.clear()
        for kind, name in self.breakpoints:
            if kind == "node":
                breakpoints.node(name)
            else:
                breakpoints.enter(name)
        if self.break_on_nan:
            breakpoints.nan_or_inf()

    def _current_element(self) -> str:
        stepper = self.stepper
        if stepper is None or stepper.done:
            return ""
        scene = self.scene
        picture = scene.picture
        if stepper.frames:  # inside an entered call: mark the call
            call = stepper.frames[0]
            node = self._call_node(call)
            if node is not None:
                element = picture.element_of_node(node, scene.prefix)
                if element is not None:
                    return element.id
            ids = scene.elements([call])
            return ids[0] if ids else ""
        element = picture.element_of_node(stepper.current.name, scene.prefix)
        return element.id if element is not None else ""

    def _call_node(self, call: str) -> str | None:
        """The node of the current program that runs swapped or fused ``call``, or None."""
        info = swap_info(self.surgery.module)
        if info is not None and call in info.call_nodes:
            return info.call_nodes[call]
        return None

    def _reveal_current(self) -> None:
        """The current node inside a collapsed box: open the modules around it."""
        stepper = self.stepper
        if stepper is not None and not stepper.done and not stepper.frames:
            element = self.scene.picture.element_of_node(stepper.current.name, self.scene.prefix)
            if element is not None and element.kind == "box":
                # open the outermost call around the node with everything inside it (one
                # layout for the whole call, not one per submodule the steps go through);
                # close again what was opened for calls the stepper has left
                outer = stepper.stack[0]
                inside = self.partitions[outer].fqn + "." if outer in self.partitions else None
                needed = set(stepper.stack) | {
                    c for c, p in self.partitions.items() if inside and p.fqn.startswith(inside)
                }
                opened = self._opened()
                left = self._stepper_opened - needed
                self._stepper_opened = (self._stepper_opened & needed) | (needed - opened)
                self._open = (opened - left) | needed
                self._render()
        self._mark_current()

    def _mark_current(self) -> None:
        current = self._current_element()
        if current != self.current:
            self.current = current
            self.scroll_current += 1
            self._touch("current")

    def summaries(self) -> list[Summary]:
        """The values the next node reads, then the last value computed (what the stepper
        panel shows; a value the stepper no longer keeps is left out)."""
        stepper = self.stepper
        if stepper is None:
            return []
        names: list[str] = []
        if not stepper.done:
            names += [n.name for n in stepper.current.all_input_nodes]
        if self.last_step is not None and self.last_step.ran:
            names.append(self.last_step.ran[-1])
        summaries = []
        for name in dict.fromkeys(names):
            try:
                summaries.append(stepper.summary(name))
            except GraphSurgeonError:
                continue  # a value not kept (or of another frame): nothing to show
        return summaries[:_SUMMARIES]

    # -- saving ---------------------------------------------------------------------------

    def picture_text(self, format_: str) -> tuple[str, str]:
        """The current picture as ``(file name, text)``: ``"svg"`` or ``"dot"``."""
        scene = self.scene
        stem = f"{scene.picture.name}-{self.view}"
        if format_ == "svg":
            return f"{stem}.svg", scene.svg
        if format_ == "dot":
            return f"{stem}.dot", scene.view.dot
        raise WidgetError(f"save: expected 'svg' or 'dot', got {format_!r}")


class _CopyMarker:
    def __repr__(self) -> str:
        return "<a copy of the original>"


_COPY = _CopyMarker()


def _module_from(value: Any, label: str) -> torch.nn.Module:
    if isinstance(value, type) and issubclass(value, torch.nn.Module):
        try:
            return value()
        except TypeError as error:
            raise WidgetError(
                f"{label}() needs arguments ({error}); type the call in the expression box, "
                f"such as {value.__name__}(...)"
            ) from error
    if isinstance(value, torch.nn.Module):
        return value
    raise WidgetError(
        f"{label} is {type(value).__name__}, not an nn.Module: a replacement is a module "
        "(an instance, or a class built with no arguments)"
    )
