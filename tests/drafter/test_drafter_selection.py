"""Best-first selection and batch-wide allocation: native vs the Python reference vs brute force."""

import itertools

import numpy as np
import pytest
import sssd
from hypothesis import given
from hypothesis import strategies as st
from sssd import _core
from sssd.drafter import allocation as budget_alloc
from sssd.drafter import reference as ref


@st.composite
def trees(draw, max_nodes=9):
    """(parents, f, depth) of a random tree with f = product of random p along the path."""
    n = draw(st.integers(1, max_nodes))
    parents, depth, f = [-1], [0], [1.0]
    for i in range(1, n):
        p = draw(st.integers(0, i - 1))
        prob = draw(st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.5, 0.7, 0.9, 1.0]))
        parents.append(p)
        depth.append(depth[p] + 1)
        f.append(f[p] * prob)
    return parents, f, depth


@given(trees(), st.integers(0, 10), st.integers(1, 5), st.integers(0, 3))
def test_sequence_matches_reference(tree, cap, max_depth, max_width):
    parents, f, depth = tree
    got = budget_alloc.greedy_sequence(parents, f, depth, cap, max_depth, max_width)
    assert got.tolist() == ref.select_sequence(parents, f, depth, cap, max_depth, max_width)


@given(trees(), st.integers(1, 5))
def test_sequence_prefixes_are_optimal(tree, max_depth):
    parents, f, depth = tree
    seq = budget_alloc.greedy_sequence(parents, f, depth, len(parents), max_depth)
    for k in range(len(seq) + 1):
        chosen = set(seq[:k].tolist()) | {0}
        assert all(parents[v] in chosen for v in seq[:k])  # connected
        assert sum(f[v] for v in seq[:k]) == pytest.approx(ref.best_connected_sum(parents, f, k, max_depth))
    # the sequence stops only when no node within max_depth is left
    assert len(seq) == sum(1 for d in depth[1:] if d <= max_depth)


@given(st.lists(trees(max_nodes=6), min_size=1, max_size=3), st.integers(0, 12))
def test_global_allocation_is_optimal(forest, budget):
    seqs, fs = [], []
    for parents, f, depth in forest:
        s = budget_alloc.greedy_sequence(parents, f, depth, 64)
        seqs.append(s)
        fs.append(np.asarray(f)[s])
    order = budget_alloc.allocate(fs, budget)
    assert order.tolist() == ref.allocate_budget(fs, budget)
    counts = budget_alloc.allocation_counts(order, len(forest))
    total = sum(fs[i][: counts[i]].sum() for i in range(len(forest)))
    # brute force over every split of the budget between the trees
    best = 0.0
    for split in itertools.product(*[range(len(s) + 1) for s in seqs]):
        if sum(split) <= budget:
            value = sum(ref.best_connected_sum(t[0], t[1], k) for t, k in zip(forest, split, strict=True))
            best = max(best, value)
    assert total == pytest.approx(best)


@given(
    st.lists(st.lists(st.sampled_from([0.9, 0.5, 0.3, 0.1, 0.05]), max_size=6), min_size=1, max_size=4),
    st.integers(0, 16),
    st.lists(st.one_of(st.none(), st.sampled_from([0.005, 0.01, 0.02, 0.05])), min_size=4, max_size=4),
    st.sampled_from([0.01, 0.02, 0.04]),
)
def test_slo_allocation_matches_reference(raw_seqs, budget, targets, step_time):
    fs = [np.sort(np.asarray(s, dtype=np.float64))[::-1] for s in raw_seqs]
    tpot = targets[: len(fs)]
    order = budget_alloc.allocate(fs, budget, tpot, step_time, 0.001)
    expected = ref.allocate_budget(fs, budget, [np.nan if t is None else t for t in tpot], step_time, 0.001)
    assert order.tolist() == expected
    # after the SLO phase no short request that could still grow is left unserved while others got nodes
    counts = budget_alloc.allocation_counts(order, len(fs))
    assert counts.sum() == min(budget, sum(len(s) for s in fs))


def test_slo_serves_short_request_first():
    confident = np.array([0.9, 0.9, 0.8, 0.8])
    hard = np.array([0.3, 0.2, 0.1, 0.05])
    plain = budget_alloc.allocate([confident, hard], 4)
    assert budget_alloc.allocation_counts(plain, 2).tolist() == [4, 0]
    # request 1 needs (0.02 + 0) / 0.015 = 1.33 tokens per step: it gets nodes until 1 + 0.3 + 0.2 >= 1.33
    slo = budget_alloc.allocate([confident, hard], 4, [None, 0.015], step_time=0.02)
    assert slo.tolist()[:2] == [1, 1]
    assert budget_alloc.allocation_counts(slo, 2).tolist() == [2, 2]


