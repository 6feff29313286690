"""The output head's cost, one model (``sssd.policy.head_cost.HeadCost``): verification's choice of head
calls and the cost model's price of a step's head read the same measured calls."""

from __future__ import annotations

import numpy as np
import pytest
from sssd.policy.cost_model import CostModel
from sssd.policy.head_cost import HeadCost
from sssd.policy.interface import StepRecord


def test_calls_are_averaged_by_rows_and_an_unmeasured_size_costs_the_largest_smaller_one():
    head = HeadCost()
    assert not head.measured and head.estimate(4) is None and float(head.step_s(4, 3.0)) == 0.0
    head.record(5, 0.008)
    head.record(7, 0.004)  # same bucket (8): the newest weighs a quarter
    head.record(0, 1.0)
    head.record(3, float("nan"))  # nothing to learn from either
    assert head.cost == {8: pytest.approx(0.007)} and head.measured
    assert head.estimate(20) == pytest.approx(0.007) and head.estimate(2) is None
    # a step's head: one call for the first level, one per expected level beyond it
    np.testing.assert_allclose(head.step_s(8, [0.0, 1.5]), [0.007, 0.0175])


def test_all_rows_at_once_where_rows_are_free_one_level_at_a_time_where_they_are_dear():
    flat, steep = HeadCost(reprobe=0), HeadCost(reprobe=0)
    flat.cost = {1 << i: 1.0 for i in range(8)}
    steep.cost = {1 << i: 10.0**i for i in range(8)}
    assert flat.all_at_once(1, 17) and not steep.all_at_once(1, 17)
    assert not flat.all_at_once(4, 4)  # nothing more to ask for
    assert not HeadCost().all_at_once(1, 17)  # no call measured yet: one level first
    probing = HeadCost(reprobe=4)  # a refused size is measured again now and then
    probing.cost = dict(steep.cost)
    assert [probing.all_at_once(1, 17) for _ in range(8)] == [False, False, False, True] * 2
    for _ in range(200):
        flat.level(True)
    assert flat.p_continue > 0.9


def test_the_cost_model_prices_the_head_it_measured_and_fits_the_rest_of_the_forward():
    """Steps that report their head's time: the head's calls go to HeadCost, the forward's fit sees the
    forward without them, and a prediction adds the head's calls back (one per expected level)."""
    cm = CostModel(prior_weight=0.0)
    for k in range(0, 33, 4):
        levels = k // 8
        head_s = 0.004 * (1 + levels)
        step = StepRecord(1, 300, 1 + k, k, (levels,), forward_s=0.05 + 0.001 * k + head_s, head_s=head_s)
        for _ in range(4):
            cm.observe(step)
    cm.forward.refit()
    assert cm.head.estimate(1) == pytest.approx(0.004)
    body = cm.predict(1, 300, [0, 16], drafted=False, tree_pairs=0.0).forward
    with_head = cm.predict(1, 300, [0, 16], drafted=False, tree_pairs=0.0, head_levels=[0.0, 2.0]).forward
    np.testing.assert_allclose(with_head - body, [0.0, 0.008], atol=1e-9)
    assert float(with_head[1]) == pytest.approx(0.05 + 0.016 + 0.004 * 3, rel=0.02)


def test_a_profile_keeps_the_heads_calls_and_rejects_bad_ones(tmp_path):
    cm = CostModel()
    cm.head.record(4, 0.003)
    cm.save(tmp_path / "p.json")
    assert CostModel.load(tmp_path / "p.json").head.cost == {4: pytest.approx(0.003)}
    with pytest.raises(ValueError, match="head"):
        HeadCost.from_dict({"rows": [4], "call_s": [-1.0]})
    with pytest.raises(ValueError, match="head"):
        HeadCost.from_dict({"rows": [4, 8], "call_s": [0.1]})


def test_a_step_is_priced_by_the_rows_it_asks_for_when_calls_are_recorded_by_rows():
    """Calls measured by their own rows: a candidate costs one call of B rows per level or one call of all
    B + k rows, whichever is cheaper (verification's choice), or that one call where every row is asked
    for; without the nodes, one call per level as before."""
    head = HeadCost()
    for rows, ms in ((1, 8.0), (2, 8.5), (4, 9.0), (8, 11.0), (16, 20.0)):
        head.record(rows, ms)
    levels, nodes = [0.0, 0.5, 2.0, 0.1], [0, 3, 7, 15]
    np.testing.assert_allclose(head.step_s(1, levels), [8.0, 12.0, 24.0, 8.8])
    np.testing.assert_allclose(head.step_s(1, levels, nodes), [8.0, 9.0, 11.0, 8.8])
    np.testing.assert_allclose(head.step_s(1, levels, nodes, one_call=True), [8.0, 9.0, 11.0, 20.0])
    np.testing.assert_allclose(head.step_s(2, 0.0, [0, 30], one_call=True), [8.5, 20.0])  # 32 rows: 16's


def test_a_shared_head_is_recorded_by_its_calls_and_priced_by_its_rows():
    """share_head: observe leaves the head's calls to the head (recorded where they are made), and a
    prediction prices each candidate by the rows its step asks for."""
    steps = [
        StepRecord(1, 300, 1 + k, k, (k // 4,), forward_s=0.05 + 0.001 * k + 0.01, head_s=0.01, head_calls=1)
        for k in range(0, 17, 4)
    ]
    apart, shared = CostModel(prior_weight=0.0), CostModel(prior_weight=0.0)
    head = shared.share_head()
    assert head is shared.head and shared.head_per_call and not shared.head_one_call
    for rows, s in ((1, 0.008), (8, 0.011), (16, 0.02)):
        head.record(rows, s)
    for cm in (apart, shared):
        for _ in range(4):
            cm.fit(steps)
    assert shared.head.cost == {1: 0.008, 8: 0.011, 16: 0.02}  # observe added nothing
    assert apart.head.cost == {1: pytest.approx(0.01)}  # a step's head time, as calls of one row
    kw = dict(drafted=False, tree_pairs=0.0, head_levels=[0.0, 2.0, 0.5])
    ks = [0, 7, 15]
    # the same forward fitted without the head; the heads: (1 + levels) x 0.01 apart, and shared
    # 0.008 | min(0.011, 3 x 0.008) | min(0.02, 1.5 x 0.008)
    diff = shared.predict(1, 300, ks, **kw).forward - apart.predict(1, 300, ks, **kw).forward
    np.testing.assert_allclose(diff, [0.008 - 0.01, 0.011 - 0.03, 0.012 - 0.015], atol=1e-9)
    every = CostModel(prior_weight=0.0)
    every.share_head(head, one_call=True)
    assert every.head is head and every.head_one_call
    got = every.head.step_s(1, [0.0, 2.0, 0.5], [0, 7, 15], one_call=True)
    np.testing.assert_allclose(got, [0.008, 0.011, 0.02])


@pytest.mark.parametrize("measured", [(1, 2, 4, 8, 16), (8,), (2, 32)])
def test_a_step_of_all_rows_costs_what_estimate_says_of_its_rows(measured):
    head = HeadCost()
    for i, rows in enumerate(measured):
        head.record(rows, 0.001 * (i + 3))
    for b in (1, 2, 3, 5, 8):
        ks = np.arange(0, 80)
        want = [head.estimate(b + k) or (head.estimate(b) or 0.0) for k in ks]
        np.testing.assert_allclose(head.step_s(b, 0.0, ks, one_call=True), want)
        per_level = (head.estimate(b) or 0.0) * 1.5
        np.testing.assert_allclose(head.step_s(b, 0.5, ks), np.minimum(want, per_level))
