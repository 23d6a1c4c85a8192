"""What is selected in a SurgeryWidget, and what the picture marks.

:class:`Selection` owns the selection (a module or call, and an fx node when a node was picked)
and the marks of the picture: the selection, its producers and consumers, the search's
matches, the culprits, the region and what is similar to it. A click, a name typed or sent by
the page, and a search all select through :meth:`Selection.select`, the one place the
selection changes; the panels read what the selection is (its node, its module, how it is
called, where it comes from) here. What a click on each element of the picture would mark
(:meth:`Selection.click_marks`) is read from the same rule, and shipped with the picture: the
page marks a click at once, and the kernel's marks confirm it.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .. import _meta, display
from .._derived import cached
from ..errors import UnknownModuleError, UnknownNameError, WidgetError, unknown_name
from ..partition import ModuleInfo, ProgramIndex, program_index
from ..rewrite import swap_info
from ._view import packed

__all__ = ["Selection"]


class Selection:
    """The selection of a :class:`~graphsurgeon.widget.SurgerySession` and the marks of its
    picture.

    State: :attr:`selected` (a call or module name), :attr:`selected_node` (an fx node;
    ``"call/node"`` inside a swapped call), :attr:`marks` (element ids by what they mark) and
    :attr:`scroll` (bumped: scroll the selection into view).
    """

    def __init__(self, session: Any):
        self.session = session
        self.selected: str | None = None
        self.selected_node: str | None = None
        self.marks: dict[str, Any] = {}
        self.scroll = 0
        self._elements: list[str] = []  # the elements a click selected
        # each picture's click_marks, kept with its Scene (the view keeps the scenes)
        self._click_marks: weakref.WeakKeyDictionary[Any, dict[str, Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._packed_click_marks: weakref.WeakKeyDictionary[Any, tuple[str, bytes]] = (
            weakref.WeakKeyDictionary()
        )
        # the last search's marks: (scene, matches, program index, their ids)
        self._match_ids: tuple[Any, list, Any, list[str]] | None = None

    def target(self, name: str | None, verb: str) -> str:
        """The module an action works on: ``name``, else the selection."""
        name = name if name is not None else self.selected
        if name is None:
            raise WidgetError(f"{verb}: select a module first (click it, or w.select(name))")
        return name

    # -- selecting --------------------------------------------------------------------------

    def click(self, element_id: str) -> None:
        """Select what a click in the picture hit: a cluster or box selects its module call,
        a node selects that node (and the call it belongs to)."""
        self._selection_is(*self._click_target(element_id))

    def _click_target(
        self, element_id: str, chain_of_node: Callable[[str], tuple[str, ...]] | None = None
    ) -> tuple[str | None, str | None, list[str]]:
        """What a click on ``element_id`` selects: (call or module, fx node, the elements
        clicked), as :meth:`_selection_is` takes them (``chain_of_node``: the view's, read
        once for many clicks)."""
        picture = self.session.viewer.scene.picture
        if element_id not in picture:
            raise WidgetError(f"the picture has no element {element_id!r}")
        element = picture[element_id]
        call = getattr(element, "call", None)
        calls = getattr(element, "calls", ())
        if call:
            return call, None, [element_id]
        if calls:
            return calls[0], None, [element_id]
        node = getattr(element, "node", None)
        if node:
            chain = (chain_of_node or self.session.viewer.chain_of_node)(node)
            return chain[-1] if chain else None, node, [element_id]
        raise WidgetError(f"{element_id!r} is not a module or a node")

    def click_inside(self, element_id: str) -> None:
        """Select a node of the swapped call's picture the stepper is inside: it is then
        ``"call/node"``, which run to selection and the breakpoint button reach."""
        stepping = self.session.stepping
        inside = stepping.inside
        frames = stepping.stepper.frames if stepping.stepper is not None else ()
        if inside is None or not frames:
            raise WidgetError("no call is entered: step into a swapped call first")
        picture = inside.picture
        if element_id not in picture:
            raise WidgetError(f"the call's picture has no element {element_id!r}")
        node = getattr(picture[element_id], "node", None)
        if not node:
            raise WidgetError(f"{element_id!r} is not a node of the call")
        self._selection_is(frames[0], f"{frames[0]}/{node}", [])

    def select(self, name: str | None) -> None:
        """Select a module or call (``"layers.1"``, ``"shared@1"``), an fx node (of the
        current program, or one a swap removed), ``"call/node"`` (a node inside a swapped
        call, as the stepper names it), or nothing (None). A module inside a collapsed box
        stays in its box; a search opens it. Selecting another module clears the replacement
        chosen for the previous one. A name the program does not have raises, and the
        selection stays what it was."""
        if name is None or name == "":
            self._selection_is(None, None, [])
            return
        if not isinstance(name, str):
            raise WidgetError(f"select: expected a module or node name, got {name!r}")
        session = self.session
        tree = session.tree
        if name in tree or session.viewer.calls_of(name):
            if name not in tree:  # a call: as every view names it ("blk@0" is "blk")
                name = program_index(session.surgery.program).resolve(name).name
            self._selection_is(name, None, [])
        elif name in self._node_names():
            self._select_node(name)
        elif name in session.viewer.call_nodes():  # a region made one call: drawn as one node
            self._selection_is(name, None, self.call_elements(name))
        elif session.viewer.inner_call(name) is not None:
            self._selection_is(session.viewer.inner_call(name), name, [])
        else:
            choices = dict.fromkeys([*tree.keys(), *session.partitions])
            raise UnknownNameError(unknown_name(name, choices, kind="module or node"))

    def _select_node(self, node: str) -> None:
        chain = self.session.viewer.chain_of_node(node)
        self._selection_is(chain[-1] if chain else None, node, [])

    def _selection_is(self, name: str | None, node: str | None, elements: list[str]) -> None:
        """The one place the selection changes: a replacement chosen for another module is
        dropped, then the selection, the picker and the preview change together."""
        self.selected, self.selected_node = name, node
        self._elements = elements
        self.session.picker.keep_for(name)
        self.session.touch("selection", "choice")
        self.mark()

    def scroll_into_view(self) -> None:
        """Ask the page to scroll the selection into view."""
        self.scroll += 1
        self.session.touch("scroll")

    # -- what a name is ---------------------------------------------------------------------

    def _node_names(self) -> dict[str, None]:
        """The fx nodes a selection can name: the program drawn's, then those only the
        original has (a swap removed them; the before/after pictures draw them)."""
        surgery = self.session.surgery
        drawn = self.session.viewer.drawn_program()

        def read() -> dict[str, None]:  # names only: kept with the program drawn
            names = {n.name: None for n in drawn.graph.nodes}
            if surgery.replacements:
                names.update((n.name, None) for n in surgery.program.graph.nodes)
            return names

        return cached(drawn, "widget: node names", read)

    def node(self, name: str) -> torch.fx.Node | None:
        """The fx node ``name``: of the program drawn, else of the original program (a node a
        swap removed), else of the swapped call the stepper is inside (``"call/node"``)."""
        session = self.session
        for graph in (session.viewer.drawn_program().graph, session.surgery.program.graph):
            for node in graph.nodes:
                if node.name == name:
                    return node
        call = session.viewer.inner_call(name)
        stepper = session.stepping.stepper
        if call is not None and stepper is not None and stepper.frames[:1] == (call,):
            inner = name[len(call) + 1 :]
            for node in stepper.call_graph.graph.nodes:
                if node.name == inner:
                    return node
        return None

    def removed_by(self, node: str) -> str | None:
        """The swapped call that removed fx node ``node`` of the original program, or None."""
        session = self.session
        info = swap_info(session.surgery.module) if session.viewer.can_diff else None
        if info is None:
            return None
        for call, part in info.partitions.items():
            if node in part.nodes and call not in info.fused:
                return call
        return None

    def module_info(self, name: str) -> ModuleInfo | None:
        """The module tree's row of the module that ``name`` (a module or a call) names."""
        return self.session.tree.get(_meta.split_call_name(name)[0])

    def call_text(self, call: str, replacement: torch.nn.Module | None = None) -> str:
        """How the program makes ``call``: ``(x: f32[1, 16, 64]) → f32[1, 16, 64]``, the
        arguments named as ``replacement``'s forward names them (default: the original's);
        '' when the call's signature was not preserved."""
        session = self.session
        if session.partitions[call].signature is None:
            return ""
        index = program_index(session.surgery.program)
        return index.call_text(call, module=replacement, wrap=48)

    def source_of(self, call: str) -> str:
        """Where the first op of ``call`` comes from (``model.py:12``), or ''."""
        session = self.session
        by_name = program_index(session.surgery.program).by_name
        for name in session.partitions[call].nodes:
            node = by_name.get(name)
            if node is not None and node.op == "call_function":
                text = _meta.source_text(node)
                if text:
                    return text
        return ""

    # -- marks ------------------------------------------------------------------------------

    def mark(self) -> None:
        """Mark in the picture shown: the selection, its producers and consumers, the
        search's matches, the culprits, the region and what is similar to it."""
        session = self.session
        scene = session.viewer.scene
        ids = self._ids_selected(self.selected, self.selected_node, self._elements)
        split = _meta.split_call_name
        matches = session.searcher.matches
        index = program_index(session.surgery.program)  # read once for every match
        culprits = session.bisection.culprits if session.bisection is not None else ()
        culprit_ids = [e for c in culprits for e in (self.ids_of(c) or self.call_elements(c))]
        regions = session.regions
        similar = regions.similar
        self.marks = {
            "selected": ids,
            "focus": self._focus(ids),
            **scene.flow(ids),
            "module": self._row_of(self.selected),
            "matches": self._ids_of_matches(matches, index),
            "culprits": list(dict.fromkeys(culprit_ids)),
            "culprit_modules": [display.id_text(split(c)[0]) for c in culprits],
            "match_modules": [display.id_text(m.name) for m in matches if m.kind == "module"],
            "region": self._node_ids(regions.region),
            "similar": self._node_ids(
                n for m in (similar.matches if similar else ()) for n in m.nodes
            ),
            "near": self._node_ids(
                n for m in (similar.near_misses if similar else ()) for n in m.nodes
            ),
        }
        session.touch("marks")

    def _ids_of_matches(self, matches: list, index: ProgramIndex) -> list[str]:
        """The ids drawing a search's matches (up to a thousand), worked out once per picture:
        a search marks the picture shown, then the one it opens, then selects its first match,
        and the selection changes nothing of where the matches are drawn."""
        scene = self.session.viewer.scene
        kept = self._match_ids
        if kept is not None and kept[0] is scene and kept[1] is matches and kept[2] is index:
            return kept[3]
        ids = list(dict.fromkeys(e for m in matches for e in self.ids_of(m.name, index)))
        self._match_ids = (scene, matches, index, ids)
        return ids

    def _focus(self, ids: list[str]) -> str | None:
        """The element that shows the selection best, which the page brings into view when
        asked to (``scroll``): the node a swapped or fused module is now called by, else the
        first element marked. In the before/after picture a swapped module's cluster holds the
        nodes it replaced too, often wider than the view, where its top left corner (its
        label) would show and the new call be cut at the edge."""
        name = self.selected
        if name is not None and self.selected_node is None and self.session.viewer.call_nodes():
            module = _meta.split_call_name(name)[0]
            for call in self._covered(name):
                if _meta.split_call_name(call)[0] == module:
                    found = self.call_elements(call)
                    if found:
                        return found[0]
        return ids[0] if ids else None

    @staticmethod
    def _row_of(name: str | None) -> str:
        """The tree row marked for selection ``name``, as its ``data-gs-module`` attribute
        carries the module (``""``: none)."""
        return display.id_text(_meta.split_call_name(name)[0]) if name is not None else ""

    def _ids_selected(self, name: str | None, node: str | None, elements: list[str]) -> list[str]:
        """The ids marked as the selection (:meth:`_selection_is`'s arguments): the node's
        element (inside a swapped call: the call), else the elements clicked, else what draws
        the module or call (the box it is collapsed in)."""
        scene = self.session.viewer.scene
        if node is not None:
            call = self.session.viewer.inner_call(node)
            if call is not None and node not in self._node_names():
                return self.ids_of(call)  # inside a call: the call
            element = scene.node_element(node)
            return [element.id] if element is not None else []
        if name is None:
            return []
        ids = [e for e in elements if e in scene.picture]
        return ids or self._calls_drawn(self._covered(name)) or self.call_elements(name)

    def click_marks(self) -> dict[str, Any]:
        """What a click on each element of the picture shown marks, as :meth:`click` and
        :meth:`mark` would: the page marks a click with it at once, before the kernel answers.

        ``{"ids": [...], "modules": [...], "clicks": [[element, selected, producers,
        consumers, edges, module], ...]}``: every element and list of elements as an index in
        ``ids``, the tree row as an index in ``modules`` (its ``data-gs-module``; -1: none).
        Made once per picture (kept with it).
        """
        scene = self.session.viewer.scene
        made = self._click_marks.get(scene)
        if made is not None:
            return made
        ids: dict[str, int] = {}
        modules: dict[str, int] = {}

        def indexes(elements: Iterable[str]) -> list[int]:
            return [ids.setdefault(e, len(ids)) for e in elements]

        clicks = []
        chain_of_node = self.session.viewer.chains_of_nodes()
        picture = scene.picture
        for element in (*picture.nodes, *picture.clusters):  # what a click can hit
            element_id = element.id
            try:
                name, node, elements = self._click_target(element_id, chain_of_node)
            except WidgetError:
                continue  # a side of a split diff: not a module or a node
            selected = self._ids_selected(name, node, elements)
            flow = scene.flow(selected)
            module = self._row_of(name)
            clicks.append(
                [
                    ids.setdefault(element_id, len(ids)),
                    indexes(selected),
                    indexes(flow["producers"]),
                    indexes(flow["consumers"]),
                    indexes(flow["edges"]),
                    modules.setdefault(module, len(modules)) if module else -1,
                ]
            )
        made = {"ids": list(ids), "modules": list(modules), "clicks": clicks}
        self._click_marks[scene] = made
        return made

    def packed_click_marks(self) -> tuple[str, bytes]:
        """:meth:`click_marks` as the page receives them with the picture: ``(key, deflated
        JSON)`` (:func:`._view.packed`; 45 KB of JSON at 384 layers, 11 KB deflated). Made once
        per picture."""
        scene = self.session.viewer.scene
        made = self._packed_click_marks.get(scene)
        if made is None:
            text = json.dumps(self.click_marks(), separators=(",", ":"))
            made = self._packed_click_marks[scene] = packed(text)
        return made

    def _covered(self, name: str, index: ProgramIndex | None = None) -> list[str]:
        """The calls module, call or container ``name`` covers ([]: a name of no module);
        ``index``: the program's index, read already."""
        try:
            index = index or program_index(self.session.surgery.program)
            return list(index.calls_covered(name))
        except UnknownModuleError:
            return []

    def ids_of(self, name: str, index: ProgramIndex | None = None) -> list[str]:
        """The ids drawing a module (a container: the calls it covers), a call or an fx node
        (the box holding it when it is collapsed); [] when the picture does not show it.
        ``index``: the program's index, read already (marking every match of a search)."""
        session = self.session
        scene = session.viewer.scene
        known = name in session.tree or name in session.partitions
        calls = self._covered(name, index) if known else []
        if calls:
            return self._calls_drawn(calls)
        element = scene.node_element(name)
        return [element.id] if element is not None else []

    def _node_ids(self, nodes: Iterable[str]) -> list[str]:
        """The ids drawing fx nodes (a box holding one, once), in order."""
        scene = self.session.viewer.scene
        found = []
        for node in nodes:
            element = scene.node_element(node)
            if element is not None:
                found.append(element.id)
        return list(dict.fromkeys(found))

    def call_elements(self, call: str) -> list[str]:
        """The element drawing swapped or fused ``call`` as one node of the program drawn."""
        node = self.session.viewer.call_node(call)
        element = self.session.viewer.scene.node_element(node) if node is not None else None
        return [element.id] if element is not None else []

    def _calls_drawn(self, calls: list[str]) -> list[str]:
        """The ids drawing ``calls`` (a cluster, a box, a call's one node), else the box they
        are collapsed in (a parent's box, or a run of boxes)."""
        session = self.session
        scene = session.viewer.scene
        found = scene.elements(calls)
        if found:
            return found
        for call in calls:
            part = session.partitions.get(call)
            for node in part.nodes if part is not None else ():
                element = scene.picture.element_of_node(node, scene.prefix)
                if element is not None:
                    return [element.id]
        return []
