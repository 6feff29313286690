"""SLO-aware admission: priority order, holding requests back for running TPOT targets, FIFO without SLOs."""

from __future__ import annotations

import numpy as np
import pytest
from sssd.policy.adaptive import AdmitView, BudgetConfig, BudgetPolicy, StepRecord, StepView, fifo
from sssd.policy.admission import Candidate, RunningState, admission_order, admit_with_slo, projected_tpot
from sssd.policy.cost_model import CostModel


def fixed_cost():
    """Forward = 0.5 s + 0.1 s per token scored; nothing else; pinned (online samples do not move it).
    So a plain step of b requests takes 0.5 + 0.1·b and a prompt of P tokens prefills in 0.5 + 0.1·(P-1)."""
    return CostModel(forward=(0.0, 0.1, 0.5), draft=(0, 0, 0), verify=(0, 0, 0), prior_weight=1e12)


def running_policy(target=None, steps=10, **config):
    """A policy whose batch is request 0 after ``steps`` plain steps of 0.6 s, one token each."""
    config.setdefault("slo_admit_margin", 1.0)  # the hand-checked numbers below are exact targets
    policy = BudgetPolicy(BudgetConfig(budget=0, **config), fixed_cost())
    if target is not None:
        policy.set_slo(0, target, priority=1.0)
    view = StepView([0], [10], [10], [None])
    for _ in range(steps):
        policy.plan(view)
        policy.observe(policy.decide(view, None), StepRecord(1, 10, 1, 0, (0,), forward_s=0.6))
    return policy


def admit_view(waiting=(1,), prompt=3, limit=10, running_left=10):
    w = list(waiting)
    return AdmitView(w, [prompt] * len(w), [limit] * len(w), StepView([0], [10], [running_left], [None]), 15)


def test_admission_order_is_priority_then_fifo():
    assert admission_order([0.0, 1.0, 0.0, 1.0, 2.0]) == [4, 1, 3, 0, 2]
    assert admission_order([0.0, 0.0, 0.0]) == [0, 1, 2]


def test_without_targets_admission_is_fifo():
    policy = running_policy()
    view = AdmitView([5, 3, 9], [3, 3, 3], [10] * 3, StepView([0], [10], [10], [None]), 2)
    assert policy.admit(view) == fifo(view) == [5, 3]


def test_relaxed_request_waits_while_it_would_push_a_tight_one_over():
    # Request 0: 10 tokens in 6 s so far, 10 to go at 0.6 s per step alone: TPOT 0.6 s exactly. Admitting
    # request 1 (a 3-token prompt) stalls it 0.7 s (prefill of 2 tokens) and makes every step 0.7 s:
    # (6 + 0.7 + 10·0.7) / 20 = 0.685 s per token.
    policy = running_policy(target=0.6)
    assert policy.admit(admit_view()) == []
    assert running_policy(target=0.69).admit(admit_view()) == [1]
    assert running_policy(target=None).admit(admit_view()) == [1]
    run = RunningState(*(np.array([x]) for x in (0.6, 1.0, 6.0, 10, 10, 1.0, 10)))
    assert projected_tpot(run, fixed_cost(), 0.0) == pytest.approx(0.6)


def test_a_request_that_misses_anyway_is_not_protected():
    # 10 tokens took 20 s: even alone (0.6 s per token from now) its TPOT is (20 + 6) / 20 = 1.3 s > 1 s
    policy = BudgetPolicy(BudgetConfig(budget=0, slo_admit_margin=1.0), fixed_cost())
    policy.set_slo(0, 1.0, priority=1.0)
    for _ in range(10):
        policy.plan(StepView([0], [10], [10], [None]))
        policy.observe(
            policy.decide(StepView([0], [10], [10], [None]), None),
            StepRecord(1, 10, 1, 0, (0,), forward_s=2.0),
        )
    assert policy.admit(admit_view()) == [1]


