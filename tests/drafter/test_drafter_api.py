"""The Drafter API: contract fields, request lifecycle and every bad input of the issue."""

import numpy as np
import pytest
import sssd
from sssd.batch import on_path_mask
from sssd.drafter.retrieval import DraftBatch

REPEAT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 10, 5, 6, 7]


def make(**kw):
    return sssd.Drafter(config=sssd.DrafterConfig(calibration=None, **kw))


def check_contract(b: DraftBatch, rids):
    n, nb = b.num_nodes, b.num_trees
    assert nb == len(rids)
    assert b.tokens.dtype == np.int32 and b.parents.dtype == np.int32 and b.depth.dtype == np.int32
    assert b.probs.dtype == np.float32 and b.offsets.dtype == np.int64 and b.rank.dtype == np.int32
    assert b.gain.dtype == np.float64 and b.gain.shape == (n - nb + 1,)
    assert b.offsets[0] == 0 and b.offsets[-1] == n
    for i in range(nb):
        s, e = b.offsets[i], b.offsets[i + 1]
        assert b.parents[s] == -1 and b.depth[s] == 0 and b.probs[s] == 1.0 and b.rank[s] == -1
        for j in range(1, e - s):
            p = b.parents[s + j]
            assert 0 <= p < j and b.depth[s + j] == b.depth[s + p] + 1
    ranks = np.sort(b.rank[b.rank >= 0])
    assert np.array_equal(ranks, np.arange(n - nb))
    f = b.acc_prob[b.rank >= 0][np.argsort(b.rank[b.rank >= 0])].astype(np.float64)
    assert np.allclose(b.gain, np.concatenate([[0], np.cumsum(f)]), rtol=1e-5)


def test_propose_contract_and_roots():
    d = make()
    d.add_request(1, np.array(REPEAT, dtype=np.int32))
    d.add_request(2, [1, 2, 3, 1, 2])
    b = d.propose([1, 2], budget=6)
    check_contract(b, [1, 2])
    assert b.tokens[b.offsets[0]] == 7 and b.tokens[b.offsets[1]] == 2
    assert b.num_draft_nodes == 6
    # the input source continues "5 6 7" with "8"
    assert 8 in b.tokens[1 : b.offsets[1]]


def test_truncate_is_prefix_selection():
    d = make()
    d.add_request(1, REPEAT)
    d.add_request(2, [1, 2, 3, 1, 2, 3, 1, 2])
    b = d.propose([1, 2], budget=10)
    for k in range(b.num_draft_nodes + 1):
        t = b.truncate(k)
        check_contract(t, [1, 2])
        assert t.num_draft_nodes == k
        assert np.isclose(t.gain[-1], b.gain[k])
        c = d.propose([1, 2], budget=k)
        assert np.array_equal(c.tokens, t.tokens) and np.array_equal(c.parents, t.parents)


def test_lifecycle_extend_remove_pool():
    d = make()
    d.add_request(1, [1, 2, 3])
    d.extend(1, [4, 5, 6, 7])
    assert d.context_length(1) == 7 and len(d) == 1
    d.remove_request(1)
    assert not d.has_request(1) and d.pool_tokens == 4
    d.add_request(2, [9, 4, 5])
    b = d.propose([2], budget=4)
    assert list(b.tokens[1:3]) == [6, 7] and b.source[1] == 2  # continued from the pool


def test_no_sources_still_roots():
    d = make(use_input=False, use_pool=False)
    d.add_request(1, REPEAT)
    b = d.propose([1], budget=8)
    assert b.num_nodes == 1 and b.tokens[0] == REPEAT[-1]


@pytest.mark.parametrize("budget", [0, [0, 0]])
def test_budget_zero_roots_only(budget):
    d = make()
    d.add_request(1, REPEAT)
    d.add_request(2, REPEAT)
    b = d.propose([1, 2], budget=budget)
    assert b.num_nodes == 2 and list(b.offsets) == [0, 1, 2] and b.gain.tolist() == [0.0]


def test_budget_larger_than_candidates():
    d = make()
    d.add_request(1, [1, 2, 1, 2, 3])
    b = d.propose([1], budget=10_000)
    small = d.propose([1], budget=5)
    assert b.num_draft_nodes <= 127 and b.num_draft_nodes == small.num_draft_nodes <= 5


