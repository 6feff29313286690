"""The engine's threading contract, enforced.

One thread drives an engine (``step``, ``generate``, ``stream``). Any thread may call ``add_request``
(it never waits: requests go to an inbox the next step takes), ``abort`` and ``result`` (they wait for a
running step to end, at most one step) and ``has_unfinished``. Two locks implement it:

- ``engine._lock`` (re-entrant) guards the engine's state; a step holds it from start to end;
- ``engine._stepping`` is held by the running step only. Holding ``_lock`` while ``_stepping`` is locked
  therefore means being inside one's own step (a callback, a ``stream()`` collected mid-step), where an
  abort is deferred to the start of the next step instead of changing the batch under the running step.
"""

from __future__ import annotations

import functools
from typing import Any


def one_step_at_a_time(step: Any) -> Any:
    """``Engine.step`` under the engine's lock: requests added by other threads join first, aborts made
    from inside the previous step are applied, and a second concurrent ``step()`` raises. Both locks are
    taken by ``with`` statements, so an interrupt (``KeyboardInterrupt``) anywhere cannot leave them held."""

    @functools.wraps(step)
    def run(self: Any) -> list:
        if self._stepping.locked():
            where = "inside a step of this thread" if lock_free(self._lock) else "in another thread"
            raise RuntimeError(
                f"Engine.step() is already running {where}: one thread drives an engine (step, generate, "
                "stream); other threads may call add_request(), abort(), result() and has_unfinished()"
            )
        with self._lock, self._stepping:
            self._take_inbox()
            self._apply_deferred_aborts()
            return step(self)

    return run


def lock_free(lock: Any) -> bool:
    """True when this thread can take ``lock`` now (taken and given back on one line: no interrupt
    between)."""
    return lock.acquire(blocking=False) and (lock.release() or True)
