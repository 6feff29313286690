"""Cost model: robust fitting recovers known coefficients; online refresh; profiles round-trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sssd.policy.cost_model import CostModel, StepSample, huber_irls


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
            StepSample(
                batch_size=b,
                n_context=ctx,
                n_batched=nb,
                budget=k,
                forward_s=fwd[0] * ctx + fwd[1] * nb + fwd[2] * (k > 0) + fwd[3] + (0.2 if slow else 0.0),
                draft_s=drf[0] * b + drf[1] * k + drf[2] if k else 0.0,
                other_s=oth[0] * b + oth[1] * nb + oth[2],
            )
        )
    return out


def test_cost_model_fit_recovers_all_parts():
    rng = np.random.default_rng(2)
    fwd, drf, oth = (2e-7, 3e-4, 4e-3, 1e-2), (4e-5, 2e-6, 1e-4), (2e-5, 1e-6, 3e-4)
    cm = CostModel(prior_weight=0.0).fit(_timings(rng, 300, fwd, drf, oth))
    np.testing.assert_allclose(cm.forward.coef, fwd, rtol=0.05)
    np.testing.assert_allclose(cm.draft.coef, drf, rtol=0.05)
    np.testing.assert_allclose(cm.other.coef, oth, rtol=0.05)
    c = cm.predict(4, 4000, [0, 16])
    assert c.draft[0] == 0.0 and c.draft[1] > 0
    assert c.forward[1] - c.forward[0] == pytest.approx(16 * fwd[1] + fwd[2], rel=0.05)
    assert c.total[1] > c.total[0]


def test_online_refresh_tracks_a_changed_machine():
    rng = np.random.default_rng(3)
    cm = CostModel(forward=(2e-7, 3e-4, 0.0, 1e-2), window=128, forget=0.97)
    # the machine gets twice as slow: the window forgets the old regime
    for t in _timings(rng, 200, (4e-7, 6e-4, 5e-3, 2e-2), (0, 0, 0), (0, 0, 0), outliers=0.05):
        cm.observe(t)
    np.testing.assert_allclose(cm.forward.coef, (4e-7, 6e-4, 5e-3, 2e-2), rtol=0.1)


def test_prior_holds_unexcited_directions():
    # every sample has budget 0: the budget slope of the draft part cannot be learned, keep the seed
    cm = CostModel(forward=(1e-7, 5e-4, 1e-2), prior_weight=8.0)
    for b in range(1, 40):
        cm.observe(StepSample(b, 100 * b, b, 0, forward_s=1e-7 * 100 * b + 5e-4 * b + 1e-2))
    cm.forward.refit()
    assert cm.forward.coef[1] == pytest.approx(5e-4, rel=0.1)


def test_profile_round_trip(tmp_path):
    cm = CostModel(forward=(1e-7, 2e-4, 3e-3), draft=(1e-5, 1e-6, 2e-5), other=(1e-5, 0.0, 1e-4))
    p = tmp_path / "p.json"
    cm.save(p, extra={"samples": []})
    back = CostModel.load(p)
    np.testing.assert_allclose(back.forward.coef, cm.forward.coef)
    np.testing.assert_allclose(back.draft.coef, cm.draft.coef)
    assert json.loads(p.read_text())["version"] == 1
    with pytest.raises(FileNotFoundError):
        CostModel.load(tmp_path / "missing.json")
    old = json.loads(p.read_text())  # a profile from before the tree-step term still loads
    del old["forward"]["tree"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert CostModel.load(tmp_path / "old.json").forward.coef[2] == 0.0
    (tmp_path / "bad.json").write_text('{"version": 1, "forward": {}}')
    with pytest.raises(ValueError):
        CostModel.load(tmp_path / "bad.json")


def test_observe_rejects_inconsistent_steps():
    cm = CostModel()
    with pytest.raises(ValueError):
        cm.observe(StepSample(batch_size=4, n_context=10, n_batched=2, budget=0, forward_s=0.01))
