"""What a step did, and the engine's running totals: ``Budget`` (the step's draft budget, one type) and
``EngineStats`` (totals; ``record`` does all the accounting). A step is recorded once, as the policy's
``sssd.policy.interface.StepRecord`` (re-exported here), with its phases' names: ``draft_s``,
``forward_s`` (of it ``head_s``), ``verify_s``, ``prefill_s``; the totals carry the same names.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sssd.policy.interface import StepRecord, renamed_time


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
class EngineStats:
    steps: int = 0
    tokens: int = 0
    accepted: int = 0
    nodes: int = 0  # draft (non-root) nodes verified
    # seconds per phase over every step (the names of StepRecord's phases)
    draft_s: float = 0.0
    forward_s: float = 0.0  # the verification forward and the output head
    head_s: float = 0.0  # of forward_s: the output head
    verify_s: float = 0.0
    prefill_s: float = 0.0  # admitting requests (added as they are prefilled, not by record)
    step_s: float = 0.0
    drafter_errors: int = 0  # drafter exceptions and refused or cut drafts (the requests decoded plainly)
    request_errors: int = 0  # requests finished with finish_reason="error" (their own input failed)
    repaired: int = 0  # requests whose KV cache rows were rebuilt after a step was interrupted
    policy_errors: int = (
        0  # policy hooks that raised or returned something malformed (see sssd.engine.recovery)
    )
    compiles: int = 0  # shape buckets of the verification forward compiled or captured (EngineConfig.compile)
    compile_time: float = 0.0  # seconds they took (not counted in the step and forward times)
    # the most recent steps (EngineConfig.history_size of them); the totals above cover every step
    history: deque[StepRecord] = field(default_factory=lambda: deque(maxlen=1024), repr=False)

    __getattr__ = renamed_time

    def record(self, step: StepRecord, requests: Sequence[Any]) -> StepRecord:
        """Add a step to the totals, to its ``requests``' own statistics (the batch in slot order,
        ``sssd.engine.requests.Request``) and to the history; returns the step."""
        self.steps += 1
        self.tokens += step.tokens
        self.accepted += sum(step.accepted)
        self.nodes += step.num_nodes - step.batch_size
        self.draft_s += step.draft_s
        self.forward_s += step.forward_s
        self.head_s += step.head_s
        self.verify_s += step.verify_s
        self.step_s += step.step_s
        for req, drafted, accepted in zip(requests, step.drafted, step.accepted, strict=True):
            st = req.stats
            st.steps += 1
            st.accepted += accepted
            st.draft_nodes += drafted
            st.draft_s += step.draft_s
            st.forward_s += step.forward_s
            st.step_s += step.step_s
        self.history.append(step)
        return step
