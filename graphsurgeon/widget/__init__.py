"""The notebook app: :class:`SurgeryWidget` (an anywidget) and its view model.

:class:`SurgeryModel` is every action of the widget in plain Python (no ipywidgets); the
widget copies its fields into traits and routes the page's events to it. Importing this
package needs ``anywidget`` only for :class:`SurgeryWidget`.
"""

from ._model import VIEWS, Candidate, SurgeryModel

__all__ = ["VIEWS", "Candidate", "SurgeryModel", "SurgeryWidget"]


def __getattr__(name: str):
    if name == "SurgeryWidget":
        try:
            from ._widget import SurgeryWidget
        except ImportError as error:
            from ..errors import MissingDependencyError

            raise MissingDependencyError(
                f"SurgeryWidget needs the anywidget package ({error}): pip install anywidget"
            ) from error
        return SurgeryWidget
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
