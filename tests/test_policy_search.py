"""The adaptive policy finds the best budget: on synthetic forward-cost curves of real shapes (a CPU in
float32, a CPU with bfloat16 matrix units, a GPU, a forward too steep for speculation) and drafters whose
trees vary from step to step, its goodput reaches that of the best fixed budget (0, 4, 8, 16, 32), on the
same seeded acceptance draws and timing noise (``tests/policy_sim.py``). Deterministic: no wall clock."""

from __future__ import annotations

import numpy as np
import pytest
from sssd.policy.adaptive import BudgetConfig, BudgetPolicy
from sssd.policy.goodput import BudgetChoice, explore_budget

from tests.fake_drafts import make_batch
from tests.policy_sim import piecewise, run_policy

MS = 1e-3
CURVES = {  # forward seconds by scored tokens (batch 1, context 300), measured shapes of this project's CPU
    "cpu-float32": piecewise(
        {1: 52 * MS, 2: 56 * MS, 4: 80 * MS, 8: 97 * MS, 16: 102 * MS, 32: 122 * MS, 64: 173 * MS}
    ),
    "cpu-bfloat16": piecewise({1: 50 * MS, 16: 52 * MS, 32: 62 * MS, 64: 82 * MS}, tree_s=1 * MS),
    "gpu": piecewise({1: 10 * MS, 64: 10.6 * MS}),
    "steep": piecewise({1: 50 * MS, 64: 50 * MS + 63 * 12 * MS}),
}


def chain(n, p):
    return (list(range(n)), [p] * n)


def varied(batch_size: int, n: int = 40, seed: int = 0, empty: float = 0.35):
    """``n`` batches: each request's tree is empty (the drafter found nothing) with probability ``empty``,
    else a chain of 3..40 nodes with p in [0.3, 0.95]."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        trees = []
        for _ in range(batch_size):
            if rng.random() < empty:
                trees.append(([], []))
            else:
                trees.append(chain(int(rng.integers(3, 41)), float(rng.uniform(0.3, 0.95))))
        out.append(make_batch(trees))
    return out


def _rate(policy, curve, batches, steps):
    _, tokens, seconds = run_policy(policy, curve, batches, steps, seed=1)
    return tokens.sum() / seconds.sum()


@pytest.mark.parametrize("curve", sorted(CURVES))
@pytest.mark.parametrize("drafts", ["varied-1", "varied-4", "steady-1"])
def test_adaptive_reaches_the_best_fixed_budget(curve, drafts):
    batches = {
        "varied-1": varied(1),
        "varied-4": varied(4),
        "steady-1": [make_batch([chain(40, 0.8)])],
    }[drafts]
    steps = 160  # a short run: the policy's warm-up counts
    fixed = {k: _rate(BudgetPolicy(BudgetConfig(mode="fixed", budget=k)), CURVES[curve], batches, steps)
             for k in (0, 4, 8, 16, 32)}  # fmt: skip
    adaptive = _rate(BudgetPolicy(BudgetConfig(budget=32)), CURVES[curve], batches, steps)
    best = max(fixed, key=fixed.get)
    assert adaptive >= 0.95 * fixed[best], f"adaptive {adaptive:.1f} tok/s, fixed {best}: {fixed[best]:.1f}"


def test_a_cheap_drafter_is_kept_through_steps_where_it_finds_nothing():
    """A drafter that costs 0.4% of a step and finds nothing on a third of the steps is asked every step:
    backing off after an empty step would skip the next steps where it finds something."""
    batches = varied(1, seed=3)
    calls = []
    policy = BudgetPolicy(BudgetConfig(budget=32))
    plan = policy.plan
    policy.plan = lambda view: calls.append(plan(view)) or calls[-1]
    run_policy(policy, CURVES["cpu-bfloat16"], batches, 120, seed=1)
    assert sum(k > 0 for k in calls) == len(calls)


def test_exploration_schedule():
    """Every ``every``-th drafted step halves the choice (or verifies nothing when a plain step is due), the
    next exploration step takes one and a half times it, capped by the batch."""
    gp = np.linspace(1.0, 2.0, 33)
    choice = BudgetChoice(12, 3.0, 0.05, gp, np.full(33, 0.05))
    gain = np.arange(33) * 0.1
    assert explore_budget(choice, gain, 1.0, tick=3, every=8) is choice
    assert explore_budget(choice, gain, 1.0, tick=16, every=8).budget == 12 // 2
    assert explore_budget(choice, gain, 1.0, tick=16, every=8, plain=True).budget == 0
    # warm-up: every other step, down and up in turn
    ks = [explore_budget(choice, gain, 1.0, tick=t, every=8, warmup=4).budget for t in range(1, 7)]
    assert ks == [12, 18, 12, 6, 12, 12]
    up = explore_budget(choice, gain, 2.0, tick=8, every=8)
    assert up.budget == 18 and up.expected_accepted == pytest.approx(2.0 * 1.8)
    big = BudgetChoice(30, 3.0, 0.05, gp, np.full(33, 0.05))
    assert explore_budget(big, gain, 1.0, tick=24, every=8).budget == 32
    assert explore_budget(choice, gain, 1.0, tick=8, every=0) is choice
