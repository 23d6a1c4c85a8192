"""The one runner of graphviz's ``dot``, and its cache.

Every laid-out picture (``gs.to_svg``, ``gs.draw``, ``Drawing.save``, the report, the widget,
the command line) is made by :func:`layout`: it finds ``dot`` (or says how to install it), runs
it on DOT text and keeps the last results, so drawing the same picture again (undo, switching
views back) costs no new layout.

A large picture with a stack of open layers (a decoder drawn fully open) is laid out in parts
when its DOT text was made by :meth:`Picture.to_dot <graphsurgeon.render.picture.Picture.to_dot>`
in this process: each distinct layer once, the rest around one placeholder, then drawn as one
picture (:mod:`graphsurgeon.render._stack`): identical layers look alike, and 80 layers take
about the time of a few.

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
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ..errors import MissingDependencyError, RenderError

__all__ = ["layout"]

_LAYOUTS: OrderedDict[str, bytes] = OrderedDict()
_LAYOUTS_LOCK = threading.Lock()
#: How many layouts are kept (the least recently used goes first).
_LAYOUTS_MAX = 64
# DOT text (its digest) -> the Picture that wrote it, while that picture lives
_PICTURES: OrderedDict[str, weakref.ref] = OrderedDict()
_PICTURES_MAX = 64


def _key(dot: str) -> str:
    return hashlib.sha256(dot.encode("utf-8", "surrogatepass")).hexdigest()


def remember(dot: str, picture: Any) -> None:
    """Note that ``picture`` wrote ``dot``: laying ``dot`` out may then lay the picture out in
    parts (a stack of layers). Kept weakly, for the last few pictures."""
    if len(dot) < _STACKED_MIN_TEXT:
        return  # too small to be worth laying out in parts
    key = _key(dot)
    with _LAYOUTS_LOCK:
        _PICTURES[key] = weakref.ref(picture)
        _PICTURES.move_to_end(key)
        while len(_PICTURES) > _PICTURES_MAX:
            _PICTURES.popitem(last=False)


# DOT texts shorter than this are laid out whole (about 600 drawn nodes)
_STACKED_MIN_TEXT = 200_000


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
    """Run graphviz's ``program`` with ``arguments`` on each of ``texts``, at the same time;
    their outputs, in order. Raises RenderError when one fails."""
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


def layout(dot: str, format: str = "svg") -> bytes:
    """``dot`` laid out by graphviz's ``dot`` in ``format`` (``"svg"``, ``"png"``, ``"pdf"``
    ...); results are cached by (format, DOT text).

    Raises :class:`~graphsurgeon.MissingDependencyError` when ``dot`` is not installed, and
    :class:`~graphsurgeon.errors.RenderError` when it fails.
    """
    binary = _binary()
    text_key = _key(dot)
    key = f"{format}\0{text_key}"
    with _LAYOUTS_LOCK:
        cached = _LAYOUTS.get(key)
        if cached is not None:
            _LAYOUTS.move_to_end(key)
            return cached
        picture = _PICTURES.get(text_key)
        picture = picture() if picture is not None else None
    output = None
    if picture is not None:
        from ._stack import stacked  # only for large pictures

        try:
            output = stacked(picture, format, run)
        except (KeyError, IndexError, ValueError):  # parts it could not join up: laid out whole
            output = None
    if output is None:
        result = subprocess.run(
            [binary, f"-T{format}"], input=dot.encode(), capture_output=True, check=False
        )
        if result.returncode != 0:
            message = result.stderr.decode(errors="replace").strip()
            raise RenderError(f"graphviz's dot failed (exit {result.returncode}): {message}")
        output = result.stdout
    with _LAYOUTS_LOCK:
        _LAYOUTS[key] = output
        while len(_LAYOUTS) > _LAYOUTS_MAX:
            _LAYOUTS.popitem(last=False)
    return output
