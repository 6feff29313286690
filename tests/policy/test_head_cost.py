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
