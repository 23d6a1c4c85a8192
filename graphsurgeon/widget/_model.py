"""The SurgeryWidget's view model: everything the widget does, in plain Python.

:class:`SurgeryModel` holds a :class:`~graphsurgeon.Surgery`, the view (which calls are open,
which picture is shown), the selection, the replacement being chosen and a
:class:`~graphsurgeon.Stepper`; each action (a click, a button) is a method that calls the
engine, the renderer or the stepper and then publishes what the page shows as plain fields
(``model.fields``: SVG text, HTML panels already escaped, element ids to mark). The widget only
copies those fields into its traits and routes the page's events to these methods, so tests
drive every control without a browser, and nothing here imports ipywidgets or IPython.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.widget import SurgeryModel
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> m = SurgeryModel(gs.Surgery.from_model(model, (torch.randn(2, 4),)))
    >>> m.select("1")
    >>> m.fields["selected"], m.fields["marks"]["selected"]
    ('1', ['node:relu'])
    >>> m.choose("identity")
    >>> m.swap()
    >>> m.surgery.replacements
    {'1': Identity()}
    >>> m.verify().ok  # the program is faithful to the eager model with Identity in it
    True
    >>> m.compare().first_divergence  # but Identity is not ReLU
    '1'
"""

from __future__ import annotations

import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .. import _meta
from .. import display as d
from .._meta import split_call_name
from ..compare import Comparison
from ..display import id_text, shown
from ..display import inline_svg as _inline
from ..drawing import draw
from ..errors import (
    GraphSurgeonError,
    UnknownModuleError,
    UnknownNameError,
    WidgetError,
    did_you_mean,
    unknown_name,
)
from ..partition import Partition, call_index, partition, program_index
from ..render import GraphView, graph_view
from ..render._writer import call_signature as _call_signature
from ..render.graphviz import layout as _layout
from ..render.picture import Picture
from ..step import Stepper, StepResult, summary_table
from ..surgery import Surgery
from ..verify import VerifyReport

__all__ = ["VIEWS", "SurgeryModel"]

#: The pictures the graph panel can show: the current program, or before/after.
VIEWS = ("program", "merged", "split")
# Positions in Picture rows (the fields of PictureNode / PictureCluster, in order).
_NODE_FIELDS = 11
_N_KIND, _N_NODE, _N_CALLS, _N_TOOLTIP, _N_CLUSTER, _N_MEMBERS = 1, 2, 3, 6, 7, 8
_C_CALL, _C_TOOLTIP, _C_CLUSTER, _C_MEMBERS = 1, 4, 5, 6
# Pictures kept laid out, so that undo/redo and switching views back cost no new layout.
_KEPT_PICTURES = 12
# The steps one "step" button may run to reach a node the picture shows (glue is not drawn).
_STEP_LIMIT = 10_000
# How many characters of a name the panels show (the middle of a longer one gives way to "…").
_PANEL_NAME_LIMIT = 120


def _name(name: str) -> str:
    """A module or call name as the panels show it: HTML text, control characters visible,
    a long name shortened (the ids and ``data-gs-*`` attributes carry it whole)."""
    return d.escape(shown(name, _PANEL_NAME_LIMIT))


@dataclass(frozen=True)
class Candidate:
    """A replacement the picker offers: ``key`` identifies it, ``label`` is what is shown."""

    key: str
    label: str


