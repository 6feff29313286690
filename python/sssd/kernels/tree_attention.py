"""CUDA tree attention and KV commit: torch-facing wrappers of ``sssd._cuda`` and their float64 references.

The extension never links libtorch: these wrappers check devices, dtypes, shapes and contiguity of torch
tensors and pass raw pointers, element strides and the current CUDA stream as integers.

Packed batch layout (B requests, N = total tree nodes, Hq query heads, Hkv KV heads, D head dim)::

    q, out            [N, Hq, D]         fp16/bf16; tree i's queries are rows offsets[i]:offsets[i+1]
    k_tree, v_tree    [N, Hkv, D]        this step's K/V of the tree nodes (the scratch area)
    k_cache, v_cache  [S, R, Hkv, D]     S cache slots of R rows; request i's committed context is rows
                                         0..ctx_lens[i]-1 of slot slots[i], attended without a mask
    masks             [N, 2] uint64      bit j (word j // 64) of row offsets[i] + a is set when node a of
                                         tree i attends node j of the same tree: its ancestors and itself

Node 0 of each tree is its root. Query heads map to KV heads as in ``transformers`` (head h uses KV head
h // (Hq // Hkv)); K/V are never repeated. The innermost dimension must be contiguous; other strides are
free (views of a fused projection work) as long as rows stay 16-byte aligned (strides multiple of 8).
A query that attends nothing (empty context and an empty mask row) gets an output of zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from sssd import _core

try:  # the extension exists only in builds with a CUDA compiler
    from sssd import _cuda
except ImportError:  # pragma: no cover - depends on the build
    _cuda = None

MAX_TREE_NODES = 128  # nodes per tree: the kernel's ancestor masks are two 64-bit words
KEY_TILE = 64


def has_cuda() -> bool:
    """True when the package was built with its CUDA extension (``sssd._cuda``)."""
    return _cuda is not None


def cuda_available() -> bool:
    """True when the CUDA extension is built and at least one CUDA device is visible."""
    return _cuda is not None and _cuda.device_count() > 0


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _torch():
    import torch

    return torch


def _require_ext(op: str) -> None:
    if _cuda is None:
        raise RuntimeError(
            f"{op}: sssd was built without its CUDA extension; reinstall with nvcc on PATH "
            "(`pip install .`, see docs/cuda.md) or use the torch reference on CPU"
        )


@dataclass(frozen=True)
class PackedTrees:
    """Per-step metadata of a packed batch, validated once on the host and uploaded to ``device``.

    The host copies (``*_host``) size the launch without a device sync; derived sizes are cached (the
    same metadata serves every layer of a step).
    """

    offsets: Any  # torch int64 [B+1]
    ctx_lens: Any  # torch int32 [B]
    slots: Any  # torch int32 [B]
    masks: Any  # torch int64 [N, 2] (uint64 bit patterns)
    offsets_host: np.ndarray  # int64 [B+1]
    ctx_lens_host: np.ndarray  # int32 [B]
    slots_host: np.ndarray  # int32 [B]
    masks_host: np.ndarray  # uint64 [N, 2]

    @cached_property
    def batch(self) -> int:
        return len(self.ctx_lens_host)

    @cached_property
    def total_nodes(self) -> int:
        return int(self.offsets_host[-1])

    @cached_property
    def max_nodes(self) -> int:
        return int(np.diff(self.offsets_host).max())

    @cached_property
    def max_ctx(self) -> int:
        return int(self.ctx_lens_host.max())

    @classmethod
    def from_numpy(cls, offsets, ctx_lens, slots, masks, device="cpu") -> PackedTrees:
        """Validate host arrays (offsets [B+1], ctx_lens [B], slots [B], masks [N, 2] uint64) and upload."""
        torch = _torch()
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        ctx_lens = np.ascontiguousarray(ctx_lens, dtype=np.int32)
        slots = np.ascontiguousarray(slots, dtype=np.int32)
        masks = np.ascontiguousarray(masks)
        if masks.dtype != np.uint64 or masks.ndim != 2 or masks.shape[1] != 2:
            raise TypeError(f"masks must be a uint64 array [N, 2], got {masks.dtype} {masks.shape}")
        batch = len(ctx_lens)
        if batch < 1 or offsets.shape != (batch + 1,) or slots.shape != (batch,):
            raise ValueError("need offsets [B+1], ctx_lens [B] and slots [B] with B >= 1")
        sizes = np.diff(offsets)
        if offsets[0] != 0 or (sizes < 1).any() or (sizes > MAX_TREE_NODES).any():
            raise ValueError(f"offsets must start at 0 and give every tree 1..{MAX_TREE_NODES} nodes")
        if offsets[-1] != len(masks):
            raise ValueError(f"masks has {len(masks)} rows but the trees have {offsets[-1]} nodes")
        if (ctx_lens < 0).any() or (slots < 0).any():
            raise ValueError("ctx_lens and slots must be non-negative")
        if len(np.unique(slots)) != batch:
            raise ValueError("every request needs its own cache slot")

        def up(a):
            return torch.from_numpy(a).to(device)

        return cls(
            up(offsets), up(ctx_lens), up(slots), up(masks.view(np.int64)), offsets, ctx_lens, slots, masks
        )


def _check_tensor(name: str, t, ndim: int, dtypes, device=None) -> None:
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; expected one of {[str(d) for d in dtypes]}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")


def _check_cache_shapes(k_tree, v_tree, k_cache, v_cache) -> tuple[int, int, int, int]:
    n, hkv, d = k_tree.shape
    if tuple(v_tree.shape) != (n, hkv, d):
        raise ValueError(f"v_tree shape {tuple(v_tree.shape)} differs from k_tree {tuple(k_tree.shape)}")
    if tuple(k_cache.shape) != tuple(v_cache.shape) or tuple(k_cache.shape[2:]) != (hkv, d):
        raise ValueError(
            f"caches must be [S, R, {hkv}, {d}], got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if v_cache.stride() != k_cache.stride():
        raise ValueError("v_cache must have the same strides as k_cache")
    return n, hkv, d, k_cache.shape[1]


def _check_trees_vs_cache(trees: PackedTrees, n: int, k_cache) -> None:
    if trees.total_nodes != n:
        raise ValueError(f"the trees have {trees.total_nodes} nodes but the tensors have {n} rows")
    if trees.max_ctx > k_cache.shape[1]:
        raise ValueError(f"a context length ({trees.max_ctx}) exceeds the cache rows ({k_cache.shape[1]})")
    if trees.max_ctx > 0 and int(trees.slots_host.max()) >= k_cache.shape[0]:
        raise ValueError(f"a slot index exceeds the cache's {k_cache.shape[0]} slots")


def tree_attention(
    q, k_tree, v_tree, k_cache, v_cache, trees: PackedTrees, *, scale=None, out=None, splits=None
):
    """Tree attention on CUDA tensors (layout in the module docstring); returns ``out`` [N, Hq, D].

    ``splits`` forces the number of context splits (default: planned from the device's SM count).
    Runs on the current stream of q's device; no host synchronisation.
    """
    torch = _torch()
    _require_ext("tree_attention")
    _check_tensor("q", q, 3, (torch.float16, torch.bfloat16))
    if q.device.type != "cuda":
        raise ValueError(f"tree_attention needs CUDA tensors, q is on {q.device}")
    for name, t, nd in (
        ("k_tree", k_tree, 3),
        ("v_tree", v_tree, 3),
        ("k_cache", k_cache, 4),
        ("v_cache", v_cache, 4),
    ):
        _check_tensor(name, t, nd, (q.dtype,), q.device)
    n, hkv, d, _ = _check_cache_shapes(k_tree, v_tree, k_cache, v_cache)
    if q.shape[0] != n or q.shape[2] != d or q.shape[1] % hkv:
        raise ValueError(f"q {tuple(q.shape)} does not match k_tree {tuple(k_tree.shape)} (Hq % Hkv == 0)")
    if d not in (64, 128):
        raise ValueError(f"the CUDA kernel supports head dims 64 and 128, got {d}")
    _check_trees_vs_cache(trees, n, k_cache)
    for name, t, dt in (("offsets", trees.offsets, torch.int64), ("ctx_lens", trees.ctx_lens, torch.int32)):
        _check_tensor(name, t, 1, (dt,), q.device)
    _check_tensor("slots", trees.slots, 1, (torch.int32,), q.device)
    _check_tensor("masks", trees.masks, 2, (torch.int64,), q.device)
    if out is None:  # token-major, so [N, Hq, D] -> [1, N, Hq * D] is a view for the caller
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    else:
        _check_tensor("out", out, 3, (q.dtype,), q.device)
        if out.shape != q.shape:
            raise ValueError(f"out shape {tuple(out.shape)} must equal q's {tuple(q.shape)}")
    hq = q.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    max_ctx, max_nodes = trees.max_ctx, trees.max_nodes
    if splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        splits, chunk = _cuda.tree_attention_plan(trees.batch, hq, hkv, max_nodes, max_ctx, sms)
    else:
        if int(splits) < 1:
            raise ValueError(f"splits must be >= 1, got {splits}")
        chunk = _ceil_div(_ceil_div(max(max_ctx, 1), int(splits)), KEY_TILE) * KEY_TILE
        splits = max(1, _ceil_div(max_ctx, chunk))
    partial_out = partial_lse = None
    if splits > 1:
        partial_out = torch.empty((splits, n, hq, d), dtype=torch.float32, device=q.device)
        partial_lse = torch.empty((splits, n, hq), dtype=torch.float32, device=q.device)
    with torch.cuda.device(q.device):
        _cuda.tree_attention(
            q=q.data_ptr(), q_strides=q.stride()[:2], out=out.data_ptr(), out_strides=out.stride()[:2],
            k_cache=k_cache.data_ptr(), v_cache=v_cache.data_ptr(), cache_strides=k_cache.stride()[:3],
            k_tree=k_tree.data_ptr(), v_tree=v_tree.data_ptr(), tree_strides=k_tree.stride()[:2],
            v_tree_strides=v_tree.stride()[:2],
            offsets=trees.offsets.data_ptr(), ctx_lens=trees.ctx_lens.data_ptr(),
            slots=trees.slots.data_ptr(),
            masks=trees.masks.data_ptr(), batch=trees.batch, total_nodes=n, q_heads=hq, kv_heads=hkv,
            head_dim=d, max_nodes=max_nodes, max_ctx=max_ctx, scale=scale,
            dtype=0 if q.dtype == torch.float16 else 1, splits=splits, chunk=chunk,
            partial_out=0 if partial_out is None else partial_out.data_ptr(),
            partial_lse=0 if partial_lse is None else partial_lse.data_ptr(),
            stream=torch.cuda.current_stream(q.device).cuda_stream,
        )  # fmt: skip
    return out


def built_architectures() -> tuple[int, ...]:
    """The SM architectures the extension was compiled for (e.g. (80, 90)); empty without it."""
    if _cuda is None:
        return ()
    return tuple(int("".join(c for c in a if c.isdigit())) for a in str(_cuda.architectures).split(","))


def architecture_supported(capability: tuple[int, int], built: tuple[int, ...] | None = None) -> bool:
    """Whether a device of compute ``capability`` (major, minor) can run the kernels: sm_80 or newer (bf16
    WMMA, cp.async) and not older than the oldest architecture built (newer devices JIT its PTX)."""
    built = built_architectures() if built is None else built
    cc = 10 * int(capability[0]) + int(capability[1])
    return cc >= 80 and bool(built) and cc >= min(built)


def _device_supported(device) -> bool:
    torch = _torch()
    return architecture_supported(torch.cuda.get_device_capability(device))


def kernel_can_run(device, dtype, head_dim: int) -> bool:
    """Whether the kernel can serve a model on ``device`` with weights of ``dtype`` and this head dim: the
    extension is built, a device is visible, CUDA, fp16/bf16, head dim 64 or 128, and the device's
    architecture is supported (:func:`architecture_supported`)."""
    torch = _torch()
    return (
        _cuda is not None
        and torch.device(device).type == "cuda"
        and dtype in (torch.float16, torch.bfloat16)
        and int(head_dim) in (64, 128)
        and cuda_available()
        and _device_supported(torch.device(device))
    )


def kernel_supports(q, k_tree) -> bool:
    """Whether :func:`tree_attention` can run these tensors (built extension, CUDA, fp16/bf16, D 64/128)."""
    torch = _torch()
    return (
        _cuda is not None
        and q.device.type == "cuda"
        and q.dtype in (torch.float16, torch.bfloat16)
        and k_tree.dtype == q.dtype
        and q.shape[-1] in (64, 128)
        and q.stride(-1) == 1
        and all(s % 8 == 0 for s in q.stride()[:2])
        and _device_supported(q.device)
    )


def cpu_kernel_can_run(device, dtype) -> bool:
    """Whether sssd's CPU tree attention can serve a model on ``device`` with weights of ``dtype``."""
    torch = _torch()
    return (
        torch.device(device).type == "cpu" and dtype == torch.float32 and hasattr(_core, "tree_attention_cpu")
    )


def cpu_kernel_supports(q) -> bool:
    """True when sssd's CPU tree attention (``sssd._core.tree_attention_cpu``, float32) can run ``q``."""
    return q.device.type == "cpu" and str(q.dtype) == "torch.float32" and hasattr(_core, "tree_attention_cpu")


def tree_attention_cpu(q, k_tree, v_tree, k_cache, v_cache, trees: PackedTrees, *, scale=None, isa: int = 0):
    """Tree attention on the CPU in float32 (``csrc/core/tree_attention_cpu.h``): q ``[N, Hq, D]``,
    k_tree/v_tree ``[N, Hkv, D]``, k_cache/v_cache ``[slots, Hkv, rows, D]`` (the engine's cache layout;
    any strides with a contiguous last dimension, read without copies). Returns ``[N, Hq, D]``."""
    torch = _torch()
    out = torch.empty(q.shape, dtype=q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    _core.tree_attention_cpu(
        q.numpy(), k_tree.numpy(), v_tree.numpy(), k_cache.numpy(), v_cache.numpy(), trees.offsets_host,
        trees.ctx_lens_host, trees.slots_host, trees.masks_host, out.numpy(), scale, torch.get_num_threads(),
        isa,
    )  # fmt: skip
    return out


def dispatch_tree_attention(q, k_tree, v_tree, k_cache, v_cache, trees: PackedTrees, *, scale=None):
    """The attention function's entry point: the CUDA kernel when :func:`kernel_supports` says so, else the
    float64 reference on the tensors' device (any dtype, any head dim), cast back to q's dtype."""
    if kernel_supports(q, k_tree):
        return tree_attention(q, k_tree, v_tree, k_cache, v_cache, trees, scale=scale)
    ref = tree_attention_reference(q, k_tree, v_tree, k_cache, v_cache, trees, scale=scale)
    return ref.to(q.dtype)


def hf_tree_attention(
    query, key, value, k_cache, v_cache, trees: PackedTrees, *, scale=None, emulate: bool = False
):
    """Tree attention in the shapes of a ``transformers`` attention function over the engine's cache layer.

    query ``[1, Hq, N, D]`` and key/value ``[1, Hkv, N, D]`` are the packed step (tree 0's nodes first);
    k_cache/v_cache ``[slots, Hkv, rows, D]`` hold the committed rows (``trees.ctx_lens``) of slots
    ``trees.slots``. Returns ``[1, N, Hq, D]`` (what the attention function returns). The kernel runs
    when :func:`kernel_supports` allows it, else the float64 reference; every view is zero-copy.
    ``emulate=True`` runs the kernel's host emulation instead (float32 on the CPU; for tests).
    """
    q = query[0].transpose(0, 1)
    k_tree, v_tree = key[0].transpose(0, 1), value[0].transpose(0, 1)
    if not emulate and cpu_kernel_supports(q):
        return tree_attention_cpu(q, k_tree, v_tree, k_cache, v_cache, trees, scale=scale).unsqueeze(0)
    kc, vc = k_cache.transpose(1, 2), v_cache.transpose(1, 2)  # [slots, rows, Hkv, D] views
    if emulate:
        out = tree_attention_emulated(q, k_tree, v_tree, kc, vc, trees, scale=scale)
        return out.to(q.device, q.dtype).unsqueeze(0)
    return dispatch_tree_attention(q, k_tree, v_tree, kc, vc, trees, scale=scale).unsqueeze(0)


@dataclass(frozen=True)
class CommitPlan:
    """Rows to commit: scratch row ``src_rows[k]`` goes to cache row ``dst_rows[k]`` of slot ``dst_slots[k]``.

    Built once per step on the host (validated there) and reused by every layer.
    """

    src_rows: Any  # torch int32 [A]
    dst_slots: Any  # torch int32 [A]
    dst_rows: Any  # torch int32 [A]
    src_rows_host: np.ndarray  # int32 [A]
    dst_slots_host: np.ndarray  # int32 [A]
    dst_rows_host: np.ndarray  # int32 [A]

    @property
    def count(self) -> int:
        return len(self.src_rows_host)

    @classmethod
    def from_numpy(cls, src_rows, dst_slots, dst_rows, device="cpu") -> CommitPlan:
        torch = _torch()
        arrays = [np.ascontiguousarray(a, dtype=np.int32) for a in (src_rows, dst_slots, dst_rows)]
        if not all(a.ndim == 1 and len(a) == len(arrays[0]) for a in arrays):
            raise ValueError("src_rows, dst_slots and dst_rows must be 1-D of equal length")
        if any((a < 0).any() for a in arrays):
            raise ValueError("commit indexes must be non-negative")
        pairs = arrays[1].astype(np.int64) << 32 | arrays[2].astype(np.int64)
        if len(np.unique(pairs)) != len(pairs):
            raise ValueError("two committed rows target the same cache row")
        return cls(*(torch.from_numpy(a).to(device) for a in arrays), *arrays)

    @classmethod
    def for_paths(cls, paths, offsets, ctx_lens, slots, device="cpu") -> CommitPlan:
        """Plan for accepted paths: ``paths[i]`` = node indexes within tree i (root first when committed),
        written to rows ctx_lens[i], ctx_lens[i]+1, ... of slot slots[i]."""
        src, dst_slot, dst_row = [], [], []
        for i, path in enumerate(paths):
            path = np.asarray(path, dtype=np.int64)
            size = int(offsets[i + 1] - offsets[i])
            if ((path < 0) | (path >= size)).any():
                raise ValueError(f"path {i} has node indexes outside its tree of {size} nodes")
            src.append(offsets[i] + path)
            dst_slot.append(np.full(len(path), slots[i]))
            dst_row.append(ctx_lens[i] + np.arange(len(path)))
        cat = [np.concatenate(x) if x else np.zeros(0) for x in (src, dst_slot, dst_row)]
        return cls.from_numpy(*cat, device=device)


_KV_DTYPES_NAMES = ("float16", "bfloat16", "float32")


def _check_kv_pair(name: str, k, v, ndim: int, device=None):
    torch = _torch()
    dtypes = tuple(getattr(torch, n) for n in _KV_DTYPES_NAMES)
    _check_tensor(f"k_{name}", k, ndim, dtypes, device)
    _check_tensor(f"v_{name}", v, ndim, (k.dtype,), k.device)
    if k.shape != v.shape or k.stride() != v.stride():
        raise ValueError(f"k_{name} and v_{name} must have the same shape and strides")


def _span(t) -> tuple[int, int]:
    """Byte range [start, end) that tensor ``t`` can touch (from its strides)."""
    start = t.data_ptr()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True) if n > 0)
    return start, start + (last + 1) * t.element_size()


