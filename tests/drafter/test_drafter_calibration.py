"""Calibration tables: fit, apply (numpy vs native), JSON, online updates through the drafter."""

import json

import numpy as np
import pytest
import sssd
from sssd.batch import on_path_mask
from sssd.drafter import calibration as cal
from test_batch_paths import random_paths


def synthetic(n=20000, seed=0):
    rng = np.random.default_rng(seed)
    source = rng.integers(0, 3, n).astype(np.int8)
    depth = rng.integers(1, 9, n).astype(np.int32)
    match = rng.integers(1, 30, n).astype(np.int32)
    raw = rng.random(n).astype(np.float32)
    true_p = np.clip(raw**2 * np.where(source == 0, 0.9, 0.5), 0, 1)
    accepted = (rng.random(n) < true_p).astype(np.int8)
    return source, depth, match, raw, accepted, true_p


def test_fit_is_monotone_and_calibrated():
    s, d, m, r, y, p = synthetic()
    table = cal.fit(s, d, m, r, y)
    assert np.all(np.diff(table.values, axis=-1) >= -1e-7)
    q = table.apply(s, d, m, r)
    assert cal.calibration_error(q, y) < cal.calibration_error(r, y)
    assert cal.calibration_error(q, y) < 0.03
    assert np.abs(q - p).mean() < 0.08


def test_apply_matches_native():
    s, d, m, r, y, _ = synthetic(2000, seed=1)
    table = cal.fit(s, d, m, r, y)
    native = table.native().apply(s, d, m, r)
    assert np.allclose(native, table.apply(s, d, m, r), atol=1e-6)
    edge = np.array([0.0, 1.0, 0.999999, 1e-9, 2.0, -1.0], np.float32)
    z = np.zeros(edge.size)
    assert np.allclose(
        table.native().apply(z.astype(np.int8), z.astype(np.int32) + 1, z.astype(np.int32) + 1, edge),
        table.apply(z, z + 1, z + 1, edge),
        atol=1e-6,
    )


def test_isotonic_matches_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(50):
        y = rng.random(7)
        w = rng.random(7) + 0.1
        got = cal.isotonic(y, w)
        assert np.all(np.diff(got) >= -1e-12)
        # PAV is the weighted least-squares projection: no monotone perturbation does better
        best = np.sum(w * (got - y) ** 2)
        for _ in range(200):
            z = np.sort(got + rng.normal(0, 0.05, 7))
            assert np.sum(w * (z - y) ** 2) >= best - 1e-12


def test_json_round_trip_and_errors(tmp_path):
    s, d, m, r, y, _ = synthetic(3000)
    table = cal.fit(s, d, m, r, y)
    path = tmp_path / "t.json"
    table.save(path)
    back = cal.CalibrationTable.load(path)
    assert np.allclose(back.values, table.values, atol=1e-6) and back.depth_edges == table.depth_edges
    obj = json.loads(path.read_text())
    for key, value in (("format", "x"), ("version", 99), ("sources", ["a"])):
        with pytest.raises(ValueError):
            cal.CalibrationTable.from_json({**obj, key: value})
    with pytest.raises(ValueError):
        cal.CalibrationTable.from_json({**obj, "values": [[1]]})
    bad = np.asarray(obj["values"])
    bad[0, 0, 0, 0] = 2.0
    with pytest.raises(ValueError):
        cal.CalibrationTable.from_json({**obj, "values": bad.tolist()})
    with pytest.raises(ValueError):
        cal.CalibrationTable.identity(depth_edges=(1, 1, 2))
    with pytest.raises(ValueError):
        cal.fit(s, d, m, r, y * 2)


def test_default_table_loads_and_is_used():
    table = cal.default_table()
    assert table.weights.sum() > 0  # fitted, not the identity
    d = sssd.Drafter(config=sssd.DrafterConfig())
    assert np.allclose(d.calibration.values, table.values, atol=1e-6)


def test_online_updates_touch_only_observed_groups():
    d = sssd.Drafter(config=sssd.DrafterConfig(calibration="identity"))
    d.add_request(1, [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7])
    before = d.calibration
    for _ in range(30):  # the input source keeps predicting 8 / 9 after "5 6 7"; the truth is 1
        b = d.propose([1], budget=4)
        d.extend(1, [1])
        d.observe([1], b, on_path_mask(b, tokens=[[]]))
        d.extend(1, [5, 6, 7])
    after = d.calibration
    changed = np.nonzero(np.any(after.values != before.values, axis=-1))
    assert set(changed[0].tolist()) == {0}  # only the input source
    assert np.all(np.diff(after.values, axis=-1) >= -1e-7)
    assert np.all(after.values[changed] <= before.values[changed] + 1e-7)  # only failures were seen
    assert after.weights.sum() > before.weights.sum()


def test_online_off_keeps_table():
    d = sssd.Drafter(config=sssd.DrafterConfig(calibration="identity", online_calibration=False))
    d.add_request(1, [5, 6, 7, 8, 5, 6, 7])
    b = d.propose([1], budget=4)
    d.extend(1, [1])
    d.observe([1], b, on_path_mask(b, tokens=[[]]))
    assert np.array_equal(d.calibration.values, cal.CalibrationTable.identity().values)


