"""How an engine's budget is set: ``EngineConfig(budget=k, budget_mode=...)``, the one way.

- ``"adaptive"`` (the default): each step the goodput-optimal global budget in 0..k
  (``sssd.policy.adaptive.BudgetPolicy``, its cost model seeded by ``EngineConfig.cost_profile`` if given);
- ``"fixed"``: k draft nodes every step, shared by the batch (the drafter's joint selection places them);
- ``"per_request"``: k draft nodes every step for each request's tree.

``sssd generate --budget K --budget-mode MODE`` is the same setting. A request's own budget
(``add_request(budget=...)``) overrides the plan for that request in every mode. The older ways are
deprecated and mapped onto it: ``EngineConfig(per_request_budget=True)`` is ``budget_mode="per_request"``,
``EngineConfig(policy=FixedBudget(k))`` is ``budget=k, budget_mode="fixed"``. (``BudgetConfig(mode="fixed")``
is a setting of the adaptive policy itself, for callers that drive it directly: the serving benchmark
compares fixed and adaptive budgets under one policy's admission and records.)
"""

from __future__ import annotations

import warnings
from typing import Any

from sssd.policy.interface import FixedBudget

BUDGET_MODES = ("adaptive", "fixed", "per_request")


def check_budget_mode(budget_mode: Any, per_request_budget: Any = False, policy: Any = None) -> str:
    """The budget mode an engine config asks for (one of ``BUDGET_MODES``); a ValueError for an unknown
    mode, a DeprecationWarning for the older ways of asking for a fixed budget."""
    if budget_mode not in BUDGET_MODES:
        raise ValueError(f"EngineConfig.budget_mode must be one of {BUDGET_MODES}, got {budget_mode!r}")
    if not isinstance(per_request_budget, bool):
        raise ValueError(f"EngineConfig.per_request_budget must be True or False, got {per_request_budget!r}")
    if per_request_budget:
        warnings.warn(
            "EngineConfig(per_request_budget=True) is deprecated: use budget_mode='per_request'",
            DeprecationWarning,
            stacklevel=4,
        )
        budget_mode = "per_request"  # whatever the mode: it always implied a fixed budget per tree
    if type(policy) is FixedBudget:
        warnings.warn(
            "EngineConfig(policy=FixedBudget(k)) is deprecated: use EngineConfig(budget=k, "
            "budget_mode='fixed') (or 'per_request')",
            DeprecationWarning,
            stacklevel=4,
        )
    return budget_mode


def default_policy(budget_mode: str, budget: int, cost_profile: str | None = None) -> Any:
    """The policy an engine runs when ``EngineConfig.policy`` is not given."""
    if budget_mode == "fixed":
        return FixedBudget(int(budget))
    if budget_mode == "per_request":
        return FixedBudget(int(budget), per_request=True)
    if budget_mode != "adaptive":
        raise ValueError(f"budget_mode must be one of {BUDGET_MODES}, got {budget_mode!r}")
    from sssd.policy.adaptive import BudgetConfig, BudgetPolicy
    from sssd.policy.cost_model import CostModel

    cost = CostModel.load(cost_profile) if cost_profile else None
    return BudgetPolicy(BudgetConfig(mode="adaptive", budget=int(budget)), cost)
