"""The engine's budget-policy hook: what a policy sees (``StepView``, ``AdmitView``), what it learns after
each step (``StepRecord``: the one record of a step, which the cost model and ``EngineStats`` keep too),
the protocol (``PolicyHook``), the minimal policy (``FixedBudget``) and the minimal batch a drafter
returns (``PlainDraftBatch``).

A policy is any object with ``plan(view: StepView)`` (the step's budget: a global int or one per
request; 0 = plain decoding) and ``observe``. A *deciding* policy (``DecidingPolicy``; the adaptive
``sssd.policy.adaptive.BudgetPolicy``, the engine's default) also has ``decide(view, batch) ->
Decision`` (``sssd.policy.records``: the part of the proposed batch to verify, or a plain step for
``batch=None``, and what it predicted), and learns with ``observe(decision, record: StepRecord)``: the
engine holds the decision through the step, so the policy hands nothing over between its calls. A
simple policy (``PolicyHook``, e.g. ``FixedBudget``) learns with ``observe(record)`` and may cut the
proposed batch with ``select(view, batch)``. Optional hooks of both: ``propose_kwargs(view)`` (extra
drafter arguments), ``admit(view: AdmitView)`` (who joins the batch) and ``remove_request(rid)``.
"""

from __future__ import annotations

import warnings
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


# the times' names before each phase had one name (EngineStats.draft_time is now draft_s, ...)
_OLD_NAMES = {f"{p}_time": f"{p}_s" for p in ("draft", "forward", "head", "verify", "prefill", "step")}


def renamed_time(obj: Any, name: str) -> Any:
    """``__getattr__`` of the statistics whose times were renamed: the old name still reads the new field,
    with a DeprecationWarning; any other missing name is an AttributeError."""
    if name in _OLD_NAMES:
        new = _OLD_NAMES[name]
        warnings.warn(f"{type(obj).__name__}.{name} is now .{new}", DeprecationWarning, stacklevel=3)
        return getattr(obj, new)
    raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")


@dataclass(frozen=True)
class StepRecord:
    """One finished step, as the engine measured it: what a policy's ``observe`` learns from, what the cost
    model is fitted on (``CostModel.observe``) and what ``EngineStats.history`` keeps. Times in seconds;
    per-request tuples in batch (slot) order.

    The phases of a step (docs/architecture.md): ``draft_s`` (the policy's plan, the drafter's propose
    call, checking its trees), ``forward_s`` (the verification forward, the output head included: ``head_s``
    is its part), ``verify_s`` (walking the trees, the KV commit and the bookkeeping: appending tokens,
    the drafter's update, retiring requests). ``step_s`` is their sum. ``prefill_s`` (admitting requests
    just before the step, while the running ones wait) is not part of it.
    """

    batch_size: int
    context_tokens: int  # committed tokens attended to (sum over the batch, before the step)
    num_nodes: int  # tokens the forward scored: one root per request + the draft nodes
    budget: int | tuple[int, ...] = 0  # the step's plan (after per-request overrides); 0: plain decoding
    accepted: tuple[int, ...] = ()  # [B] accepted draft nodes per request (the next token not counted)
    draft_s: float = 0.0
    forward_s: float = 0.0
    head_s: float = 0.0  # of forward_s: the output head over the rows verification asked for
    verify_s: float = 0.0
    prefill_s: float = 0.0
    request_ids: tuple[int, ...] = ()  # [B] the batch (empty: not known)
    drafted: tuple[int, ...] = ()  # [B] draft nodes verified per request (empty: not known)
    tokens: int = 0  # tokens handed to the callers (truncated at stops; an interrupted step's too)
    head_calls: int = 0  # output-head calls that took head_s (0: not known)

    def __post_init__(self) -> None:
        for name in ("accepted", "request_ids", "drafted"):  # lists (JSON, callers) become tuples
            object.__setattr__(self, name, tuple(getattr(self, name)))
        k = self.budget
        object.__setattr__(self, "budget", int(k) if np.ndim(k) == 0 else tuple(int(x) for x in k))
        b = self.batch_size
        if b < 0 or self.num_nodes < b or self.context_tokens < 0:
            raise ValueError(f"inconsistent step record: {self}")
        for name in ("accepted", "request_ids", "drafted"):
            if len(getattr(self, name)) not in (0, b):
                raise ValueError(f"StepRecord.{name} must have one entry per request ({b}) or none")

    @property
    def step_s(self) -> float:
        return self.draft_s + self.forward_s + self.verify_s

    __getattr__ = renamed_time  # the old names (forward_time, ...) still read, with a DeprecationWarning

    @property
    def draft_budget(self) -> int:
        """Draft nodes the drafter was asked for in all (the plan's total)."""
        return self.budget if isinstance(self.budget, int) else sum(self.budget)


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

    def observe(self, record: StepRecord) -> None: ...


class DecidingPolicy(Protocol):
    """A policy whose decision for a step is a value (``sssd.policy.adaptive.BudgetPolicy``)."""

    def plan(self, view: StepView) -> int | Sequence[int]: ...

    def decide(self, view: StepView, batch: Any) -> Any: ...  # a sssd.policy.records.Decision

    def observe(self, decision: Any, record: StepRecord) -> None: ...


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

    def observe(self, record: StepRecord) -> None:
        pass
