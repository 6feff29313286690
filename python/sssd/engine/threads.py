"""The engine's threading contract, enforced.

One thread drives an engine (``step``, ``generate``, ``stream``). Any thread may call ``add_request``
(it never waits: requests go to an inbox the next step takes), ``abort`` and ``result`` (they wait for a
running step to end, at most one step) and ``has_unfinished``. An ``abort`` that waits is applied by the
next step right after its recovery, before admission (it registers first), and its result is kept for it
until it takes it, so a driving thread that steps again at once cannot starve it: locks are not fair.

``engine._lock`` (re-entrant) guards the engine's state and a step holds it from start to end (taken
and given back here). Whether a thread is inside a step is read from its stack (a frame of a step
function), never from a flag: a flag that an interrupt kept from being reset would lie forever. A second
``step()`` while one runs raises RuntimeError; an ``abort`` from inside a step of its own thread (a
callback, a ``stream()`` collected mid-step) is deferred to the start of the next step instead of
changing the batch under the running step.

``KeyboardInterrupt`` is delivered to the main thread between bytecodes, also between the end of a
``with`` block and the lock's release (the block's exit is not protected); the lock then stays held by
that thread. Such levels are given back when that thread starts its next step (a thread cannot hold the
lock legitimately then), so other threads wait at most until then.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

_STEP_CODES: set[Any] = set()  # code objects of the wrapped step functions


def in_step(thread_id: int) -> bool:
    """True when thread ``thread_id`` is running an engine step now (a step frame is on its stack)."""
    if thread_id == threading.get_ident():
        frame = sys._getframe()
    else:
        frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_code in _STEP_CODES:
            return True
        frame = frame.f_back
    return False


def one_step_at_a_time(step: Any) -> Any:
    """``Engine.step`` (and its variants) under the engine's lock: requests added by other threads join
    first (the step applies waiting aborts after its recovery), and a second concurrent step raises.
    The events are handed out by the step's last statement (``Engine._hand_out``); when anything escapes
    after it, the hand-out of the step before is put back first (no call comes before that, so nothing can
    interrupt it), and the step's events come again with the next step."""
    _STEP_CODES.add(step.__code__)

    @functools.wraps(step)
    def run(self: Any, *args: Any) -> list:
        me = threading.get_ident()
        other = self._stepper
        if in_step(me) or (other is not None and other != me and in_step(other)):
            where = "inside a step of this thread" if in_step(me) else "in another thread"
            raise RuntimeError(
                f"Engine.step() is already running {where}: one thread drives an engine (step, generate, "
                "stream); other threads may call add_request(), abort(), result() and has_unfinished()"
            )
        if self._lock._is_owned():  # levels an interrupt left held: no step of this thread runs now
            self._lock._release_save()  # gives back every level (threading.Condition uses it too)
        self._lock.acquire()
        delivered = self._out  # the hand-out of the last step whose events reached their caller
        try:
            self._stepper = me
            self._deliver()
            self._take_inbox()
            events = step(self, *args)
            self._lock.release()
            return events
        except BaseException:
            self._out = delivered  # first: this step's events did not reach the caller
            if self._lock._is_owned():
                self._lock.release()
            raise

    return run
