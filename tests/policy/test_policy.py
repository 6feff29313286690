"""Budget policy: goodput choice, per-request caps, SLO-first allocation, acceptance check."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sssd.policy.adaptive import BudgetConfig, BudgetPolicy, StepRecord, StepView
from sssd.policy.cost_model import FORWARD_FEATURES, CostModel, tree_pairs_of
from sssd.policy.goodput import (
    accumulated_probs,
    candidate_tree_pairs,
    cap_per_request,
    choose_budget,
    expected_head_levels,
    request_gain_table,
)
from sssd.policy.interface import PlainDraftBatch
from sssd.policy.slo import slo_first

from tests.fake_drafts import FakeDrafter, make_batch


def _view(rids, ctx):
    return StepView(list(rids), list(ctx), [1000] * len(rids), [None] * len(rids))


def chain(n, p):
    return (list(range(n)), [p] * n)  # node j's parent is j (the previous node; 0 = root)


def flat_cost(per_token=1e-4, const=1e-2, draft=0.0):
    """Forward = const + per_token·tokens; no context term; drafting costs ``draft`` per call."""
    return CostModel(forward=(0.0, per_token, const), draft=(0.0, 0.0, draft), verify=(0.0, 0.0, 0.0))


def test_fake_batch_ranks_greedily_across_requests():
    b = make_batch([chain(3, 0.9), chain(3, 0.5)])
    f = accumulated_probs(b)
    np.testing.assert_allclose(f[1:4], [0.9, 0.81, 0.729], rtol=1e-6)
    # greedy by f: 0.9, 0.81, 0.729, then 0.5 of the second request
    assert list(b.rank) == [-1, 0, 1, 2, -1, 3, 4, 5]
    np.testing.assert_allclose(b.gain[:5], [0, 0.9, 1.71, 2.439, 2.939], rtol=1e-6)
    t = b.truncate(4)
    assert list(t.offsets) == [0, 4, 6] and list(t.parents) == [-1, 0, 1, 2, -1, 0]


def test_budget_zero_when_acceptance_is_zero():
    b = make_batch([chain(16, 0.0), chain(16, 0.0)])
    c = choose_budget(b.gain, 2, 100, flat_cost())
    assert c.budget == 0


def test_budget_zero_when_cost_is_steep():
    b = make_batch([chain(16, 0.9)] * 4)
    # each extra token costs as much as the whole step: speculation cannot pay
    c = choose_budget(b.gain, 4, 100, flat_cost(per_token=1e-2, const=1e-3))
    assert c.budget == 0


def test_large_budget_when_it_pays():
    b = make_batch([chain(32, 0.95)] * 2)
    c = choose_budget(b.gain, 2, 100, flat_cost(per_token=1e-6, const=1e-2))
    assert c.budget >= 48
    assert c.goodput[c.budget] > 3 * c.goodput[0]


def test_budget_stops_where_marginal_gain_falls_below_marginal_cost():
    # hand-checked: one request, chain with p = 0.5 → gains 0.5, 0.25, 0.125 ...; cost 0.1 + 0.02 per node
    # goodput(k) = (1 + Σ) / (0.1 + 0.02 (1 + k)): k=0 8.33, k=1 10.71, k=2 10.94, k=3 10.42
    b = make_batch([chain(8, 0.5)])
    c = choose_budget(b.gain, 1, 0, flat_cost(per_token=0.02, const=0.1), min_gain=0.0)
    assert c.budget == 2
    np.testing.assert_allclose(c.goodput[:4], [1 / 0.12, 1.5 / 0.14, 1.75 / 0.16, 1.875 / 0.18])


def test_correction_scales_expected_acceptance():
    b = make_batch([chain(8, 0.9)])
    cost = flat_cost(per_token=0.02, const=0.1)
    assert choose_budget(b.gain, 1, 0, cost, correction=1.0).budget > 0
    assert choose_budget(b.gain, 1, 0, cost, correction=0.01).budget == 0


def test_per_request_cap():
    b = make_batch([chain(6, 0.9), chain(6, 0.2)])
    capped = cap_per_request(b, 2)
    assert len(capped.gain) == 5  # 2 nodes per request
    t = capped.truncate(4)
    assert list(np.diff(t.offsets)) == [3, 3]
    policy = BudgetPolicy(BudgetConfig(mode="fixed", budget=8, max_per_request=2), flat_cost())
    plan = policy.step(FakeDrafter(b), _view([0, 1], [5, 5]))
    assert plan.budget == 4 and list(np.diff(plan.batch.offsets)) == [3, 3]


def test_request_gain_table_matches_truncation():
    b = make_batch([chain(3, 0.9), ([0, 0, 1], [0.6, 0.3, 0.5])])
    table = request_gain_table(b)
    f = accumulated_probs(b)
    for k in range(len(b.gain)):
        t = b.truncate(k)
        expect = [accumulated_probs(t)[t.offsets[i] + 1 : t.offsets[i + 1]].sum() for i in range(2)]
        np.testing.assert_allclose(table[k], expect, atol=1e-9)
    assert table[-1].sum() == pytest.approx(f[b.rank >= 0].sum())


def test_slo_first_serves_short_requests_first():
    # request 0: confident, no target. Request 1: weaker drafts, tight target. Throughput order gives
    # request 0 every node first; SLO order must give request 1 nodes until it meets its target.
    b = make_batch([chain(4, 0.9), chain(4, 0.6)])
    assert list(b.rank[1:5]) == [0, 1, 2, 3]
    step_s = 0.1
    # request 1 needs (1 + Σf) · 0.05 >= 0.1 → Σf >= 1: 0.6 + 0.36 = 0.96 (short), + 0.216 → 1.176 (met)
    r = slo_first(b, step_s, np.array([np.inf, 0.05]))
    assert list(r.rank[6:10]) == [0, 1, 2, 7]  # three nodes of request 1 first, its 4th last
    assert list(r.rank[1:5]) == [3, 4, 5, 6]
    np.testing.assert_allclose(r.gain[1:4], [0.6, 0.96, 1.176], rtol=1e-6)
    # the most short request first among equal priorities; priority overrides shortfall
    b2 = make_batch([chain(2, 0.5), chain(2, 0.5)])
    r2 = slo_first(b2, 0.1, np.array([0.07, 0.06]))  # request 1 is shorter (0.04 vs 0.03 s)
    assert r2.rank[4] == 0
    r3 = slo_first(b2, 0.1, np.array([0.07, 0.06]), priority=np.array([1.0, 0.0]))
    assert r3.rank[1] == 0
    # a request that cannot reach its target (needs Σf >= 2.33, has 0.75) gets no SLO priority
    r4 = slo_first(b2, 0.1, np.array([np.inf, 0.03]))
    np.testing.assert_array_equal(r4.rank, b2.rank)


def test_adaptive_policy_backs_off_when_speculation_does_not_pay():
    b = make_batch([chain(8, 0.0)] * 2)
    drafter = FakeDrafter(b)
    policy = BudgetPolicy(BudgetConfig(max_backoff=4), flat_cost(draft=1e-3))
    budgets = [policy.step(drafter, _view([0, 1], [25, 25])).budget for _ in range(20)]
    assert budgets == [0] * 20
    assert drafter.calls < 10  # probes with back-off instead of proposing every step


def test_adaptive_policy_backs_off_from_a_drafter_whose_own_time_does_not_pay():
    # good trees (p = 0.6) from a drafter that takes as long as a forward: once a tree is drafted it is
    # worth verifying (budget > 0), but drafting at all loses to plain decoding, so the policy stops
    # calling the drafter (probes only); a cheap drafter with the same trees is called every step
    trees = make_batch([chain(8, 0.6)])
    slow, fast = FakeDrafter(trees), FakeDrafter(trees)
    p_slow = BudgetPolicy(BudgetConfig(max_backoff=8), flat_cost(per_token=1e-4, const=1e-2, draft=2e-2))
    p_fast = BudgetPolicy(BudgetConfig(max_backoff=8), flat_cost(per_token=1e-4, const=1e-2, draft=1e-4))
    first = p_slow.step(slow, _view([0], [25]))
    assert first.budget > 0  # the drafted tree is verified
    for _ in range(30):
        p_slow.step(slow, _view([0], [25]))
        p_fast.step(fast, _view([0], [25]))
    assert slow.calls < 10 and fast.calls == 30


def test_adaptive_policy_slo_mode_meets_tight_target():
    b = make_batch([chain(8, 0.9), chain(8, 0.6), chain(8, 0.9)])
    cost = flat_cost(per_token=5e-4, const=0.05)
    policy = BudgetPolicy(BudgetConfig(budget=24, slo_goodput_tolerance=0.2), cost)
    plain = policy.step(FakeDrafter(b), _view([0, 1, 2], [100] * 3))
    policy.set_slo(1, 0.025)
    slo = policy.step(FakeDrafter(b), _view([0, 1, 2], [100] * 3))
    tree1 = slice(slo.batch.offsets[1], slo.batch.offsets[2])
    exp1 = accumulated_probs(slo.batch)[tree1][1:].sum()
    assert slo.predicted_s / (1 + exp1) <= 0.025
    assert slo.choice.goodput[slo.budget] >= 0.8 * plain.choice.goodput.max()


def test_acceptance_check_and_correction():
    b = make_batch([chain(8, 0.9)])
    policy = BudgetPolicy(BudgetConfig(), flat_cost(per_token=1e-3, const=0.05))
    for _ in range(30):
        plan = policy.step(FakeDrafter(b), _view([0], [100]))
        half = plan.expected_accepted / policy.correction / 2
        policy.observe(plan, StepRecord(1, 100, 1 + plan.budget, 64, (half,), forward_s=0.05))
    assert policy.acceptance.ratio == pytest.approx(0.5, rel=0.05)
    assert policy.correction == pytest.approx(0.5, rel=0.1)
    rep = policy.slo_report()
    assert rep[0]["met"] is None and rep[0]["tpot_s"] < 0.05


def test_config_validation():
    with pytest.raises(ValueError):
        BudgetConfig(mode="greedy")
    with pytest.raises(ValueError):
        BudgetConfig(budget=-1)
    with pytest.raises(ValueError):
        BudgetPolicy().set_slo(1, 0.0)
    with pytest.raises(ValueError):
        choose_budget(np.array([]), 1, 0, CostModel())


def test_generic_truncate_matches_fake_batch():
    from sssd.policy.goodput import truncate_batch

    b = make_batch([chain(3, 0.9), ([0, 0, 1], [0.6, 0.3, 0.5]), chain(2, 0.1)])
    # the same fields in the method-less contract type, so truncate_batch cannot defer to b.truncate
    clone = PlainDraftBatch(**{f.name: getattr(b, f.name) for f in dataclasses.fields(b)})
    for k in range(len(b.gain)):
        want, got = b.truncate(k), truncate_batch(clone, k)
        for name in ("tokens", "parents", "probs", "depth", "offsets", "rank"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=f"{name} k={k}")


def test_tree_step_overhead_makes_small_budgets_unattractive():
    b = make_batch([chain(8, 0.5)])
    cheap = CostModel(forward=(0.0, 1e-3, 0.0, 0.1), draft=(0, 0, 0), verify=(0, 0, 0))
    jump = CostModel(forward=(0.0, 1e-3, 0.12, 0.1), draft=(0, 0, 0), verify=(0, 0, 0))
    assert choose_budget(b.gain, 1, 0, cheap).budget > 0
    # a tree step costs 120 ms more than a plain one: at most 2 tokens in 0.23 s < 1 token in 0.1 s
    assert choose_budget(b.gain, 1, 0, jump).budget == 0


def _random_trees(rng, max_nodes: int) -> list:
    """1-4 trees of 0..max_nodes - 1 draft nodes, each node's parent any earlier node (or the root)."""
    trees = []
    for _ in range(int(rng.integers(1, 5))):
        n = int(rng.integers(0, max_nodes))
        trees.append(([int(rng.integers(0, j + 1)) for j in range(n)], list(rng.uniform(0.05, 1.0, n))))
    return trees


