"""Python's cyclic collector held while the widget answers a click, let go once it has answered.

A swap at 384 layers makes ~130k objects (the new program's nodes, their dicts and tuples).
The collector's young passes walk every object made since the last one, so once the rewrite
turns it on again they walk all of them: a pass of 20 ms, then one of 50 ms over what the first
left, both before the page got its picture (70 of the swap's 460 ms, measured in the kernel
behind a browser). The objects live on, so the walks are owed; :func:`held` only moves them
after the answer: the collector stays off for the click's action and its publishing, and is
turned on again :data:`RELEASE_DELAY` later, on a thread of its own, where an allocation lets
it run its own policy at once (its young passes, a full pass when one is due) while the page
draws what it got.

Actions that follow each other closer than that (a loop of swaps in a cell) keep it off, but
not for longer than :data:`LONGEST_HOLD`: the next one runs the owed passes first, so memory
held by cyclic garbage stays bounded.

An action that runs programs (verify, compare, find culprits, an overlay, find similar) is not
held: it runs them as often as it needs, and what they leave in cycles is the collector's to
free as they go.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator

# Seconds from the end of the last held action to the collector's return. The answer is
# published when the action ends, but the kernel's IOPub thread sends it: a collection started
# at once would hold the interpreter, and the answer with it, until its end.
RELEASE_DELAY = 0.05
# Seconds the collector stays off, at most, through actions that take it over one from another.
LONGEST_HOLD = 1.0
# Seconds from the end of a swap built ahead to the collector's return: a Swap clicked before
# then takes the hold over (its build is ~0.3 s at 384 layers, so the collector is off less than
# LONGEST_HOLD), and the full pass the build brought due (0.5 s at 384 layers, which cannot
# pause) runs after the Swap's answer, not in the Swap.
AHEAD_DELAY = 0.6

_lock = threading.Lock()
_holds = 0  # held actions running (they nest: a page message runs an action)
_turn_on = False  # whether the collector was on when the hold began: the user's choice is kept
_release: threading.Timer | None = None  # the collector's return, while it waits
_off_since = 0.0  # when the hold turned the collector off (time.monotonic)


@contextlib.contextmanager
def held(release_delay: float = RELEASE_DELAY) -> Iterator[None]:
    """The collector off inside, and on again ``release_delay`` seconds after the last hold
    ends (if it was on when the first began). A hold that begins before then takes the
    collector over as it is: it stays off.

    A swap built ahead (``SurgerySession.prepare_swap``) holds it with :data:`AHEAD_DELAY`:
    the passes its objects bring due then run after the Swap that takes it has answered, as
    a swap's own do, not while it is being waited for."""
    global _holds, _turn_on, _release, _off_since
    overdue = False
    with _lock:
        if _release is not None:  # a return waiting: this hold takes it over
            _release.cancel()
            _release = None
            overdue = time.monotonic() - _off_since > LONGEST_HOLD
        elif _holds == 0:
            _turn_on = gc.isenabled()
            gc.disable()
            _off_since = time.monotonic()
        _holds += 1
    if overdue:  # off long enough: the owed passes first (outside the lock: finalizers run)
        gc.enable()
        _run_policy()
        gc.disable()
        with _lock:
            _off_since = time.monotonic()
    try:
        yield
    finally:
        with _lock:
            _holds -= 1
            if _holds == 0 and _turn_on:
                _release = threading.Timer(release_delay, _let_go)
                _release.daemon = True
                _release.start()


def _let_go() -> None:
    """The collector on again, unless a hold began meanwhile (it cancelled this return, which
    may already have been running: then it is no longer the one waiting)."""
    global _release
    with _lock:
        if _release is not threading.current_thread() or _holds:
            return
        _release = None
        gc.enable()
    _run_policy()  # its passes now, on this thread, not in the next click


def _run_policy() -> None:
    """The collector's passes that are due (young ones, a full one when due), chosen by its own
    policy: an allocation of a tracked object is where it decides to run (CPython 3.11 runs
    them in that allocation, 3.12 on this thread's next check of its eval loop)."""
    _ = [None]


def releasing() -> bool:
    """Whether the collector's return waits (tests wait for it)."""
    with _lock:
        return _release is not None
