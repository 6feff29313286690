"""Tree buffers for verification, built natively from a batch of draft trees.

Works on any object with ``parents``, ``depth`` and ``offsets`` arrays (a ``DraftBatch``): trees of at
most 128 nodes each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sssd import _core


@dataclass(frozen=True)
class TreeBuffers:
    """Per-node buffers. N nodes, D = deepest depth in the batch."""

    positions: np.ndarray  # [N] int32 position offset of each node past its request's context (= depth)
    ancestor_masks: np.ndarray  # [N, 2] uint64: bit j of row i (word j // 64) set iff node j of the same
    #                              tree is node i or one of its ancestors (tree-local indices)
    paths: np.ndarray  # [N, D + 1] int32 global node indices of root..node, then -1
    tree_index: np.ndarray  # [N] int32 tree (request) of each node

    def accepted_path(self, node: int) -> np.ndarray:
        """Global indices of root..node (what to gather to commit the accepted path ending at ``node``)."""
        return self.paths[node, : int(self.positions[node]) + 1]


def tree_buffers(batch: Any) -> TreeBuffers:
    """Build the buffers of ``batch``. ValueError for a malformed batch or a tree over 128 nodes."""
    parents = np.asarray(batch.parents)
    depth = np.asarray(batch.depth)
    offsets = np.asarray(batch.offsets)
    for name, arr, dt in (
        ("parents", parents, np.int32),
        ("depth", depth, np.int32),
        ("offsets", offsets, np.int64),
    ):
        if arr.dtype != dt:
            raise TypeError(f"batch.{name} must have dtype {np.dtype(dt)}, got {arr.dtype}")
    positions, masks, paths, tree = _core.tree_buffers(
        np.ascontiguousarray(parents), np.ascontiguousarray(depth), np.ascontiguousarray(offsets)
    )
    return TreeBuffers(positions, masks, paths, tree)
