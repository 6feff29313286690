"""The adaptive budget policy's settings (``BudgetConfig``): how the global budget is chosen, explored
and backed off, how TPOT targets steer it and how requests are admitted. Plain data, checked on creation.
"""

from __future__ import annotations

from dataclasses import dataclass

from sssd.checks import check_fields
from sssd.policy.interface import DEFAULT_BUDGET

# BudgetConfig.mode: the adaptive policy's own choice, or its choice switched off (an engine's budget is set
# by EngineConfig.budget_mode: sssd.policy.budget_mode.BUDGET_MODES)
POLICY_MODES = ("adaptive", "fixed")
# finished requests whose (time, tokens, target) records are kept: the lengths that predict the running
# requests' (the most recent 512) and slo_report's recent history; older records are dropped, so the
# policy's memory does not grow with the number of requests it has ever seen
FINISHED_RECORDS = 512


@dataclass(frozen=True)
class BudgetConfig:
    """How the engine chooses the global speculation budget of each step."""

    # "adaptive" (default) | "fixed": the budget below every step, with this policy's admission, SLO targets
    # and records (the serving benchmarks compare the two under one policy; an engine's fixed budget is
    # EngineConfig(budget_mode="fixed"))
    mode: str = "adaptive"
    budget: int = DEFAULT_BUDGET  # fixed: the budget; adaptive: the largest candidate (the propose size)
    max_per_request: int | None = None  # cap on any one request's tree (non-root nodes)
    min_gain: float = 0.02  # speculate only if predicted goodput beats plain decoding by this much
    acceptance_correction: bool = True  # scale Σf by the observed/predicted acceptance ratio
    correction_window: float = 64.0  # steps (exponential forgetting of the ratio's evidence)
    # each request's own observed/predicted ratio (shrunk towards the batch's by this many predicted
    # tokens) values and ranks its nodes: a request copying from its prompt gets the nodes it accepts
    request_correction_prior: float = 4.0  # 0: one ratio for the whole batch
    request_correction_window: float = 32.0  # drafted steps of the request
    max_backoff: int = 32  # longest run of steps without calling the drafter before probing again
    # drafted steps over which the drafter's predicted net value is averaged; the policy backs off when
    # the average falls below -min_gain (one step where the drafter finds nothing is no reason to stop)
    backoff_memory: float = 8.0
    # every n-th drafted step verifies half the chosen budget, the n-th after that 1.5 times it, so that the
    # cost model measures sizes around its optimum (0: never)
    explore_every: int = 8
    explore_warmup: int = 16  # the first drafted steps explore every other step (a cold model learns fast)
    plain_probe_every: int = 64  # a plain step instead of the half when none was measured for this many steps
    slo_slack_s: float = 0.0  # ε added to the predicted step time when deciding who falls short
    slo_goodput_tolerance: float = 0.05  # expected goodput the SLO choice may give up
    # True: the drafter ranks SLO-first (propose(slo=..., step_time=...)). Off by default: the batch then
    # lacks the throughput-optimal ranking, so the goodput cost of the SLO choice cannot be bounded.
    slo_via_drafter: bool = False
    slo_catch_up: float = 2.0  # per-step targets follow each request's TPOT so far (1 = off)
    # SLO-aware admission (``admit``; only when some request has a target): higher priority first, and a
    # request waits while admitting it would push a running request with a target over it.
    slo_admission: bool = True
    slo_admit_margin: float = 0.95  # scales the targets in the admission test (< 1: safety margin)
    slo_admit_hold: bool = True  # a request with a target also waits while it could not meet it
    slo_admit_tolerance: float = 1.0  # never hold the batch where its throughput is this far below full
    slo_max_defer: int = 256  # admission calls a request may be held back before it is admitted anyway
    length_samples: int = 8  # finished requests needed before their lengths predict the running ones'

    def __post_init__(self) -> None:
        check_fields(self)  # budget=True or NaN fails here, not later in the engine
        if self.mode not in POLICY_MODES:
            raise ValueError(f"BudgetConfig.mode must be one of {POLICY_MODES}, got {self.mode!r}")
        if self.budget < 0:
            raise ValueError(f"budget must be >= 0, got {self.budget}")
        if self.max_per_request is not None and self.max_per_request < 0:
            raise ValueError("max_per_request must be >= 0 or None")
        if not self.backoff_memory >= 1.0:
            raise ValueError(f"backoff_memory must be >= 1 (drafted steps), got {self.backoff_memory}")
        if not 0.0 <= self.slo_goodput_tolerance < 1.0:
            raise ValueError("slo_goodput_tolerance must be in [0, 1)")
        if not (self.slo_admit_margin > 0 and 0.0 <= self.slo_admit_tolerance and self.slo_max_defer >= 0):
            raise ValueError("slo_admit_margin must be > 0, slo_admit_tolerance and slo_max_defer >= 0")