def _overlap(a, b) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def kv_commit(k_tree, v_tree, k_cache, v_cache, plan: CommitPlan) -> None:
    """Gather committed scratch rows ([N, Hkv, D]) into cache rows ([S, R, Hkv, D]), K and V, in place."""
    torch = _torch()
    _require_ext("kv_commit")
    _check_kv_pair("tree", k_tree, v_tree, 3)
    for src in (k_tree, v_tree):
        for dst in (k_cache, v_cache):
            if _overlap(src, dst):
                raise ValueError(
                    "kv_commit: the scratch rows and the cache share memory; rows moved in place could be "
                    "overwritten before they are read (gather the scratch rows into a new tensor first)"
                )
    if k_tree.device.type != "cuda":
        raise ValueError(f"kv_commit needs CUDA tensors, k_tree is on {k_tree.device}")
    _check_kv_pair("cache", k_cache, v_cache, 4, k_tree.device)
    if k_cache.dtype != k_tree.dtype or tuple(k_cache.shape[2:]) != tuple(k_tree.shape[1:]):
        raise ValueError("cache and scratch must share dtype, KV heads and head dim")
    for t in (plan.src_rows, plan.dst_slots, plan.dst_rows):
        _check_tensor("commit plan index", t, 1, (torch.int32,), k_tree.device)
    if plan.count == 0:
        return
    if plan.src_rows_host.max() >= k_tree.shape[0]:
        raise ValueError(f"a source row exceeds the scratch's {k_tree.shape[0]} rows")
    if plan.dst_slots_host.max() >= k_cache.shape[0] or plan.dst_rows_host.max() >= k_cache.shape[1]:
        raise ValueError(
            f"a destination exceeds the cache's {k_cache.shape[0]} slots x {k_cache.shape[1]} rows"
        )
    with torch.cuda.device(k_tree.device):
        _cuda.kv_commit(
            k_src=k_tree.data_ptr(), v_src=v_tree.data_ptr(), src_strides=k_tree.stride()[:2],
            src_tokens=k_tree.shape[0], k_dst=k_cache.data_ptr(), v_dst=v_cache.data_ptr(),
            dst_strides=k_cache.stride()[:3], num_slots=k_cache.shape[0], num_rows=k_cache.shape[1],
            src_rows=plan.src_rows.data_ptr(), dst_slots=plan.dst_slots.data_ptr(),
            dst_rows=plan.dst_rows.data_ptr(), count=plan.count, kv_heads=k_tree.shape[1],
            head_dim=k_tree.shape[2], elem_bytes=k_tree.element_size(),
            stream=torch.cuda.current_stream(k_tree.device).cuda_stream,
        )  # fmt: skip