def test_allocation_bad_input():
    with pytest.raises(ValueError):
        budget_alloc.allocate([[0.5]], -1)
    with pytest.raises(ValueError, match="non-increasing"):
        budget_alloc.allocate([[0.1, 0.5]], 2)
    with pytest.raises(ValueError, match="TPOT"):
        budget_alloc.allocate([[0.5]], 1, [0.0])
    with pytest.raises(ValueError, match="2 TPOT targets for 1"):
        budget_alloc.allocate([[0.5]], 1, [0.1, 0.1])
    with pytest.raises(ValueError):
        budget_alloc.greedy_sequence([0, 0], [1.0, 0.5], [0, 1], 2)


def test_drafter_global_budget_is_joint_greedy():
    """A propose() over several requests takes the best nodes across all their trees."""
    d = sssd.Drafter(config=sssd.DrafterConfig(calibration=None))
    d.add_request(0, [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3])  # confident
    d.add_request(1, [7, 8, 9, 7, 5, 7, 6, 7, 4, 7])  # four different continuations of 7
    full = d.propose([0, 1], budget=[64, 64])
    per = [full.acc_prob[full.offsets[i] + 1 : full.offsets[i + 1]] for i in range(2)]
    for k in range(0, 12):
        b = d.propose([0, 1], budget=k)
        expected = ref.allocate_budget([np.sort(p.astype(np.float64))[::-1] for p in per], k)
        got = np.diff(b.offsets) - 1
        assert got.tolist() == np.bincount(expected, minlength=2).tolist()


def test_drafter_slo_in_propose():
    d = sssd.Drafter(config=sssd.DrafterConfig(calibration=None))
    d.add_request(0, [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3])
    d.add_request(1, [7, 8, 9, 7, 5, 7, 6, 7, 4, 7])
    plain = d.propose([0, 1], budget=3)
    slo = d.propose([0, 1], budget=3, slo=[None, 0.001], step_time=0.02)
    assert np.diff(plain.offsets).tolist()[1] < np.diff(slo.offsets).tolist()[1]
    assert slo.rank[slo.offsets[1] + 1] == 0  # the short request took the first node


def _random_tree(rng, n, values):
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    depth, f = [0], [1.0]
    for i in range(1, n):
        depth.append(depth[parents[i]] + 1)
        f.append(f[parents[i]] * float(rng.choice(values)))
    return parents, f, depth


@pytest.mark.parametrize("values", [(0.5, 0.25, 1.0), (0.0, -0.0, 0.5, 1.0), (0.3, 0.7, 1.2, -0.5)])
def test_sequence_and_merge_keys_on_ties_signed_zeros_and_growing_f(values):
    """The native heaps and the batch merge compare (f, index) as one integer key: ties (many equal f),
    -0.0 == +0.0, negative f and f growing along a path must still give the reference's order, on trees
    and batches larger than a tournament's power of two."""
    rng = np.random.default_rng(len(values))
    for _ in range(40):
        parents, f, depth = _random_tree(rng, int(rng.integers(1, 200)), values)
        cap, max_depth = int(rng.integers(0, 130)), int(rng.integers(1, 12))
        arrays = np.asarray(parents, np.int32), np.asarray(f, np.float64), np.asarray(depth, np.int32)
        got = _core.select_sequence(*arrays, cap, max_depth, 0)
        assert got.tolist() == ref.select_sequence(parents, f, depth, cap, max_depth, 0)
        b = int(rng.integers(0, 70))
        fs = [np.asarray(rng.choice(values, int(rng.integers(0, 9))), np.float64) for _ in range(b)]
        budget = int(rng.integers(0, 300))
        got = _core.allocate_budget(fs, budget, None, 0.02, 0.0)
        assert got.tolist() == ref.allocate_budget([x.tolist() for x in fs], budget)


def test_nan_f_keeps_a_valid_selection_and_allocation():
    """NaN has no place in the integer key order: those inputs take the pair heaps, and stay well formed."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        parents, f, depth = _random_tree(rng, 60, (0.5, 0.9))
        f[int(rng.integers(1, 60))] = np.nan
        seq = _core.select_sequence(
            np.asarray(parents, np.int32), np.asarray(f, np.float64), np.asarray(depth, np.int32), 30, 64, 0
        ).tolist()
        chosen = {0}
        for v in seq:
            assert parents[v] in chosen and v not in chosen
            chosen.add(v)
        assert len(seq) == 30
        fs = [np.asarray([0.9, np.nan, 0.1]), np.asarray([0.5, 0.4]), np.asarray([np.nan])]
        order = _core.allocate_budget(fs, 10, None, 0.02, 0.0).tolist()
        assert sorted(order) == [0, 0, 0, 1, 1, 2]
