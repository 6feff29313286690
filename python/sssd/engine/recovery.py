"""Keeping a step's faults from stranding the batch: the drafter and the budget policy are guarded, the KV
cache is a cache.

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

:class:`PolicyGuard` calls the budget policy, checked: a misbehaving policy never stalls a request. A
policy is user code (``EngineConfig.policy``, see ``sssd.policy.interface``). Whatever a hook raises or
returns, the step goes on:

- ``plan(view)`` must return an int >= 0 or one per request; anything else (3.5, NaN, None, a list of
  the wrong length, a negative budget, an exception) makes that step a plain decoding step (budget 0);
- ``admit(view)`` must return ids of waiting requests; anything else admits first come, first served;
- ``propose_kwargs(view)`` must return a dict (else no extra arguments);
- ``decide(view, batch)`` (a deciding policy) must return a ``Decision`` with a ``batch`` (else the batch
  as proposed, which the engine still cuts to the planned budget); a simple policy's optional
  ``select(view, batch)`` must return a batch (same fallback). Either way the engine gets a
  ``Decision``, holds it through the step and hands it back to ``observe``;
- ``observe(decision, record)`` (a deciding policy; a simple one: ``observe(record)``) and
  ``remove_request(rid)`` only inform the policy: their errors are counted.

Every such error is counted in ``EngineStats.policy_errors`` and logged once per hook on the
``sssd.engine`` logger, naming the policy. ``KeyboardInterrupt`` is not caught: it is the user's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from sssd.policy.interface import AdmitView, StepView, fifo
from sssd.policy.records import Decision

log = logging.getLogger("sssd.engine")


def _is_budget(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and x >= 0


def checked_plan(plan: Any, n: int) -> int | list[int]:
    """``plan`` as an int (global budget) or a list of ``n`` ints (one per request), all >= 0; raises
    ValueError saying what is wrong otherwise."""
    if _is_budget(plan):
        return int(plan)
    if isinstance(plan, (str, bytes, Mapping)) or not hasattr(plan, "__iter__"):
        raise ValueError(f"returned {plan!r:.60}; expected an int >= 0 or a sequence of {n} of them")
    budgets = list(plan)
    if len(budgets) != n:
        raise ValueError(f"returned {len(budgets)} budgets for {n} requests")
    bad = [x for x in budgets if not _is_budget(x)]
    if bad:
        raise ValueError(f"returned budget {bad[0]!r:.30} among {n}; budgets must be ints >= 0")
    return [int(x) for x in budgets]


class PolicyGuard:
    """Calls ``policy``'s hooks and checks what they return (see the module docstring)."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.errors: dict[str, int] = {}

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def has(self, hook: str) -> bool:
        return callable(getattr(self.policy, hook, None))

    def _failed(self, hook: str, what: str, fallback: str) -> None:
        first = hook not in self.errors
        self.errors[hook] = self.errors.get(hook, 0) + 1
        if first:
            log.warning(
                "budget policy %s.%s() %s; %s (further errors are counted in EngineStats.policy_errors)",
                type(self.policy).__name__, hook, what, fallback,
            )  # fmt: skip

    def _call(self, hook: str, *args: Any, fallback: str) -> tuple[bool, Any]:
        try:
            return True, getattr(self.policy, hook)(*args)
        except Exception as e:
            self._failed(hook, f"raised {type(e).__name__}: {e}", fallback)
            return False, None

    def plan(self, view: StepView) -> int | list[int]:
        """The step's budget: an int for the batch or one per request; 0 (plain decoding) on failure."""
        fallback = "this step decodes without speculation"
        ok, plan = self._call("plan", view, fallback=fallback)
        if not ok:
            return 0
        try:
            return checked_plan(plan, len(view.request_ids))
        except ValueError as e:
            self._failed("plan", str(e), fallback)
            return 0

    def admit(self, view: AdmitView) -> list[int]:
        """Ids of waiting requests to admit, in order; first come, first served on failure."""
        fallback = "waiting requests are admitted first come, first served"
        ok, ids = self._call("admit", view, fallback=fallback)
        if not ok:
            return fifo(view)
        waiting = set(view.waiting_ids)
        try:
            if isinstance(ids, (str, bytes, Mapping)) or not hasattr(ids, "__iter__"):
                raise ValueError(f"returned {ids!r:.60}; expected a list of waiting request ids")
            ids = list(ids)
            unknown = [r for r in ids if isinstance(r, (bool, np.bool_)) or r not in waiting]
            if unknown:
                raise ValueError(f"returned {unknown[0]!r:.30}, which is not a waiting request id")
        except ValueError as e:
            self._failed("admit", str(e), fallback)
            return fifo(view)
        return [int(r) for r in ids]

    def propose_kwargs(self, view: StepView) -> dict:
        if not self.has("propose_kwargs"):
            return {}
        fallback = "the drafter is called without extra arguments"
        ok, kw = self._call("propose_kwargs", view, fallback=fallback)
        if ok and not (isinstance(kw, Mapping) and all(isinstance(k, str) for k in kw)):
            self._failed("propose_kwargs", f"returned {kw!r:.60}; expected a dict", fallback)
            ok = False
        return dict(kw) if ok else {}

    def decide(self, view: StepView, batch: Any) -> Decision:
        """The step's decision for the proposed ``batch`` (None: nothing proposed): a deciding policy's
        ``decide``, else its ``select`` (if any) as a ``Decision``; the batch as proposed on failure."""
        if not self.has("decide"):
            return _as_decision(view, self.select(view, batch) if batch is not None else None)
        fallback = "the batch is verified as proposed, cut to the planned budget"
        ok, out = self._call("decide", view, batch, fallback=fallback)
        if ok and not hasattr(out, "batch"):
            self._failed("decide", f"returned {out!r:.60}; expected a Decision", fallback)
            ok = False
        return out if ok else _as_decision(view, batch)

    def select(self, view: StepView, batch: Any) -> Any:
        if not self.has("select"):
            return batch
        fallback = "the batch is verified as proposed, cut to the planned budget"
        ok, out = self._call("select", view, batch, fallback=fallback)
        if ok and out is None:
            self._failed("select", "returned None", fallback)
            ok = False
        return out if ok else batch

    def observe(self, decision: Decision, record: Any) -> None:
        """The measured step, with the step's decision for a deciding policy."""
        args = (decision, record) if self.has("decide") else (record,)
        self._call("observe", *args, fallback="the step is not fed back")

    def remove_request(self, rid: int) -> None:
        if self.has("remove_request"):
            self._call("remove_request", rid, fallback="its state may stay in the policy")


def _as_decision(view: StepView, batch: Any) -> Decision:
    """A decision that verifies ``batch`` as it is (None: a plain step), predicting nothing. The batch is
    not trusted yet (``sssd.engine.trees`` checks it next): its size counts only when it has one."""
    try:
        k = max(int(len(batch.tokens) - len(batch.offsets) + 1), 0)
    except Exception:  # None, or anything a drafter returned
        k = 0
    return Decision(tuple(view.request_ids), batch, k, 0.0, 0.0, batch is not None)


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