def test_candidate_tree_pairs_are_those_of_each_truncated_batch():
    """The pairs the policy prices each candidate budget with are the padded attention's of the trees that
    budget keeps (``tree_pairs_of`` on ``truncate(k)``), for trees of every shape and unequal contexts."""
    rng = np.random.default_rng(5)
    for _ in range(30):
        trees = _random_trees(rng, 10)
        batch = make_batch(trees)
        ctx = rng.integers(0, 500, len(trees))
        pairs = candidate_tree_pairs(batch, ctx)
        assert len(pairs) == len(batch.gain) and pairs[0] == 0.0
        for k in range(len(batch.gain)):
            cut = batch.truncate(k)
            assert pairs[k] == tree_pairs_of(np.diff(np.asarray(cut.offsets)), ctx)
    with pytest.raises(ValueError, match="one entry per request"):
        candidate_tree_pairs(make_batch([chain(3, 0.5)]), [1, 2])


def test_policy_samples_carry_the_verified_trees_pairs():
    """What the cost model learns from: the step's own tree attention pairs, from the trees the policy kept
    and the requests' contexts (a plain step: none)."""
    batch = make_batch([chain(6, 0.9), chain(2, 0.5)])
    policy = BudgetPolicy(BudgetConfig(mode="fixed", budget=6), flat_cost())
    drafted = policy.step(FakeDrafter(batch), _view([0, 1], [100, 300]))
    # a decision is a value: deciding another step in between changes nothing of this one's feedback
    plain = policy.decide(_view([0, 1], [101, 301]), None)  # a step without drafts
    sizes = np.diff(np.asarray(drafted.batch.offsets))
    policy.observe(drafted, StepRecord(2, 400, int(sizes.sum()), 6, (0, 0), forward_s=0.05))
    x = policy.cost.forward._xs[-1]
    assert x[FORWARD_FEATURES.index("tree_attention")] == tree_pairs_of(sizes, [100, 300]) > 0
    policy.observe(plain, StepRecord(2, 402, 2, 0, (0, 0), forward_s=0.04))
    assert policy.cost.forward._xs[-1][FORWARD_FEATURES.index("tree_attention")] == 0.0
    assert [k for _, k in policy.history] == [drafted.budget, 0] and drafted.budget == 6


