"""The flat-batch algebra (``sssd.batch``): a batch cut to some of its nodes is the same trees, renumbered."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sssd
from sssd.batch import accumulated_probs, global_parents, reached_nodes, take_nodes, tree_index, tree_sums


def _paths(tokens, parents, offsets) -> list[set[tuple[int, ...]]]:
    """Each tree as the set of its nodes' token paths from the root."""
    out = []
    for t in range(len(offsets) - 1):
        a, e = int(offsets[t]), int(offsets[t + 1])
        path: dict[int, tuple[int, ...]] = {}
        for v in range(e - a):
            p = int(parents[a + v])
            path[v] = (*(path[p] if p >= 0 else ()), int(tokens[a + v]))
        out.append(set(path.values()))
    return out


def test_tree_index():
    assert tree_index(np.array([0, 2, 3, 3 + 4])).tolist() == [0, 0, 1, 2, 2, 2, 2]


def test_global_parents_and_reached_nodes():
    @dataclass
    class Batch:
        offsets: np.ndarray
        parents: np.ndarray

    # tree 0: root, 1 <- 0, 2 <- 0, 3 <- 1; tree 1: root, 1 <- 0
    b = Batch(np.array([0, 4, 6]), np.array([-1, 0, 0, 1, -1, 0]))
    assert global_parents(b.offsets, b.parents).tolist() == [-1, 0, 0, 1, -1, 4]
    on_path = np.array([True, True, False, False, True, False])
    # tested: the children of an accepted node (0's children 1 and 2, 1's child 3, tree 1's node 5)
    assert reached_nodes(b, on_path).tolist() == [False, True, True, True, False, True]
    on_path[1] = False
    assert reached_nodes(b, on_path).tolist() == [False, True, True, False, False, True]


def test_draft_batch_take_keeps_paths_ranks_and_gain():
    d = sssd.Drafter(config=sssd.DrafterConfig(use_pool=False))
    d.add_request(1, [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 1, 5, 6, 7])
    d.add_request(2, [3, 4, 3, 4, 3, 2, 3, 4, 3])
    batch = d.propose([1, 2], budget=12)
    keep = (batch.depth <= 1) | (np.arange(batch.num_nodes) % 3 == 0)
    while True:  # closed under parents
        glob = np.where(batch.parents >= 0, batch.parents + batch.offsets[tree_index(batch.offsets)], 0)
        closed = keep & keep[glob]
        if (closed == keep).all():
            break
        keep = closed
    assert not keep.all()
    cut = batch.take(keep)
    full = _paths(batch.tokens, batch.parents, batch.offsets)
    kept = _paths(cut.tokens, cut.parents, cut.offsets)
    assert all(k <= f for k, f in zip(kept, full, strict=True))
    assert sum(len(k) for k in kept) == int(keep.sum())
    drafted = cut.rank >= 0
    assert sorted(cut.rank[drafted].tolist()) == list(range(int(drafted.sum())))
    order = np.argsort(cut.rank[drafted])
    np.testing.assert_allclose(np.diff(cut.gain), cut.acc_prob[drafted][order], rtol=1e-5)
    assert take_nodes(batch, np.ones(batch.num_nodes, bool)) is batch


@dataclass(frozen=True)
class _Plain:
    tokens: np.ndarray
    parents: np.ndarray
    offsets: np.ndarray
    request_ids: np.ndarray


def test_take_nodes_cuts_a_plain_dataclass_batch():
    b = _Plain(np.array([1, 2, 3, 4, 9, 8, 7]), np.array([-1, 0, 0, 2, -1, 0, 1]), np.array([0, 4, 7]),
               np.array([10, 11]))  # fmt: skip
    cut = take_nodes(b, np.array([1, 0, 1, 1, 1, 1, 0], bool))
    assert cut.tokens.tolist() == [1, 3, 4, 9, 8]
    assert cut.parents.tolist() == [-1, 0, 1, -1, 0]
    assert cut.offsets.tolist() == [0, 3, 5] and cut.request_ids.tolist() == [10, 11]


def test_tree_sums_and_accumulated_probs():
    b = _Plain(np.array([1, 2, 3, 4, 9, 8]), np.array([-1, 0, 1, 0, -1, 0]), np.array([0, 4, 6]),
               np.array([10, 11]))  # fmt: skip
    probs = np.array([1.0, 0.5, 0.4, 0.25, 1.0, 0.8])
    depth = np.array([0, 1, 2, 1, 0, 1])

    @dataclass(frozen=True)
    class WithProbs:
        parents: np.ndarray
        probs: np.ndarray
        depth: np.ndarray
        offsets: np.ndarray

    f = accumulated_probs(WithProbs(b.parents, probs, depth, b.offsets))
    np.testing.assert_allclose(f, [1.0, 0.5, 0.2, 0.25, 1.0, 0.8])
    np.testing.assert_allclose(tree_sums(np.where(b.parents >= 0, f, 0.0), b.offsets), [0.95, 0.8])
    assert tree_sums(np.zeros(0), np.array([0])).shape == (0,)
