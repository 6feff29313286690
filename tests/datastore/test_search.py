"""Continuation search: native vs the Python reference on random corpora (identical flat arrays, node
order included), hand-written tries (canonical form: paths with counts and match lengths), and every bad
search input."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sssd import Datastore, SearchConfig, build_datastore
from sssd.datastore.reference import ReferenceDatastore, canonical_trie, check_trie_invariants

# Corpus used by the hand-written cases. Suffix-array order of the suffixes starting with (5, 6):
# doc 3 "5 6 |" < doc 0 "5 6 7 8 |" < doc 1 "5 6 7 9 |".
DOCS = [[5, 6, 7, 8], [5, 6, 7, 9], [6, 7, 8, 1], [5, 6]]


def build(directory: Path, shards: list[list[list[int]]], vocab_size: int) -> Datastore:
    paths = []
    for k, docs in enumerate(shards):
        paths.append(directory / f"shard{k:02d}.sssd")
        build_datastore(docs, paths[-1], vocab_size=vocab_size)
    return Datastore.open(paths)


@pytest.fixture
def ds(tmp_path: Path) -> Datastore:
    return build(tmp_path, [DOCS], 10)


def expected(root: int, count: int, paths: dict[tuple[int, ...], tuple[int, int]]):
    return root, count, paths


def cfg(**kw) -> SearchConfig:
    base = {"max_query_len": 3, "min_query_len": 1, "min_occurrences": 1, "max_samples": 100, "max_depth": 3}
    return SearchConfig(**{**base, **kw})


# ---------------------------------------------------------------------------------------------------
# Hand-written cases with exact expected tries: {path: (count, match_len)}


def test_longest_suffix_only_when_it_occurs_often_enough(ds):
    # (4, 5, 6) never occurs; (5, 6) occurs 3 times (once at a document end: counted, no children).
    got = canonical_trie(ds.search_one([4, 5, 6], cfg()))
    assert got == expected(6, 3, {(7,): (2, 2), (7, 8): (1, 2), (7, 9): (1, 2)})


def test_shorter_suffixes_while_below_min_occurrences(ds):
    # 3 < 4 occurrences of (5, 6), so (6,) adds its 4 occurrences; longer matches weigh more.
    got = canonical_trie(ds.search_one([4, 5, 6], cfg(min_occurrences=4)))
    paths = {(7,): (5, 2), (7, 8): (3, 2), (7, 9): (2, 2), (7, 8, 1): (1, 1)}
    assert got == expected(6, 7, paths)


def test_down_to_min_query_len_only(ds):
    got = canonical_trie(ds.search_one([4, 5, 6], cfg(min_occurrences=100, min_query_len=2)))
    assert got == expected(6, 3, {(7,): (2, 2), (7, 8): (1, 2), (7, 9): (1, 2)})
    # no suffix of length >= 2 occurs: nothing, even though (6,) would
    assert canonical_trie(ds.search_one([9, 6], cfg(min_query_len=2))) == expected(6, 0, {})


def test_samples_are_spread_over_the_range_not_the_first(tmp_path):
    store = build(tmp_path, [[[1, t] for t in range(2, 12)]], 20)
    got = canonical_trie(store.search_one([1], cfg(max_samples=5, max_depth=1)))
    # 10 occurrences in suffix-array order 2..11; indices i * 10 // 5 = 0, 2, 4, 6, 8
    assert got == expected(1, 5, {(t,): (1, 1) for t in (2, 4, 6, 8, 10)})
    got = canonical_trie(store.search_one([1], cfg(max_samples=3, max_depth=1)))
    assert got == expected(1, 3, {(t,): (1, 1) for t in (2, 5, 8)})  # 0, 10 // 3, 20 // 3


def test_spread_over_all_shards_together(tmp_path):
    store = build(tmp_path, [[[1, t] for t in range(2, 6)], [[1, t] for t in range(6, 10)]], 20)
    got = canonical_trie(store.search_one([1], cfg(max_samples=4, max_depth=1)))
    assert got == expected(1, 4, {(t,): (1, 1) for t in (2, 4, 6, 8)})


def test_depth_limit_and_document_end(ds):
    got = canonical_trie(ds.search_one([8], cfg(max_depth=1)))
    assert got == expected(8, 2, {(1,): (1, 1)})  # doc 0 ends after 8; doc 2 continues with 1
    assert canonical_trie(ds.search_one([7], cfg(max_depth=0))) == expected(7, 3, {})


def test_no_match_crosses_a_document_boundary(tmp_path):
    store = build(tmp_path, [[[1, 2], [3, 4]]], 10)
    assert canonical_trie(store.search_one([2], cfg())) == expected(2, 1, {})  # 2 ends its document
    # (2, 3) spans the boundary and must not match; (3,) does
    assert canonical_trie(store.search_one([2, 3], cfg())) == expected(3, 1, {(4,): (1, 1)})
    assert canonical_trie(store.search_one([1, 2, 3, 4], cfg(max_query_len=4))) == expected(4, 1, {})


def test_wide_vocabulary_ids_above_65535_are_found(tmp_path):
    store = build(tmp_path, [[[65535, 65536, 69999], [69999, 0, 65536]]], 70000)
    assert store.info().token_width == 4
    got = canonical_trie(store.search_one([65535, 65536], cfg()))
    assert got == expected(65536, 1, {(69999,): (1, 2)})
    got = canonical_trie(store.search_one([69999], cfg()))
    assert got == expected(69999, 2, {(0,): (1, 1), (0, 65536): (1, 1)})


def test_empty_context_gives_an_empty_trie(ds):
    trie = ds.search_one([], cfg())
    assert list(trie.tokens) == [-1] and list(trie.parents) == [-1] and list(trie.counts) == [0]


def test_max_samples_zero_gives_an_empty_trie(ds):
    assert canonical_trie(ds.search_one([5, 6], cfg(max_samples=0))) == expected(6, 0, {})


def test_context_longer_than_the_datastore(ds):
    ctx = [9] * 1000 + [5, 6]
    got = canonical_trie(ds.search_one(ctx, cfg(max_query_len=2000)))
    assert got == canonical_trie(ds.search_one([5, 6], cfg()))


def test_no_match_at_all(ds):
    assert canonical_trie(ds.search_one([3], cfg())) == expected(3, 0, {})


def test_batch_results_line_up_with_contexts(ds):
    contexts = [[5, 6], [], np.array([6, 7], dtype=np.int32), [3]]
    res = ds.search(contexts, cfg())
    assert len(res) == 4 and res.offsets[0] == 0 and res.offsets[-1] == res.tokens.size
    for i, c in enumerate(contexts):
        assert canonical_trie(res.trie(i)) == canonical_trie(ds.search_one(c, cfg()))
    assert len(ds.search([], cfg())) == 0
    with pytest.raises(IndexError):
        res.trie(4)


# ---------------------------------------------------------------------------------------------------
# Bad search input


@pytest.mark.parametrize("ctx", [[5, 10], [5, -1], [2**31 - 1]])
def test_context_ids_outside_the_vocabulary(ds, ctx):
    with pytest.raises(ValueError, match="vocabulary"):
        ds.search_one(ctx, cfg())


def test_context_ids_outside_int32(ds):
    with pytest.raises(ValueError, match="int32"):
        ds.search_one([2**40], cfg())


@pytest.mark.parametrize(
    "ctx",
    [np.array([5, 6], dtype=np.int64), np.array([5, 6], dtype=np.uint16), np.array([5.0, 6.0]), [5.0, 6.0]],
)
def test_wrong_context_dtype_is_a_type_error(ds, ctx):
    with pytest.raises(TypeError):
        ds.search_one(ctx, cfg())


def test_context_layout_errors(ds):
    with pytest.raises(ValueError, match="1-D"):
        ds.search([np.zeros((2, 2), dtype=np.int32)], cfg())
    with pytest.raises(ValueError, match="contiguous"):
        ds.search([np.arange(10, dtype=np.int32)[::2]], cfg())
    with pytest.raises(TypeError, match="sequence of contexts"):
        ds.search(np.array([5, 6], dtype=np.int32), cfg())


def test_one_bad_context_fails_the_batch(ds):
    with pytest.raises(ValueError, match="vocabulary"):
        ds.search([[5, 6]] * 8 + [[11]] + [[5, 6]] * 8, cfg())


@pytest.mark.parametrize(
    "kw",
    [
        {"min_query_len": 0},
        {"max_query_len": 1, "min_query_len": 2},
        {"max_samples": -1},
        {"max_depth": -1},
        {"min_occurrences": -1},
    ],
)
def test_invalid_config(ds, kw):
    with pytest.raises(ValueError):
        ds.search_one([5, 6], cfg(**kw))
    with pytest.raises(ValueError):
        ReferenceDatastore.from_documents(DOCS, 10).search_one([5, 6], cfg(**kw))


# ---------------------------------------------------------------------------------------------------
# Native == reference on random corpora


@st.composite
def corpora(draw):
    """(vocab_size, shards: [[document]]): a small alphabet so that matches happen."""
    vocab = draw(st.sampled_from([3, 50, 65535, 65536, 70000]))
    ids = st.one_of(st.integers(0, min(vocab - 1, 4)), st.just(vocab - 1), st.integers(0, vocab - 1))
    alphabet = draw(st.lists(ids, min_size=1, max_size=4, unique=True))
    tokens = draw(st.lists(st.sampled_from(alphabet), min_size=1, max_size=60))
    cuts = sorted(draw(st.lists(st.integers(0, len(tokens)), max_size=8)))
    bounds = [0, *cuts, len(tokens)]
    docs = [tokens[a:b] for a, b in itertools.pairwise(bounds)]
    shard_cuts = sorted(draw(st.lists(st.integers(0, len(docs)), max_size=2)))
    sb = [0, *shard_cuts, len(docs)]
    shards = [docs[a:b] for a, b in itertools.pairwise(sb)]
    shards = [s for s in shards if sum(map(len, s))]  # an empty shard cannot be built
    contexts = draw(
        st.lists(
            st.one_of(
                st.lists(st.sampled_from(alphabet), max_size=8),
                st.integers(0, len(tokens)).flatmap(lambda e: st.just(tokens[max(0, e - 6) : e])),
            ),
            min_size=1,
            max_size=5,
        )
    )
    return vocab, shards, contexts


configs = st.builds(
    lambda lo, extra, occ, samples, depth: SearchConfig(lo + extra, lo, occ, samples, depth),
    st.integers(1, 3),
    st.integers(0, 4),
    st.integers(0, 6),
    st.integers(0, 6),
    st.integers(0, 5),
)


def assert_within_one_document(shards, context, trie) -> None:
    """Every node's path, after the context suffix that produced it, lies inside one document."""
    docs = [tuple(d) for s in shards for d in s]
    _, _, paths = canonical_trie(trie)
    for path, (_, match_len) in paths.items():
        needle = (*context[len(context) - match_len :], *path)
        assert any(d[i : i + len(needle)] == needle for d in docs for i in range(len(d) - len(needle) + 1)), (
            f"{needle} is not inside any document"
        )


@settings(max_examples=120)
@given(corpora(), configs)
def test_native_search_equals_reference(corpus, config):
    vocab, shards, contexts = corpus
    with tempfile.TemporaryDirectory() as tmp:
        store = build(Path(tmp), shards, vocab)
        got = store.search(contexts, config)
    want = ReferenceDatastore(shards, vocab).search(contexts, config)
    assert len(got) == len(want) == len(contexts)
    for i, ctx in enumerate(contexts):
        trie = got.trie(i)
        check_trie_invariants(trie)
        assert canonical_trie(trie) == canonical_trie(want.trie(i)), f"context {ctx}"
        for field in ("tokens", "parents", "counts", "depth", "match_len"):  # node order too
            assert np.array_equal(getattr(trie, field), getattr(want.trie(i), field)), (field, ctx)
        assert_within_one_document(shards, ctx, trie)