def test_the_same_view_and_batch_give_the_same_decision():
    """``decide`` consumes nothing that ``observe`` needs: deciding twice gives equal decisions."""
    batch = make_batch([chain(6, 0.9), chain(3, 0.5)])
    policy = BudgetPolicy(BudgetConfig(mode="fixed", budget=5), flat_cost())
    a, b = (policy.decide(_view([0, 1], [100, 300]), batch) for _ in range(2))
    assert (a.budget, a.expected_accepted, a.predicted_s, a.tree_pairs, a.request_ids) == (
        b.budget, b.expected_accepted, b.predicted_s, b.tree_pairs, b.request_ids
    )  # fmt: skip
    np.testing.assert_array_equal(a.predicted_per_request, b.predicted_per_request)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.budget = 3


def test_expected_head_levels_is_the_expected_longest_accepted_path():
    """Two requests with chains of p = 0.5 and 0.8: at each budget the expected longest accepted path (the
    output-head calls the verification walk makes beyond the first) equals a Monte Carlo estimate; a
    request's siblings at one depth add up (one of them at most is on the path)."""
    batch = make_batch([chain(4, 0.5), chain(4, 0.8)])
    levels = expected_head_levels(batch)
    rng = np.random.default_rng(0)
    kept_depths = [np.zeros(2, dtype=int)]
    rank, offsets = np.asarray(batch.rank), np.asarray(batch.offsets)
    for k in range(1, len(batch.gain)):
        cut = np.zeros(2, dtype=int)
        for r in range(2):
            mine = np.arange(offsets[r], offsets[r + 1])
            cut[r] = int(np.sum((rank[mine] >= 0) & (rank[mine] < k)))
        kept_depths.append(cut)
    u = rng.random((20000, 2, 4))
    for k, cut in enumerate(kept_depths):
        acc = []  # accepted depth of each draw: the first edge that fails, at most the kept chain
        for r, p in enumerate((0.5, 0.8)):
            fails = np.concatenate([u[:, r, :] >= p, np.ones((len(u), 1), bool)], axis=1)
            acc.append(np.minimum(np.argmax(fails, axis=1), cut[r]))
        assert levels[k] == pytest.approx(np.maximum(*acc).mean(), abs=0.03)
    assert levels[0] == 0.0 and np.all(np.diff(levels) >= 0)
    star = make_batch([([0, 0, 0], [0.3, 0.3, 0.3])])  # three siblings: depth 1 reached with 0.9
    assert expected_head_levels(star)[-1] == pytest.approx(0.9)
    assert expected_head_levels(star, [2.0])[-1] == pytest.approx(1.0)  # a probability, at most 1


