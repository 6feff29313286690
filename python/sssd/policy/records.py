"""What the budget policy decides and records: its decision for a step (``Decision``), a request's TPOT
target (``SLOTarget``), the acceptance check (``AcceptanceStats``) and each step as decided and measured
(``PolicyStep``, the policy's ``trace``). Plain data; ``sssd.policy.adaptive`` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sssd.policy.goodput import BudgetChoice


@dataclass(frozen=True)
class SLOTarget:
    tpot_s: float  # time per output token target, seconds
    priority: float = 0.0  # larger = served first among requests that fall short


@dataclass(frozen=True)
class Decision:
    """What the policy decided for one step (``BudgetPolicy.decide``), and all that its ``observe`` needs
    to learn from the step: the policy keeps nothing else between the two. ``batch`` is None when no
    propose call was made (a plain decoding step)."""

    request_ids: tuple[int, ...]  # the requests decided for, in batch order
    batch: object | None  # the batch to verify (the proposed one cut to ``budget``), or None
    budget: int  # draft nodes kept (0: plain decoding)
    expected_accepted: float  # corrected Σf of the kept nodes
    predicted_s: float  # predicted step time at ``budget``
    drafted: bool  # the drafter was called
    choice: BudgetChoice | None = None  # every candidate budget's prediction (adaptive choices only)
    tree_pairs: float = 0.0  # tree attention pairs of the kept trees (a cost-model feature)
    # [B] the drafter's own Σf of each request's kept nodes (the acceptance check); empty when not drafted
    predicted_per_request: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass
class AcceptanceStats:
    """Observed vs predicted accepted tokens (the acceptance model check)."""

    predicted: float = 0.0  # forgotten sums used for the correction factor
    observed: float = 0.0
    total_predicted: float = 0.0  # plain totals, for reports
    total_observed: float = 0.0
    steps: int = 0

    @property
    def ratio(self) -> float:
        """observed / predicted over the whole run (1.0 = calibrated; < 1: over-confident drafter)."""
        return self.total_observed / self.total_predicted if self.total_predicted > 0 else float("nan")


@dataclass(frozen=True)
class PolicyStep:
    """One step as the policy planned and then measured it (``BudgetPolicy.trace``), for reports."""

    batch_size: int
    budget: int  # draft nodes verified (0: plain decoding)
    drafted: bool  # the drafter was called (False: backed off, or nothing to draft)
    predicted_s: float  # predicted step time at the chosen budget
    step_s: float  # measured step time
    expected_accepted: float  # corrected Σf of the kept nodes
    accepted: int  # draft nodes the model accepted (the next token excluded)
