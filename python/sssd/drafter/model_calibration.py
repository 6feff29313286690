"""Online calibration of a model drafter's node scores (numpy only).

A draft model's probability q of a token is not the probability that the target accepts it: under greedy
verification the target's argmax decides, so a good draft's top child is accepted far more often than its q
says, and its fourth child far less. The table learns, per (sibling rank, q bin), how often a node whose
parent was accepted (it was *reached*) was accepted itself, starting from the prior p = q:

    p(q, rank) = (accepted + prior_weight * q) / (reached + prior_weight)

Counts decay (``decay`` per observed tree) so the table follows the workload.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sssd.batch import tree_index

Q_EDGES = np.array([0.01, 0.03, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9])  # 9 bins of q
MAX_RANK = 4  # sibling ranks 0, 1, 2, 3 and "4 or later"


class ScoreTable:
    def __init__(self, prior_weight: float = 20.0, decay: float = 0.999):
        self.prior_weight, self.decay = float(prior_weight), float(decay)
        shape = (MAX_RANK + 1, len(Q_EDGES) + 1)
        self.reached = np.zeros(shape)
        self.accepted = np.zeros(shape)

    @staticmethod
    def _cells(q: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.minimum(rank, MAX_RANK), np.searchsorted(Q_EDGES, q, side="right")

    def __call__(self, q: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Calibrated p of nodes with draft probability ``q`` and sibling rank ``rank`` (same shapes)."""
        r, b = self._cells(np.asarray(q), np.asarray(rank))
        w = self.prior_weight
        return np.clip((self.accepted[r, b] + w * q) / (self.reached[r, b] + w), 0.0, 1.0)

    def record(self, q: np.ndarray, rank: np.ndarray, accepted: np.ndarray) -> None:
        """Nodes that were reached: their q, sibling rank and whether they were accepted."""
        r, b = self._cells(np.asarray(q), np.asarray(rank))
        np.add.at(self.reached, (r, b), 1.0)
        np.add.at(self.accepted, (r, b), np.asarray(accepted, np.float64))


def sibling_rank(parents: np.ndarray) -> np.ndarray:
    """Position of each node among its parent's children, in node order (roots: 0). ``parents`` may be
    a batch's parents made global (each tree's offset added), so that the ranks of every tree come at
    once."""
    parents = np.asarray(parents, np.int64)
    n = len(parents)
    order = np.argsort(parents, kind="stable")  # grouped by parent, in node order within a group
    grouped = parents[order]
    first = np.ones(n, bool)
    first[1:] = grouped[1:] != grouped[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    rank = np.zeros(n, np.int64)
    rank[order] = np.arange(n) - start
    rank[parents < 0] = 0
    return rank


def record_batch(table: ScoreTable, batch: Any, on_path: np.ndarray) -> int:
    """Record every tree of ``batch`` (``offsets``, ``parents``, ``raw_score``): each node whose parent is
    on the accepted path (``on_path``, bool ``[N]``) was reached, and accepted when on the path itself.
    Returns the trees recorded."""
    offsets = np.asarray(batch.offsets, np.int64)
    parents = np.asarray(batch.parents, np.int64)
    b = len(offsets) - 1
    table.reached *= table.decay**b
    table.accepted *= table.decay**b
    tree = tree_index(offsets)
    glob_parent = np.where(parents >= 0, parents + offsets[:-1][tree], -1)
    reached = np.flatnonzero((parents >= 0) & on_path[np.maximum(glob_parent, 0)])
    if len(reached):
        rank = sibling_rank(glob_parent)[reached]
        table.record(np.asarray(batch.raw_score, np.float64)[reached], rank, on_path[reached])
    return b