def test_online_update_matches_soft_binning():
    """observe() adds each trial (a node whose parent was accepted) to its group's two nearest knots."""
    d = sssd.Drafter(config=sssd.DrafterConfig(calibration="identity", use_pool=False))
    d.add_request(1, [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7, 8, 3, 5, 6, 7])
    b = d.propose([1], budget=12)
    before = d.calibration.weights.copy()
    d.extend(1, [8, 1, 4])  # two draft tokens accepted ("8 1"), then the next token 4
    d.observe([1], b, on_path_mask(b, tokens=[[8, 1]]))
    delta = d.calibration.weights - before
    on = {0}
    for v in range(1, b.num_nodes):
        parent = b.parents[v]
        if parent in on and b.depth[v] <= 2 and [8, 1][b.depth[v] - 1] == b.tokens[v]:
            on.add(v)
    trials = [v for v in range(1, b.num_nodes) if b.parents[v] in on]
    expected = np.zeros_like(delta)
    table = cal.CalibrationTable.identity()
    for v in trials:
        dd, mm = table.bins(b.depth[v], b.match_len[v])
        t = float(b.raw_score[v]) * (table.num_knots - 1)
        k = min(int(t), table.num_knots - 2)
        expected[b.source[v], dd, mm, k] += 1 - (t - k)
        expected[b.source[v], dd, mm, k + 1] += t - k
    assert len(trials) >= 3
    assert np.allclose(delta, expected, atol=1e-5)


def _old_trials(b, accepted_tokens):
    """The trials the former observe recorded (it re-matched the accepted tokens in each tree, the first
    child holding each): (node, accepted) for every node whose parent lay on that path."""
    out = []
    for t, toks in enumerate(accepted_tokens):
        a, e = int(b.offsets[t]), int(b.offsets[t + 1])
        on, node = {0}, 0
        for x in toks:
            node = next(v for v in range(1, e - a) if b.parents[a + v] == node and b.tokens[a + v] == x)
            on.add(node)
        out += [(a + v, v in on) for v in range(1, e - a) if b.parents[a + v] in on]
    return out


def _one_node_trees(b, trials) -> tuple[dict, np.ndarray]:
    """The trials as a batch of root + one node trees (the node on the path when it was accepted), in the
    same order: what the former observe handed the table, one trial per tree."""
    nodes = np.asarray([v for v, _ in trials], np.int64)
    k = len(nodes)
    pairs = lambda root, node: np.stack([np.full(k, root), node], axis=1).reshape(-1)  # noqa: E731
    arrays = {
        "offsets": np.arange(k + 1, dtype=np.int64) * 2,
        "parents": pairs(-1, np.zeros(k)).astype(np.int32),
        "source": pairs(-1, b.source[nodes]).astype(np.int8),
        "depth": pairs(0, b.depth[nodes]).astype(np.int32),
        "match_len": pairs(0, b.match_len[nodes]).astype(np.int32),
        "raw_score": pairs(1.0, b.raw_score[nodes]).astype(np.float32),
    }
    on_path = pairs(True, np.asarray([acc for _, acc in trials], bool)).astype(bool)
    return arrays, on_path


@pytest.mark.parametrize("seed", range(4))
def test_observe_records_what_token_matching_recorded(seed):
    """The mask from the verified paths' node indices records exactly the trials, with their outcomes, that
    the former observe found by matching the accepted tokens, on random batches (before or after extend,
    alike): a second drafter fed those trials one by one ends with a bit-identical table."""
    rng = np.random.default_rng(seed)
    cfg = sssd.DrafterConfig(max_depth=6)  # the shipped table, refitted online
    d, twin = sssd.Drafter(config=cfg), sssd.Drafter(config=cfg)
    for r in range(5):
        d.add_request(r, rng.integers(0, 6, 40).astype(np.int32))
    for step in range(12):
        b = d.propose(list(range(5)), budget=int(rng.integers(1, 40)))
        paths = random_paths(rng, b, go_on=0.7)
        tokens = [[int(b.tokens[b.offsets[t] + v]) for v in p[1:]] for t, p in enumerate(paths)]
        assert np.array_equal(on_path_mask(b, paths=paths), on_path_mask(b, tokens=tokens))
        if step % 2:
            assert d.observe(list(range(5)), b, on_path_mask(b, paths=paths)) == 5
        for t, toks in enumerate(tokens):
            d.extend(t, np.asarray([*toks, int(rng.integers(0, 6))], np.int32))
        if step % 2 == 0:
            assert d.observe(list(range(5)), b, on_path_mask(b, paths=paths)) == 5
        trials = _old_trials(b, tokens)
        assert any(acc for _, acc in trials) and not all(acc for _, acc in trials)
        twin._native.observe(*_one_node_trees(b, trials))
        assert np.array_equal(d.calibration.weights, twin.calibration.weights)
        assert np.array_equal(d.calibration.values, twin.calibration.values)
