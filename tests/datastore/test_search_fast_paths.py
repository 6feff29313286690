"""Edge cases of the fast search paths (lockstep range search, sampled-key index with first-symbol and
pair tables, sorted-run trie insertion) against a brute-force search written here.

The index is forced on tiny datastores with SSSD_SEARCH_INDEX="STRIDE,1" (read when a mapping is first
searched), so every path runs on corpora small enough for the brute force.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sssd import Datastore, SearchConfig, build_datastore

INDEX_MODES = ["off", "2,1", "4,1", "64,1"]


def _suffix_array(docs: list[list[int]]) -> tuple[list[int], list[int]]:
    """(stream, sorted real positions): stream = token + 1 per token, 0 after each document; suffixes
    compared over the whole stream, as the builder does."""
    stream: list[int] = []
    for d in docs:
        stream += [t + 1 for t in d] + [0]
    positions = [p for p, s in enumerate(stream) if s != 0]
    positions.sort(key=lambda p: stream[p:])
    return stream, positions


def brute_search(shards: list[list[list[int]]], ctx: list[int], cfg: SearchConfig) -> dict[str, list[int]]:
    """The trie search_context builds, node for node (creation order)."""
    root = ctx[-1] if ctx else -1
    trie = {"tokens": [root], "parents": [-1], "counts": [0], "depth": [0], "match_len": [0]}
    children: dict[tuple[int, int], int] = {}
    max_len = min(cfg.max_query_len, len(ctx))
    if max_len < cfg.min_query_len or cfg.max_samples == 0:
        return trie
    built = [_suffix_array(docs) for docs in shards]
    query = [t + 1 for t in ctx[len(ctx) - max_len :]]

    def occurrences(length: int) -> list[tuple[list[int], int]]:
        q = query[max_len - length :]
        return [(s, p) for s, pos in built for p in pos if s[p : p + length] == q]

    if not occurrences(cfg.min_query_len):
        return trie
    longest = max(n for n in range(cfg.min_query_len, max_len + 1) if occurrences(n))
    for length in range(longest, cfg.min_query_len - 1, -1):
        occ = occurrences(length)
        n = len(occ)
        k = min(n, cfg.max_samples)
        for i in range(k):
            stream, p = occ[i if n == k else i * n // k]
            trie["counts"][0] += 1
            node = 0
            for d in range(cfg.max_depth):
                sym = stream[p + length + d]
                if sym == 0:
                    break
                child = children.get((node, sym - 1))
                if child is None:
                    child = len(trie["tokens"])
                    children[(node, sym - 1)] = child
                    for field, value in zip(
                        ("tokens", "parents", "counts", "depth", "match_len"),
                        (sym - 1, node, 0, trie["depth"][node] + 1, length),
                        strict=True,
                    ):
                        trie[field].append(value)
                trie["counts"][child] += 1
                node = child
        if n >= cfg.min_occurrences:
            break
    return trie


def check(tmp_path, shards, contexts, cfg, vocab, sa64=(), name="ds"):
    paths = []
    for i, docs in enumerate(shards):
        p = tmp_path / f"{name}_{i}.sssd"
        build_datastore(docs, p, vocab_size=vocab, force_sa64=i in sa64)
        paths.append(p)
    ds = Datastore.open(paths if len(paths) > 1 else paths[0])
    result = ds.search([np.asarray(c, dtype=np.int32) for c in contexts], cfg)
    for j, ctx in enumerate(contexts):
        got = result.trie(j)
        want = brute_search(shards, list(ctx), cfg)
        for field, values in want.items():
            assert getattr(got, field).tolist() == values, (field, ctx, cfg)


@pytest.fixture(params=INDEX_MODES)
def index_mode(request, monkeypatch):
    monkeypatch.setenv("SSSD_SEARCH_INDEX", request.param)
    return request.param


CFG = SearchConfig(max_query_len=16, min_query_len=1, min_occurrences=4, max_samples=100, max_depth=8)


def test_ranges_of_size_one(tmp_path, index_mode):
    rng = np.random.default_rng(0)
    docs = [list(rng.permutation(500)[:120]) for _ in range(4)]  # every n-gram (n >= 2) is unique
    contexts = [d[: i + 1] for d in docs for i in (0, 1, 5, 50, 119)] + [[7], [499, 3]]
    for cfg in (CFG, SearchConfig(max_query_len=3, min_query_len=1, min_occurrences=1, max_samples=1)):
        check(tmp_path, [docs], contexts, cfg, 500, name=f"u{cfg.max_samples}")


def test_queries_equal_to_whole_documents(tmp_path, index_mode):
    docs = [[1, 2, 3], [1, 2, 3], [4], [2, 3, 1, 2, 3, 9], [9, 9], []]
    contexts = [d for d in docs if d] + [[5, 1, 2, 3], [3, 9, 9]]
    cfg = SearchConfig(max_query_len=8, min_query_len=1, min_occurrences=0, max_samples=100, max_depth=8)
    check(tmp_path, [docs], contexts, cfg, 10)
    check(tmp_path, [docs], contexts, CFG, 10, name="b")


def test_long_repeated_runs(tmp_path, index_mode):
    docs = [[5] * 700, [1, 2] * 300, [5] * 3 + [6], [0, 0, 0, 1] * 50]
    contexts = [[5] * 20, [5] * 3, [2, 1, 2], [1, 2] * 10, [0, 0, 1, 0, 0], [6, 5, 5]]
    for cfg in (
        CFG,
        SearchConfig(max_query_len=24, min_query_len=2, min_occurrences=50, max_samples=37, max_depth=30),
    ):
        check(tmp_path, [docs], contexts, cfg, 8, name=f"r{cfg.max_samples}")


def test_ids_above_65535(tmp_path, index_mode):
    rng = np.random.default_rng(1)
    high = [65534, 65535, 65536, 65537, 69999]
    docs = [list(rng.choice([*high, 0, 1, 2], size=int(rng.integers(1, 60)))) for _ in range(40)]
    contexts = [docs[i][:j] for i in range(0, 40, 5) for j in (1, 2, 4, 9)] + [[69999, 65536], [65535]]
    check(tmp_path, [docs], contexts, CFG, 70_000)


def test_shards_of_different_widths(tmp_path, index_mode):
    rng = np.random.default_rng(2)
    shards = [[list(rng.integers(0, 6, size=int(rng.integers(0, 40)))) for _ in range(30)] for _ in range(3)]
    contexts = [list(rng.integers(0, 6, size=int(rng.integers(1, 12)))) for _ in range(40)]
    check(tmp_path, shards, contexts, CFG, 6, sa64=(1,))


@settings(max_examples=40)
@given(
    docs=st.lists(st.lists(st.integers(0, 4), max_size=30), min_size=1, max_size=12),
    contexts=st.lists(st.lists(st.integers(0, 4), max_size=12), min_size=1, max_size=6),
    max_query_len=st.integers(1, 12),
    min_query_len=st.integers(1, 4),
    min_occurrences=st.integers(0, 6),
    max_samples=st.integers(0, 9),
    max_depth=st.integers(0, 6),
    stride=st.sampled_from(["off", "2,1", "8,1"]),
)
def test_random_corpora(
    tmp_path_factory,
    docs,
    contexts,
    max_query_len,
    min_query_len,
    min_occurrences,
    max_samples,
    max_depth,
    stride,
):
    if min_query_len > max_query_len:
        min_query_len = max_query_len
    if not any(docs):
        docs = [[0], *docs]  # an empty corpus is rejected by the builder
    cfg = SearchConfig(max_query_len, min_query_len, min_occurrences, max_samples, max_depth)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SSSD_SEARCH_INDEX", stride)
        check(tmp_path_factory.mktemp("h"), [docs], contexts, cfg, 5)


def test_index_is_dropped_with_its_mapping(tmp_path, monkeypatch):
    """A new datastore mapped at a closed one's address must not reuse the old index."""
    import gc

    monkeypatch.setenv("SSSD_SEARCH_INDEX", "2,1")
    rng = np.random.default_rng(3)
    cfg = SearchConfig(max_query_len=6, min_query_len=1, min_occurrences=2, max_samples=5, max_depth=4)
    for round_ in range(6):
        docs = [list(rng.integers(0, 4, size=50)) for _ in range(8)]  # same shape every round
        path = tmp_path / f"r{round_}.sssd"
        build_datastore(docs, path, vocab_size=4)
        ds = Datastore.open(path)
        contexts = [docs[i][:j] for i in range(8) for j in (3, 9)]
        result = ds.search([np.asarray(c, dtype=np.int32) for c in contexts], cfg)
        for j, ctx in enumerate(contexts):
            assert result.trie(j).tokens.tolist() == brute_search([docs], list(ctx), cfg)["tokens"]
        del ds, result
        gc.collect()
