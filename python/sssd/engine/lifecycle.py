"""Requests in and out of the engine's batch: queueing (from any thread), admission into cache slots,
results, aborts, freeing a request's slot, retiring finished requests and handing out a step's events.
``Engine`` (``sssd.engine.engine``) runs the steps.

The batch's bookkeeping is written to survive an interrupt at any line (``KeyboardInterrupt`` or an
exception anywhere, tested line by line by tests/interrupt_sweep.py): a request is moved in one statement,
queued until its slot exists, and an abort from inside a step waits for the next one (see
``sssd.engine.threads``). A step's events are handed out by one statement, its last: it stores what they
hold (``HandOut``), which the next step applies to the requests; a step that raises after it puts back the
previous one (``sssd.engine.threads``), so its events come again with the next step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from sssd.checks import check_int
from sssd.engine.recovery import repair_batch
from sssd.engine.requests import GenerationResult, Request, StreamEvent, as_prompt_ids
from sssd.engine.sampling import SamplingParams, as_params
from sssd.engine.threads import in_step
from sssd.policy.interface import AdmitView, StepView


@dataclass(frozen=True)
class HandOut:
    """What a step's returned events held: per request the output tokens and text characters now handed
    out, and the requests whose final event was among them."""

    marks: tuple[tuple[Request, int, int], ...]
    final: frozenset[int]


class RequestsMixin:
    """``add_request``, ``has_unfinished``, ``result``, ``abort`` and admission of
    ``sssd.engine.engine.Engine`` (which owns the queues, the batch, the adapter, the guards and the
    stores of results)."""

    def add_request(
        self,
        prompt: Any,
        params: SamplingParams | None = None,
        *,
        budget: int | None = None,
        **overrides: Any,
    ) -> int:
        """Queue a request (text or token ids); it joins the batch at the next step. Returns its id.
        ``overrides``: SamplingParams fields (max_new_tokens, temperature, top_k, top_p, seed, stop, ...)."""
        return self._queue(prompt, as_params(params, overrides), budget, None)

    def _queue(self, prompt: Any, params: SamplingParams, budget: Any, owner: int | None) -> int:
        """``add_request`` for the requests of ``owner`` (a run of ``sssd.engine.runs``; None: step()'s
        caller), who receives their events."""
        ids = as_prompt_ids(prompt, self.tokenizer, self.vocab_size)
        if len(ids) >= self.adapter.max_positions:
            raise ValueError(
                f"prompt of {len(ids)} tokens does not fit the model's context "
                f"of {self.adapter.max_positions} tokens"
            )
        if budget is not None:
            budget = check_int(budget, "budget", lo=0)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        eos = self.default_eos if params.eos_token_ids is None else params.eos_token_ids
        rid = next(self._ids)
        self._next_id = max(self._next_id, rid + 1)  # ids handed out so far (a hint for messages)
        max_context = self.adapter.max_positions
        req = Request(rid, ids, params, frozenset(eos), budget, max_context, self.tokenizer, owner=owner)
        self._inbox.append(req)  # never waits for a running step: the next one takes it
        return rid

    def has_unfinished(self) -> bool:
        """True while a request is queued or running, or a finished request of ``step()``'s caller (added
        with ``add_request``) has a final event not handed out yet (a step interrupted after finishing it):
        ``while engine.has_unfinished(): engine.step()`` delivers every event. The final events of a
        ``generate()`` / ``stream()``'s requests wait for it, not for ``step()``."""
        if self._inbox or self._waiting or self._active:
            return True
        out = self._out
        return any(r.owner is None and (out is None or r.rid not in out.final) for r in self._unreported)

    def result(self, rid: int) -> GenerationResult | None:
        """The result of a finished request, taken (returned once): held until its final event is handed
        out, then among the ``EngineConfig.kept_results`` most recent; None when unknown or released."""
        with self._lock:
            for store in (self._finished, self._aborts, self._results):
                res = store.pop(rid, None)
                if res is not None:
                    return res
            return None

    def _take_inbox(self) -> None:
        """Move requests added by any thread into the queue, in order. Safe to interrupt: a request that
        was appended but not yet popped is recognized as the queue's last."""
        inbox, waiting = self._inbox, self._waiting
        while inbox:
            req = inbox[0]
            if not (waiting and waiting[-1] is req):
                waiting.append(req)
            inbox.popleft()

    def _admit(self) -> float:
        """Admit waiting requests into free slots (prefill their prompts). Who joins is the policy's
        ``admit(AdmitView)`` when it has one (FIFO otherwise; an empty batch always takes one request).
        Returns the seconds spent, which the running requests waited."""
        free = self.config.max_batch_size - len(self._active)
        if not self._waiting or free <= 0:
            return 0.0
        chosen = self._admission(free)
        t_start = time.perf_counter()
        for req in chosen:
            t0 = time.perf_counter()
            slot = self.adapter.cache.add(req.rid)
            self._active.append(req)
            self._waiting.remove(req)  # only now: an interrupt before this leaves it queued, not lost
            self.adapter.prefill(slot, req.prompt[:-1])  # the last prompt token is the first step's root
            if self._guard is not None:
                self._guard.add(req)
            req.stats.prefill_s = time.perf_counter() - t0
            self.stats.prefill_s += req.stats.prefill_s
        if not chosen:
            return 0.0
        self.adapter.synchronize()  # GPU: the prefills' time, not their launch time
        return time.perf_counter() - t_start

    def _admission(self, free: int) -> list[Request]:
        waiting = list(self._waiting)
        if not self._policy.has("admit"):
            return waiting[:free]
        reqs = self._active
        view = AdmitView(
            [r.rid for r in waiting],
            [len(r.prompt) for r in waiting],
            [r.remaining for r in waiting],
            view_of(reqs),
            free,
        )  # fmt: skip
        by_id = {r.rid: r for r in waiting}
        chosen = [by_id[rid] for rid in dict.fromkeys(self._policy.admit(view))][:free]
        if not chosen and not reqs:
            chosen = waiting[:1]  # an empty batch always makes progress
        return chosen

    # -- the end of a step ---------------------------------------------------------------------------
    def _retire(self, events: list[StreamEvent]) -> list[StreamEvent]:
        """Free the slots of finished requests (highest slot first: the last slot moves into a freed one)."""
        out = list(events)
        for slot in range(len(self._active) - 1, -1, -1):
            req = self._active[slot]
            if not req.finish_reason:
                continue
            res = req.result()
            e = events[slot]
            out[slot] = StreamEvent(req.rid, e.tokens, e.text, True, req.finish_reason, res)
            self._finished[req.rid] = res
            self._unreported.append(req)  # until its final event is handed out
            self._release(slot)
        return out

    def _hand_out(self, reqs: list[Request], events: list[StreamEvent], owner: int | None) -> list:
        """The events of ``owner``'s requests (``reqs[i]``'s event is ``events[i]``), handed out by the
        step's last statement (see the module docstring); the others' tokens and text wait in their
        requests for their owner's step. A finished request's result moves to the bounded store of recent
        results (``EngineConfig.kept_results``) at once: its final event is built from the request."""
        out, marks, final = [], [], []
        for r, e in zip(reqs, events, strict=True):
            if r.owner != owner:
                continue
            out.append(e)
            marks.append((r, r.emitted + len(e.tokens), r.emitted_text + len(e.text)))
            if e.finished:
                final.append(r.rid)
                self._keep_result(r.rid)
        self._out = HandOut(tuple(marks), frozenset(final))
        return out

    def _keep_result(self, rid: int) -> None:
        kept, finished = self._results, self._finished
        res = finished.get(rid)
        if res is not None:  # in both stores for a moment, never in neither
            kept[rid] = res
            del finished[rid]
        while len(kept) > self.config.kept_results:
            kept.popitem(last=False)

    def _deliver(self) -> None:
        """Apply the hand-out of the last step whose events reached their caller (the first thing a step
        does). Applying it twice changes nothing, so a step interrupted here applies it again."""
        out = self._out
        if out is None:
            return
        for req, tokens, chars in out.marks:
            req.handed_out(tokens, chars)
        if out.final:
            self._unreported = [r for r in self._unreported if r.rid not in out.final]
        self._out = None

    def _recover(self) -> tuple[list[StreamEvent], list[Request]]:
        """Bring the batch back to its invariants after something escaped a step (see
        ``sssd.engine.recovery``); on the fast path a few comparisons. Returns the final events of requests
        that an interrupted step finished but did not hand out, and those requests."""
        active = self._active
        if self._waiting and active:  # admitted while still queued (an interrupted admission)
            running = {r.rid for r in active}
            if any(r.rid in running for r in self._waiting):
                self._waiting = deque(r for r in self._waiting if r.rid not in running)
        for req in active:
            req.catch_up()  # the checks of a token whose append was interrupted
        self.stats.repaired += repair_batch(self.adapter, active)
        if any(r.finish_reason == "abort" for r in (*self._waiting, *active)):  # an interrupted abort:
            for req in [r for r in (*self._waiting, *active) if r.finish_reason == "abort"]:
                self._abort_now(req.rid)  # completed (its result kept for the aborting caller)
        if any(r.finish_reason for r in active):  # an interrupted retirement
            for slot in range(len(active) - 1, -1, -1):
                req = active[slot]
                if req.finish_reason:
                    req.finish_text()
                    self._finished.setdefault(req.rid, req.result())
                    if req not in self._unreported:
                        self._unreported.append(req)
                    self._release(slot)
        unreported = list(self._unreported)
        events = [  # final events an interrupted step did not hand out (or another owner's, kept for it)
            StreamEvent(r.rid, r.output[r.emitted :], r.peek_text(), True, r.finish_reason, r.result())
            for r in unreported
        ]
        return events, unreported

    def _release(self, slot: int) -> None:
        """Free a request's slot: its drafter and policy state, its cache rows (the last slot moves here)."""
        req = self._active[slot]
        if self._guard is not None:
            self._guard.remove(req)
        self._policy.remove_request(req.rid)  # per-request state of the budget policy
        moved = self.adapter.cache.remove(slot)
        # one statement each: an interrupt leaves the batch as it was or as it should be, never with the
        # moved request in two slots (an interrupt between a copy and a pop once ran a request twice)
        if moved is None:
            del self._active[slot]
        else:
            self._active[slot:] = [self._active[moved], *self._active[slot + 1 : moved]]

    def abort(self, rid: int) -> GenerationResult:
        """Stop a request, queued or running: its slot, cache rows and drafter state are freed at once.
        Returns its partial result with ``finish_reason="abort"`` (tokens and text generated so far). A
        request that already finished keeps its result, which is returned (and no longer kept); an aborted
        one's result is kept among the recent results like a finished one's (``result(rid)`` takes it).
        Raises ``KeyError`` for an id this engine does not know (or whose result was released).

        Safe from any thread: while another thread runs a step, this waits for the step to end, and the
        abort takes effect before the next step begins. Called from inside a step (a policy or drafter
        callback, a ``stream()`` collected mid-step), the abort takes effect before the next step and the
        result is the request's state now.

        An abort interrupted anywhere (``KeyboardInterrupt``) loses nothing: the request runs on as if it
        was not aborted, or it is aborted and its result is kept (``abort(rid)`` again or ``result(rid)``
        returns it); tests/engine/test_engine_abort_sweep.py tries every instruction."""
        if not self._lock.acquire(blocking=False):  # a step of another thread runs: it applies this abort
            self._abort_waiting.add(rid)  # first thing after its recovery, whoever gets the lock next
            self._lock.acquire()  # (a lock is not fair: the driving thread may step again before we wake)
        try:
            if in_step(threading.get_ident()):  # called from inside this thread's own step
                return self._abort_later(rid)
            self._recover()  # after an interrupted step: the batch as the next step would find it
            self._take_inbox()
            return self._abort_now(rid)  # (or the result a step took for this thread while it waited)
        finally:
            self._abort_waiting.discard(rid)
            self._lock.release()

    def _abort_now(self, rid: int) -> GenerationResult:
        """Abort request ``rid`` now, or return the result it holds. An aborted request's result is stored
        in ``_aborts`` before the request leaves the queue or the batch, and stays there (the next step
        moves it to the store of recent results): an interrupt at any instruction leaves the request
        untouched, marked aborted in its place (the next step, or another ``abort``, completes it) or gone
        with its result stored, even once this has returned it (a return value in flight)."""
        for req in self._waiting:
            if req.rid == rid:
                self._aborts[rid] = self._aborted(req)
                self._policy.remove_request(rid)  # e.g. an SLO target set while it waited
                self._waiting.remove(req)
                return self._aborts[rid]
        for slot, req in enumerate(self._active):
            if req.rid == rid:
                self._aborts[rid] = self._aborted(req)
                self._release(slot)
                return self._aborts[rid]
        res = self._aborts.get(rid) or self._finished.pop(rid, None) or self._results.pop(rid, None)
        if res is not None:
            return res
        known = isinstance(rid, int) and 0 <= rid < self._next_id
        what = "finished and its result was taken or released" if known else "not known to this engine"
        raise KeyError(f"request id {rid!r}: {what} (not queued, running or holding a result)")

    def _abort_later(self, rid: int) -> GenerationResult:
        for req in (*self._inbox, *self._waiting, *self._active):
            if req.rid == rid and not req.finish_reason:
                self._deferred_aborts.append(rid)
                return replace(req.result(), finish_reason="abort")
        return self._abort_now(rid)  # finished (or unknown): nothing in the batch changes

    def _apply_deferred_aborts(self) -> None:
        """The aborts that wait for this step (after its recovery, before admission): those of threads
        waiting in ``abort`` (their results stay in ``_aborts`` for them) and those made from inside the
        previous step. The results of the aborts before move to the store of recent results, where
        ``result(rid)`` finds them (a caller interrupted before it had its result: see ``_abort_now``)."""
        for rid in list(self._abort_waiting):
            if any(r.rid == rid for r in (*self._waiting, *self._active)):
                self._abort_now(rid)
        for rid in [r for r in self._aborts if r not in self._abort_waiting]:
            self._results[rid] = self._aborts[rid]  # in both stores for a moment, never in neither
            del self._aborts[rid]
        while len(self._results) > self.config.kept_results:  # bounded, aborts or not
            self._results.popitem(last=False)
        while self._deferred_aborts:
            try:
                self._abort_now(self._deferred_aborts[0])
            except KeyError:  # finished meanwhile (its result stays), or an interrupted earlier try
                pass
            self._deferred_aborts.popleft()

    def _aborted(self, req: Request) -> GenerationResult:
        req.finish_reason = "abort"
        req.finish_text()
        res = req.result()
        if req.rid in self._watch:  # a generate() / stream() waits for it: it gets the result too
            self._watch[req.rid] = res
            self._watch_aborted.add(req.rid)
        return res


def view_of(reqs: list[Request]) -> StepView:
    """What the budget policy sees of the requests ``reqs`` (in batch order)."""
    return StepView(
        [r.rid for r in reqs],
        [r.context_len for r in reqs],
        [r.remaining for r in reqs],
        [r.budget for r in reqs],
    )
