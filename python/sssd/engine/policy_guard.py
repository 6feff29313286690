"""The engine's calls into its budget policy, checked: a misbehaving policy never stalls a request.

A policy is user code (``EngineConfig.policy``, see ``sssd.policy.interface``). Whatever a hook raises or
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
