"""The algebra of a flat batch of draft trees, shared by the drafters, the budget policy and the engine.

A batch holds B trees of N nodes in all: tree ``i`` is ``slice(offsets[i], offsets[i+1])`` (``offsets``
``[B + 1]``), node 0 of each tree is its root and every parent comes before its children (``parents``
``[N]`` index within the own tree, -1 for roots). Functions here take those arrays (or any object that
has them) and work on the whole batch at once, never tree by tree.

Imports nothing of sssd (numpy only).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


def tree_index(offsets: np.ndarray) -> np.ndarray:
    """``[N]`` int64: the tree (request position in the batch) each node belongs to."""
    offsets = np.asarray(offsets, np.int64)
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def tree_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``[B]`` float64: the sum of ``values`` (``[N]``) over each tree's nodes (0 for an empty batch)."""
    offsets = np.asarray(offsets, np.int64)
    return np.bincount(tree_index(offsets), weights=values, minlength=len(offsets) - 1)


def accumulated_probs(batch: Any) -> np.ndarray:
    """f(v) = product of p along the path root..v, per node ``[N]`` float64 (1.0 for roots), from the
    batch's ``parents``, ``probs``, ``depth`` and ``offsets``. One vectorised pass per depth (parents
    precede children, so depth d needs only depth d - 1)."""
    parents = np.asarray(batch.parents)
    probs = np.asarray(batch.probs, dtype=np.float64)
    offsets = np.asarray(batch.offsets, np.int64)
    depth = np.asarray(batch.depth)
    f = np.ones(len(parents), dtype=np.float64)
    glob_parent = np.where(parents >= 0, parents + offsets[tree_index(offsets)], -1)
    for d in range(1, int(depth.max(initial=0)) + 1):
        sel = np.flatnonzero(depth == d)
        f[sel] = f[glob_parent[sel]] * probs[sel]
    return f


def take_nodes(batch: Any, keep: np.ndarray) -> Any:
    """The batch restricted to the nodes ``keep`` (bool ``[N]``, roots kept, closed under parents), of the
    same type: per-node fields indexed, ``offsets`` recomputed, ``parents`` renumbered within each tree.

    A batch with its own ``take(keep)`` (``sssd.drafter.DraftBatch``: it also renumbers its selection
    ranks) is asked to do it; another dataclass is cut field by field (a field whose first dimension is N
    is per node, others are kept as they are); anything else is returned whole. Nothing is copied when
    every node is kept."""
    keep = np.asarray(keep, bool)
    if keep.all():
        return batch
    own = getattr(batch, "take", None)
    if callable(own):
        return own(keep)
    if not dataclasses.is_dataclass(batch):
        return batch
    n = len(keep)
    offsets, parents = renumbered(batch.offsets, batch.parents, keep)
    changes: dict[str, Any] = {"offsets": offsets, "parents": parents}
    for f in dataclasses.fields(batch):
        x = getattr(batch, f.name)
        if f.name not in changes and isinstance(x, np.ndarray) and x.ndim >= 1 and x.shape[0] == n:
            changes[f.name] = x[keep]
    return dataclasses.replace(batch, **changes)


def renumbered(offsets: np.ndarray, parents: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, parents)`` of the nodes ``keep`` (bool ``[N]``, closed under parents): each kept node's
    parent renumbered to its position among its tree's kept nodes; dtypes kept."""
    offsets = np.asarray(offsets)
    parents = np.asarray(parents)
    keep = np.asarray(keep, bool)
    tree = tree_index(offsets)
    counts = np.bincount(tree[keep], minlength=len(offsets) - 1)
    new_offsets = np.zeros(len(offsets), offsets.dtype)
    np.cumsum(counts, out=new_offsets[1:])
    new_index = np.cumsum(keep) - 1  # [N] position of each kept node in the new batch
    starts = np.asarray(offsets, np.int64)[tree]
    parent_glob = np.where(parents >= 0, parents + starts, 0)
    new_parents = np.where(parents >= 0, new_index[parent_glob] - new_offsets[tree], -1)
    return new_offsets, new_parents[keep].astype(parents.dtype)