class _Scene:
    """One laid-out picture and the maps a click or a selection needs, built once per picture."""

    def __init__(self, view: GraphView, svg: str, prefix: str):
        self.view = view
        self.svg = svg
        self.prefix = prefix  # "after/" in a split diff: where the current program is drawn
        picture: Picture = view.picture
        self.picture = picture
        self.of_call: dict[str, list[str]] = {}
        self.of_fqn: dict[str, list[str]] = {}
        self.inside: dict[str, list[str]] = {}  # cluster id -> node ids in it, at any depth
        rows = picture.rows
        for element_id, row in rows.items():
            calls = row[_N_CALLS] if len(row) == _NODE_FIELDS else (row[_C_CALL],)
            for call in calls:
                if call:
                    self.of_call.setdefault(call, []).append(element_id)
                    self.of_fqn.setdefault(split_call_name(call)[0], []).append(element_id)
        for element_id, row in rows.items():
            if len(row) == _NODE_FIELDS:
                parent = row[_N_CLUSTER]
                while parent is not None:
                    self.inside.setdefault(parent, []).append(element_id)
                    parent = rows[parent][_C_CLUSTER]
        self.outgoing: dict[str, list[tuple[str, str]]] = {}
        self.incoming: dict[str, list[tuple[str, str]]] = {}
        for edge in picture.edge_rows:
            edge_id, tail, head = edge[0], edge[1], edge[2]
            self.outgoing.setdefault(tail, []).append((edge_id, head))
            self.incoming.setdefault(head, []).append((edge_id, tail))

    def elements(self, name: str) -> list[str]:
        """The ids drawing call or module ``name`` (its cluster, its box, or its one node)."""
        if "@" in name:
            return list(self.of_call.get(name, ()))
        return list(self.of_fqn.get(name, ()))

    def flow(self, selected: list[str]) -> dict[str, list[str]]:
        """The selection's producers and consumers, and the edges between them and it."""
        nodes: set[str] = set()
        for element_id in selected:
            nodes.update(self.inside.get(element_id, (element_id,)))
        producers, consumers, edges = [], [], []
        for node in sorted(nodes):
            for edge_id, tail in self.incoming.get(node, ()):
                if tail not in nodes:
                    producers.append(tail)
                    edges.append(edge_id)
            for edge_id, head in self.outgoing.get(node, ()):
                if head not in nodes:
                    consumers.append(head)
                    edges.append(edge_id)
        return {
            "producers": sorted(set(producers)),
            "consumers": sorted(set(consumers)),
            "edges": sorted(set(edges)),
        }


