"""The step's flat batch of trees: the vectorised mask builders, child lookup, verification walk and KV
commit agree with per-tree parent walks (the oracles) on random batches of trees of every shape."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sssd.engine.acceptance import child_index, children_lists
from sssd.engine.adapter import StepOutput
from sssd.engine.attention import commit_reference
from sssd.engine.backends import ancestor_bits, ancestor_rows, dense_visibility, padded_ancestors
from sssd.engine.kv_cache import CacheShape, KVCache
from sssd.engine.trees import AcceptedPaths, Tree, TreeBatch, chain_tree, root_trees
from sssd.engine.verify import ChildLookup, subtrees, verify_step
from sssd.kernels.reference import ancestor_masks


def random_tree(n: int, rng: np.random.Generator, shape: str = "random", vocab: int = 6) -> Tree:
    if shape == "chain":
        parents = np.arange(-1, n - 1)
    elif shape == "fan":
        parents = np.array([-1] + [0] * (n - 1))
    else:
        parents = np.array([-1] + [int(rng.integers(v)) for v in range(1, n)])
    depth = np.zeros(n, np.int64)
    for v in range(1, n):
        depth[v] = depth[parents[v]] + 1
    return Tree(rng.integers(0, vocab, n), parents, depth)  # few tokens: repeated siblings happen


def random_batch(seed: int, max_nodes: int = 20) -> TreeBatch:
    rng = np.random.default_rng(seed)
    shapes = ["random", "chain", "fan"]
    b = int(rng.integers(1, 6))
    return TreeBatch.of(
        [random_tree(int(rng.integers(1, max_nodes)), rng, shapes[int(rng.integers(3))]) for _ in range(b)]
    )


def walk_ancestors(parents: np.ndarray) -> np.ndarray:
    """The oracle: bool [n, n] by walking up from every node."""
    n = len(parents)
    m = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            m[i, j] = True
            j = int(parents[j])
    return m


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_masks_equal_the_per_tree_parent_walks(seed):
    batch = random_batch(seed)
    rng = np.random.default_rng(seed)
    committed = rng.integers(0, 9, batch.num_trees)
    rows = int((committed + batch.sizes).max()) + 2
    vis = dense_visibility(batch, committed, rows)
    nodes = 32
    pad = padded_ancestors(batch, batch.num_trees + 1, nodes)
    anc = ancestor_rows(batch)
    n_max = batch.max_size
    assert vis.shape == (batch.num_trees, n_max, rows)
    for i, tree in enumerate(batch.trees()):
        n, c = len(tree.tokens), int(committed[i])
        want = walk_ancestors(tree.parents)
        a = int(batch.offsets[i])
        assert np.array_equal(anc[a : a + n, :n], want) and not anc[a : a + n, n:].any()
        expect = np.zeros((n_max, rows), bool)
        expect[:n, :c] = True
        expect[:n, c : c + n] = want
        expect[n:, 0] = True  # padding queries see row 0 only
        assert np.array_equal(vis[i], expect)
        corner = np.eye(nodes, dtype=bool)
        corner[:n, :n] = want
        assert np.array_equal(pad[i], corner)
    assert np.array_equal(pad[-1], np.eye(nodes, dtype=bool))  # a padding slot
    bits = ancestor_bits(batch)
    assert bits.dtype == np.uint64 and np.array_equal(bits, ancestor_masks(batch.parents, batch.offsets))


def test_batches_of_chains_take_the_triangle():
    batch = TreeBatch.of(
        [chain_tree(np.arange(5)).tree(0), chain_tree([3]).tree(0), chain_tree([1, 2]).tree(0)]
    )
    assert batch.is_chains
    got = ancestor_rows(batch)
    for i, tree in enumerate(batch.trees()):
        a, n = int(batch.offsets[i]), len(tree.tokens)
        assert np.array_equal(got[a : a + n, :n], walk_ancestors(tree.parents))


@pytest.mark.parametrize("seed", range(10))
def test_child_lookup_equals_the_per_tree_dicts(seed):
    batch = random_batch(seed)
    lookup = ChildLookup(batch)
    for i, tree in enumerate(batch.trees()):
        a = int(batch.offsets[i])
        index, kids = child_index(tree.tokens, tree.parents), children_lists(tree.parents)
        for v in range(len(tree.tokens)):
            tokens = np.arange(-1, 8)
            got = lookup(np.full(len(tokens), a + v), tokens)
            want = [a + index[(v, t)] if (v, t) in index else -1 for t in tokens.tolist()]
            assert got.tolist() == want
            assert (lookup.children(a + v) - a).tolist() == kids[v]
    below = subtrees(batch, batch.offsets[:-1])
    assert below.tolist() == list(range(batch.num_nodes))  # every root's subtree: everything


def _greedy_walk(tree: Tree, logits: torch.Tensor) -> tuple[list[int], int]:
    """The oracle: one tree, one node at a time."""
    index = child_index(tree.tokens, tree.parents)
    node, path = 0, [0]
    while True:
        x = int(logits[node].argmax())
        nxt = index.get((node, x))
        if nxt is None:
            return path, x
        path.append(nxt)
        node = nxt


@pytest.mark.parametrize("seed", range(10))
def test_greedy_verification_of_the_batch_equals_walking_each_tree(seed):
    batch = random_batch(seed)
    rng = np.random.default_rng(seed)
    # logits that mostly follow a child: the walks go deep
    logits = torch.randn(batch.num_nodes, 6, generator=torch.Generator().manual_seed(seed))
    for v in range(batch.num_nodes):
        kids = ChildLookup(batch).children(v)
        if len(kids) and rng.random() < 0.8:
            logits[v, int(batch.tokens[kids[int(rng.integers(len(kids)))]])] += 10.0
    reqs = [SimpleNamespace(params=SimpleNamespace(greedy=True))] * batch.num_trees
    got = verify_step(StepOutput(logits, None), batch, reqs)
    assert got.offsets[-1] == len(got.nodes) and np.array_equal(batch.tree_of[got.nodes], np.repeat(
        np.arange(batch.num_trees), got.lengths))  # fmt: skip
    for i, tree in enumerate(batch.trees()):
        a = int(batch.offsets[i])
        path, token = _greedy_walk(tree, logits[a : a + len(tree.tokens)])
        assert got.path(i).tolist() == path and int(got.next_tokens[i]) == token
    assert np.flatnonzero(got.on_path(batch.num_nodes)).tolist() == sorted(got.nodes.tolist())


def test_flat_commit_equals_the_per_slot_reference():
    shape = CacheShape(layers=2, kv_heads=2, head_dim=3, dtype=torch.float32, device=torch.device("cpu"))
    cache = KVCache(shape, capacity=16)
    for _ in range(3):
        cache.add()
    cache.lengths[:] = [2, 0, 5]
    cache.keys.copy_(torch.randn(cache.keys.shape))
    cache.values.copy_(torch.randn(cache.values.shape))
    batch = TreeBatch.of([random_tree(n, np.random.default_rng(n)) for n in (6, 1, 5)])
    paths = [np.array([0, 2, 5]), np.array([0]), np.array([0, 1, 3, 4])]
    accepted = AcceptedPaths.from_paths(batch, paths, [1, 2, 3])
    assert [accepted.path(i).tolist() for i in range(3)] == [p.tolist() for p in paths]
    want = [commit_reference(cache.values[:, s], int(cache.lengths[s]), p) for s, p in enumerate(paths)]
    lengths = cache.lengths + accepted.lengths
    cache.commit(np.arange(3), accepted.local, accepted.offsets)
    assert cache.lengths.tolist() == lengths.tolist()
    for s in range(3):
        n = int(lengths[s])
        torch.testing.assert_close(cache.values[:, s, :, :n], want[s][:, :, :n])


def test_subset_and_placement_keep_node_order_and_renumber_parents():
    rng = np.random.default_rng(0)
    batch = TreeBatch.of([random_tree(7, rng), random_tree(4, rng, "chain")])
    keep = np.zeros(batch.num_nodes, bool)
    keep[batch.offsets[:-1]] = True
    keep[[1, 8, 9]] = True  # node 1 of tree 0 (a child of the root), nodes 1, 2 of the chain
    sub = batch.subset(keep, np.array([11, 12]))
    assert sub.sizes.tolist() == [2, 3] and sub.tokens[[0, 2]].tolist() == [11, 12]
    assert sub.parents.tolist() == [-1, 0, -1, 0, 1] and sub.depth.tolist() == [0, 1, 0, 1, 2]
    placed = sub.placed(np.array([1, 3]), np.array([5, 6, 7, 8]))
    assert placed.sizes.tolist() == [1, 2, 1, 3]
    assert placed.tokens.tolist() == [5, 11, int(sub.tokens[1]), 7, *sub.tokens[2:].tolist()]
    assert placed.parents.tolist() == [-1, -1, 0, -1, -1, 0, 1]
    roots = root_trees([4, 9])
    assert roots.sizes.tolist() == [1, 1] and roots.parents.tolist() == [-1, -1]


def test_draft_distributions_follow_their_nodes():
    rng = np.random.default_rng(1)
    q = rng.random((4, 6))
    tree = Tree(np.array([1, 2, 3, 4]), np.array([-1, 0, 0, 1]), np.array([0, 1, 1, 2]), q)
    batch = TreeBatch.of([random_tree(3, rng), tree])
    assert batch.uses_q.tolist() == [False, True]
    assert np.array_equal(batch.tree(1).q[1:], q[1:])
    keep = np.array([True, True, True, True, True, False, True])
    sub = batch.subset(keep)
    assert np.array_equal(sub.q[sub.q_index[sub.q_index >= 0]], q[[1, 3]])


def test_the_backend_is_chosen_once_and_plans_each_forward():
    """The adapter picks its attention backend when it is built; a forward's plan is SDPA or the kernel's
    (trees over the kernel's 128 nodes: SDPA), and every layer runs that one plan."""
    from sssd.engine.adapter import ModelAdapter
    from sssd.engine.backends import PackedBackend, PackedPlan, SdpaBackend, SdpaPlan
    from tiny_models import tiny_model

    model = tiny_model("llama")
    sdpa = ModelAdapter(model, attention="sdpa")
    emulated = ModelAdapter(model, attention="emulated")
    assert type(sdpa.backend) is SdpaBackend and isinstance(emulated.backend, PackedBackend)
    for adapter in (sdpa, emulated):
        slot = adapter.cache.add()
        adapter.prefill(slot, np.array([3, 4, 5]))
    small = TreeBatch.of([random_tree(5, np.random.default_rng(0))])
    assert isinstance(sdpa._context(0, small), SdpaPlan)
    assert isinstance(emulated._context(0, small), PackedPlan)
    assert isinstance(emulated._context(0, chain_tree(np.arange(200) % 7)), SdpaPlan)
    plan = emulated._context(0, small)
    plan.record = True
    calls = []
    real = plan.run

    def run(*a, **k):
        calls.append(id(plan))
        return real(*a, **k)

    plan.run = run
    emulated._run(small.tokens, 3 + small.depth, plan, "none")
    assert len(calls) == emulated.num_layers and plan.calls == list(range(emulated.num_layers))
