"""The run-to-completion and streaming fronts of the engine (``generate``, ``stream``) over its steps.

Several runs on one engine: each ``generate()`` / ``stream()`` owns its requests and receives exactly their
events; whichever run (or ``step()`` caller) makes a step, the events of other owners' requests stay in
those requests (their new tokens and text) until their owner steps next, and it gets them all then. So two
``stream()`` iterators advanced alternately, or a ``generate()`` called inside a ``stream()`` loop, each get
all of their own tokens and text and none of the others'; ``step()`` returns only the events of requests
added with ``add_request``. A run steps only while one of its requests is unfinished, and every step
advances them, so it never loops without work.

Both own their requests: when they stop early (an exception, ``KeyboardInterrupt``, a closed iterator)
the unfinished ones are aborted, so nothing is left running; their results go to the caller and are not
kept in the engine. A request of theirs aborted by another caller (another thread) ends them too: it is
reported with ``finish_reason="abort"``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from sssd.engine.requests import GenerationResult, StreamEvent
from sssd.engine.sampling import SamplingParams, as_params

_RUNS = itertools.count(1)  # owner ids of runs (next() is atomic)


class RunsMixin:
    """``generate`` and ``stream`` of ``sssd.engine.engine.Engine`` (which provides ``_step_for``,
    ``_queue``, ``abort`` and the ``_watch`` / ``_finished`` / ``_results`` stores)."""

    def _add_all(
        self, prompts: Any, params: SamplingParams | None, budget: int | None, kw: dict, owner: int
    ) -> list[int]:
        if isinstance(prompts, (str, np.ndarray)) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], (int, np.integer, Mapping))
        ):  # one prompt: text, token ids or one conversation (a list of message dicts)
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise ValueError("no prompts")
        params = as_params(params, kw)
        rids: list[int] = []
        try:
            for i, p in enumerate(prompts):
                own = params
                if params.seed is not None:  # distinct, reproducible streams per prompt
                    own = as_params(params, {"seed": params.seed + i})
                rids.append(self._queue(p, own, budget, owner))
        except BaseException:  # a bad prompt among them: none of them runs
            for rid in rids:
                self._abort_quietly(rid)
            raise
        return rids

    def generate(
        self, prompts: Any, params: SamplingParams | None = None, *, budget: int | None = None, **kw: Any
    ) -> list[GenerationResult]:
        """Generate for every prompt (run to completion); results in prompt order. ``kw``: SamplingParams
        fields (max_new_tokens, temperature, top_k, top_p, seed, stop, eos_token_ids). With a seed, prompt
        ``i`` samples with ``seed + i``. If a step raises (or ``KeyboardInterrupt``), its unfinished
        requests are aborted before the exception propagates: nothing is left running."""
        owner = next(_RUNS)
        rids = self._add_all(prompts, params, budget, kw, owner)
        results: dict[int, GenerationResult] = {}
        self._watch.update(dict.fromkeys(rids))
        try:
            pending = set(rids)
            while pending:
                for e in self._run_step(owner, pending):
                    if e.finished:
                        results[e.request_id] = e.result
                        pending.discard(e.request_id)
        except BaseException:
            for rid in rids:
                if rid not in results:
                    self._abort_quietly(rid)
            raise
        finally:
            self._unwatch(rids)
        return [results[r] for r in rids]

    def stream(
        self, prompts: Any, params: SamplingParams | None = None, *, budget: int | None = None, **kw: Any
    ) -> Iterator[StreamEvent]:
        """Like ``generate`` but yields a StreamEvent (with its text delta) whenever tokens are accepted.
        Closing the iterator early (``break``, ``.close()``, garbage collection) aborts its unfinished
        requests, so they stop using the batch. Its events are its own requests' only (see the module
        docstring): other runs and ``step()`` may be used between its events."""
        owner = next(_RUNS)
        rids = self._add_all(prompts, params, budget, kw, owner)
        pending = set(rids)
        self._watch.update(dict.fromkeys(rids))
        try:
            while pending:
                for e in self._run_step(owner, pending):
                    if e.finished:
                        pending.discard(e.request_id)
                    yield e
        finally:  # the consumer stopped early (closed, broke out, was collected) or a step raised
            for rid in pending:
                self._abort_quietly(rid)
            self._unwatch(rids)

    def _run_step(self, owner: int, pending: set[int]) -> list[StreamEvent]:
        """One step for run ``owner``: the events of its ``pending`` requests with tokens or a finish, and
        a final abort event for each that another caller aborted (it sends none of its own)."""
        events = [e for e in self._step_for(owner) if e.tokens or e.finished]
        for rid, res in self._aborted_elsewhere(pending).items():
            events.append(StreamEvent(rid, [], "", True, "abort", res))
        if not events and not any(self._knows(rid) for rid in pending):
            raise RuntimeError(  # an invariant: never step forever for requests the engine lost
                f"requests {sorted(pending)} of this run are no longer queued or running in the engine"
            )
        return events

    def _knows(self, rid: int) -> bool:
        """Whether request ``rid`` is queued, running or has a final event not handed out."""
        return any(r.rid == rid for r in (*self._inbox, *self._waiting, *self._active, *self._unreported))

    def _aborted_elsewhere(self, rids: set[int]) -> dict[int, GenerationResult]:
        """The results of ``rids`` that another caller aborted (they send no final event)."""
        hit = self._watch_aborted  # rids of _watch that have an abort result: usually none
        return {r: self._watch[r] for r in list(hit) if r in rids} if hit else {}

    def _unwatch(self, rids: list[int]) -> None:
        """Forget ``rids`` (their results went to the caller of generate / stream)."""
        for rid in rids:
            self._watch.pop(rid, None)
            self._watch_aborted.discard(rid)
            self._finished.pop(rid, None)
            self._aborts.pop(rid, None)
            self._results.pop(rid, None)

    def _abort_quietly(self, rid: int) -> None:
        try:
            self.abort(rid)
        except KeyError:
            pass
