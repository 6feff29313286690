"""Turn a drafter's batch of trees into the per-request trees the model scores, checking it first.

The engine accepts any object with ``tokens``, ``parents``, ``depth`` (``[N]``) and ``offsets``
(``[B + 1]``) laid out as the shared contract says (tree ``i`` = ``slice(offsets[i], offsets[i+1])``,
node 0 of each tree is its root = the request's last context token, ``parents`` index within the own
tree, -1 for roots). A malformed batch raises ``MalformedDraftError`` (a ValueError) naming the problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sssd.engine.adapter import Tree


class MalformedDraftError(ValueError):
    """The drafter returned trees the engine cannot verify."""


def root_tree(token: int) -> Tree:
    return Tree(np.array([token], np.int64), np.array([-1], np.int64), np.array([0], np.int64))


def _field(batch: Any, name: str, n: int | None) -> np.ndarray:
    x = getattr(batch, name, None)
    if x is None:
        raise MalformedDraftError(f"draft batch has no '{name}' field")
    x = np.asarray(x)
    if x.ndim != 1 or (x.size and not np.issubdtype(x.dtype, np.integer)):
        raise MalformedDraftError(
            f"draft batch '{name}' must be a 1-D integer array, got {x.dtype} {x.shape}"
        )
    if n is not None and len(x) != n:
        raise MalformedDraftError(f"draft batch '{name}' has {len(x)} entries, expected {n}")
    return x.astype(np.int64)


def split_batch(
    batch: Any, last_tokens: Sequence[int], vocab_size: int, max_depth: Sequence[int]
) -> list[tuple[Tree, np.ndarray]]:
    """Validate ``batch`` and cut it into one ``Tree`` per request, dropping nodes deeper than
    ``max_depth[i]`` (no point scoring tokens past a request's remaining budget of output).

    Returns ``(tree, kept)`` per request; ``kept`` = global node indices of the tree's nodes in ``batch``.
    """
    b = len(last_tokens)
    offsets = _field(batch, "offsets", b + 1)
    tokens = _field(batch, "tokens", None)
    n = len(tokens)
    parents = _field(batch, "parents", n)
    depth = _field(batch, "depth", n)
    sizes = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != n or (sizes < 1).any():
        raise MalformedDraftError(
            f"draft batch offsets {offsets.tolist()} do not split {n} nodes into {b} trees"
        )
    if n and (tokens.min() < 0 or tokens.max() >= vocab_size):
        bad = int(tokens[(tokens < 0) | (tokens >= vocab_size)][0])
        raise MalformedDraftError(f"draft token {bad} is outside the model's vocabulary [0, {vocab_size})")
    tree_of = np.repeat(np.arange(b), sizes)
    local = np.arange(n) - offsets[tree_of]
    is_root = local == 0
    if (parents[is_root] != -1).any():
        raise MalformedDraftError("node 0 of every tree must be its root (parent -1)")
    inner = ~is_root
    if ((parents[inner] < 0) | (parents[inner] >= local[inner])).any():
        v = int(np.nonzero(inner & ((parents < 0) | (parents >= local)))[0][0])
        raise MalformedDraftError(
            f"parents are not topological: node {local[v]} of tree {tree_of[v]} has parent {parents[v]}"
        )
    if (depth[is_root] != 0).any():
        raise MalformedDraftError("root depth must be 0")
    glob_parent = np.where(inner, parents + offsets[tree_of], 0)
    if (depth[inner] != depth[glob_parent[inner]] + 1).any():
        raise MalformedDraftError("depth must be the parent's depth + 1")
    roots = tokens[offsets[:-1]]
    want = np.asarray(last_tokens, dtype=np.int64)
    if (roots != want).any():
        i = int(np.nonzero(roots != want)[0][0])
        raise MalformedDraftError(
            f"root of tree {i} is token {roots[i]}, expected the last context token {want[i]}"
        )
    out = []
    for i in range(b):
        a, e = int(offsets[i]), int(offsets[i + 1])
        t, p, d = tokens[a:e], parents[a:e], depth[a:e]
        kept = np.arange(a, e)
        limit = max(int(max_depth[i]), 0)
        if len(d) > 1 and d.max() > limit:
            keep = np.nonzero(d <= limit)[0]  # a prefix-closed set: parents are shallower
            remap = np.full(len(d), -1, np.int64)
            remap[keep] = np.arange(len(keep))
            p = np.where(p[keep] >= 0, remap[np.maximum(p[keep], 0)], -1)
            t, d, kept = t[keep], d[keep], kept[keep]
        out.append((Tree(t, p, d), kept))
    return out
