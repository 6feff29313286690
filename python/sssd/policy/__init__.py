"""Budget policy: how many tokens the batch speculates each step, and who joins the batch.

Owns the measured cost model of a step (``cost_model``: fitted online, robust least squares in
``robust_fit``), the goodput-optimal global budget, its local exploration and SLO-first re-ranking as pure
functions (``goodput``), admission under time-per-output-token targets (``admission``), the policies the
engine calls (``adaptive``: ``BudgetConfig``, ``BudgetPolicy``; what they record in ``records``), the
engine-facing interface types and ``FixedBudget`` (``interface``), and measuring a model's cost profile on
this machine (``profiling``).

May import: numpy, ``sssd.fileio``; ``profiling`` alone runs the engine (torch) to measure it.
"""

from sssd.policy.cost_model import CostModel

__all__ = ["CostModel"]