def test_per_request_budgets():
    d = make()
    for r in range(3):
        d.add_request(r, REPEAT)
    b = d.propose([0, 1, 2], budget=[0, 2, 5])
    assert list(np.diff(b.offsets)) == [1, 3, 6]
    with pytest.raises(ValueError, match="2 per-request budgets for 3"):
        d.propose([0, 1, 2], budget=[1, 2])
    with pytest.raises(ValueError):
        d.propose([0, 1, 2], budget=[1, -2, 3])
    with pytest.raises(ValueError):
        d.propose([0], budget=-1)


def test_unknown_and_duplicate_ids():
    d = make()
    d.add_request(1, [1, 2])
    with pytest.raises(ValueError, match="already exists"):
        d.add_request(1, [3])
    with pytest.raises(KeyError):
        d.extend(5, [1])
    with pytest.raises(ValueError, match="unknown request"):
        d.propose([1, 5])
    with pytest.raises(ValueError, match="twice"):
        d.propose([1, 1])
    with pytest.raises(sssd.UnknownRequestError):
        d.remove_request(5)


def test_extend_after_remove():
    d = make()
    d.add_request(1, [1, 2])
    d.remove_request(1)
    with pytest.raises(sssd.UnknownRequestError):
        d.extend(1, [3])
    d.add_request(1, [4])  # the id may be reused


def test_empty_prompt_and_bad_tokens():
    d = make(vocab_size=100)
    with pytest.raises(ValueError, match="empty"):
        d.add_request(1, [])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        d.add_request(1, [1, 100])
    with pytest.raises(ValueError):
        d.add_request(1, [-1])
    with pytest.raises(TypeError):
        d.add_request(1, np.array([1, 2], dtype=np.int64))
    d.add_request(1, [1, 2])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        d.extend(1, [5, 200])
    assert d.context_length(1) == 2  # nothing was appended


def test_slo_validation():
    d = make()
    d.add_request(1, REPEAT)
    d.add_request(2, REPEAT)
    for bad in (0.0, -1.0, [0.01, 0.0], [0.01, -3]):
        with pytest.raises(ValueError, match="SLO"):
            d.propose([1, 2], budget=4, slo=bad)
    with pytest.raises(ValueError, match="1 SLO targets for 2"):
        d.propose([1, 2], budget=4, slo=[0.01])
    b = d.propose([1, 2], budget=4, slo=[None, 0.01])
    check_contract(b, [1, 2])


def test_observe_validation_and_independence_of_extend():
    d = sssd.Drafter(config=sssd.DrafterConfig(calibration="identity"))
    d.add_request(1, REPEAT)
    b = d.propose([1], budget=4)
    assert b.num_draft_nodes >= 2 and b.parents[1] == 0
    root = on_path_mask(b, paths=[[0]])
    with pytest.raises(ValueError, match="request ids"):
        d.observe([2], b, root)
    with pytest.raises(TypeError, match="bool"):
        d.observe([1], b, root.tolist())
    with pytest.raises(TypeError, match="bool"):
        d.observe([1], b, root.astype(np.int64))
    with pytest.raises(ValueError, match="shape"):
        d.observe([1], b, root[:-1])
    with pytest.raises(ValueError, match="root"):
        d.observe([1], b, ~root & (b.parents == 0))
    kids = np.flatnonzero(b.parents == 0)
    two = root.copy()
    two[kids[:2]] = True
    if len(kids) >= 2:
        with pytest.raises(ValueError, match="two children"):
            d.observe([1], b, two)
    orphan = root.copy()
    orphan[np.flatnonzero(b.parents > 0)[:1]] = True
    if orphan.sum() == 2:
        with pytest.raises(ValueError, match="parent"):
            d.observe([1], b, orphan)
    before = d.calibration.weights.sum()
    assert d.observe([1], b, on_path_mask(b, paths=[[0, 1]])) == 1  # before extend: recorded now
    assert d.calibration.weights.sum() > before
    d.remove_request(1)
    assert d.observe([1], b, root) == 1  # the mask says it all: the request need not exist any more


def test_batch_fields_are_complete():
    import dataclasses

    d = make()
    d.add_request(1, REPEAT)
    b = d.propose([1], budget=3)
    names = {f.name for f in dataclasses.fields(DraftBatch)}
    assert names == set(vars(b))
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.tokens = None


def test_empty_batch():
    d = make()
    b = d.propose([], budget=10)
    assert b.num_trees == 0 and b.num_nodes == 0 and b.offsets.tolist() == [0] and b.gain.tolist() == [0.0]
    assert d.propose([], budget=[]).num_trees == 0
