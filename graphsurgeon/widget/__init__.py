"""The notebook app: :class:`SurgeryWidget` (an anywidget) and the session behind it.

:class:`SurgerySession` is the widget's state and every action it has, in plain Python (no
ipywidgets, no HTML): a coordinator of the Surgery and its edits over one small object per
concern (``_view``, ``_selection``, ``_search``, ``_picker``, ``_regions``, ``_stepping``);
``_panels`` writes what the page shows of that state, and :class:`SurgeryWidget` holds the
traits and the one table of its buttons (``ACTIONS``: one name per action, its method's).
Importing this package needs ``anywidget`` only for :class:`SurgeryWidget` and ``ACTIONS``.
"""

from ._session import LARGE_LAYOUT, OVERLAYS, VIEWS, Candidate, Match, SurgerySession

__all__ = [
    "ACTIONS",
    "LARGE_LAYOUT",
    "OVERLAYS",
    "VIEWS",
    "Candidate",
    "Match",
    "SurgerySession",
    "SurgeryWidget",
]


def __getattr__(name: str):
    if name in ("SurgeryWidget", "ACTIONS"):
        try:
            from . import _widget
        except ImportError as error:
            from ..errors import MissingDependencyError

            raise MissingDependencyError(
                f"SurgeryWidget needs the anywidget package ({error}): pip install anywidget"
            ) from error
        return getattr(_widget, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
