"""Tree attention and KV commit: torch implementations for CPU plus slow, obviously-correct references.

Layout used everywhere in this file (one layer):
- queries ``q``: ``[B, H, n, D]`` (``n`` = nodes per request after padding),
- keys/values ``k``, ``v``: ``[B, Hkv, L, D]`` with ``H % Hkv == 0`` (grouped-query attention: query head
  ``h`` reads key/value head ``h // (H // Hkv)``),
- ``visible``: bool ``[B, n, L]``, True where a query may read a key.

For a request with ``c`` committed cache rows and a draft tree of ``n`` nodes stored at rows ``c..c+n-1``,
node ``t`` sees every committed row and the rows of its ancestors and itself (the masks:
``sssd.engine.backends``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)  # enable_gqa argument


def tree_attention_reference(
    q: torch.Tensor,
    k_ctx: torch.Tensor,
    v_ctx: torch.Tensor,
    k_tree: torch.Tensor,
    v_tree: torch.Tensor,
    parents: np.ndarray,
    scaling: float | None = None,
) -> torch.Tensor:
    """Attention of one request's tree nodes, computed node by node with explicit loops (the oracle).

    q: ``[H, n, D]``; k_ctx, v_ctx: ``[Hkv, c, D]`` committed rows; k_tree, v_tree: ``[Hkv, n, D]``.
    Returns ``[H, n, D]`` in float64-accumulated precision cast back to ``q.dtype``.
    """
    h_q, n, d = q.shape
    h_kv = k_ctx.shape[0]
    group = h_q // h_kv
    scale = 1.0 / math.sqrt(d) if scaling is None else scaling
    out = torch.empty_like(q)
    for t in range(n):
        path = [t]
        while parents[path[-1]] >= 0:
            path.append(int(parents[path[-1]]))
        rows = sorted(path)
        for h in range(h_q):
            g = h // group
            keys = torch.cat([k_ctx[g], k_tree[g, rows]]).double()
            vals = torch.cat([v_ctx[g], v_tree[g, rows]]).double()
            w = torch.softmax(keys @ q[h, t].double() * scale, dim=0)
            out[h, t] = (w @ vals).to(q.dtype)
    return out


def causal_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling=None
) -> torch.Tensor:
    """Ordinary causal attention, bottom-right aligned: q ``[H, n, D]`` are the last ``n`` of the ``L``
    positions of k, v ``[Hkv, L, D]``. Returns ``[H, n, D]``."""
    h_q, n, d = q.shape
    h_kv, length, _ = k.shape
    group = h_q // h_kv
    scale = 1.0 / math.sqrt(d) if scaling is None else scaling
    kk = k.repeat_interleave(group, dim=0).double()
    vv = v.repeat_interleave(group, dim=0).double()
    scores = q.double() @ kk.transpose(1, 2) * scale
    allowed = torch.ones(n, length, dtype=torch.bool).tril(length - n)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vv).to(q.dtype)


def tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """Batched tree attention with torch's fused SDPA (no key/value repetition for GQA).

    q: ``[B, H, n, D]``; k, v: ``[B, Hkv, L, D]``; visible: bool ``[B, n, L]`` or None (all visible).
    Returns ``[B, H, n, D]``.
    """
    mask = None if visible is None else visible.unsqueeze(1)
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
    if _SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=True)
    group = q.shape[1] // k.shape[1]  # torch < 2.5: repeat the K/V heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)


def commit_reference(cache: torch.Tensor, length: int, path: np.ndarray) -> torch.Tensor:
    """KV commit oracle for one request: ``cache`` ``[..., rows, D]`` (rows on dim -2) holds the tree's
    nodes at rows ``length + t``; returns a copy whose rows ``length + i`` hold node ``path[i]``."""
    out = cache.clone()
    for i, t in enumerate(path):
        out[..., length + i, :] = cache[..., length + int(t), :]
    return out
