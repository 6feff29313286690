"""What a step did, and the engine's running totals: ``Budget`` (the step's draft budget, one type),
``StepRecord`` (one step, named fields) and ``EngineStats`` (totals; ``record`` does all the accounting).

Times are seconds. A step's phases: draft (the policy's plan, the drafter, checking its trees), forward
(the verification forward and the output head, which verification applies lazily to the rows it needs),
verify (walking the trees, the KV commit, appending tokens, retiring finished requests).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sssd.policy.interface import StepTiming


@dataclass(frozen=True)
class Budget:
    """A step's draft budget: ``total`` drafted nodes shared by the whole batch (the drafter's joint
    selection chooses where they go), or one budget per request (``per_request``, in batch order;
    ``total`` is then their sum). 0 everywhere: a plain decoding step."""

    total: int
    per_request: tuple[int, ...] | None = None

    @classmethod
    def of(cls, plan: int | Sequence[int], own: Sequence[int | None] = ()) -> Budget:
        """From a checked plan (an int for the batch or one per request) and the requests' own budgets
        (``add_request(budget=...)``, None where unset), which override the plan: the others then get
        an even share of a batch budget."""
        per = None if isinstance(plan, int) else [int(x) for x in plan]
        if any(b is not None for b in own):
            share = per if per is not None else [int(plan) // len(own)] * len(own)
            per = [int(b) if b is not None else s for b, s in zip(own, share, strict=True)]
        if per is None:
            return cls(int(plan))
        return cls(sum(per), tuple(per))

    @property
    def shared(self) -> bool:
        """A budget for the batch (the policy may cut the proposed batch with ``select``)."""
        return self.per_request is None

    def of_requests(self, idx: Sequence[int]) -> int | list[int]:
        """What the drafter gets for the requests ``idx`` (batch positions): the batch budget, or theirs."""
        return self.total if self.per_request is None else [self.per_request[i] for i in idx]

    def as_plan(self) -> int | tuple[int, ...]:
        return self.total if self.per_request is None else self.per_request


@dataclass
class StepRecord:
    """One step: who took part, what they drafted and accepted, and how long each phase took."""

    requests: list[Any]  # the batch, in slot order (sssd.engine.requests.Request)
    budget: Budget
    drafted: list[int]  # draft (non-root) nodes verified per request
    accepted: list[int]  # of them accepted per request (the model's own token not counted)
    tokens: int  # tokens handed to the caller by this step (truncated at stops; interrupted steps' too)
    context_tokens: int  # committed tokens attended to (sum over the batch, before the step)
    draft_s: float = 0.0
    forward_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0  # admitting requests before the step (the running ones waited)
    head_s: float = 0.0  # of forward_s: the output head over the rows verification asked for

    @property
    def step_s(self) -> float:
        return self.draft_s + self.forward_s + self.verify_s

    def timing(self) -> StepTiming:
        """What the budget policy learns from the step."""
        b = len(self.requests)
        return StepTiming(
            b, self.budget.as_plan(), b + sum(self.drafted), self.context_tokens, tuple(self.accepted),
            self.draft_s, self.forward_s, self.verify_s, self.step_s, self.prefill_s,
            tuple(r.rid for r in self.requests),
        )  # fmt: skip


@dataclass
class EngineStats:
    steps: int = 0
    tokens: int = 0
    accepted: int = 0
    nodes: int = 0  # draft (non-root) nodes verified
    draft_time: float = 0.0
    forward_time: float = 0.0  # the verification forward and the output head
    head_time: float = 0.0  # of forward_time: the output head
    verify_time: float = 0.0
    prefill_time: float = 0.0
    step_time: float = 0.0
    drafter_errors: int = 0  # drafter exceptions and refused or cut drafts (the requests decoded plainly)
    request_errors: int = 0  # requests finished with finish_reason="error" (their own input failed)
    repaired: int = 0  # requests whose KV cache rows were rebuilt after a step was interrupted
    policy_errors: int = 0  # policy hooks that raised or returned something malformed (see policy_guard)
    compiles: int = 0  # shape buckets of the verification forward compiled or captured (EngineConfig.compile)
    compile_time: float = 0.0  # seconds they took (not counted in the step and forward times)
    # the most recent steps (EngineConfig.history_size of them); the totals above cover every step
    history: deque[StepTiming] = field(default_factory=lambda: deque(maxlen=1024), repr=False)

    def record(self, step: StepRecord) -> StepTiming:
        """Add a step to the totals, to its requests' own statistics and to the history; returns the
        timing the budget policy observes."""
        timing = step.timing()
        self.steps += 1
        self.tokens += step.tokens
        self.accepted += sum(step.accepted)
        self.nodes += sum(step.drafted)
        self.draft_time += step.draft_s
        self.forward_time += step.forward_s
        self.head_time += step.head_s
        self.verify_time += step.verify_s
        self.step_time += step.step_s
        for req, drafted, accepted in zip(step.requests, step.drafted, step.accepted, strict=True):
            st = req.stats
            st.steps += 1
            st.accepted += accepted
            st.draft_nodes += drafted
            st.draft_time += step.draft_s
            st.forward_time += step.forward_s
            st.step_time += step.step_s
        self.history.append(timing)
        return timing
