"""Fault injectors shared by the fault tests (tests/engine/test_engine_faults.py,
tests/engine/test_engine_chaos.py) and the soaks (tests/chaos.py, tests/fault_soak.py): a drafter that raises
on demand, a trace function raising KeyboardInterrupt at random lines of the engine, and a loop that
steps an engine to the end through them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import sssd

ENGINE_DIR = str(Path(sssd.__file__).parent / "engine")
HAND_OUT = {"_hand_out", "handed_out"}
METHODS = ("add_request", "extend", "propose", "observe", "remove_request")


class FaultyDrafter:
    """Wraps a drafter; each call of a method in ``methods`` raises with probability ``p`` (or exactly at
    the calls listed in ``at``) while ``armed``."""

    def __init__(self, inner, p=0.0, methods=METHODS, seed=0, at=None):
        self.inner, self.p, self.methods = inner, p, set(methods)
        self.rng = np.random.default_rng(seed)
        self.at = at or {}
        self.calls = dict.fromkeys(METHODS, 0)
        self.raised = 0
        self.armed = True

    def _maybe_fail(self, name):
        self.calls[name] += 1
        if not self.armed or name not in self.methods:
            return
        if self.calls[name] in self.at.get(name, ()) or self.rng.random() < self.p:
            self.raised += 1
            raise RuntimeError(f"injected {name} failure")

    def __getattr__(self, name):
        if name in METHODS:
            fn = getattr(self.inner, name)

            def call(*a, **k):
                self._maybe_fail(name)
                return fn(*a, **k)

            return call
        raise AttributeError(name)


class Interrupter:
    """A trace function raising KeyboardInterrupt at a random line of the engine's own code."""

    def __init__(self, rate, seed):
        self.rate, self.rng, self.fired, self.on = rate, np.random.default_rng(seed), 0, True

    def __call__(self, frame, event, arg):
        # everywhere in the engine but the hand-out of a step's events (see engine._hand_out)
        if not frame.f_code.co_filename.startswith(ENGINE_DIR) or frame.f_code.co_name in HAND_OUT:
            return None
        return self._line

    def _line(self, frame, event, arg):
        if event == "line" and self.on and self.rng.random() < self.rate:
            self.fired += 1
            raise KeyboardInterrupt
        return self._line


def run_to_end(engine, n, max_steps=2000, trace=None, before_step=None, streamed=None):
    """Step until every request finished, swallowing injected KeyboardInterrupts; returns the results.
    ``trace``: the tracing interrupter, set again after each interrupt (Python drops a trace function
    that raised); ``before_step(i)``: called before step i (from 1); ``streamed``: a dict that collects
    each request's tokens from the events."""
    results, interrupts = {}, 0
    for i in range(1, max_steps + 1):
        if not engine.has_unfinished():
            break
        if before_step is not None:
            before_step(i)
        try:
            sys.settrace(trace)  # inside step() only (Python also drops a trace function that raised)
            try:
                events = engine.step()
            finally:
                sys.settrace(None)
            for e in events:
                if streamed is not None:
                    streamed.setdefault(e.request_id, []).extend(e.tokens)
                if e.finished:
                    results[e.request_id] = e.result
        except KeyboardInterrupt:
            interrupts += 1
    for rid in range(n):  # results of requests retired by a repair (their last event was lost)
        if rid not in results:
            res = engine.result(rid)
            if res is not None:
                results[rid] = res
    return results, interrupts
