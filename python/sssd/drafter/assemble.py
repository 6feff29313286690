"""Best-first selection over candidate nodes of many trees and packing into a ``DraftBatch`` (numpy only).

Shared by the model drafter and the merged drafter. Candidates are kept in one flat table (roots
included) in *creation order*: a parent is created before its children and, for sampled drafts, earlier
draws of a node's children before later ones. Selection sorts by ``key`` (descending), ties by creation
order. When ``key`` never increases from a parent to its children (and from a sibling to the next sibling
where sibling order matters), every selected set is closed under parents (and sibling prefixes), so any
prefix of the order is a valid set of trees: ``DraftBatch.truncate(k)`` and the budget policy rely on it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from sssd.batch import renumbered
from sssd.drafter.retrieval import DraftBatch


@dataclass(frozen=True, eq=False)
class ModelDraftBatch(DraftBatch):
    """A ``DraftBatch`` that may carry the draft distributions its nodes were sampled from."""

    # [N, V] float32: row v = the distribution node v's token was drawn from (node order; roots zero);
    # None for deterministic drafts. The engine's SpecInfer verification reads it.
    draft_probs: np.ndarray | None = None

    def truncate(self, k: int) -> ModelDraftBatch:
        out = super().truncate(k)
        kw = {f.name: getattr(out, f.name) for f in fields(DraftBatch)}
        dp = self.draft_probs
        if dp is not None:
            keep = (self.rank < int(k)) & (self.rank >= 0) | (self.parents < 0)
            dp = dp[keep]
        return ModelDraftBatch(**kw, draft_probs=dp)

    def take(self, keep: np.ndarray) -> ModelDraftBatch:
        keep = np.asarray(keep, bool)
        offsets, parents = renumbered(self.offsets, self.parents, keep)
        dp = self.draft_probs[keep] if self.draft_probs is not None else None
        return ModelDraftBatch(**self._taken(keep, offsets, parents), draft_probs=dp)


class Candidates:
    """Growing flat table of candidate nodes (roots first, then in creation order)."""

    COLUMNS: ClassVar[dict[str, type]] = {
        "tree": np.int64,  # which request
        "parent": np.int64,  # global candidate index, -1 for roots
        "token": np.int64,
        "depth": np.int64,
        "prob": np.float64,  # p(node | parent)
        "key": np.float64,  # selection key (f, or a monotone lower bound of it)
        "raw": np.float64,  # raw score before calibration
        "source": np.int64,
        "source_mask": np.int64,
        "match_len": np.int64,
    }

    def __init__(self, roots: np.ndarray, source_mask: int = 0):
        b = len(roots)
        self._parts: dict[str, list[np.ndarray]] = {name: [] for name in self.COLUMNS}
        self.n = 0
        self.add(
            tree=np.arange(b), parent=np.full(b, -1), token=roots, depth=np.zeros(b), prob=np.ones(b),
            key=np.ones(b), raw=np.ones(b), source=np.full(b, -1), source_mask=np.full(b, source_mask),
            match_len=np.zeros(b),
        )  # fmt: skip
        self.roots = np.arange(b)

    def add(self, **cols: Any) -> np.ndarray:
        """Append nodes (every column given, equal lengths); returns their global indices."""
        m = len(cols["token"])
        for name, dtype in self.COLUMNS.items():
            self._parts[name].append(np.asarray(cols[name], dtype=dtype).reshape(m))
        self._cache = None
        idx = np.arange(self.n, self.n + m)
        self.n += m
        return idx

    def __getattr__(self, name: str) -> np.ndarray:
        if name not in Candidates.COLUMNS:
            raise AttributeError(name)
        cache = self.__dict__.get("_cache")
        if cache is None:
            cache = self.__dict__["_cache"] = {}
        if name not in cache:
            parts = self._parts[name]
            cache[name] = np.concatenate(parts) if len(parts) > 1 else parts[0]
            self._parts[name] = [cache[name]]
        return cache[name]


def select(cand: Candidates, budget: int | None, caps: np.ndarray) -> np.ndarray:
    """Non-root candidates in selection order: by key (descending, ties by creation order), at most
    ``caps[t]`` per tree, at most ``budget`` in all (None: no global budget)."""
    idx = np.nonzero(cand.parent >= 0)[0]
    if len(idx) == 0:
        return idx
    order = idx[np.lexsort((idx, -cand.key[idx]))]
    tree = cand.tree[order]
    by_tree = np.argsort(tree, kind="stable")
    starts = np.searchsorted(tree[by_tree], tree[by_tree], side="left")
    pos = np.empty(len(order), np.int64)
    pos[by_tree] = np.arange(len(order)) - starts  # position of each node within its own tree's order
    order = order[pos < caps[tree]]
    return order if budget is None else order[: max(int(budget), 0)]


def build_batch(
    cand: Candidates,
    sel: np.ndarray,
    request_ids: np.ndarray,
    context_len: np.ndarray,
    draft_probs: np.ndarray | None = None,
) -> ModelDraftBatch:
    """Pack roots + the selected candidates (``sel``, selection order) into a batch; within a tree the
    nodes follow the selection order. ``draft_probs`` ``[len(sel), V]`` rows follow ``sel``."""
    b = len(cand.roots)
    rank = np.full(cand.n, -1, np.int64)
    rank[sel] = np.arange(len(sel))
    members = np.concatenate([cand.roots, sel])
    members = members[np.lexsort((rank[members], cand.tree[members]))]  # tree-major, root (rank -1) first
    tree = cand.tree[members]
    counts = np.bincount(tree, minlength=b)
    offsets = np.zeros(b + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    local = np.full(cand.n, -1, np.int64)
    local[members] = np.arange(len(members)) - offsets[tree]
    par = cand.parent[members]
    parents = np.where(par >= 0, local[np.maximum(par, 0)], -1)
    gain = np.zeros(len(sel) + 1)
    np.cumsum(cand.key[sel], out=gain[1:])
    dp = None
    if draft_probs is not None:
        dp = np.zeros((len(members), draft_probs.shape[1]), np.float32)
        pos_in_sel = rank[members]
        dp[pos_in_sel >= 0] = draft_probs[pos_in_sel[pos_in_sel >= 0]]
    return ModelDraftBatch(
        tokens=cand.token[members].astype(np.int32),
        parents=parents.astype(np.int32),
        probs=cand.prob[members].astype(np.float32),
        depth=cand.depth[members].astype(np.int32),
        offsets=offsets,
        rank=rank[members].astype(np.int32),
        gain=gain,
        acc_prob=cand.key[members].astype(np.float32),
        source=cand.source[members].astype(np.int8),
        source_mask=cand.source_mask[members].astype(np.uint8),
        match_len=cand.match_len[members].astype(np.int32),
        raw_score=cand.raw[members].astype(np.float32),
        context_len=np.asarray(context_len, np.int64),
        request_ids=np.asarray(request_ids, np.int64),
        draft_probs=dp,
    )
