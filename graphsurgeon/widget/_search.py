"""A SurgeryWidget's search: its text, its matches, the one shown, and what it opens.

What a text matches is the engine's one reading (:func:`graphsurgeon.patterns.search.search`);
:class:`Searcher` keeps the result, goes through it (next, previous, a click on a row), selects
the match shown with the modules around it opened for as long as it is shown, and runs the
same search again in the program an edit made.
"""

from __future__ import annotations

from typing import Any

from ..errors import WidgetError, did_you_mean
from ..patterns.search import Match, prepare, search

__all__ = ["MATCHES", "Searcher"]

#: How many matches a search keeps (lists and marks).
MATCHES = 1_000


class Searcher:
    """The search of a :class:`~graphsurgeon.widget.SurgerySession`.

    State: :attr:`search_text` (``""``: no search), :attr:`matches` and :attr:`match_index`
    (the match shown; -1 without a search).
    """

    def __init__(self, session: Any):
        self.session = session
        self.search_text = ""
        self.matches: list[Match] = []
        self.match_index = -1

    def prepare(self) -> None:
        """Read what a search of the current program looks in (its module and op texts), so
        that the first search costs what later ones do (at 384 layers 45 ms of its 75)."""
        prepare(self.session.surgery)

    def search(self, text: str) -> None:
        r"""Find modules and nodes by name, module type (``LayerNorm``), op (``aten.gelu``),
        initials (``sdpa`` for scaled_dot_product_attention, ``bn`` for BatchNorm2d) or a
        regular expression (``layers\.\d+\.mlp``): every match is listed and marked in
        the picture, and the first is selected, with the modules around it opened (an exact
        name comes first). :meth:`next_match` and :meth:`previous_match` go through them."""
        text = (text or "").strip()
        if not text:
            raise WidgetError("search: type a name, a module type, an op or a regex")
        matches = self._find(text)
        if not matches:
            # the last search's matches, marks and count go: they would read as this one's
            self.close_search()
            session = self.session
            names = dict.fromkeys([*session.tree.keys(), *session.partitions])
            raise WidgetError(
                f"search: no module or node matches {text!r} (by name, type such as LayerNorm, "
                f"op such as aten.gelu, initials such as sdpa, or regex).{did_you_mean(text, names)}"
            )
        self.search_text, self.matches, self.match_index = text, matches, 0
        self.session.touch("search")
        self._show_match(early=True)

    def _find(self, text: str) -> list[Match]:
        return search(self.session.surgery, text, limit=MATCHES)

    def next_match(self) -> None:
        """Select the next match of the search (after the last: the first)."""
        self._step(1)

    def previous_match(self) -> None:
        """Select the previous match of the search (before the first: the last)."""
        self._step(-1)

    def go_to_match(self, index: int) -> None:
        """Select match ``index`` of the search (a click on its row)."""
        if not self.matches:
            raise WidgetError("search: nothing found yet; type a search first")
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(self.matches)
        ):
            raise WidgetError(f"search: no match {index!r} (there are {len(self.matches)})")
        self.match_index = index
        self.session.touch("search")
        self._show_match()

    def _step(self, by: int) -> None:
        if not self.matches:
            raise WidgetError("search: nothing found yet; type a search first")
        self.match_index = (self.match_index + by) % len(self.matches)
        self.session.touch("search")
        self._show_match()

    def close_search(self) -> None:
        """Forget the search: its marks go, and what it opened closes."""
        self.search_text, self.matches, self.match_index = "", [], -1
        session = self.session
        session.touch("search")
        if session.viewer.revealed_by("search"):
            session.viewer.reveal("search", ())
        else:
            session.selection.mark()

    def _show_match(self, early: bool = False) -> None:
        """Select the match shown, with what hides it opened, and scroll to it. ``early`` (a
        new search): when that opens modules, the matches are first listed and marked in the
        picture shown, and the page shows them while the new picture is laid out (a layout of
        a large program takes several times what finding and marking the matches takes)."""
        session = self.session
        viewer = session.viewer
        match = self.matches[self.match_index]
        if match.kind == "module":
            wanted = {a for c in session.viewer.calls_of(match.name) for a in viewer.ancestors(c)}
        else:
            wanted = set(viewer.chain_of_node(match.name)[-1:])
        if early and wanted != viewer.revealed_by("search"):
            session.selection.mark()
            session.show_early(f"opening {match.name}…")
        viewer.reveal("search", wanted)
        session.selection.select(match.name)
        element = viewer.scene.node_element(match.name) if match.kind == "node" else None
        if element is not None and element.kind == "ops":  # its module's own ops: open them
            viewer.reveal("search", wanted | {element.id})
        session.selection.scroll_into_view()

    def after_change(self) -> None:
        """The same search in the program an edit made (the match shown kept, or the last);
        a search that no longer finds anything is closed, without a new picture."""
        if not self.search_text:
            return
        self.matches = self._find(self.search_text)
        self.match_index = min(self.match_index, len(self.matches) - 1)
        if not self.matches:
            self.search_text = ""
            self.session.viewer.reveal("search", (), render=False)
