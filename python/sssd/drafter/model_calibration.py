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
    """Position of each node among its parent's children, in node order (roots: 0)."""
    rank = np.zeros(len(parents), np.int64)
    seen: dict[int, int] = {}
    for v in range(len(parents)):
        p = int(parents[v])
        if p >= 0:
            rank[v] = seen.get(p, 0)
            seen[p] = rank[v] + 1
    return rank


def reached_nodes(
    tokens: np.ndarray, parents: np.ndarray, path_tokens: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Nodes of one tree (root = node 0) whose parent was accepted, and whether each was accepted, given
    the accepted tokens ``path_tokens`` (in order from the root)."""
    node, on_path = 0, {0}
    for x in path_tokens:
        kids = np.nonzero((parents == node) & (tokens == x))[0]
        if len(kids) == 0:
            break
        node = int(kids[0])
        on_path.add(node)
    reached = np.nonzero(np.isin(parents, list(on_path)))[0]
    return reached, np.isin(reached, list(on_path))


def record_batch(table: ScoreTable, batch: Any, accepted_tokens: list[list[int] | None]) -> int:
    """Record every tree of ``batch`` whose accepted tokens are known; returns the trees recorded."""
    n = 0
    table.reached *= table.decay ** len(accepted_tokens)
    table.accepted *= table.decay ** len(accepted_tokens)
    for i, path in enumerate(accepted_tokens):
        if path is None:
            continue
        a, e = int(batch.offsets[i]), int(batch.offsets[i + 1])
        tokens, parents = np.asarray(batch.tokens[a:e]), np.asarray(batch.parents[a:e])
        reached, acc = reached_nodes(tokens, parents, path)
        if len(reached):
            rank = sibling_rank(parents)[reached]
            table.record(np.asarray(batch.raw_score[a:e], np.float64)[reached], rank, acc)
        n += 1
    return n