def test_tight_request_goes_first_and_waits_until_it_can_meet_its_target():
    policy = running_policy(target=None)  # request 0 has no target
    policy.set_slo(2, 0.5, priority=1.0)  # cannot be met: a step with two requests takes 0.7 s
    policy.set_slo(3, 0.8, priority=1.0)
    assert policy.admit(admit_view(waiting=(1, 2))) == []  # 2 waits, and 1 behind it
    # 3 meets 0.8 s with request 0 (0.7 s steps); 1 would stall it 0.7 s and make steps 0.8 s:
    # (0.7 + 10·0.8) / 10 = 0.87 s per token
    assert policy.admit(admit_view(waiting=(1, 3))) == [3]
    policy.set_slo(3, 0.9, priority=1.0)
    assert policy.admit(admit_view(waiting=(1, 3))) == [3, 1]


def test_max_defer_admits_anyway():
    policy = running_policy(target=0.6, slo_max_defer=2)
    assert [policy.admit(admit_view()) for _ in range(3)] == [[], [], [1]]


def test_empty_batch_always_admits():
    cost = fixed_cost()
    run = RunningState(*(np.zeros(0) for _ in range(7)))
    cands = [Candidate(1, 3, 10.0), Candidate(2, 3, 10.0, priority=1.0)]
    got = admit_with_slo(run, cands, {2: 0.01}, 1, cost, nodes_per_request=0.0, default_rate=1.0)
    assert got == [2]


def test_prefill_stalls_count_for_running_requests_only():
    policy = BudgetPolicy(BudgetConfig(budget=0), fixed_cost())
    policy.plan(StepView([0], [10], [10], [None]))
    policy.observe(
        policy.decide(StepView([0], [10], [10], [None]), None),
        StepRecord(1, 10, 1, 0, (0,), forward_s=0.6),
    )
    policy.plan(StepView([0, 1], [11, 3], [10, 10], [None, None]))
    policy.observe(
        policy.decide(StepView([0, 1], [11, 3], [10, 10], [None, None]), None),
        StepRecord(2, 14, 2, 0, (0, 0), forward_s=0.7, prefill_s=0.7),
    )
    rep = policy.slo_report()
    assert rep[0]["tpot_s"] == pytest.approx((0.6 + 0.7 + 0.7) / 2)
    assert rep[1]["tpot_s"] == pytest.approx(0.7)  # its own prefill is before its first token


def test_expected_remaining_from_finished_lengths():
    policy = BudgetPolicy(BudgetConfig(budget=0, length_samples=8), fixed_cost())
    rid = 0
    for n in [4] * 4 + [20] * 4:
        for _ in range(n):
            policy.plan(StepView([rid], [10], [100], [None]))
            policy.observe(
                policy.decide(StepView([rid], [10], [100], [None]), None),
                StepRecord(1, 10, 1, 0, (0,), forward_s=0.6),
            )
        policy.remove_request(rid)
        rid += 1
    got = policy.requests.expected_remaining(np.array([0, 5]), [100, 100])
    np.testing.assert_allclose(got, [12.0, 100.0])  # mean of 4,4,4,4,20,20,20,20; too few past 5
    np.testing.assert_allclose(policy.requests.expected_remaining(np.array([0]), [10]), [7.0])  # capped at 10


@pytest.mark.parametrize(("tolerance", "want"), [(1.0, []), (0.5, []), (0.3, [1])])
def test_admit_tolerance_bounds_the_batch_held_back(tolerance, want):
    # requests per second of step time: 1 / 0.6 = 1.67 alone, 2 / 0.7 = 2.86 with request 1. Within 50%
    # the batch of one may be held; within 30% it may not (1.67 < 0.7 · 2.86), so 1 joins anyway.
    policy = running_policy(target=0.6, slo_admit_margin=1.0, slo_admit_tolerance=tolerance)
    assert policy.admit(admit_view()) == want