def test_expected_head_levels_matches_the_product_formula_on_random_trees():
    """The one-pass update equals Σ_d (1 - Π_r (1 - P_r(d))) computed afresh for every budget."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        trees = _random_trees(rng, 12)
        batch = make_batch(trees)
        scale = rng.uniform(0.5, 3.0, len(trees))
        got = expected_head_levels(batch, scale)
        f = accumulated_probs(batch)
        rank, depth = np.asarray(batch.rank), np.asarray(batch.depth)
        tree = np.repeat(np.arange(len(trees)), np.diff(np.asarray(batch.offsets)))
        for k in range(len(batch.gain)):
            kept = (rank >= 0) & (rank < k)
            want = 0.0
            for d in range(1, int(depth.max(initial=0)) + 1):
                p = [min(1.0, float(np.sum((f * scale[tree])[kept & (tree == r) & (depth == d)])))
                     for r in range(len(trees))]  # fmt: skip
                want += 1.0 - float(np.prod([1.0 - x for x in p]))
            assert got[k] == pytest.approx(want, abs=1e-9)


def test_a_step_has_one_record_with_one_name_per_phase():
    step = StepRecord(2, 10, 5, 3, (1, 0), draft_s=0.1, forward_s=0.2, head_s=0.05, verify_s=0.3)
    assert step.step_s == pytest.approx(0.6) and step.draft_budget == 3
    assert StepRecord(2, 10, 2, [4, 5]).draft_budget == 9 and StepRecord(2, 10, 2, [4, 5]).budget == (4, 5)
    with pytest.warns(DeprecationWarning, match="forward_s"):
        assert step.forward_time == 0.2  # the name before one name per phase
    with pytest.raises(AttributeError):
        _ = step.other_s
    with pytest.raises(ValueError, match="inconsistent"):
        StepRecord(2, 10, 1)  # fewer scored tokens than requests
    with pytest.raises(ValueError, match="one entry per request"):
        StepRecord(2, 10, 2, accepted=(1,))
