"""Tree attention inside a transformers model: the registered attention function and one backend per
way of running it, each as plan (once per forward) and run (every layer).

The model is switched to the attention function registered under ``ATTENTION_NAME`` and called with an
extra keyword argument, ``sssd_step``, that transformers hands untouched to every attention call: the
forward's *plan*. A plan holds everything the layers share (masks, indices, kernel metadata, where each
node's K/V goes), built once from the step's flat batch (``sssd.engine.trees.TreeBatch``) and the
committed lengths; its ``run(module, query, key, value, scale, kwargs)`` is one layer. The backend is
chosen once, when the adapter is built (``backend_for``):

- ``SdpaBackend`` (``"sdpa"``): the queries are laid out per request (``[B, H, n_max, D]``, padded) for one
  fused torch SDPA call per layer over the request's cache rows, with a dense boolean mask
  (``SdpaPlan``; the model drafter builds these plans itself under the name ``StepContext``);
- ``PackedBackend`` (``"packed"``, ``"emulated"``): the packed layout goes as is to
  :func:`sssd.kernels.tree_attention.hf_tree_attention`: the CUDA tree kernel (fp16/bf16, head dim
  64/128), sssd's CPU kernel in float32, else the kernel's float64 reference; ``"emulated"`` runs the
  kernel's host emulation (tests). Trees of more than ``MAX_TREE_NODES`` nodes (long prefill chunks) get
  an SDPA plan.

The static-shape forward (``sssd.engine.static_step``) passes its own plan, ``StaticArgs``, built inside
the compiled or captured graph. Eager plans first write the step's K/V into the cache rows after each
request's committed rows (the scratch tail); the adapter's ``commit`` later moves the accepted ones.

The masks the plans hold are built here and nowhere else. Every builder takes the flat batch
(``sssd.engine.trees.TreeBatch``: one tree per slot, checked once where it entered the engine) and works
on all trees at once; the only Python loop is over depth levels. All masks derive from
:func:`ancestor_rows`, whose oracle is the parent walk of ``sssd.kernels.reference.ancestor_masks``
(tests). Node ``t`` of a tree sees itself and its ancestors; every node sees all of its request's
committed cache rows.

- :func:`dense_visibility` — bool ``[B, n_max, rows]`` for torch SDPA over the cache (the eager forward);
- :func:`padded_ancestors` — bool ``[slots, nodes, nodes]`` for the static-shape forward, which builds its
  cache-row mask inside the graph from it and the committed lengths;
- :func:`ancestor_bits` — uint64 ``[N, 2]`` rows of the CUDA tree kernel (bit ``j`` of a node's row: tree
  node ``j`` is visible), for trees of at most ``MAX_TREE_NODES`` nodes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sssd.engine.attention import tree_attention
from sssd.engine.kv_cache import KVCache, StepWrites
from sssd.engine.trees import TreeBatch
from sssd.kernels.tree_attention import MAX_TREE_NODES


def ancestor_rows(batch: TreeBatch, width: int | None = None) -> np.ndarray:
    """bool ``[N, width]`` (``width`` >= the largest tree, default it): ``m[v, j]`` is True when node ``j``
    of ``v``'s tree is ``v`` or one of its ancestors. One vectorised pass per depth level (a level's rows
    are their parents' rows plus the diagonal); batches of chains are lower triangles at once."""
    width = batch.max_size if width is None else int(width)
    local = batch.local
    if batch.is_chains:
        return local[:, None] >= np.arange(width)[None, :]
    m = np.zeros((batch.num_nodes, width), dtype=bool)
    m[np.arange(batch.num_nodes), local] = True
    gp = batch.global_parents
    for level in batch.levels:
        m[level] |= m[gp[level]]
    return m


