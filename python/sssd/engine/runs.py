"""The run-to-completion and streaming fronts of the engine (``generate``, ``stream``) over ``step()``.

Both own their requests: when they stop early (an exception, ``KeyboardInterrupt``, a closed iterator)
the unfinished ones are aborted, so nothing is left running; their results go to the caller and are not
kept in the engine. A request of theirs aborted by another caller (another thread) ends them too: it is
reported with ``finish_reason="abort"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from sssd.engine.requests import GenerationResult, StreamEvent
from sssd.engine.sampling import SamplingParams, as_params


class RunsMixin:
    """``generate`` and ``stream`` of ``sssd.engine.engine.Engine`` (which provides ``step``,
    ``add_request``, ``abort`` and the ``_watch`` / ``_finished`` / ``_results`` stores)."""

    def _add_all(
        self, prompts: Any, params: SamplingParams | None, budget: int | None, kw: dict
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
                rids.append(self.add_request(p, own, budget=budget))
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
        rids = self._add_all(prompts, params, budget, kw)
        mine = set(rids)
        results: dict[int, GenerationResult] = {}
        self._watch.update(dict.fromkeys(rids))
        try:
            while len(results) < len(rids):
                for e in self.step():
                    if e.finished and e.request_id in mine:
                        results[e.request_id] = e.result
                results.update(self._aborted_elsewhere(mine.difference(results)))
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
        requests, so they stop using the batch."""
        rids = self._add_all(prompts, params, budget, kw)
        pending = set(rids)
        self._watch.update(dict.fromkeys(rids))
        try:
            while pending:
                for e in self.step():
                    if e.request_id not in pending:
                        continue
                    if e.finished:
                        pending.discard(e.request_id)
                    if e.tokens or e.finished:
                        yield e
                for rid, res in self._aborted_elsewhere(pending).items():
                    pending.discard(rid)
                    yield StreamEvent(rid, [], "", True, "abort", res)
        finally:  # the consumer stopped early (closed, broke out, was collected) or a step raised
            for rid in pending:
                self._abort_quietly(rid)
            self._unwatch(rids)

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
            self._results.pop(rid, None)

    def _abort_quietly(self, rid: int) -> None:
        try:
            self.abort(rid)
        except KeyError:
            pass
