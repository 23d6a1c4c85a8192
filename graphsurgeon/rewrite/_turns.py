"""Who goes first when a rewrite runs in the background (:func:`graphsurgeon.rewrite.warm_up`).

A warm-up builds a program on a thread of its own while its user looks at the widget. It must
never make a click wait: Python runs one thread at a time, so a warm-up working while the
widget answers a click would take half of that click's time. So the warm-up stops at
:func:`pause_point` (every few hundred nodes it copies, every part it writes) while an
:func:`interactive` action runs, and goes on when it ends, unless the action is itself waiting
for a rewrite (:func:`waiting_for_rewrite`): that one needs the warm-up finished, so it goes on
at once. In any other thread, :func:`pause_point` costs one attribute read.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_condition = threading.Condition()
_busy = 0  # interactive actions running (they nest: a page message runs an action)
_waiting = 0  # rewrites waiting for the one a warm-up is making
_local = threading.local()


def in_warm_up() -> bool:
    """Whether this thread is a warm-up's."""
    return getattr(_local, "warming", False)


@contextlib.contextmanager
def warming() -> Iterator[None]:
    """This thread is a warm-up's while inside (its pause points pause)."""
    _local.warming = True
    try:
        yield
    finally:
        _local.warming = False


@contextlib.contextmanager
def interactive() -> Iterator[None]:
    """An action someone waits for (a widget's click) runs inside: warm-ups pause meanwhile."""
    global _busy
    with _condition:
        _busy += 1
    try:
        yield
    finally:
        with _condition:
            _busy -= 1
            _condition.notify_all()


@contextlib.contextmanager
def waiting_for_rewrite() -> Iterator[None]:
    """A rewrite outside a warm-up waits inside for its turn: a paused warm-up goes on, as
    the rewrite needs it finished."""
    global _waiting
    if in_warm_up():
        yield
        return
    with _condition:
        _waiting += 1
        _condition.notify_all()
    try:
        yield
    finally:
        with _condition:
            _waiting -= 1


def idle() -> bool:
    """Whether no interactive action runs and no rewrite waits."""
    with _condition:
        return not _busy and not _waiting


def pause_point() -> None:
    """In a warm-up's thread: wait while an interactive action runs that does not wait for a
    rewrite. Anywhere else: nothing."""
    if not getattr(_local, "warming", False):
        return
    with _condition:
        while _busy and not _waiting:
            _condition.wait()
