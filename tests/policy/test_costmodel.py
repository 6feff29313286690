"""Cost model: robust fitting recovers known coefficients; online refresh; profiles round-trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sssd.policy.cost_model import (
    KNOTS,
    CostModel,
    huber_irls,
    tree_pairs_estimate,
    tree_pairs_of,
)
from sssd.policy.interface import StepRecord


def _synthetic(rng, n, coef, outlier_frac=0.1):
    x = np.column_stack([rng.integers(0, 20000, n), rng.integers(1, 600, n), np.ones(n)]).astype(float)
    y = x @ coef + rng.normal(0, 1e-4, n)
    bad = rng.random(n) < outlier_frac
    y[bad] += rng.uniform(0.05, 0.5, bad.sum())  # a GC pause or a noisy neighbour: always slower
    return x, y


def test_huber_recovers_coefficients_with_outliers():
    rng = np.random.default_rng(0)
    coef = np.array([3e-7, 4e-5, 8e-3])
    x, y = _synthetic(rng, 400, coef)
    got = huber_irls(x, y)
    np.testing.assert_allclose(got, coef, rtol=0.05)
    # ordinary least squares is dragged by the outliers (sanity check that the test has teeth)
    ols, *_ = np.linalg.lstsq(x, y, rcond=None)
    assert abs(ols[2] - coef[2]) > 5 * abs(got[2] - coef[2])


def test_huber_clamps_negative_coefficients():
    rng = np.random.default_rng(1)
    x = np.column_stack([rng.random(100), np.ones(100)])
    y = -0.5 * x[:, 0] + 1.0  # the true slope is negative: clamp it to 0 and refit the intercept
    got = huber_irls(x, y)
    assert got[0] == 0.0 and got[1] == pytest.approx(0.75, abs=0.05)


def test_huber_rejects_bad_shapes():
    with pytest.raises(ValueError):
        huber_irls(np.ones((3, 2)), np.ones(4))
    with pytest.raises(ValueError):
        huber_irls(np.ones((0, 2)), np.ones(0))


def _timings(rng, n, fwd, drf, oth, outliers=0.1):
    out = []
    for _ in range(n):
        b = int(rng.integers(1, 33))
        k = int(rng.choice([0, 8, 16, 32, 64, 128]))
        ctx = int(b * rng.integers(50, 2000))
        nb = b + k
        slow = rng.random() < outliers
        out.append(
            StepRecord(
                batch_size=b,
                context_tokens=ctx,
                num_nodes=nb,
                budget=k,
                forward_s=fwd[0] * ctx + fwd[1] * nb + fwd[2] * (k > 0) + fwd[3] + (0.2 if slow else 0.0),
                draft_s=drf[0] * b + drf[1] * k + drf[2] if k else 0.0,
                verify_s=oth[0] * b + oth[1] * nb + oth[2],
            )
        )
    return out


def test_cost_model_fit_recovers_all_parts():
    rng = np.random.default_rng(2)
    fwd, drf, oth = (2e-7, 3e-4, 4e-3, 1e-2), (4e-5, 2e-6, 1e-4), (2e-5, 1e-6, 3e-4)
    cm = CostModel(prior_weight=0.0).fit(_timings(rng, 300, fwd, drf, oth))
    f = cm.forward.coef  # [n_context, one slope per token segment, tree, const]
    seen = np.array(KNOTS[1:]) <= 32 + 128  # segments the samples cover (up to 32 requests + 128 nodes)
    np.testing.assert_allclose(f[1 : 1 + seen.sum()], fwd[1], rtol=0.05)
    # the first token's share of the line goes into the constant: g(1) = 0
    np.testing.assert_allclose(f[[0, -2, -1]], [fwd[0], fwd[2], fwd[3] + fwd[1]], rtol=0.05)
    np.testing.assert_allclose(cm.draft.coef, drf, rtol=0.05)
    np.testing.assert_allclose(cm.verify.coef, oth, rtol=0.05)
    c = cm.predict(4, 4000, [0, 16])
    assert c.draft[0] == 0.0 and c.draft[1] > 0
    assert c.forward[1] - c.forward[0] == pytest.approx(16 * fwd[1] + fwd[2], rel=0.05)
    assert c.total[1] > c.total[0]


def test_online_refresh_tracks_a_changed_machine():
    rng = np.random.default_rng(3)
    cm = CostModel(forward=(2e-7, 3e-4, 0.0, 1e-2), window=128, forget=0.97)
    # the machine gets twice as slow: the window forgets the old regime
    new = (4e-7, 6e-4, 5e-3, 2e-2)
    steps = _timings(rng, 200, new, (0, 0, 0), (0, 0, 0), outliers=0.05)
    for t in steps:
        cm.observe(t)
    # the step shapes of the recent window are predicted at the new machine's times (a token count the
    # window never saw keeps what the old regime or the prior says: the model has one slope per range)
    err = [
        float(cm.predict(t.batch_size, t.context_tokens, t.num_nodes - t.batch_size).forward)
        / (new[0] * t.context_tokens + new[1] * t.num_nodes + new[2] * (t.num_nodes > t.batch_size) + new[3])
        - 1
        for t in steps[-64:]
    ]
    assert np.median(np.abs(err)) < 0.05 and np.percentile(np.abs(err), 90) < 0.1


def test_prior_holds_unexcited_directions():
    # every sample has budget 0: the budget slope of the draft part cannot be learned, keep the seed
    cm = CostModel(forward=(1e-7, 5e-4, 1e-2), prior_weight=8.0)
    for b in range(1, 40):
        cm.observe(StepRecord(b, 100 * b, b, 0, forward_s=1e-7 * 100 * b + 5e-4 * b + 1e-2))
    cm.forward.refit()
    assert cm.forward.coef[1] == pytest.approx(5e-4, rel=0.1)


def test_profile_round_trip(tmp_path):
    cm = CostModel(forward=(1e-7, 2e-4, 3e-3), draft=(1e-5, 1e-6, 2e-5), verify=(1e-5, 0.0, 1e-4))
    p = tmp_path / "p.json"
    cm.save(p, extra={"samples": []})
    back = CostModel.load(p)
    np.testing.assert_allclose(back.forward.coef, cm.forward.coef)
    np.testing.assert_allclose(back.draft.coef, cm.draft.coef)
    assert json.loads(p.read_text())["version"] == 4
    with pytest.raises(FileNotFoundError):
        CostModel.load(tmp_path / "missing.json")
    old = json.loads(p.read_text())  # a profile from before the verify part had its name still loads
    old["version"], old["other"] = 3, old.pop("verify")
    (tmp_path / "v3.json").write_text(json.dumps(old))
    np.testing.assert_allclose(CostModel.load(tmp_path / "v3.json").verify.coef, cm.verify.coef)
    del old["forward"]["tree"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert CostModel.load(tmp_path / "old.json").forward.coef[-2] == 0.0
    del old["forward"]["tree_attention"]  # nor the tree attention term (version 2)
    old["version"] = 2
    (tmp_path / "v2.json").write_text(json.dumps(old))
    assert CostModel.load(tmp_path / "v2.json").forward.coef[-3] == 0.0
    other_knots = json.loads(p.read_text())
    other_knots["forward"]["knots"] = [1, 4, 16]
    (tmp_path / "knots.json").write_text(json.dumps(other_knots))
    with pytest.raises(ValueError, match="knots"):
        CostModel.load(tmp_path / "knots.json")
    (tmp_path / "bad.json").write_text('{"version": 1, "forward": {}}')
    with pytest.raises(ValueError):
        CostModel.load(tmp_path / "bad.json")


def test_observe_rejects_inconsistent_steps():
    cm = CostModel()
    with pytest.raises(ValueError):
        cm.observe(StepRecord(batch_size=4, context_tokens=10, num_nodes=2, budget=0, forward_s=0.01))


def test_version_1_profile_loads_with_the_same_predictions(tmp_path):
    """A profile of the single-slope model (version 1) predicts exactly what it did."""
    v1 = {
        "version": 1,
        "meta": {},
        "forward": {"n_context": 2e-7, "n_batched": 3e-4, "tree": 4e-3, "const": 1e-2},
        "draft": {"batch_size": 1e-5, "budget": 1e-6, "const": 2e-5},
        "other": {"batch_size": 1e-5, "n_batched": 0.0, "const": 1e-4},
    }
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    cm = CostModel.load(tmp_path / "v1.json")
    for b, ctx, k in ((1, 300, 0), (1, 300, 16), (4, 4000, 64), (8, 100, 600)):
        want = 2e-7 * ctx + 3e-4 * (b + k) + 4e-3 * (k > 0) + 1e-2
        assert float(cm.predict(b, ctx, k).forward) == pytest.approx(want, rel=1e-9)


def _curve_samples(curve, rng, n=400, outliers=0.05):
    """Forward samples at batch 1, context 300, tree sizes 0..64, from ``curve(n_batched)`` seconds."""
    out = []
    for _ in range(n):
        k = int(rng.integers(0, 65))
        t = curve(1 + k) * float(np.exp(rng.normal(0, 0.02))) + (0.1 if rng.random() < outliers else 0.0)
        out.append(StepRecord(1, 300, 1 + k, k, forward_s=t))
    return out


@pytest.mark.parametrize(
    "points",
    [
        {1: 0.050, 16: 0.052, 32: 0.062, 64: 0.082},  # bfloat16 on AMX: flat to ~16 tokens, then rising
        {
            1: 0.052,
            2: 0.056,
            4: 0.080,
            8: 0.097,
            16: 0.102,
            32: 0.122,
            64: 0.173,
        },  # float32: a jump, then slow
    ],
)
def test_token_cost_follows_a_curve_a_line_cannot(points):
    ns, ts = np.array(sorted(points), dtype=float), np.array([points[k] for k in sorted(points)])
    curve = lambda n: float(np.interp(n, ns, ts))  # noqa: E731
    cm = CostModel(prior_weight=0.0).fit(_curve_samples(curve, np.random.default_rng(4)))
    sizes = np.arange(0, 65)
    pred = cm.predict(1, 300, sizes, drafted=False).forward
    true = np.array([curve(1 + k) for k in sizes])
    assert np.max(np.abs(pred / true - 1)) < 0.03
    # the design's single line through the same samples misses by far more somewhere (the test has teeth)
    x = np.column_stack([1 + sizes, np.ones_like(sizes)]).astype(float)
    line = x @ np.linalg.lstsq(x, true, rcond=None)[0]
    assert np.max(np.abs(line / true - 1)) > 0.06


def test_default_prior_is_scaled_to_the_machine():
    """The built-in prior gives a shape (4% of a step per token, 1e-5 per tree attention pair), not another
    machine's seconds: a few plain steps of 50 ms make the model predict 50 ms, and sizes never measured
    cost 4% per token of it plus their attention."""
    cm = CostModel()
    for _ in range(3):
        cm.observe(StepRecord(1, 300, 1, 0, forward_s=0.050))
    plain, tree = cm.predict(1, 300, [0, 32], drafted=False).forward
    assert plain == pytest.approx(0.050, rel=0.02)
    assert tree / plain - 1 == pytest.approx(32 * 0.04 + 32 * (300 + 1 + 32) * 1e-5, rel=0.1)
    absolute = CostModel(forward=(2e-8, 2e-4, 0.0, 5e-3))  # an explicit prior keeps its seconds
    for _ in range(3):
        absolute.observe(StepRecord(1, 300, 1, 0, forward_s=0.050))
    assert float(absolute.predict(1, 300, 0, drafted=False).forward) < 0.045


def test_prefill_beyond_the_measured_sizes_keeps_the_measured_slope():
    cm = CostModel(prior_weight=0.0)
    for k in range(0, 33):
        cm.observe(StepRecord(1, 0, 1 + k, k, forward_s=0.05 + 0.002 * k))
    cm.forward.refit()
    assert cm.measured_tokens() == 33
    # 500 tokens: the measured 2 ms per token goes on (the token segments there hold only the prior)
    assert cm.prefill_time(500) - float(cm.predict(1, 0, 0, drafted=False).total) == pytest.approx(
        0.002 * 499, rel=0.05
    )


def test_tree_pairs_price_where_the_nodes_go():
    """At batch 4 the attention runs padded to the largest tree: the same 16 draft nodes on one request
    cost more than 4 on each. Fitted on steps of both kinds (and plain ones), the model tells them apart;
    the even-spread estimate is what a caller without the trees' shapes gets."""
    rng = np.random.default_rng(0)
    per_pair, ctx = 5e-7, 4 * 600

    def forward_s(sizes):
        return 0.06 + 5e-5 * (sum(sizes) - 4) + per_pair * tree_pairs_of(sizes, [600] * 4)

    cm = CostModel()
    for i in range(240):
        sizes = [[1, 1, 1, 1], [5, 5, 5, 5], [17, 1, 1, 1], [9, 9, 1, 1]][i % 4]
        t = forward_s(sizes) * float(np.exp(rng.normal(0, 0.02)))
        cm.observe(
            StepRecord(4, ctx, sum(sizes), 16, forward_s=t), tree_pairs=tree_pairs_of(sizes, [600] * 4)
        )
    for sizes in ([5, 5, 5, 5], [17, 1, 1, 1], [9, 9, 1, 1]):
        pairs = tree_pairs_of(sizes, [600] * 4)
        pred = float(cm.predict(4, ctx, sum(sizes) - 4, drafted=False, tree_pairs=pairs).forward)
        assert pred == pytest.approx(forward_s(sizes), rel=0.03)
    concentrated = tree_pairs_of([17, 1, 1, 1], [600] * 4)
    assert concentrated == 4 * 16 * 617 and tree_pairs_of([5, 5, 5, 5], [600] * 4) == 4 * 4 * 605
    assert tree_pairs_estimate(4, ctx, 16) == pytest.approx(4 * 4 * (600 + 1 + 4))
    assert tree_pairs_of([], []) == 0.0


def test_sizes_beyond_the_measured_continue_the_last_measured_slope():
    """A forward measured flat up to 17 tokens (bfloat16 matrix units) is predicted flat beyond, not at the
    prior's 4% per token, so the policy tries the larger trees and measures them; a steep one stays steep."""
    for slope in (2e-5, 2e-3):
        cm, prior = CostModel(), CostModel(extend_slope=False)
        for i in range(120):
            k = i % 17
            for m in (cm, prior):
                m.observe(StepRecord(1, 300, 1 + k, k, forward_s=0.05 + slope * k), tree_pairs=0.0)
        for m in (cm, prior):
            m.forward.refit()
        grow = lambda m: float(np.diff(m.predict(1, 300, [16, 48], drafted=False, tree_pairs=0.0).forward)[0])  # noqa: E731
        assert grow(cm) == pytest.approx(32 * slope, rel=0.3, abs=2e-4)
        if slope < 1e-4:
            assert grow(prior) > 20 * grow(cm)  # the prior's 4% per token: the case this is for