def ancestor_matrix(parents: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """bool ``[n, n]`` of one tree (``m[i, j]``: node ``j`` is node ``i`` or one of its ancestors)."""
    parents = np.asarray(parents, np.int64)
    n = len(parents)
    tree = TreeBatch(np.zeros(n, np.int64), parents, np.asarray(depth, np.int64), np.array([0, n], np.int64))
    return ancestor_rows(tree)


def dense_visibility(batch: TreeBatch, committed: np.ndarray, rows: int) -> np.ndarray:
    """bool ``[B, n_max, rows]``: tree ``i``'s node ``t`` (stored at cache row ``committed[i] + t``) sees
    the committed rows and its ancestors' rows. Padding queries (``t >= len(tree)``) see row 0 only, so
    softmax stays defined; their outputs are dropped."""
    committed = np.asarray(committed, np.int64)
    n_max = batch.max_size
    row = np.arange(rows)
    real = np.arange(n_max)[None, :] < batch.sizes[:, None]  # [B, n_max]
    vis = real[:, :, None] & (row[None, None, :] < committed[:, None, None])
    vis[:, :, 0] |= ~real
    if batch.num_trees == 1:  # one tree (a prefill chunk, a lone request): its block is a slice
        c = int(committed[0])
        vis[0, :, c : c + n_max] = ancestor_rows(batch)
        return vis
    v, j = np.nonzero(ancestor_rows(batch))
    tree = batch.tree_of[v]
    vis[tree, batch.local[v], committed[tree] + j] = True
    return vis


def padded_ancestors(batch: TreeBatch, slots: int, nodes: int) -> np.ndarray:
    """bool ``[slots, nodes, nodes]``: tree ``b``'s ancestor matrix in the top-left corner of slot ``b``;
    every padding node (and every node of a padding slot) sees itself only."""
    anc = np.zeros((slots, nodes, nodes), dtype=bool)
    anc[:, np.arange(nodes), np.arange(nodes)] = True
    anc[batch.tree_of, batch.local] = ancestor_rows(batch, nodes)
    return anc


def ancestor_bits(batch: TreeBatch) -> np.ndarray:
    """uint64 ``[N, 2]`` (the batch's nodes in order): bit ``j`` of a node's row (word ``j // 64``) is set
    when node ``j`` of its tree is the node or one of its ancestors."""
    if batch.max_size > MAX_TREE_NODES:
        raise ValueError(f"the tree kernel's masks hold trees of at most {MAX_TREE_NODES} nodes")
    bits = np.packbits(ancestor_rows(batch, MAX_TREE_NODES), axis=1, bitorder="little")  # [N, 16] bytes
    return np.ascontiguousarray(bits).view("<u8").astype(np.uint64)  # two little-endian 64-bit words


ATTENTION_NAME = "sssd_tree"
ATTENTION_BACKENDS = ("auto", "sdpa", "packed", "emulated")


def sssd_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: ``query`` ``[1, H, N, D]``, ``key``/``value`` ``[1, Hkv, N, D]``
    (already rotated by the model). Runs the forward's plan for this layer; returns ``([1, N, H, D],
    None)``."""
    plan = kwargs.get("sssd_step")
    if plan is None:
        raise RuntimeError(
            f"the '{ATTENTION_NAME}' attention only runs inside an sssd Engine forward; "
            "call model.set_attn_implementation('sdpa') to use the model on its own"
        )
    scale = module.scaling if scaling is None else scaling
    return plan.run(module, query, key, value, scale, kwargs), None


def register() -> None:
    """Register ``sssd_attention`` (this module's name for it, looked up at each call) with transformers
    under ``ATTENTION_NAME`` (every adapter does, when it is built)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, sssd_attention)


@dataclass
class EagerPlan:
    """What every layer of one eager forward shares: the slots it covers, the keys each request reads
    (``rows``: max committed + nodes), where the nodes' K/V go."""

    cache: KVCache
    slot_start: int
    slot_stop: int
    rows: int
    n_max: int  # nodes per request after padding
    writes: StepWrites
    calls: list[int] = field(default_factory=list, kw_only=True)  # layer ids seen (only filled by the probe)
    record: bool = field(default=False, kw_only=True)

    def run(self, module: Any, query, key, value, scale: float, kwargs: dict) -> torch.Tensor:
        """One layer: store the nodes' K/V at their scratch rows, then attend."""
        if kwargs.get("softcap") is not None:
            raise NotImplementedError(
                f"{type(module).__name__}: attention logit soft-capping is not supported"
            )
        window = kwargs.get("sliding_window")
        if window is not None and self.rows > window:
            raise NotImplementedError(
                f"{type(module).__name__}: sliding-window attention beyond {window} tokens is not supported"
            )
        layer = module.layer_idx
        if self.record:
            self.calls.append(layer)
        self.cache.write(layer, key, value, self.writes)
        return self.attend(layer, query, key, value, scale)

    def attend(self, layer: int, query, key, value, scale: float) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class SdpaPlan(EagerPlan):
    """Torch SDPA over each request's cache rows, queries padded to ``n_max`` per request."""

    visible: torch.Tensor | None  # bool [B, n_max, rows]; None = everything visible
    pad_src: torch.Tensor | None  # int64 [B * n_max]: packed index of each padded query; None = no padding
    unpad: torch.Tensor | None  # int64 [N]: padded index of each packed node

    def attend(self, layer: int, query, key, value, scale: float) -> torch.Tensor:
        k, v = self.cache.view(layer, self.slot_start, self.slot_stop, self.rows)
        b = self.slot_stop - self.slot_start
        h, d = query.shape[1], query.shape[3]
        q = query[0]
        if self.pad_src is not None:
            q = q.index_select(1, self.pad_src)
        q = q.reshape(h, b, self.n_max, d).transpose(0, 1)
        out = tree_attention(q, k, v, self.visible, scale)  # [B, H, n_max, D]
        out = out.transpose(1, 2).reshape(b * self.n_max, h, d)
        if self.unpad is not None:
            out = out.index_select(0, self.unpad)
        return out.unsqueeze(0)


