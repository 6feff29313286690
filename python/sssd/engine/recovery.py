"""Keeping a step's faults from stranding the batch: the drafter is optional, the KV cache a cache.

The request's tokens (prompt + output) are the truth. Everything else the engine holds about a request —
its KV cache rows, the drafter's copy of its context — is a cache that can be rebuilt from them:

- :class:`DrafterGuard` calls the drafter. An exception in any of its methods costs at most the
  speculation of the requests concerned: they draft nothing until their drafter state is rebuilt
  (``remove_request`` + ``add_request`` with all their tokens), retried with exponential back-off in
  steps. Errors are counted and logged once per method. What ``propose`` returns is checked before use
  (``sssd.engine.trees``): a malformed tree costs its request's speculation, an oversized one is cut.
- :func:`repair_batch` runs before every step and brings the batch back to its invariants after anything
  escaped a step (an exception, ``KeyboardInterrupt``): every running request owns exactly one cache slot,
  in batch order, holding ``context_len - 1`` committed rows (all but the root). Rows past that are
  uncommitted (a step interrupted between the cache commit and the tokens) and are dropped; missing rows
  (an interrupted prefill) are prefilled; a slot mapping that cannot be trusted is rebuilt from the tokens.
  On the fast path it costs two array comparisons.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger("sssd.engine")

MAX_BACKOFF_STEPS = 1024


class DrafterGuard:
    """The engine's calls into ``drafter``; per request ``req.drafter_tokens`` is the number of its tokens the
    drafter holds (-1: unknown, so it must be rebuilt before the request drafts again)."""

    def __init__(self, drafter: Any):
        self.drafter = drafter
        self.errors: dict[str, int] = {}
        self.step = 0  # steps seen, for back-off

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def failed(self, method: str, err: BaseException, reqs: list[Any] = ()) -> None:
        first = method not in self.errors
        self.errors[method] = self.errors.get(method, 0) + 1
        if first:
            log.warning(
                "drafter %s.%s() raised %s: %s; the requests concerned decode without speculation until "
                "their drafter state is rebuilt (further errors are counted in EngineStats.drafter_errors)",
                type(self.drafter).__name__, method, type(err).__name__, err,
            )  # fmt: skip
        for req in reqs:
            req.drafter_tokens = -1
            req.draft_failures += 1
            req.draft_retry = self.step + min(2**req.draft_failures, MAX_BACKOFF_STEPS)

    def refused(self, req: Any, message: str) -> None:
        """A malformed draft for ``req`` (see ``sssd.engine.trees``): counted like an exception of
        ``propose`` for that request alone, whose drafter state is rebuilt before it drafts again."""
        from sssd.engine.trees import MalformedDraftError

        self.failed("propose", MalformedDraftError(message), [req])

    def over_budget(self, cut: int, proposed: int, budget: Any) -> None:
        """``propose`` returned more drafted nodes than the budget; ``cut`` of them were dropped. Counted
        and logged once; the trees, cut to the budget, are still verified."""
        first = "over budget" not in self.errors
        self.errors["over budget"] = self.errors.get("over budget", 0) + 1
        if first:
            log.warning(
                "drafter %s.propose() returned %d drafted nodes for a budget of %s: the engine verifies "
                "the best ones within the budget and drops %d (further such steps are counted in "
                "EngineStats.drafter_errors)", type(self.drafter).__name__, proposed, budget, cut,
            )  # fmt: skip

    @staticmethod
    def _tokens(req: Any) -> np.ndarray:
        return np.concatenate([req.prompt, np.asarray(req.output, dtype=np.int64)]).astype(np.int32)

    def add(self, req: Any) -> None:
        try:
            self.drafter.add_request(req.rid, self._tokens(req))
        except Exception as e:
            self.failed("add_request", e, [req])
            return
        req.drafter_tokens = req.context_len

    def extend(self, req: Any, new_tokens: list[int]) -> None:
        if req.drafter_tokens != req.context_len - len(new_tokens):
            return  # out of sync already: rebuilt before it drafts again
        try:
            self.drafter.extend(req.rid, np.asarray(new_tokens, dtype=np.int32))
        except Exception as e:
            self.failed("extend", e, [req])
            return
        req.drafter_tokens = req.context_len

    def remove(self, req: Any) -> None:
        try:
            self.drafter.remove_request(req.rid)
        except Exception as e:
            self.failed("remove_request", e)
        req.drafter_tokens = -1

    def sync(self, reqs: list[Any]) -> None:
        """Rebuild the drafter state of requests whose copy disagrees with their tokens (when their
        back-off allows)."""
        self.step += 1
        for req in reqs:
            if req.drafter_tokens != req.context_len and self.step >= req.draft_retry:
                try:  # the drafter may hold a stale copy, or none
                    self.drafter.remove_request(req.rid)
                except Exception:
                    pass
                self.add(req)

    def propose(self, reqs: list[Any], rids: list[int], budget: Any, kwargs: dict) -> Any:
        """The drafter's batch for ``rids``, or None when it failed (the step then decodes plainly)."""
        try:
            return self.drafter.propose(rids, budget=budget, **kwargs)
        except Exception as e:
            self.failed("propose", e, reqs)
            return None

    def recycle(self, top_k: Any) -> None:
        """The step's top-k rows (a ``TopKRecorder``) to the drafter's recycled candidates."""
        try:
            self.drafter.recycle(*top_k.arrays())
        except Exception as e:  # a lost update of a cache: nothing to rebuild
            self.failed("recycle", e)

    def observe(self, rids: list[int], batch: Any, on_path: np.ndarray) -> None:
        """The drafter's ``observe``: ``on_path`` (bool per node of ``batch``) marks each tree's accepted
        path from its root (``sssd.batch.on_path_mask`` builds one from paths or tokens)."""
        if not hasattr(self.drafter, "observe"):
            return
        try:
            self.drafter.observe(rids, batch, on_path)
        except Exception as e:  # online calibration only: nothing to rebuild
            self.failed("observe", e)


def repair_batch(adapter: Any, active: list[Any]) -> int:
    """Make the cache slots match ``active`` (see the module docstring). Returns the number of requests
    whose rows had to be fixed (0 on the fast path)."""
    cache = adapter.cache
    n = len(active)
    rids = np.fromiter((r.rid for r in active), dtype=np.int64, count=n)
    want = np.fromiter((r.context_len - 1 for r in active), dtype=np.int64, count=n)
    owners, lengths = cache.owners, cache.lengths
    if len(owners) == len(lengths) == n and np.array_equal(owners, rids):
        if np.array_equal(lengths, want):
            return 0
        fixed = 0
        for slot, req in enumerate(active):
            have, need = int(lengths[slot]), int(want[slot])
            if have > need:  # rows of a step whose tokens never arrived: uncommitted
                cache.lengths[slot] = need
                fixed += 1
            elif have < need:  # an interrupted prefill: go on from where it stopped
                adapter.prefill(slot, _context(req)[have:need])
                fixed += 1
        return fixed
    if len(owners) > n and len(lengths) == len(owners) and np.array_equal(owners[:n], rids):
        while cache.num_active > n:  # slots of an interrupted admission
            cache.remove(cache.num_active - 1)
        return repair_batch(adapter, active)
    log.warning("KV cache slots do not match the batch after an interrupted step: rebuilding %d requests", n)
    cache.clear()
    for req in active:
        slot = cache.add(req.rid)
        adapter.prefill(slot, _context(req)[:-1])
    return n


def _context(req: Any) -> np.ndarray:
    return np.concatenate([req.prompt, np.asarray(req.output, dtype=np.int64)])
