import numpy as np
import pytest
from sssd.evaluation.baselines import PromptLookupConfig, PromptLookupDrafter, lookup_chain


def _ctx(*tokens):
    return np.asarray(tokens, dtype=np.int32)


def test_longest_suffix_wins_over_most_recent_shorter_one():
    # "1 2 3" occurs at the start; "3" alone occurs later (followed by 8); the 3-gram match wins.
    ctx = _ctx(1, 2, 3, 4, 5, 9, 3, 8, 1, 2, 3)
    assert lookup_chain(ctx, 10).tolist() == [4, 5, 9, 3, 8, 1, 2, 3]
    assert lookup_chain(ctx, 2).tolist() == [4, 5]
    assert lookup_chain(ctx, 10, max_ngram=1).tolist() == [8, 1, 2, 3]


def test_most_recent_occurrence_and_no_match():
    assert lookup_chain(_ctx(7, 1, 7, 2, 7), 5).tolist() == [2, 7]
    assert lookup_chain(_ctx(1, 2, 3), 5).size == 0
    assert lookup_chain(_ctx(5), 5).size == 0
    assert lookup_chain(_ctx(5, 5), 0).size == 0
    assert lookup_chain(_ctx(5, 5), 3).tolist() == [5]


def test_min_ngram_excludes_short_matches():
    assert lookup_chain(_ctx(9, 1, 4, 2, 1), 3, min_ngram=2).size == 0
    assert lookup_chain(_ctx(2, 1, 4, 2, 1), 3, min_ngram=2).tolist() == [4, 2, 1]


def test_matches_brute_force_on_random_contexts():
    rng = np.random.default_rng(0)
    for _ in range(300):
        ctx = rng.integers(0, 4, size=rng.integers(1, 30)).astype(np.int32)
        want = []
        for k in (3, 2, 1):
            if ctx.size <= k:
                continue
            ends = [
                j for j in range(k - 1, ctx.size - 1) if ctx[j - k + 1 : j + 1].tolist() == ctx[-k:].tolist()
            ]
            if ends:
                want = ctx[ends[-1] + 1 : ends[-1] + 6].tolist()
                break
        assert lookup_chain(ctx, 5).tolist() == want


def test_batch_layout_per_request_budgets():
    d = PromptLookupDrafter()
    d.add_request(10, [1, 2, 3, 4, 1, 2, 3])
    d.add_request(11, [5, 6, 7])
    batch = d.propose([10, 11], budget=[2, 4])
    assert batch.offsets.tolist() == [0, 3, 4]
    assert batch.tokens.tolist() == [3, 4, 1, 7]
    assert batch.parents.tolist() == [-1, 0, 1, -1]
    assert batch.depth.tolist() == [0, 1, 2, 0]
    assert batch.rank.tolist() == [-1, 0, 1, -1]
    assert batch.probs[0] == 1.0 and batch.gain.shape == (3,)


def test_global_budget_is_spent_level_by_level():
    d = PromptLookupDrafter()
    d.add_request(0, [1, 2, 3, 1, 2, 3])  # chain: 1 2 3 (capped by the context end)
    d.add_request(1, [4, 5, 4])  # chain: 5 4
    batch = d.propose([0, 1], budget=4)
    sizes = np.diff(batch.offsets).tolist()
    assert sizes == [3, 3]  # 2 + 2 nodes
    assert d.propose([0, 1], budget=0).tokens.tolist() == [3, 4]
    assert np.diff(d.propose([0, 1], budget=100).offsets).tolist() == [4, 3]


def test_extend_and_lifecycle_errors():
    d = PromptLookupDrafter(PromptLookupConfig(max_chain=3))
    d.add_request(0, [1, 2])
    d.extend(0, np.arange(100, dtype=np.int32) % 5)  # grows past the initial buffer
    assert d.context(0).size == 102
    assert d.propose([0], budget=[64]).offsets.tolist() == [0, 4]
    with pytest.raises(ValueError, match="already exists"):
        d.add_request(0, [1])
    with pytest.raises(ValueError, match="empty"):
        d.add_request(1, [])
    with pytest.raises(ValueError):
        d.add_request(2, [1, -1])
    with pytest.raises(ValueError, match="duplicate"):
        d.propose([0, 0])
    with pytest.raises(ValueError):
        d.propose([0], budget=[1, 2])
    with pytest.raises(ValueError):
        d.propose([0], budget=-1)
    d.remove_request(0)
    with pytest.raises(KeyError):
        d.extend(0, [1])
    with pytest.raises(KeyError):
        d.propose([0])
    with pytest.raises(ValueError):
        PromptLookupConfig(min_ngram=0)
