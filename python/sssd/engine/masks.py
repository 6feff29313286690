"""The one place where draft trees become attention masks and kernel metadata.

A tree (``sssd.engine.trees.Tree``) is checked once, where it enters the engine (``check_drafts``); every
mask below is derived from one builder, :func:`ancestor_matrix`, whose oracle is the parent walk of
``sssd.kernels.reference.ancestor_masks`` (tests). Node ``t`` of a tree sees itself and its ancestors;
every node sees all of its request's committed cache rows.

- :func:`dense_visibility` — bool ``[B, n_max, rows]`` for torch SDPA over the cache (the eager forward);
- :func:`padded_ancestors` — bool ``[slots, nodes, nodes]`` for the static-shape forward, which builds its
  cache-row mask inside the graph from it and the committed lengths;
- :func:`ancestor_bits` — uint64 ``[N, 2]`` rows of the CUDA tree kernel (bit ``j`` of a node's row: tree
  node ``j`` is visible), for trees of at most ``MAX_TREE_NODES`` nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sssd.kernels.tree_attention import MAX_TREE_NODES


def ancestor_matrix(parents: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """bool ``[n, n]``: ``m[i, j]`` is True when node ``j`` is node ``i`` or one of its ancestors.

    ``parents[i] < i`` (-1 for the root), ``depth`` = parent's + 1: a checked tree. Built one depth level
    at a time (each level's rows are their parents' rows plus the diagonal); a chain is the lower
    triangle."""
    parents = np.asarray(parents, dtype=np.int64)
    n = len(parents)
    if n <= 1 or np.array_equal(parents, np.arange(-1, n - 1)):  # a chain (prefill chunks, one-path drafts)
        return np.tri(n, dtype=bool)
    depth = np.asarray(depth)
    m = np.eye(n, dtype=bool)
    for d in range(1, int(depth.max()) + 1):
        level = np.flatnonzero(depth == d)
        m[level] |= m[parents[level]]
    return m


def dense_visibility(trees: Sequence, committed: np.ndarray, rows: int) -> np.ndarray:
    """bool ``[B, n_max, rows]``: tree ``i``'s node ``t`` (stored at cache row ``committed[i] + t``) sees
    the committed rows and its ancestors' rows. Padding queries (``t >= len(tree)``) see row 0 only, so
    softmax stays defined; their outputs are dropped."""
    n_max = max(len(t.tokens) for t in trees)
    vis = np.zeros((len(trees), n_max, rows), dtype=bool)
    for i, (t, c) in enumerate(zip(trees, committed, strict=True)):
        n, c = len(t.tokens), int(c)
        vis[i, :n, :c] = True
        vis[i, :n, c : c + n] = ancestor_matrix(t.parents, t.depth)
        vis[i, n:, 0] = True
    return vis


def padded_ancestors(trees: Sequence, slots: int, nodes: int) -> np.ndarray:
    """bool ``[slots, nodes, nodes]``: tree ``b``'s ancestor matrix in the top-left corner of slot ``b``;
    every padding node (and every node of a padding slot) sees itself only."""
    anc = np.zeros((slots, nodes, nodes), dtype=bool)
    anc[:, np.arange(nodes), np.arange(nodes)] = True
    for b, t in enumerate(trees):
        k = len(t.tokens)
        anc[b, :k, :k] = ancestor_matrix(t.parents, t.depth)
    return anc


def ancestor_bits(trees: Sequence) -> np.ndarray:
    """uint64 ``[N, 2]`` (the packed trees' nodes in order): bit ``j`` of a node's row (word ``j // 64``)
    is set when node ``j`` of its tree is the node or one of its ancestors."""
    if any(len(t.tokens) > MAX_TREE_NODES for t in trees):
        raise ValueError(f"the tree kernel's masks hold trees of at most {MAX_TREE_NODES} nodes")
    rows = []
    for t in trees:
        m = np.zeros((len(t.tokens), MAX_TREE_NODES), dtype=bool)
        m[:, : len(t.tokens)] = ancestor_matrix(t.parents, t.depth)
        rows.append(np.packbits(m, axis=1, bitorder="little"))  # [n, 16] bytes, bit j of byte j // 8
    packed = np.ascontiguousarray(np.concatenate(rows))
    return packed.view("<u8").astype(np.uint64)  # two little-endian 64-bit words per node
