"""The one runner of graphviz's ``dot``, and its cache.

Every laid-out picture (``gs.to_svg``, ``gs.draw``, ``Drawing.save``, the report, the widget,
the command line) is made by :func:`layout`: it finds ``dot`` (or says how to install it), runs
it on DOT text and keeps the last results, so drawing the same picture again (undo, switching
views back) costs no new layout.

Example:
    >>> from graphsurgeon.render.graphviz import layout
    >>> svg = layout('digraph { "a" -> "b" }').decode()
    >>> svg.rstrip().endswith("</svg>")
    True
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import threading
from collections import OrderedDict

from ..errors import MissingDependencyError, RenderError

__all__ = ["layout"]

_LAYOUTS: OrderedDict[str, bytes] = OrderedDict()
_LAYOUTS_LOCK = threading.Lock()
#: How many layouts are kept (the least recently used goes first).
_LAYOUTS_MAX = 64


def layout(dot: str, format: str = "svg") -> bytes:
    """``dot`` laid out by graphviz's ``dot`` in ``format`` (``"svg"``, ``"png"``, ``"pdf"``
    ...); results are cached by (format, DOT text).

    Raises :class:`~graphsurgeon.MissingDependencyError` when ``dot`` is not installed, and
    :class:`~graphsurgeon.errors.RenderError` when it fails.
    """
    binary = shutil.which("dot")
    if binary is None:
        raise MissingDependencyError(
            "drawing needs graphviz's `dot` program, which is not on PATH. Install graphviz: "
            "`apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS) or "
            "`conda install graphviz`; to_dot() works without it."
        )
    key = hashlib.sha256(f"{format}\0{dot}".encode()).hexdigest()
    with _LAYOUTS_LOCK:
        cached = _LAYOUTS.get(key)
        if cached is not None:
            _LAYOUTS.move_to_end(key)
            return cached
    result = subprocess.run(
        [binary, f"-T{format}"], input=dot.encode(), capture_output=True, check=False
    )
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip()
        raise RenderError(f"graphviz's dot failed (exit {result.returncode}): {message}")
    with _LAYOUTS_LOCK:
        _LAYOUTS[key] = result.stdout
        while len(_LAYOUTS) > _LAYOUTS_MAX:
            _LAYOUTS.popitem(last=False)
    return result.stdout
