"""The per-step budget decision, behind a tiny hook so an adaptive scheduler can replace it.

A policy is any object with
- ``plan(view: StepView) -> int | Sequence[int]``: the budget of the coming step, either one global int
  for the batch (the drafter allocates it across requests) or one int per request (in ``view.request_ids``
  order). 0 = plain decoding step.
- ``observe(timing: StepTiming) -> None``: called after every step with what it cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class StepView:
    """What a policy sees before a step. Lists are in batch (slot) order."""

    request_ids: list[int]
    context_lens: list[int]  # committed tokens per request
    remaining: list[int]  # tokens each request may still produce
    own_budgets: list[int | None]  # per-request budgets given at add_request (None = not set)


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


class BudgetPolicy(Protocol):
    def plan(self, view: StepView) -> int | Sequence[int]: ...

    def observe(self, timing: StepTiming) -> None: ...


@dataclass
class FixedBudget:
    """The default policy: the same budget every step. ``per_request`` gives each tree ``budget`` nodes
    instead of sharing ``budget`` across the batch."""

    budget: int = 16
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