class SurgeryModel:
    """The state and the actions of a :class:`~graphsurgeon.SurgeryWidget`, without a widget.

    Args:
        surgery: the live Surgery every action works on (the widget's ``w.surgery``).
        namespace: returns the user's namespace (the notebook's globals), where the picker
            looks for replacements and evaluates expressions; None: no namespace.
        on_change: called with the names of the fields that changed after each action.
        on_busy: called with a line of progress before slow work (layout, verify, compare,
            stepping) and with ``""`` after it.
    """

    def __init__(
        self,
        surgery: Surgery,
        namespace: Callable[[], Mapping[str, Any]] | None = None,
        on_change: Callable[[set[str]], None] | None = None,
        on_busy: Callable[[str], None] | None = None,
    ):
        if not isinstance(surgery, Surgery):
            raise WidgetError(
                f"SurgeryModel: expected a gs.Surgery, got {type(surgery).__name__}; "
                "use gs.SurgeryWidget(program_or_surgery, args=...)"
            )
        self.surgery = surgery
        self._namespace = namespace or dict
        self._on_change = on_change or (lambda changed: None)
        self._on_busy = on_busy or (lambda text: None)
        self.fields: dict[str, Any] = {}
        self._changed: set[str] = set()
        self.view = "program"
        self._open: set[str] | None = None  # None: the renderer chooses ("auto")
        self._pictures: OrderedDict[tuple, _Scene] = OrderedDict()
        self.scene: _Scene | None = None
        self.selected: str | None = None  # a call or module name
        self.selected_node: str | None = None  # an fx node, when a node was picked
        self._selected_elements: list[str] = []
        # The replacement the next swap uses belongs to the selection it was chosen for:
        # selecting another module clears it, so a second Swap never reuses the first's.
        self.replacement: Any = None  # the module (or _COPY), or None: nothing chosen
        self.replacement_label = ""  # what the picker and the preview call it
        self.replacement_key = ""  # its picker key ("copy", "ns:fast"), "expression", "module"
        self.replacement_for: str | None = None  # the selection it was chosen for
        self.stepper: Stepper | None = None
        self._stepper_module: Any = None
        self.last_step: StepResult | None = None
        self._breakpoints: list[tuple[str, str]] = []  # ("node" | "enter", name), to re-apply
        self.break_on_nan = False
        self._budget: int | None = None  # the node budget of the default view, once chosen
        self._stepper_opened: set[str] = set()  # calls opened to show the stepper's node
        self.comparison: Comparison | None = None
        self.report: VerifyReport | None = None
        self._partitions: dict[str, Partition] = partition(surgery.program)
        self._tree = surgery.tree
        self._publish_all()

    # -- publishing -----------------------------------------------------------------------

    def _set(self, **values: Any) -> None:
        for key, value in values.items():
            if self.fields.get(key, _MISSING) != value:
                self.fields[key] = value
                self._changed.add(key)

    def _flush(self) -> None:
        changed, self._changed = self._changed, set()
        if changed:
            self._on_change(changed)

    def _publish_all(self) -> None:
        self._seen = self._state_key()
        self._set(error={}, busy="")
        self._publish_everything()
        self._flush()

    def _publish_everything(self) -> None:
        """The picture and every panel, from the current state."""
        self._render()
        self._publish_tree()
        self._publish_selection()
        self._publish_history()
        self._publish_checks()
        self._publish_stepper()
        self._publish_candidates()

    def _state_key(self) -> int:
        return self.surgery.version

    def refresh(self) -> None:
        """Show the Surgery as it is now (after it was changed from code, not by the widget)."""
        self._after_change()

    def _busy(self, text: str) -> None:
        self.fields["busy"] = text
        self._on_busy(text)

    def run(self, action: Callable[[], Any], *, catch: bool = False) -> Any:
        """Run ``action`` as one step of the widget: afterwards the fields are published; an
        error is published as a message (type, first line, details) and, unless ``catch``,
        raised again (a call from code sees the error; a click in the page only the message)."""
        try:
            if self._state_key() != self._seen:  # the Surgery was changed from code
                self._after_change()
            result = action()
        except Exception as error:
            self._set(error=_error_fields(error))
            self._busy("")
            self._flush()
            if catch:
                return None
            raise
        self._set(error={})
        self._busy("")
        self._flush()
        return result

    # -- the picture ----------------------------------------------------------------------

    def _collapse(self) -> Any:
        if self._open is None:
            return "auto"
        return {name for name in self._partitions if name not in self._open}

    def _render(self) -> None:
        surgery = self.surgery
        # fused calls compute the program's own nodes: only swaps have a before/after
        view = self.view if surgery.replacements else "program"
        module = surgery.module if (surgery.replacements or surgery.fused) else surgery.program
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
                graph, svg = drawing.view, _inline(drawing.svg)
            else:
                graph = graph_view(surgery, collapse=self._collapse(), diff=diff)
                svg = _inline(_layout(graph.dot, "svg").decode())
            scene = _Scene(graph, svg, "after/" if view == "split" else "")
            scene.module = module  # keeps id(module) from being reused while cached
            self._pictures[key] = scene
            while len(self._pictures) > _KEPT_PICTURES:
                self._pictures.popitem(last=False)
        self._pictures.move_to_end(key)
        self.scene = scene
        graph = scene.view
        caption = f"{graph.drawn_nodes:,} of {graph.graph_nodes:,} fx nodes drawn"
        if graph.collapsed:
            caption += f", {len(graph.collapsed):,} modules collapsed"
        if graph.swapped:
            caption += f", {len(graph.swapped)} swapped"
        self._set(
            svg=scene.svg,
            view=view,
            caption=caption,
            can_diff=bool(surgery.replacements),
        )
        # the selection and the stepper's node are marked again in the new picture
        self._mark_selection()
        self._mark_current()

    def set_view(self, view: str) -> None:
        """Show ``"program"`` (the current program), or before/after: ``"merged"`` (one
        picture, removed nodes greyed) or ``"split"`` (side by side)."""
        if view not in VIEWS:
            raise WidgetError(f"view: expected one of {', '.join(VIEWS)}, got {view!r}")
        if view != "program" and not self.surgery.replacements:
            raise WidgetError(
                "before/after: nothing is swapped yet (a fused call computes what it did); "
                "swap a module first"
            )
        self.view = view
        self._render()

    def _calls_of(self, name: str) -> list[str]:
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
        part = self._partitions.get(call)
        if part is None or not part.nodes:
            return []
        chain = call_index(self.surgery.program).chains.get(part.nodes[0], ())
        return list(chain[: chain.index(call)]) if call in chain else list(chain)

    def expand(self, name: str) -> None:
        """Open module (or call) ``name``, and the modules around it, in the picture."""
        calls = self._calls_or_raise(name)
        opened = self._opened()
        for call in calls:
            opened.update(self._ancestors(call))
            opened.add(call)
        self._stepper_opened -= opened  # what the user opens stays open
        self._open = opened
        self._render()

    def collapse(self, name: str) -> None:
        """Draw module (or call) ``name`` as one box again."""
        calls = self._calls_or_raise(name)
        opened = self._opened()
        for call in calls:  # the call and everything inside it
            inside = self._partitions[call].fqn + "."
            opened = {
                c for c in opened if c != call and not self._partitions[c].fqn.startswith(inside)
            }
        self._open = opened
        self._render()

    def expand_all(self) -> None:
        """Open every module (can be slow on a large program)."""
        self._open = set(self._partitions)
        self._render()

    def auto(self) -> None:
        """Back to the view the renderer chooses: as much detail as fits."""
        self._open = None
        self._render()

    def toggle(self, element_or_name: str) -> None:
        """Open a collapsed box (a run of boxes becomes one box per call), or collapse an open
        cluster: what a double-click in the picture does. Takes an element id or a name."""
        scene = self.scene
        if element_or_name in scene.picture:
            element = scene.picture[element_or_name]
            if getattr(element, "kind", None) == "box":
                opened = self._opened()
                if len(element.calls) > 1:  # a run: every call its own box, nothing opened
                    self._open = opened
                else:
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
                chain = self._chain_of_node(node) if node else ()
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

    def _chain_of_node(self, node: str) -> tuple[str, ...]:
        program = self._drawn_program()
        return call_index(program).chains.get(node, ())

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
        if name in self._tree or self._calls_of(name):
            if name not in self._tree:  # a call: as every view names it ("blk@0" is "blk")
                name = program_index(self.surgery.program).resolve(name).name
            self._select_call(name, None)
        elif name in self._node_names():
            self._select_node(name, None)
        else:
            choices = dict.fromkeys([*self._tree.keys(), *self._partitions])
            raise UnknownNameError(unknown_name(name, choices, kind="module or node"))

    def search(self, text: str) -> None:
        """Find a module or node by name (exactly, else the first whose name contains the
        text), open the modules around it and select it; the page scrolls to it."""
        text = (text or "").strip()
        if not text:
            raise WidgetError("search: type a module or node name")
        name = self._find(text)
        calls = self._calls_of(name)
        if calls:
            wanted = {a for c in calls for a in self._ancestors(c)}
        else:
            wanted = set(self._chain_of_node(name))
        if wanted - self._opened():
            self._open = self._opened() | wanted
            self._render()
        self.select(name)
        self._set(scroll=self.fields.get("scroll", 0) + 1)

    def _find(self, text: str) -> str:
        names = [*self._tree.keys(), *self._partitions]
        nodes = self._node_names()
        if text in names or text in nodes:
            return text
        lowered = text.lower()
        for name in [*names, *nodes]:
            if lowered in name.lower():
                return name
        raise WidgetError(f"search: no module or node matches {text!r}.{did_you_mean(text, names)}")

    def _node_names(self) -> dict[str, None]:
        program = self._drawn_program()
        graph = program.graph
        return {n.name: None for n in graph.nodes}

    def _select_call(self, name: str, elements: list[str] | None) -> None:
        self._selection_is(name, None, elements or [])

    def _select_node(self, node: str, element: str | None) -> None:
        chain = self._chain_of_node(node)
        self._selection_is(chain[-1] if chain else None, node, [element] if element else [])

    def _selection_is(self, name: str | None, node: str | None, elements: list[str]) -> None:
        """The one place the selection changes: a replacement chosen for another module is
        dropped, then the selection, the picker and the preview are published together."""
        self.selected, self.selected_node = name, node
        self._selected_elements = elements
        if self.replacement_for != name:
            self._choose(None, "", "")
        self._publish_selection()
        self._publish_candidates()

    def _mark_selection(self) -> None:
        scene = self.scene
        if self.selected_node is not None:
            element = scene.picture.element_of_node(self.selected_node, scene.prefix)
            if element is None and scene.prefix:
                element = scene.picture.element_of_node(self.selected_node)
            ids = [element.id] if element is not None else []
        elif self.selected is not None:
            ids = [e for e in self._selected_elements if e in scene.picture]
            ids = ids or scene.elements(self.selected) or self._box_holding(self.selected)
        else:
            ids = []
        # "module": the tree row to mark, as its data-gs-module attribute carries the name
        module = id_text(split_call_name(self.selected)[0]) if self.selected is not None else ""
        self._set(marks={"selected": ids, **scene.flow(ids), "module": module})

    def _box_holding(self, name: str) -> list[str]:
        """The box a collapsed call is drawn in (a parent's box, or a run of boxes)."""
        scene = self.scene
        for call in self._calls_of(name):
            for node in self._partitions[call].nodes:
                element = scene.picture.element_of_node(node, scene.prefix)
                if element is not None:
                    return [element.id]
        return []

    def _publish_selection(self) -> None:
        self._mark_selection()
        self._set(selected=self.selected, selected_node=self.selected_node)
        self._set(details=self._details_html())

    def _details_html(self) -> str:
        scene = self.scene
        if self.selected_node is not None:
            node = self.selected_node
            element = scene.picture.element_of_node(node, scene.prefix) or (
                scene.picture.element_of_node(node)
            )
            tooltip = element.tooltip if element is not None else "not drawn (glue)"
            if element is not None and element.kind == "box":
                tooltip = f"in the collapsed box {element.label.splitlines()[0]}"
            chain = self._chain_of_node(node)
            rows = [
                ["node", f"<code>{d.escape(node)}</code>"],
                ["module", " › ".join(_name(c) for c in chain) or "(top level)"],
                ["drawn", f'<span class="gs-pre">{d.escape(tooltip)}</span>'],
            ]
            return _fields_table(rows)
        if self.selected is None:
            return (
                '<span class="gs-muted">Click a module or a node in the picture or the tree.</span>'
            )
        name = self.selected
        fqn, _ = split_call_name(name)
        info = self._tree.get(fqn) if fqn in self._tree else None
        rows = [["module", f"<code>{_name(name)}</code>"]]
        if info is not None:
            rows.append(["type", d.escape(info.qualified_type or info.type_name)])
            calls = ", ".join(_name(c) for c in info.call_names[:20])
            more = f", … {len(info.call_names) - 20:,} more" if len(info.call_names) > 20 else ""
            rows.append(["calls", (calls + more) or "none (a container)"])
            rows.append(["nodes", f"{info.num_nodes:,}"])
            rows.append(["parameters", f"{info.num_parameters:,}"])
            verdict = (
                d.badge("swappable", "ok")
                if info.swappable
                else f"{d.badge('not swappable', 'bad')} {d.escape(info.reason or '')}"
            )
            rows.append(["swap", verdict])
        replacement = self.surgery.replacements.get(name)
        if replacement is not None:
            rows.append(["swapped for", d.escape(type(replacement).__name__)])
        elif name in self.surgery.fused:
            rows.append(["fused", "yes: its nodes run as one call"])
        calls = self._calls_of(name)
        if calls:
            # the module's own argument names, as export recorded them
            signature = program_index(self.surgery.program).call_text(calls[0], wrap=48)
            if signature:
                rows.append(["called as", f'<span class="gs-pre">{d.escape(signature)}</span>'])
            source = self._source_of(calls[0])
            if source:
                rows.append(["source", f'<span class="gs-pre">{d.escape(source)}</span>'])
        return _fields_table(rows)

    def _source_of(self, call: str) -> str:

        by_name = program_index(self.surgery.program).by_name
        for name in self._partitions[call].nodes:
            node = by_name.get(name)
            if node is not None and node.op == "call_function":
                text = _meta.source_text(node)
                if text:
                    return text
        return ""

    # -- the module tree ------------------------------------------------------------------

    def _publish_tree(self) -> None:
        parameters = {fqn: info.num_parameters for fqn, info in self._tree.items()}
        html = d.module_tree_html(self._tree, parameters, open_depth=1, selectable=True)
        swapped = set(self.surgery.replacements) | set(self.surgery.fused)
        self._set(tree=html, swapped=sorted(swapped))

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
            if isinstance(value, torch.nn.Module) and not _is_program_module(value):
                found.append(Candidate(f"ns:{key}", f"{key}: {type(value).__name__} (instance)"))
            elif (
                isinstance(value, type)
                and issubclass(value, torch.nn.Module)
                and not value.__module__.startswith(("torch.", "graphsurgeon."))
            ):
                found.append(Candidate(f"ns:{key}", f"{key}: class, built as {key}()"))
        return found

    def _publish_candidates(self) -> None:
        # the picker (choice_key), the preview and the Swap button (can_swap) are published
        # from the same state, together: they cannot disagree
        self._set(
            candidates=[{"key": c.key, "label": c.label} for c in self.candidates()],
            choice=self.replacement_label,
            choice_key=self.replacement_key,
            can_swap=self.selected is not None and self.replacement is not None,
            preview=self._preview_html(),
        )

    def _choose(self, replacement: Any, label: str, key: str) -> None:
        self.replacement, self.replacement_label, self.replacement_key = replacement, label, key
        self.replacement_for = self.selected if replacement is not None else None

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
            self._publish_candidates()
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
        self._publish_candidates()

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
        self._publish_candidates()

    def use(self, module: torch.nn.Module, label: str | None = None) -> None:
        """Make ``module`` the replacement the next swap of the selection uses."""
        self._for_selection("use")
        label = label or type(module).__name__
        self._choose(_module_from(module, label), label, "module")
        self._publish_candidates()

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

    def _preview_html(self) -> str:
        name = self.selected
        if name is None:
            return '<span class="gs-muted">Select a module to swap.</span>'
        calls = self._calls_of(name)
        if not calls:
            return f'<span class="gs-muted">{_name(name)} has no calls of its own: pick one of its submodules.</span>'
        info = self._tree.get(split_call_name(name)[0])
        removed = sum(self._partitions[c].num_nodes for c in calls)
        text = [
            f"Swapping <code>{_name(name)}</code> removes {removed:,} fx nodes "
            f"({len(calls)} call{'s' if len(calls) != 1 else ''})"
        ]
        if info is not None:
            text[0] += f" and {info.num_parameters:,} parameter elements"
            if not info.swappable:
                text.append(f"{d.badge('not swappable', 'bad')} {d.escape(info.reason or '')}")
        replacement = None if self.replacement is _COPY else self.replacement
        signature = _call_signature(self._partitions[calls[0]], replacement, self.surgery.program)
        if signature:
            text.append(
                f'The replacement is called as <span class="gs-pre">{d.escape(signature)}</span>'
            )
        if self.replacement_label:
            text.append(f"Replacement: <b>{d.escape(self.replacement_label)}</b>")
        return "<br>".join(text)

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
        self.surgery.undo()
        self._after_change()

    def redo(self) -> None:
        self.surgery.redo()
        self._after_change()

    def reset(self) -> None:
        """Back to the original program (the history is kept: redo still works)."""
        self.surgery.reset()
        self._after_change()

    def _after_change(self, show: str | None = None) -> None:
        self._seen = self._state_key()
        if show is not None and self.view == "program":
            self.view = show
        if not self.surgery.replacements:
            self.view = "program"
        self.comparison = None
        self.report = self.surgery.last_verify
        self.stepper = None
        self.last_step = None
        self._publish_everything()

    def _publish_history(self) -> None:
        s = self.surgery
        rows = []
        for i, step in enumerate(s.steps, start=1):
            undone = i > s.position
            mark = d.badge("undone", "warn") if undone else d.badge(f"step {i}", "ok")
            rows.append(
                [
                    mark,
                    d.escape(step.action),
                    f"<code>{_name(step.name)}</code>",
                    d.escape(step.replacement_type),
                ]
            )
        html = (
            d.table(["", "action", "module", "replacement"], rows, raw=range(4))
            if rows
            else '<span class="gs-muted">No swaps yet.</span>'
        )
        self._set(
            history=html,
            can_undo=s.can_undo,
            can_redo=s.can_redo,
        )

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
        self._publish_checks()
        return self.report

    def compare(self) -> Comparison:
        """Compare each swapped call with the original on the same captured inputs."""
        args, kwargs = self._inputs("compare")
        s = self.surgery
        if not s.replacements:
            raise WidgetError("compare: nothing is swapped; swap a module first")
        self._busy("comparing each swapped call with the original…")
        self.comparison = s.compare(args, kwargs)
        self._publish_checks()
        return self.comparison

    def _publish_checks(self) -> None:
        html = ""
        if self.report is not None:
            html = self.report._repr_html_() + (
                '<div class="gs-muted">The program against the eager model with the same '
                "replacements: the swap itself is faithful. Compare checks each replacement "
                "against the module it replaced.</div>"
            )
        else:
            html = '<span class="gs-muted">Not verified in this state.</span>'
        self._set(verify=html, compare=_comparison_html(self.comparison))

    # -- stepping -------------------------------------------------------------------------

    def _ensure_stepper(self) -> Stepper:
        module = self._drawn_program()
        if self.stepper is None or self._stepper_module is not module:
            args, kwargs = self._inputs("step")
            self._busy("preparing the stepper…")
            program = self.surgery.module
            self.stepper = Stepper(program, *args, **kwargs)
            self._stepper_module = module
            self.last_step = None
            for kind, name in self._breakpoints:
                self._add_breakpoint(kind, name)
            if self.break_on_nan:
                self.stepper.breakpoints.nan_or_inf()
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
        self._publish_stepper()
        return result

    def step(self) -> StepResult:
        """Run the next node the picture shows (and the glue before it)."""
        return self._move(lambda st: st.step(), "step")

    def step_over(self) -> StepResult:
        return self._move(lambda st: st.step_over(), "step over")

    def step_into(self) -> StepResult:
        return self._move(lambda st: st.step_into(), "step into")

    def step_out(self) -> StepResult:
        return self._move(lambda st: st.step_out(), "step out")

    def continue_(self) -> StepResult:
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
        self._publish_stepper()

    def toggle_breakpoint(self) -> None:
        """Stop before the selected node, or on entering the selected module; again: remove."""
        if self.selected_node is not None:
            wanted = ("node", self.selected_node)
        else:
            wanted = ("enter", self._target(None, "breakpoint"))
        if wanted in self._breakpoints:
            self._breakpoints.remove(wanted)
        else:
            self._breakpoints.append(wanted)
        if self.stepper is not None:
            self._sync_breakpoints()
        self._publish_stepper()

    def set_break_on_nan(self, on: bool) -> None:
        """Stop after any node whose value holds a NaN or an Inf."""
        self.break_on_nan = bool(on)
        if self.stepper is not None:
            self._sync_breakpoints()
        self._publish_stepper()

    def _sync_breakpoints(self) -> None:
        stepper = self.stepper
        stepper.breakpoints.clear()
        for kind, name in self._breakpoints:
            self._add_breakpoint(kind, name)
        if self.break_on_nan:
            stepper.breakpoints.nan_or_inf()

    def _add_breakpoint(self, kind: str, name: str) -> None:
        if kind == "node":
            self.stepper.breakpoints.node(name)
        else:
            self.stepper.breakpoints.enter(name)

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
            ids = scene.elements(call)
            return ids[0] if ids else ""
        element = picture.element_of_node(stepper.current.name, scene.prefix)
        return element.id if element is not None else ""

    def _call_node(self, call: str) -> str | None:
        from ..rewrite import swap_info

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
                inside = self._partitions[outer].fqn + "." if outer in self._partitions else None
                needed = set(stepper.stack) | {
                    c for c, p in self._partitions.items() if inside and p.fqn.startswith(inside)
                }
                opened = self._opened()
                left = self._stepper_opened - needed
                self._stepper_opened = (self._stepper_opened & needed) | (needed - opened)
                self._open = (opened - left) | needed
                self._render()
        self._mark_current()

    def _mark_current(self) -> None:
        current = self._current_element()
        if current != self.fields.get("current"):
            self._set(current=current, scroll_current=self.fields.get("scroll_current", 0) + 1)

    def _publish_stepper(self) -> None:
        stepper = self.stepper
        breakpoints = [
            f"{'before' if k == 'node' else 'entering'} {shown(n, _PANEL_NAME_LIMIT)}"
            for k, n in self._breakpoints
        ]
        if self.break_on_nan:
            breakpoints.append("a NaN or an Inf")
        parts = []
        if stepper is None:
            parts.append(
                '<span class="gs-muted">Press step to start running the program node by node.</span>'
            )
        else:
            if stepper.done:
                parts.append(f"{d.badge('finished', 'ok')} all {stepper.total:,} nodes ran")
            else:
                node = stepper.current
                where = " › ".join(shown(c, _PANEL_NAME_LIMIT) for c in stepper.stack)
                where = where or "(top level)"
                parts.append(
                    f"next: <code>{d.escape(node.name)}</code> "
                    f'<span class="gs-muted">{d.escape(_op_of(node))} in {d.escape(where)} · '
                    f"node {stepper.position + 1:,} of {stepper.total:,}</span>"
                )
            result = self.last_step
            if result is not None:
                reason = {"breakpoint": "stopped at a breakpoint", "end": "reached the end"}
                line = f"ran {len(result.ran):,} node{'s' if len(result.ran) != 1 else ''}"
                if result.reason in reason:
                    line += f"; {reason[result.reason]}"
                if result.breakpoints:
                    line += ": " + ", ".join(str(b) for b in result.breakpoints)
                parts.append(d.escape(line))
                if result.note:
                    parts.append(f'<span class="gs-muted">{d.escape(result.note)}</span>')
            summaries = self._summaries(stepper)
            if summaries:
                parts.append(summary_table(summaries))
        if breakpoints:
            parts.append("breakpoints: " + d.escape("; ".join(breakpoints)))
        self._set(
            stepper="<br>".join(parts),
            stepping=stepper is not None and not stepper.done,
            break_on_nan=self.break_on_nan,
        )

    def _summaries(self, stepper: Stepper) -> list:
        """The values the next node reads, then the last value computed."""
        names: list[str] = []
        if not stepper.done:
            names += [n.name for n in stepper.current.all_input_nodes]
        if self.last_step is not None and self.last_step.ran:
            names.append(self.last_step.ran[-1])
        summaries, seen = [], set()
        for name in names:
            if name in seen:
                continue
            seen.add(name)
            try:
                summaries.append(stepper.summary(name))
            except GraphSurgeonError:
                continue  # a value not kept (or of another frame): nothing to show
        return summaries[:12]

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
_MISSING = object()