def kv_append(k_src, v_src, k_dst, v_dst) -> None:
    """Copy this step's K/V ([N, Hkv, D], any row strides, K and V may differ) to the scratch (K/V alike)."""
    torch = _torch()
    _require_ext("kv_append")
    dtypes = tuple(getattr(torch, n) for n in _KV_DTYPES_NAMES)
    _check_tensor("k_src", k_src, 3, dtypes)
    _check_tensor("v_src", v_src, 3, (k_src.dtype,), k_src.device)
    if k_src.shape != v_src.shape:
        raise ValueError(f"k_src {tuple(k_src.shape)} and v_src {tuple(v_src.shape)} differ in shape")
    if k_src.device.type != "cuda":
        raise ValueError(f"kv_append needs CUDA tensors, k_src is on {k_src.device}")
    _check_kv_pair("dst", k_dst, v_dst, 3, k_src.device)
    if k_dst.dtype != k_src.dtype or k_dst.shape != k_src.shape:
        raise ValueError(
            f"destination {tuple(k_dst.shape)} must match the source {tuple(k_src.shape)} and dtype"
        )
    with torch.cuda.device(k_src.device):
        _cuda.kv_append(
            k_src=k_src.data_ptr(), v_src=v_src.data_ptr(), src_strides=k_src.stride()[:2],
            v_src_strides=v_src.stride()[:2], k_dst=k_dst.data_ptr(), v_dst=v_dst.data_ptr(),
            dst_strides=k_dst.stride()[:2],
            tokens=k_src.shape[0], kv_heads=k_src.shape[1], head_dim=k_src.shape[2],
            elem_bytes=k_src.element_size(), stream=torch.cuda.current_stream(k_src.device).cuda_stream,
        )  # fmt: skip


from sssd.kernels.reference import (  # noqa: E402  (re-exported: the oracles of the ops above)
    kv_commit_reference,
    tree_attention_emulated,
    tree_attention_reference,
)

__all__ = [
    "CommitPlan",
    "PackedTrees",
    "architecture_supported",
    "built_architectures",
    "cuda_available",
    "dispatch_tree_attention",
    "has_cuda",
    "hf_tree_attention",
    "kernel_can_run",
    "kernel_supports",
    "kv_append",
    "kv_commit",
    "kv_commit_reference",
    "tree_attention",
    "tree_attention_emulated",
    "tree_attention_reference",
]
