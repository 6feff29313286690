"""The engine's budget-policy hook: what a policy sees (``StepView``, ``AdmitView``), what it learns after
each step (``StepTiming``), the protocol (``PolicyHook``), the minimal policy (``FixedBudget``) and the
minimal batch a drafter returns (``PlainDraftBatch``).

A policy is any object with ``plan(view: StepView)`` (the step's budget: a global int or one per
request; 0 = plain decoding) and ``observe``. A *deciding* policy (``DecidingPolicy``; the adaptive
``sssd.policy.adaptive.BudgetPolicy``, the engine's default) also has ``decide(view, batch) ->
Decision`` (``sssd.policy.records``: the part of the proposed batch to verify, or a plain step for
``batch=None``, and what it predicted), and learns with ``observe(decision, timing: StepTiming)``: the
engine holds the decision through the step, so the policy hands nothing over between its calls. A
simple policy (``PolicyHook``, e.g. ``FixedBudget``) learns with ``observe(timing)`` and may cut the
proposed batch with ``select(view, batch)``. Optional hooks of both: ``propose_kwargs(view)`` (extra
drafter arguments), ``admit(view: AdmitView)`` (who joins the batch) and ``remove_request(rid)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class StepView:
    """What a policy sees before a step. Lists are in batch (slot) order."""

    request_ids: list[int]
    context_lens: list[int]  # committed tokens per request
    remaining: list[int]  # tokens each request may still produce
    own_budgets: list[int | None]  # per-request budgets given at add_request (None = not set)


@dataclass(frozen=True)
class AdmitView:
    """What a policy sees when requests wait for a batch slot (``admit``). Lists in queue order."""

    waiting_ids: list[int]
    prompt_lens: list[int]  # prompt tokens of each waiting request
    waiting_remaining: list[int]  # tokens each may produce
    running: StepView  # the batch as it is now
    free_slots: int


def fifo(view: AdmitView) -> list[int]:
    """Today's admission: the first ``free_slots`` waiting requests, in arrival order."""
    return list(view.waiting_ids[: max(view.free_slots, 0)])


@dataclass(frozen=True)
class StepTiming:
    """One finished step. Times in seconds."""

    batch_size: int
    budget: int | tuple[int, ...]  # what plan() returned (after per-request overrides)
    num_nodes: int  # nodes in the forward, roots included
    context_tokens: int  # committed tokens attended to (sum over requests, before the step)
    accepted: tuple[int, ...]  # accepted draft nodes per request (bonus excluded)
    draft_time: float
    forward_time: float
    verify_time: float  # verification + KV commit + bookkeeping
    step_time: float
    prefill_time: float = 0.0  # admitting (prefilling) requests just before this step; running ones wait
    request_ids: tuple[int, ...] = ()  # the batch, in the order of ``accepted`` (empty: not given)


@dataclass(frozen=True)
class PlainDraftBatch:
    """The fields of the drafter contract's batch and nothing more: what the engine and the budget policies
    read. ``sssd.DraftBatch`` carries these and more; a batch without ``truncate`` is cut by
    ``sssd.policy.goodput.truncate_batch``. N nodes (one root per request), B trees, M non-root nodes."""

    tokens: np.ndarray  # [N] int32
    parents: np.ndarray  # [N] int32: -1 for roots, else the parent's index within the same tree
    probs: np.ndarray  # [N] float32 p(node | parent); 1 for roots
    depth: np.ndarray  # [N] int32, roots 0
    offsets: np.ndarray  # [B + 1] int64: tree i is slice(offsets[i], offsets[i + 1])
    rank: np.ndarray  # [N] int32 position in the batch-wide selection order; -1 for roots
    gain: np.ndarray  # [M + 1] float64: gain[k] = sum of f over the nodes with rank < k


class PolicyHook(Protocol):
    """What the engine needs of a simple budget policy."""

    def plan(self, view: StepView) -> int | Sequence[int]: ...

    def observe(self, timing: StepTiming) -> None: ...


class DecidingPolicy(Protocol):
    """A policy whose decision for a step is a value (``sssd.policy.adaptive.BudgetPolicy``)."""

    def plan(self, view: StepView) -> int | Sequence[int]: ...

    def decide(self, view: StepView, batch: Any) -> Any: ...  # a sssd.policy.records.Decision

    def observe(self, decision: Any, timing: StepTiming) -> None: ...


# Draft nodes per step when nobody says: EngineConfig.budget, FixedBudget and BudgetConfig (mode "fixed":
# the budget; "adaptive": the largest one it may choose) share it, so the two fixed paths agree.
DEFAULT_BUDGET = 16


@dataclass
class FixedBudget:
    """The minimal policy: the same budget every step. ``per_request`` gives each tree ``budget`` nodes
    instead of sharing ``budget`` across the batch."""

    budget: int = DEFAULT_BUDGET
    per_request: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 0:
            raise ValueError(f"budget must be an int >= 0, got {self.budget!r}")

    def plan(self, view: StepView) -> int | Sequence[int]:
        if self.per_request:
            return [self.budget] * len(view.request_ids)
        return self.budget

    def observe(self, timing: StepTiming) -> None:
        pass
