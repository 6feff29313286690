"""Chains chosen like trees: the best path of each request's fused tree, lengths ranked batch-wide.

Serving engines such as vLLM verify one *chain* of draft tokens per request. The drafter still builds
the fused tree (request tokens, datastore, pool); the chain of a request is the tree's most probable
path (from the root, the child with the highest accumulated probability f at each depth). Since f only
falls along a path, ranking every chain node of the batch by f gives prefixes of every chain: keeping
the first ``n`` nodes of that ranking is a valid selection, and its expected accepted tokens is the sum
of their f (the same ranking the tree engine's global budget uses). How many to keep is chosen by the
caller, e.g. by goodput with :func:`sssd.policy.goodput.choose_budget`.

numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Chains:
    """Best chains of a batch of trees, B requests, each up to ``k`` tokens."""

    tokens: list[np.ndarray]  # [B] of [len_i] int32: the chain of request i (best path, root excluded)
    f: list[np.ndarray]  # [B] of [len_i] float64: accumulated probability of each chain node
    nodes: list[np.ndarray]  # [B] of [len_i] int64: the chain's node indices within the tree
    order: np.ndarray  # [M] int64 request index of the M chain nodes, by f descending (a valid ranking)
    gain: np.ndarray  # [M + 1] float64: gain[n] = Σ f of the first n nodes of `order`

    def lengths(self, n: int) -> np.ndarray:
        """[B] chain length of every request when the first ``n`` ranked nodes are kept."""
        counts = np.bincount(self.order[: max(0, int(n))], minlength=len(self.tokens))
        return counts.astype(np.int64)

    def take(self, n: int) -> list[list[int]]:
        """The drafts to submit when the first ``n`` ranked nodes are kept."""
        lengths = self.lengths(n)
        return [t[:m].tolist() for t, m in zip(self.tokens, lengths, strict=True)]


def best_chains(batch, k: int, min_f: float = 0.0, caps=None) -> Chains:
    """The most probable path (up to ``k`` nodes, nodes with f < ``min_f`` cut) of every tree of a
    ``DraftBatch``-like batch (``tokens``, ``parents``, ``acc_prob``, ``offsets``); ``caps`` ``[B]``:
    optional shorter limits per tree (e.g. the room left in a request's context)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    offsets = np.asarray(batch.offsets, dtype=np.int64)
    tokens_all = np.asarray(batch.tokens)
    parents_all = np.asarray(batch.parents)
    f_all = np.asarray(batch.acc_prob, dtype=np.float64)
    tokens: list[np.ndarray] = []
    fs: list[np.ndarray] = []
    nodes: list[np.ndarray] = []
    for i in range(len(offsets) - 1):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        parents = parents_all[lo:hi]
        f = f_all[lo:hi]
        best_child = np.full(hi - lo, -1, dtype=np.int64)
        best_f = np.full(hi - lo, -1.0)
        for v in range(1, hi - lo):  # parents precede children: one pass finds each node's best child
            p = int(parents[v])
            if f[v] > best_f[p]:
                best_f[p], best_child[p] = f[v], v
        path = []
        v = 0
        limit = k if caps is None else min(k, int(caps[i]))
        while len(path) < limit and best_child[v] >= 0 and best_f[v] >= min_f:
            v = int(best_child[v])
            path.append(v)
        idx = np.asarray(path, dtype=np.int64)
        nodes.append(idx)
        tokens.append(tokens_all[lo:hi][idx].astype(np.int32))
        fs.append(f[idx])
    req = np.concatenate([np.full(len(x), i, dtype=np.int64) for i, x in enumerate(fs)] or [np.zeros(0)])
    fcat = np.concatenate(fs) if fs else np.zeros(0)
    depth = np.concatenate([np.arange(len(x)) for x in fs] or [np.zeros(0)])
    # by f descending; ties by depth so that a chain's nodes stay in path order (f never rises on a path)
    order = np.lexsort((depth, -fcat)) if len(fcat) else np.zeros(0, dtype=np.int64)
    gain = np.concatenate([[0.0], np.cumsum(fcat[order])])
    return Chains(tokens, fs, nodes, req[order].astype(np.int64), gain)
