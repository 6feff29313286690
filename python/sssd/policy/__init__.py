"""Budget policy: how many tokens the batch speculates each step, and who joins the batch.

Owns the measured cost model of a step (``cost_model``: fitted online, robust least squares in
``robust_fit``; the output head's cost in ``head_cost``, which verification's choice of head calls reads
too), the goodput-optimal global budget and its local exploration as pure functions
(``goodput``), what time-per-output-token targets do to the choice (``slo``: SLO-first re-ranking, the SLO
choice among budgets), admission under those targets (``admission``), the adaptive
policy the engine calls (``adaptive``: ``BudgetPolicy``; its settings ``BudgetConfig`` in ``config``, what
it knows of each request in ``requests``, its ``Decision`` for a step and what it records in ``records``),
the engine-facing interface types, the one record of a step (``StepRecord``) and ``FixedBudget``
(``interface``, with ``PlainDraftBatch``: the drafter contract's fields), the engine's budget modes and
default policy (``budget_mode``: the one way to set a fixed budget), measuring a model's cost profile on
this machine (``profiling``: the caller passes the engines it times, so nothing here imports the engine),
and how busy the machine was while something was timed (``contention``: other processes' CPU time, this
process's, the load average), which the programs that print a speed figure use to say when it is
unreliable.

Imports: numpy, ``sssd.checks``, ``sssd.batch`` (the algebra of a flat batch of draft trees) and
``sssd.fileio`` (atomic profile files); torch only inside ``profiling.machine_meta``. Never the engine,
which imports this package.
"""

from sssd.policy.cost_model import CostModel

__all__ = ["CostModel"]
