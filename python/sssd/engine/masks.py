"""The one place where a step's trees become attention masks and kernel metadata.

Every builder takes the flat batch (``sssd.engine.tree_batch.TreeBatch``: one tree per slot, checked once
where it entered the engine) and works on all trees at once; the only Python loop is over depth levels.
All masks derive from :func:`ancestor_rows`, whose oracle is the parent walk of
``sssd.kernels.reference.ancestor_masks`` (tests). Node ``t`` of a tree sees itself and its ancestors;
every node sees all of its request's committed cache rows.

- :func:`dense_visibility` — bool ``[B, n_max, rows]`` for torch SDPA over the cache (the eager forward);
- :func:`padded_ancestors` — bool ``[slots, nodes, nodes]`` for the static-shape forward, which builds its
  cache-row mask inside the graph from it and the committed lengths;
- :func:`ancestor_bits` — uint64 ``[N, 2]`` rows of the CUDA tree kernel (bit ``j`` of a node's row: tree
  node ``j`` is visible), for trees of at most ``MAX_TREE_NODES`` nodes.
"""

from __future__ import annotations

import numpy as np

from sssd.engine.tree_batch import TreeBatch
from sssd.kernels.tree_attention import MAX_TREE_NODES


def ancestor_rows(batch: TreeBatch, width: int | None = None) -> np.ndarray:
    """bool ``[N, width]`` (``width`` >= the largest tree, default it): ``m[v, j]`` is True when node ``j``
    of ``v``'s tree is ``v`` or one of its ancestors. One vectorised pass per depth level (a level's rows
    are their parents' rows plus the diagonal); batches of chains are lower triangles at once."""
    width = batch.max_size if width is None else int(width)
    local = batch.local
    if batch.is_chains:
        return local[:, None] >= np.arange(width)[None, :]
    m = np.zeros((batch.num_nodes, width), dtype=bool)
    m[np.arange(batch.num_nodes), local] = True
    gp = batch.global_parents
    for level in batch.levels:
        m[level] |= m[gp[level]]
    return m


def ancestor_matrix(parents: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """bool ``[n, n]`` of one tree (``m[i, j]``: node ``j`` is node ``i`` or one of its ancestors)."""
    parents = np.asarray(parents, np.int64)
    n = len(parents)
    tree = TreeBatch(np.zeros(n, np.int64), parents, np.asarray(depth, np.int64), np.array([0, n], np.int64))
    return ancestor_rows(tree)


def dense_visibility(batch: TreeBatch, committed: np.ndarray, rows: int) -> np.ndarray:
    """bool ``[B, n_max, rows]``: tree ``i``'s node ``t`` (stored at cache row ``committed[i] + t``) sees
    the committed rows and its ancestors' rows. Padding queries (``t >= len(tree)``) see row 0 only, so
    softmax stays defined; their outputs are dropped."""
    committed = np.asarray(committed, np.int64)
    n_max = batch.max_size
    row = np.arange(rows)
    real = np.arange(n_max)[None, :] < batch.sizes[:, None]  # [B, n_max]
    vis = real[:, :, None] & (row[None, None, :] < committed[:, None, None])
    vis[:, :, 0] |= ~real
    if batch.num_trees == 1:  # one tree (a prefill chunk, a lone request): its block is a slice
        c = int(committed[0])
        vis[0, :, c : c + n_max] = ancestor_rows(batch)
        return vis
    v, j = np.nonzero(ancestor_rows(batch))
    tree = batch.tree_of[v]
    vis[tree, batch.local[v], committed[tree] + j] = True
    return vis


def padded_ancestors(batch: TreeBatch, slots: int, nodes: int) -> np.ndarray:
    """bool ``[slots, nodes, nodes]``: tree ``b``'s ancestor matrix in the top-left corner of slot ``b``;
    every padding node (and every node of a padding slot) sees itself only."""
    anc = np.zeros((slots, nodes, nodes), dtype=bool)
    anc[:, np.arange(nodes), np.arange(nodes)] = True
    anc[batch.tree_of, batch.local] = ancestor_rows(batch, nodes)
    return anc


def ancestor_bits(batch: TreeBatch) -> np.ndarray:
    """uint64 ``[N, 2]`` (the batch's nodes in order): bit ``j`` of a node's row (word ``j // 64``) is set
    when node ``j`` of its tree is the node or one of its ancestors."""
    if batch.max_size > MAX_TREE_NODES:
        raise ValueError(f"the tree kernel's masks hold trees of at most {MAX_TREE_NODES} nodes")
    bits = np.packbits(ancestor_rows(batch, MAX_TREE_NODES), axis=1, bitorder="little")  # [N, 16] bytes
    return np.ascontiguousarray(bits).view("<u8").astype(np.uint64)  # two little-endian 64-bit words
