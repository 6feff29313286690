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


def global_parents(offsets: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """``[N]`` int64: each node's parent as an index into the whole batch (-1 for roots)."""
    offsets = np.asarray(offsets, np.int64)
    parents = np.asarray(parents, np.int64)
    return np.where(parents >= 0, parents + offsets[:-1][tree_index(offsets)], -1)


def reached_nodes(batch: Any, on_path: np.ndarray) -> np.ndarray:
    """``[N]`` bool: the nodes verification reached (tested), those whose parent is on the accepted
    path ``on_path`` (``[N]`` bool; roots are never tested)."""
    glob = global_parents(batch.offsets, batch.parents)
    return (glob >= 0) & np.asarray(on_path, bool)[np.maximum(glob, 0)]


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
    glob_parent = global_parents(offsets, parents)
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
    """``(offsets, parents)`` of the nodes ``keep`` (bool ``[N]``, every tree's root kept, closed under
    parents): each kept node's parent renumbered to its position among its tree's kept nodes, -1 for the
    roots; dtypes kept. Only the kept non-root nodes' parents are read, so the nodes dropped (and a
    dropped tree's root) may hold anything."""
    offsets = np.asarray(offsets)
    parents = np.asarray(parents)
    keep = np.asarray(keep, bool)
    tree = tree_index(offsets)
    counts = np.bincount(tree[keep], minlength=len(offsets) - 1)
    new_offsets = np.zeros(len(offsets), offsets.dtype)
    np.cumsum(counts, out=new_offsets[1:])
    new_index = np.cumsum(keep) - 1  # [N] position of each kept node in the new batch
    inner = keep.copy()
    inner[np.asarray(offsets[:-1], np.int64)] = False  # the kept nodes below a root
    starts = np.asarray(offsets, np.int64)[tree[inner]]
    new_parents = np.full(len(parents), -1, np.int64)
    new_parents[inner] = new_index[parents[inner] + starts] - new_offsets[tree[inner]]
    return new_offsets, new_parents[keep].astype(parents.dtype)


def on_path_mask(
    batch: Any,
    *,
    paths: Any = None,
    tokens: Any = None,
    lengths: Any = None,
) -> np.ndarray:
    """``[N]`` bool: the nodes of each tree's accepted path, roots included (what a drafter's ``observe``
    takes), from the batch's ``offsets`` and ``parents`` and exactly one of:

    - ``paths``: per tree, the node indices of its accepted path within the tree, root (0) first, as
      verification returns them (the engine's ``paths``);
    - ``tokens``: per tree, its accepted draft tokens in order (the next token excluded), for callers
      that know only tokens: from the root, the path goes to the first child (lowest index) holding the
      next token (the batch's ``tokens`` are read).

    Either is a sequence of B integer sequences, or with ``lengths`` (``[B]``) one flat integer array
    holding them one after the other. ValueError when a path does not start at its root or leaves its
    tree, or a token has no child to go to; TypeError for non-integer entries. One vectorised pass over
    the batch (token paths: one per depth)."""
    if (paths is None) == (tokens is None):
        raise ValueError("give exactly one of paths (node indices) and tokens")
    offsets = np.asarray(batch.offsets, np.int64)
    parents = np.asarray(batch.parents)
    b = len(offsets) - 1
    if np.any(np.diff(offsets) < 1) or (b >= 0 and offsets[-1] != len(parents)):
        raise ValueError(
            "the batch's offsets must be increasing and end at its node count (each tree holds its root)"
        )
    flat, counts = _ragged(
        paths if tokens is None else tokens, lengths, b, "paths" if tokens is None else "tokens"
    )
    mask = np.zeros(len(parents), bool)
    mask[offsets[:-1]] = True
    if tokens is None:
        _mark_node_paths(mask, offsets, parents, flat, counts)
    else:
        _mark_token_paths(mask, offsets, parents, np.asarray(batch.tokens), flat, counts)
    return mask


def _ragged(values: Any, lengths: Any, b: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(flat [sum], counts [B])`` int64 of B integer sequences, or of a flat array and its lengths."""
    if lengths is None:
        if isinstance(values, np.ndarray) and values.ndim != 1 and values.dtype != object:
            seqs: Any = list(values)
        else:
            seqs = values
        if len(seqs) != b:
            raise ValueError(f"got {what} of {len(seqs)} trees for a batch of {b}")
        parts = list(map(np.ravel, seqs))
        counts = np.fromiter(map(len, parts), np.int64, count=b)
        flat = np.concatenate([p for p in parts if p.size] or [np.zeros(0, np.int64)])
    else:
        counts = np.asarray(lengths)
        flat = np.asarray(values).reshape(-1)
        if counts.shape != (b,) or (counts.size and not np.issubdtype(counts.dtype, np.integer)):
            raise ValueError(f"lengths must be {b} integers, one per tree")
        if np.any(counts < 0) or counts.sum() != len(flat):
            raise ValueError(f"lengths must be >= 0 and add up to the {len(flat)} entries of {what}")
    if flat.size and not np.issubdtype(flat.dtype, np.integer):
        raise TypeError(f"{what} must hold integers, got dtype {flat.dtype}")
    return flat.astype(np.int64), counts.astype(np.int64)


def _mark_node_paths(
    mask: np.ndarray, offsets: np.ndarray, parents: np.ndarray, nodes: np.ndarray, counts: np.ndarray
) -> None:
    """Marks paths given as node indices (root first), checking each is a path from its tree's root."""
    if np.any(counts < 1):
        raise ValueError(f"path of tree {int(np.argmax(counts < 1))} is empty: it must start at the root (0)")
    owner = np.repeat(np.arange(len(counts)), counts)
    first = np.zeros(len(nodes), bool)
    first[np.cumsum(counts)[:-1] if len(counts) else []] = True
    first[:1] = True
    size = np.diff(offsets)[owner]
    bad = (nodes < 0) | (nodes >= size) | (first & (nodes != 0))
    glob = np.where(bad, 0, nodes) + offsets[:-1][owner]
    prev = np.concatenate([[0], nodes[:-1]])
    bad |= ~first & (parents[glob].astype(np.int64) != prev)
    if np.any(bad):
        tree = int(owner[np.argmax(bad)])
        raise ValueError(
            f"path of tree {tree} is not a path from its root: node indices must start at 0 and go each "
            "to a child of the one before, within the tree"
        )
    mask[glob] = True


def _mark_token_paths(
    mask: np.ndarray,
    offsets: np.ndarray,
    parents: np.ndarray,
    node_tokens: np.ndarray,
    tokens: np.ndarray,
    counts: np.ndarray,
) -> None:
    """Marks paths given as accepted tokens: depth d goes, in every tree at once, from the node reached
    at depth d - 1 to its first child holding the tree's d-th token."""
    tree = tree_index(offsets)
    glob_parent = np.where(parents >= 0, parents + offsets[:-1][tree], -1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    cur = offsets[:-1].copy()  # [B] the node each tree's path has reached
    want = np.zeros(len(counts), np.int64)
    for d in range(1, int(counts.max(initial=0)) + 1):
        active = counts >= d
        want[active] = tokens[starts[active] + d - 1]
        hit = active[tree] & (glob_parent == cur[tree]) & (node_tokens == want[tree])
        idx = np.flatnonzero(hit)
        found, first = np.unique(tree[idx], return_index=True)  # nodes are in index order per tree
        if len(found) != int(active.sum()):
            missing = int(np.flatnonzero(active & ~np.isin(np.arange(len(counts)), found))[0])
            raise ValueError(
                f"the accepted tokens of tree {missing} do not follow a path of it: token {d} "
                f"({int(want[missing])}) is no child of the node before"
            )
        cur[found] = idx[first]
        mask[idx[first]] = True


def check_path_mask(batch: Any, on_path: Any) -> np.ndarray:
    """``on_path`` checked against the batch (``offsets``, ``parents``): a bool numpy array ``[N]``
    marking one path from the root of each tree (every root marked, every marked node's parent marked,
    at most one marked child per node). Returns it; TypeError for another type or dtype, ValueError for
    a wrong length or a mask that is no such path."""
    if not isinstance(on_path, np.ndarray) or on_path.dtype != np.bool_:
        what = on_path.dtype if isinstance(on_path, np.ndarray) else type(on_path).__name__
        raise TypeError(f"on_path must be a numpy bool array (sssd.batch.on_path_mask), got {what}")
    offsets = np.asarray(batch.offsets, np.int64)
    parents = np.asarray(batch.parents)
    n = len(parents)
    if on_path.shape != (n,):
        raise ValueError(
            f"on_path has shape {on_path.shape}, expected ({n},): one entry per node of the batch"
        )
    if not on_path[offsets[:-1]].all():
        raise ValueError("on_path must mark the root of every tree (the path starts there)")
    nonroot = parents >= 0
    glob_parent = global_parents(offsets, parents)
    marked = on_path & nonroot
    if np.any(~on_path[glob_parent[marked]]):
        raise ValueError("on_path marks a node whose parent it does not mark: not a path from the root")
    if len(np.unique(glob_parent[marked])) != int(marked.sum()):
        raise ValueError("on_path marks two children of one node: not a single path")
    return on_path
