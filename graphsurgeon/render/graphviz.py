"""The one runner of graphviz's ``dot``, and its cache.

Every laid-out picture (``gs.to_svg``, ``gs.draw``, ``Drawing.save``, the report, the widget,
the command line) is made here: :func:`run` finds a graphviz program (or says how to install
it) and runs it; :func:`layout` is ``dot``'s layout of a DOT text, pure (the same text gives
the same layout, whatever was drawn before) and cached by the text, so drawing the same picture
again (undo, switching views back) costs no new layout. A picture with a stack of many open
layers is laid out a layer at a time by :func:`graphsurgeon.render._stack.layout`, from the
picture itself, and kept in the same cache (:func:`cached`) under its own key.

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
from collections.abc import Callable, Sequence

from ..errors import MissingDependencyError, RenderError

__all__ = ["cached", "layout", "run"]

_LAYOUTS: OrderedDict[str, bytes] = OrderedDict()
_LAYOUTS_LOCK = threading.Lock()
#: How many layouts are kept (the least recently used goes first).
_LAYOUTS_MAX = 64


def _binary(name: str = "dot") -> str:
    binary = shutil.which(name)
    if binary is None:
        raise MissingDependencyError(
            "drawing needs graphviz's `dot` program, which is not on PATH. Install graphviz: "
            "`apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS) or "
            "`conda install graphviz`; to_dot() works without it."
        )
    return binary


def run(texts: Sequence[str], arguments: Sequence[str], program: str = "dot") -> list[bytes]:
    """Run graphviz's ``program`` with ``arguments`` on each of ``texts``, at the same time.

    Args:
        texts: the DOT texts, one process each.
        arguments: the command line arguments of each process (``["-Tsvg"]``).
        program: which graphviz program runs them (``"dot"``, ``"neato"``...).

    Returns:
        Each process's output, in the order of ``texts``.

    Raises:
        MissingDependencyError: ``program`` is not installed.
        RenderError: one of the processes fails (its exit status and message).
    """
    binary = _binary(program)
    processes = [
        subprocess.Popen(
            [binary, *arguments],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in texts
    ]
    results = []
    for process, text in zip(processes, texts):
        out, err = process.communicate(text.encode())
        if process.returncode != 0:
            message = err.decode(errors="replace").strip()
            raise RenderError(f"graphviz's {program} failed (exit {process.returncode}): {message}")
        results.append(out)
    return results


def cached(how: str, format: str, dot: str, make: Callable[[], bytes]) -> bytes:
    """The layout ``make()`` gives of the picture whose DOT text is ``dot``, made once, then
    kept (the last :data:`_LAYOUTS_MAX` layouts).

    Args:
        how: how it is laid out (``"dot"``: :func:`layout`; a stack a layer at a time has its
            own), part of the key.
        format: the output format (``"svg"``...), part of the key.
        dot: the picture's DOT text, part of the key (by its hash).
        make: lays the picture out, when it is not kept yet.

    Returns:
        The layout, as ``make()`` gave it.

    Raises:
        MissingDependencyError: ``dot`` is not installed (whether the layout is kept or not:
            a picture does not lay out on one machine only because it did before).
    """
    _binary()
    key = f"{how}\0{format}\0{hashlib.sha256(dot.encode('utf-8', 'surrogatepass')).hexdigest()}"
    with _LAYOUTS_LOCK:
        found = _LAYOUTS.get(key)
        if found is not None:
            _LAYOUTS.move_to_end(key)
            return found
    output = make()
    with _LAYOUTS_LOCK:
        _LAYOUTS[key] = output
        while len(_LAYOUTS) > _LAYOUTS_MAX:
            _LAYOUTS.popitem(last=False)
    return output


def layout(dot: str, format: str = "svg") -> bytes:
    """``dot`` laid out whole by graphviz's ``dot``, cached by (format, DOT text).

    Args:
        dot: the DOT text (:func:`graphsurgeon.to_dot`'s).
        format: ``"svg"``, ``"png"``, ``"pdf"``, or another format ``dot -T`` knows.

    Returns:
        The laid-out picture, as ``dot`` writes it.

    Raises:
        MissingDependencyError: ``dot`` is not installed.
        RenderError: ``dot`` fails on the text.
    """

    def make() -> bytes:
        result = subprocess.run(
            [_binary(), f"-T{format}"], input=dot.encode(), capture_output=True, check=False
        )
        if result.returncode != 0:
            message = result.stderr.decode(errors="replace").strip()
            raise RenderError(f"graphviz's dot failed (exit {result.returncode}): {message}")
        return result.stdout

    return cached("dot", format, dot, make)
