"""A minimal stand-in for the drafter's DraftBatch (the contract's fields + truncate) for policy tests.

``make_batch(trees)`` takes per-request candidate trees as (parents, probs) lists of non-root nodes
(parents index into the tree: 0 = root, node j is tree index j + 1) and ranks the nodes batch-wide
greedily by f(v) over connected subtrees, as the drafter's joint selection does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from sssd.policy.interface import PlainDraftBatch


class FakeBatch(PlainDraftBatch):
    """The contract's fields with a loop-by-loop ``truncate`` (the oracle of ``goodput.truncate_batch``)."""

    def truncate(self, k: int) -> FakeBatch:
        keep = (self.rank < k) | (self.rank < 0)  # roots have rank -1
        idx = np.flatnonzero(keep)
        tree = np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))
        new_offsets = np.concatenate(
            [[0], np.cumsum(np.bincount(tree[idx], minlength=len(self.offsets) - 1))]
        )
        local = np.full(len(self.rank), -1)
        for t in range(len(self.offsets) - 1):
            mine = idx[tree[idx] == t]
            local[mine] = np.arange(len(mine))
        parents = np.where(self.parents[idx] >= 0, local[self.parents[idx] + self.offsets[tree[idx]]], -1)
        return dataclasses.replace(
            self,
            tokens=self.tokens[idx],
            parents=parents.astype(np.int32),
            probs=self.probs[idx],
            depth=self.depth[idx],
            offsets=new_offsets.astype(np.int64),
            rank=self.rank[idx],
            gain=self.gain[: k + 1],
        )


def make_batch(trees) -> FakeBatch:
    tokens, parents, probs, depth, offsets = [], [], [], [], [0]
    for t, (par, pr) in enumerate(trees):
        base = len(tokens)
        tokens.append(1000 + t)
        parents.append(-1)
        probs.append(1.0)
        depth.append(0)
        for j, (p, q) in enumerate(zip(par, pr, strict=True)):
            assert 0 <= p <= j
            tokens.append(j + 1)
            parents.append(p)
            probs.append(q)
            depth.append(depth[base + p] + 1)
        offsets.append(len(tokens))
    parents_a = np.array(parents, dtype=np.int32)
    probs_a = np.array(probs, dtype=np.float32)
    offsets_a = np.array(offsets, dtype=np.int64)
    n = len(tokens)
    tree = np.repeat(np.arange(len(trees)), np.diff(offsets_a))
    f = np.ones(n)
    for i in range(n):
        if parents_a[i] >= 0:
            f[i] = f[parents_a[i] + offsets_a[tree[i]]] * probs_a[i]
    rank = np.full(n, -1, dtype=np.int32)
    selected = parents_a < 0
    gain = [0.0]
    r = 0
    while True:
        glob_par = np.where(parents_a >= 0, parents_a + offsets_a[tree], 0)
        frontier = np.flatnonzero(~selected & selected[glob_par] & (parents_a >= 0))
        if len(frontier) == 0:
            break
        v = frontier[np.argmax(f[frontier])]
        selected[v] = True
        rank[v] = r
        r += 1
        gain.append(gain[-1] + f[v])
    return FakeBatch(
        np.array(tokens, dtype=np.int32),
        parents_a,
        probs_a,
        np.array(depth, dtype=np.int32),
        offsets_a,
        rank,
        np.array(gain),
    )


class FakeDrafter:
    """Returns a fixed batch for any propose call (ignores the budget beyond what the batch holds)."""

    def __init__(self, batch: FakeBatch) -> None:
        self.batch = batch
        self.calls = 0

    def propose(self, rids, budget=64, slo=None):
        self.calls += 1
        k = min(int(budget), len(self.batch.gain) - 1)
        return self.batch.truncate(k)