def _fields_table(rows: list[list[str]]) -> str:
    """A two-column table of (field, HTML value) rows, without a header."""
    body = "".join(f"<tr><td>{d.escape(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="gs-table"><tbody>{body}</tbody></table>'


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


def _is_program_module(value: torch.nn.Module) -> bool:
    return isinstance(value, torch.fx.GraphModule)


def _op_of(node: Any) -> str:
    """What a node runs, as the stepper and the picture's tooltips write it."""
    if node.op in ("placeholder", "output"):
        return node.op
    weights = {n.name for n in node.all_input_nodes if n.op in ("get_attr", "placeholder")}
    return _meta.node_call_text(node, "full", weights)


def _error_fields(error: BaseException) -> dict[str, str]:
    text = str(error).strip() or type(error).__name__
    first, _, rest = text.partition("\n")
    return {
        "type": type(error).__name__,
        "message": first,
        "details": (rest + "\n\n" if rest else "")
        + "".join(traceback.format_exception(type(error), error, error.__traceback__)),
    }


def _errors_cells(values_compared: bool, max_abs: float, max_rel: float) -> str:
    """The max abs and max rel cells of a compare row; on meta, where no values were compared,
    say so instead of printing nan."""
    if not values_compared:
        return '<td class="gs-num gs-muted" colspan="2">no values compared</td>'
    return f'<td class="gs-num">{d.number(max_abs)}</td><td class="gs-num">{d.number(max_rel)}</td>'


def _comparison_html(comparison: Comparison | None) -> str:
    if comparison is None:
        return '<span class="gs-muted">Not compared in this state.</span>'
    first = comparison.first_divergence
    head = (
        d.badge("every swapped call matches", "ok")
        if comparison.ok
        else d.badge(
            f"first divergence: {shown(first, _PANEL_NAME_LIMIT)}" if first else "outputs differ",
            "bad",
        )
    )
    rows = []
    for call in comparison.calls:
        mark = d.badge("ok", "ok") if call.ok else d.badge("differs", "bad")
        rows.append(
            f'<tr data-gs-call="{d.escape(id_text(call.call_name))}" class="gs-row'
            f'{" gs-first" if call.call_name == first else ""}">'
            f"<td>{mark}</td><td><code>{_name(call.call_name)}</code></td>"
            f"<td>{d.escape(call.replacement)}</td>"
            + _errors_cells(call.values_compared, call.max_abs, call.max_rel)
            + f'<td class="gs-num">{d.number(call.input_drift) if call.values_compared else ""}</td>'
            f"<td>{d.escape(call.problem)}</td></tr>"
        )
    outputs = comparison.outputs
    mark = d.badge("ok", "ok") if outputs.ok else d.badge("differs", "bad")
    rows.append(
        f"<tr><td>{mark}</td><td>(outputs)</td><td></td>"
        + _errors_cells(
            outputs.values_compared,
            outputs.max_abs,
            max((leaf.max_rel for leaf in outputs.leaves), default=0.0),
        )
        + "<td></td><td></td></tr>"
    )
    header = "".join(
        f"<th>{h}</th>"
        for h in ("", "call", "replacement", "max abs", "max rel", "input drift", "what differs")
    )
    return (
        f'<div>{head} <span class="gs-muted">click a row to select the call</span></div>'
        f'<table class="gs-table"><thead><tr>{header}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
