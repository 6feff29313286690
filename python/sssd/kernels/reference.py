"""Slow, obviously correct versions of the CUDA ops (the test oracles), and the kernel's host emulation.

They take the same arguments and layout as :mod:`sssd.kernels.tree_attention` (see its docstring) and
run on any device, CPU included. The references compute in float64.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sssd.kernels.tree_attention import MAX_TREE_NODES

if TYPE_CHECKING:  # pragma: no cover
    from sssd.kernels.tree_attention import CommitPlan, PackedTrees


def ancestor_masks(parents: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Packed ancestor masks [N, 2] uint64 of a packed batch of trees (node attends ancestors + itself).

    ``parents`` int [N] holds each node's parent index within its own tree (-1 for roots), parents < index.
    """
    parents = np.asarray(parents, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    masks = np.zeros((len(parents), 2), dtype=np.uint64)
    for i in range(len(offsets) - 1):
        a, b = int(offsets[i]), int(offsets[i + 1])
        if not 1 <= b - a <= MAX_TREE_NODES:
            raise ValueError(f"tree {i} has {b - a} nodes; trees need 1..{MAX_TREE_NODES} nodes")
        for j in range(b - a):
            p = int(parents[a + j])
            if (j == 0) != (p < 0) or p >= j:
                raise ValueError(
                    f"tree {i}: node {j} has parent {p}; parents must be topological, root first"
                )
            if p >= 0:
                masks[a + j] = masks[a + p]
            masks[a + j, j // 64] |= np.uint64(1) << np.uint64(j % 64)
    return masks


def _mask_bits(masks_host: np.ndarray, a: int, b: int) -> np.ndarray:
    """bool [n, n]: row r allows key j of the tree occupying packed rows a..b-1."""
    n = b - a
    j = np.arange(n)
    words = masks_host[a:b][:, j // 64]  # [n, n]
    return ((words >> (j % 64).astype(np.uint64)) & np.uint64(1)).astype(bool)


def tree_attention_reference(q, k_tree, v_tree, k_cache, v_cache, trees: PackedTrees, *, scale=None):
    """float64 tree attention: each node attends its request's context rows and its allowed tree nodes.

    Returns a float64 tensor [N, Hq, D] on q's device; rows that attend nothing are 0.
    """
    import torch

    n_total, hq, d = q.shape
    hkv = k_tree.shape[1]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = torch.zeros((n_total, hq, d), dtype=torch.float64, device=q.device)
    offs, ctxs, slots = trees.offsets_host, trees.ctx_lens_host, trees.slots_host
    for i in range(len(ctxs)):
        a, b, c = int(offs[i]), int(offs[i + 1]), int(ctxs[i])
        n = b - a
        keys = torch.cat([k_cache[int(slots[i]), :c], k_tree[a:b]]).double()  # [c + n, Hkv, D]
        vals = torch.cat([v_cache[int(slots[i]), :c], v_tree[a:b]]).double()
        keys = keys.repeat_interleave(group, dim=1)  # [c + n, Hq, D]
        vals = vals.repeat_interleave(group, dim=1)
        allowed = torch.ones((n, c + n), dtype=torch.bool, device=q.device)
        allowed[:, c:] = torch.from_numpy(_mask_bits(trees.masks_host, a, b)).to(q.device)
        scores = torch.einsum("qhd,khd->hqk", q[a:b].double(), keys) * scale  # [Hq, n, c + n]
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-masked rows -> 0
        out[a:b] = torch.einsum("hqk,khd->qhd", probs, vals)
    return out


def kv_commit_reference(k_tree, v_tree, k_cache, v_cache, plan: CommitPlan) -> None:
    """In-place reference of kv_commit: cache[dst_slot, dst_row] = scratch[src_row] for K and V."""
    import torch

    src = torch.from_numpy(plan.src_rows_host.astype(np.int64)).to(k_tree.device)
    slot = torch.from_numpy(plan.dst_slots_host.astype(np.int64)).to(k_tree.device)
    row = torch.from_numpy(plan.dst_rows_host.astype(np.int64)).to(k_tree.device)
    k_cache[slot, row] = k_tree[src]
    v_cache[slot, row] = v_tree[src]


def tree_attention_emulated(
    q,
    k_tree,
    v_tree,
    k_cache,
    v_cache,
    trees: PackedTrees,
    *,
    splits=1,
    chunk=None,
    scale=None,
    round_bf16=False,
):
    """The CUDA kernel's decomposition (row tiles, 64-key tiles, context splits, log-sum-exp merge) run on
    the host in float32 by ``sssd._core.tree_attention_emulate``; returns a float32 CPU tensor [N, Hq, D].

    ``chunk`` (context keys per split, a multiple of 64) defaults to the smallest that covers the longest
    context with ``splits`` splits.
    """
    import torch

    from sssd import _core

    def host(t):
        return np.ascontiguousarray(t.detach().to("cpu", torch.float32).numpy())

    d = q.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    max_ctx = max(trees.max_ctx, 1)
    if chunk is None:
        per_split = -(-max_ctx // splits)  # ceil
        chunk = -(-per_split // 64) * 64
    out = _core.tree_attention_emulate(
        host(q), host(k_cache), host(v_cache), host(k_tree), host(v_tree),
        trees.offsets_host, trees.ctx_lens_host, trees.slots_host, trees.masks_host,
        scale, int(splits), int(chunk), bool(round_bf16),
    )  # fmt: skip
    return torch.from_numpy(out)