StepContext = SdpaPlan  # the name under which the model drafter builds its own SDPA plans


@dataclass
class PackedPlan(EagerPlan):
    """The tree kernel over the packed nodes: committed rows from the cache, tree K/V from this forward."""

    packed: Any  # sssd.kernels.tree_attention.PackedTrees
    kernel: Any  # hf_tree_attention (or its emulation)

    def attend(self, layer: int, query, key, value, scale: float) -> torch.Tensor:
        cache = self.cache
        return self.kernel(
            query, key, value, cache.keys[layer], cache.values[layer], self.packed, scale=scale
        )


class SdpaBackend:
    """Plans torch SDPA forwards."""

    name = "sdpa"

    def plan(self, cache: KVCache, slot_start: int, batch: TreeBatch, committed: np.ndarray) -> EagerPlan:
        """The plan of a forward scoring ``batch`` (tree ``i`` in slot ``slot_start + i``, after its
        ``committed[i]`` rows); reserves the cache rows it writes."""
        rows, writes = _writes(cache, slot_start, batch, committed)
        return self._sdpa(cache, slot_start, batch, committed, rows, writes)

    @staticmethod
    def _sdpa(cache, slot_start, batch, committed, rows, writes) -> SdpaPlan:
        b, n_max, dev = batch.num_trees, batch.max_size, cache.keys.device
        visible = None
        if not (b == 1 and n_max == 1):
            visible = torch.from_numpy(dense_visibility(batch, committed, rows)).to(dev)
        pad_src = unpad = None
        sizes = batch.sizes
        if (sizes != n_max).any():
            src = batch.offsets[:-1, None] + np.minimum(np.arange(n_max)[None, :], sizes[:, None] - 1)
            pad_src = torch.from_numpy(src.reshape(-1)).to(dev)
            unpad = torch.from_numpy(batch.tree_of * n_max + batch.local).to(dev)
        return SdpaPlan(cache, slot_start, slot_start + b, rows, n_max, writes, visible, pad_src, unpad)


class PackedBackend(SdpaBackend):
    """Plans tree-kernel forwards (``emulate``: the kernel's host emulation); SDPA for larger trees."""

    def __init__(self, emulate: bool = False):
        from sssd.kernels import tree_attention as ops

        self.name = "emulated" if emulate else "packed"
        self._ops = ops
        self._kernel = (
            functools.partial(ops.hf_tree_attention, emulate=True) if emulate else ops.hf_tree_attention
        )

    def plan(self, cache: KVCache, slot_start: int, batch: TreeBatch, committed: np.ndarray) -> EagerPlan:
        rows, writes = _writes(cache, slot_start, batch, committed)
        if batch.max_size > MAX_TREE_NODES:
            return self._sdpa(cache, slot_start, batch, committed, rows, writes)
        slots = np.arange(slot_start, slot_start + batch.num_trees)
        packed = self._ops.PackedTrees.from_numpy(
            batch.offsets, committed, slots, ancestor_bits(batch), cache.keys.device
        )
        shared = (cache, slot_start, slot_start + batch.num_trees, rows, batch.max_size, writes)
        return PackedPlan(*shared, packed, self._kernel)


def backend_for(attention: str) -> SdpaBackend:
    """The backend of a resolved ``attention`` setting (``"sdpa"``, ``"packed"`` or ``"emulated"``)."""
    if attention == "sdpa":
        return SdpaBackend()
    if attention in ("packed", "emulated"):
        return PackedBackend(emulate=attention == "emulated")
    raise ValueError(f"no attention backend {attention!r}; one of {ATTENTION_BACKENDS[1:]}")


def _writes(
    cache: KVCache, slot_start: int, batch: TreeBatch, committed: np.ndarray
) -> tuple[int, StepWrites]:
    """The keys each request reads (``rows``, reserved in the cache) and where the nodes' K/V go: node
    ``t`` of tree ``i`` at row ``committed[i] + t`` of slot ``slot_start + i``."""
    committed = np.asarray(committed, np.int64)
    rows = int((committed + batch.sizes).max())
    cache.reserve(rows)
    if batch.num_trees == 1:
        return rows, StepWrites(None, None, slice_slot=slot_start, slice_start=int(committed[0]))
    dev = cache.keys.device
    slot_index = torch.from_numpy(slot_start + batch.tree_of).to(dev)
    row_index = torch.from_numpy(committed[batch.tree_of] + batch.local).to(dev)
    return rows, StepWrites(slot_index, row_index)
