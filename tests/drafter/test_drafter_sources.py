"""The sources: input n-gram index vs brute force, recent-outputs pool (LRU, compaction), datastore."""

import threading

import numpy as np
import pytest
import sssd
from hypothesis import given
from hypothesis import strategies as st


def input_only(**kw):
    cfg = {"use_datastore": False, "use_pool": False, "calibration": None, "online_calibration": False}
    return sssd.Drafter(config=sssd.DrafterConfig(**{**cfg, **kw}))


def paths(b, tree=0):
    s, e = b.offsets[tree], b.offsets[tree + 1]
    out = []
    for v in range(1, e - s):
        p, chain = v, []
        while p > 0:
            chain.append(int(b.tokens[s + p]))
            p = b.parents[s + p]
        out.append(chain[::-1])
    return out


def occurs_after_root(ctx, path):
    for j in range(len(ctx) - 1):
        if ctx[j] == ctx[-1] and ctx[j + 1 : j + 1 + len(path)] == path:
            return True
    return False


@given(st.lists(st.integers(0, 3), min_size=1, max_size=40))
def test_input_candidates_occur_in_context(ctx):
    d = input_only(max_depth=5)
    d.add_request(0, ctx)
    b = d.propose([0], budget=30)
    for path in paths(b):
        assert occurs_after_root(ctx, path), path


@given(st.lists(st.integers(0, 3), min_size=2, max_size=40), st.integers(1, 6))
def test_input_longest_match_wins(ctx, max_n):
    d = input_only(
        max_depth=4, index_max_n=max_n, input_max_samples=1, input_min_occurrences=1, input_max_match=64
    )
    d.add_request(0, ctx)
    b = d.propose([0], budget=4)
    best = None
    for j in range(len(ctx) - 1):
        m = 0
        while m <= j and ctx[j - m] == ctx[len(ctx) - 1 - m]:
            m += 1
        if m >= 1 and (best is None or (m, j) > best):
            best = (m, j)
    if best is None:
        assert b.num_nodes == 1
    else:
        j = best[1]
        assert [int(t) for t in b.tokens[1:]] == ctx[j + 1 : j + 5]
        assert b.match_len[1] == best[0]


def test_long_prompt_and_incremental_extend():
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 50_000, 32_768).astype(np.int32)
    d = input_only()
    d.add_request(0, prompt)
    d.extend(0, prompt[1000:1003])  # now the context ends with a copy of prompt[1000:1003]
    b = d.propose([0], budget=8)
    assert list(b.tokens[1:4]) == list(prompt[1003:1006])
    assert b.match_len[1] >= 3


def test_pool_lru_eviction():
    d = sssd.Drafter(config=sssd.DrafterConfig(use_input=False, calibration=None, pool_max_tokens=10))
    a, b_doc, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    d.add_to_pool(a)
    d.add_to_pool(b_doc)
    d.add_request(0, [1])
    assert list(d.propose([0], budget=3).tokens[1:]) == [2, 3, 4]  # uses (touches) document a
    d.add_to_pool(c)  # 12 tokens > 10: the least recently used document (b) goes
    assert d.pool_tokens == 8
    d.add_request(1, [5])
    d.add_request(2, [9])
    batch = d.propose([0, 1, 2], budget=[3, 3, 3])
    assert np.diff(batch.offsets).tolist() == [4, 1, 4]


def test_pool_compaction_keeps_recent_documents():
    d = sssd.Drafter(config=sssd.DrafterConfig(use_input=False, calibration=None, pool_max_tokens=1000))
    for k in range(60):
        d.add_to_pool(np.arange(k * 200, k * 200 + 200, dtype=np.int32) % 30000)
    assert d.pool_tokens == 1000
    d.add_request(0, [59 * 200 + 10])
    assert list(d.propose([0], budget=3).tokens[1:]) == [59 * 200 + 11, 59 * 200 + 12, 59 * 200 + 13]
    d.add_request(1, [3 * 200 + 10])  # long evicted
    assert d.propose([1], budget=3).num_nodes == 1


def test_remove_request_adds_output_only():
    d = sssd.Drafter(config=sssd.DrafterConfig(calibration=None))
    d.add_request(0, [1, 2, 3])
    d.extend(0, [4, 5])
    d.remove_request(0, add_to_pool=False)
    assert d.pool_tokens == 0
    d.add_request(0, [1, 2, 3])
    d.extend(0, [4, 5])
    d.remove_request(0)
    assert d.pool_tokens == 2


def test_datastore_source_and_vocab(tmp_path):
    docs = [[1, 2, 3, 4, 5], [7, 2, 3, 9]]
    sssd.build_datastore(docs, tmp_path / "ds.sssd", vocab_size=20)
    ds = sssd.Datastore.open(tmp_path / "ds.sssd")
    d = sssd.Drafter(ds, sssd.DrafterConfig(use_input=False, use_pool=False, calibration=None))
    d.add_request(0, [8, 2, 3])
    b = d.propose([0], budget=10)
    assert sorted(paths(b), key=len)[:2] in ([[4], [9]], [[9], [4]])
    assert set(b.source[1:].tolist()) == {1}
    # The datastore's vocabulary does not limit the drafter's (the model's may be larger): ids past it
    # never match there. The config's vocab_size (the model's) is the limit.
    d.add_request(1, [25])
    assert d.propose([1], budget=10).num_draft_nodes == 0
    limited = sssd.Drafter(ds, sssd.DrafterConfig(use_input=False, use_pool=False, vocab_size=20))
    with pytest.raises(ValueError, match="vocabulary"):
        limited.add_request(1, [25])
    limited.add_request(0, [8, 2, 3])
    with pytest.raises(ValueError, match="vocabulary"):
        limited.extend(0, [20])
    with pytest.raises(TypeError):
        sssd.Drafter(datastore="not a datastore")


def test_thread_count_changes_nothing_but_the_threads():
    """``DrafterConfig.threads``: 1 (no parallel region), 2, 3 (more threads than requests or cores) and
    the OpenMP default draft the same trees, step after step."""
    rng = np.random.default_rng(0)
    contexts = [list(rng.integers(0, 6, 60)) for _ in range(5)]
    drafters = [input_only(threads=t) for t in (0, 1, 2, 3)]
    for d in drafters:
        for r, ctx in enumerate(contexts):
            d.add_request(r, ctx)
    for step in range(6):
        batches = [d.propose(list(range(5)), budget=24) for d in drafters]
        for b in batches[1:]:
            for name in ("tokens", "parents", "offsets", "probs", "rank"):
                np.testing.assert_array_equal(getattr(b, name), getattr(batches[0], name), err_msg=name)
        for d in drafters:
            for r in range(5):
                d.extend(r, [step % 6])


@pytest.mark.parametrize("bad", [-1, 1025, 1.0, True])
def test_thread_count_is_checked(bad):
    with pytest.raises((ValueError, TypeError), match="threads"):
        sssd.DrafterConfig(threads=bad)


def test_threads_share_one_drafter():
    d = input_only()
    for r in range(8):
        d.add_request(r, [r, 1, 2, r, 1, 2, r, 1])
    expected = d.propose(list(range(8)), budget=40)
    results = []

    def work():
        for _ in range(20):
            results.append(d.propose(list(range(8)), budget=40))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 80
    assert all(np.array_equal(r.tokens, expected.tokens) for r in results)
