"""Tree attention microbenchmark (GPU only): our kernel vs dense-mask SDPA vs a plain decode step.

Shape: Llama-3-8B attention (32 query heads, 8 KV heads, head dim 128, bf16) by default. For each batch x
context x tree size it prints and saves (JSON) the median time of
  * ours:  sssd.kernels.tree_attention.tree_attention over the packed batch (K/V read once per KV head),
  * sdpa:  torch SDPA on [B, Hq, n, ctx+n] with a dense float mask and K/V repeated to Hq heads (the generic
           path of an HF model), K/V prepared outside the timed region,
  * floor: SDPA (flash when available) with one query per request over the same context (a decode step),
and our achieved bandwidth (bytes of K/V, Q and output / time) against the device's measured copy bandwidth.

    python bench/gpu/bench_tree_attention.py                     # the full grid (minutes)
    python bench/gpu/bench_tree_attention.py --quick             # a few points
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path

import numpy as np


def need_gpu(name="bench_tree_attention"):
    try:
        import torch
    except ImportError:
        sys.exit(f"{name}: torch is not installed")
    import sssd

    if not torch.cuda.is_available():
        sys.exit(f"{name}: needs a CUDA GPU (torch.cuda.is_available() is False); nothing measured")
    if not sssd.cuda_available():
        sys.exit(
            f"{name}: sssd was built without its CUDA extension or sees no device; "
            "rebuild with nvcc on PATH (`pip install .`, docs/cuda.md)"
        )
    return torch


def grid_parser(doc: str, out: str, **axes: str) -> argparse.ArgumentParser:
    """A GPU benchmark's parser: the axes of its grid (``--NAME``: comma lists, these defaults), ``--iters``
    (timed calls per point) and ``--out`` (the JSON written)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in axes.items():
        p.add_argument(f"--{name}", default=default)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=out)
    return p


def parse_args():
    p = grid_parser(
        __doc__, "bench/results/tree_attention.json", batch="1,8,32,64", ctx="512,2048,8192,32768",
        tree="1,8,32,64,128",
    )  # fmt: skip
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--sdpa-max-gib", type=float, default=24.0, help="skip SDPA points needing more memory")
    p.add_argument("--quick", action="store_true", help="batch 1,8 x ctx 2k,8k x tree 1,32,128")
    return p.parse_args()


def ints(s):
    return [int(x) for x in s.split(",") if x]


def cuda_time_us(torch, fn, iters):
    """Median over `iters` timed calls (CUDA events), after two warm-up calls."""
    fn()
    fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return float(np.median(times))


def copy_bandwidth(torch):
    """Device copy bandwidth in GB/s (read + write of a 1 GiB buffer)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = cuda_time_us(torch, lambda: dst.copy_(src), 10)
    return 2 * src.numel() / (us * 1e-6) / 1e9


def make_batch(torch, cuda_ops, batch, ctx, n, a, dtype, seed):
    from sssd.kernels.reference import ancestor_masks  # the masks' oracle serves as their builder here

    rng = np.random.default_rng(seed)
    offsets = np.arange(batch + 1, dtype=np.int64) * n
    parents = np.concatenate([[-1] + [int(rng.integers(0, j)) for j in range(1, n)] for _ in range(batch)])
    masks = ancestor_masks(parents, offsets)
    trees = cuda_ops.PackedTrees.from_numpy(
        offsets, np.full(batch, ctx), np.arange(batch), masks, device="cuda"
    )  # fmt: skip
    N = batch * n
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, device="cuda", dtype=dtype)

    q, kt, vt = (
        rand(N, a.q_heads, a.head_dim),
        rand(N, a.kv_heads, a.head_dim),
        rand(N, a.kv_heads, a.head_dim),
    )
    kc, vc = rand(batch, ctx, a.kv_heads, a.head_dim), rand(batch, ctx, a.kv_heads, a.head_dim)
    return trees, masks, q, kt, vt, kc, vc


def sdpa_inputs(torch, trees_masks, q, kt, vt, kc, vc, batch, ctx, n, a):
    """Dense-mask SDPA inputs of the generic path: [B, Hq, n, D] queries, K/V repeated to Hq heads."""
    group = a.q_heads // a.kv_heads
    qd = q.view(batch, n, a.q_heads, a.head_dim).transpose(1, 2)
    k = torch.cat([kc, kt.view(batch, n, a.kv_heads, a.head_dim)], dim=1).transpose(1, 2)
    v = torch.cat([vc, vt.view(batch, n, a.kv_heads, a.head_dim)], dim=1).transpose(1, 2)
    k, v = k.repeat_interleave(group, dim=1).contiguous(), v.repeat_interleave(group, dim=1).contiguous()
    j = np.arange(n)
    bits = (trees_masks[:, j // 64] >> (j % 64).astype(np.uint64)) & np.uint64(1)  # [B*n, n]
    allowed = torch.from_numpy(bits.astype(bool).reshape(batch, 1, n, n)).cuda()
    mask = torch.zeros(batch, 1, n, ctx + n, dtype=q.dtype, device="cuda")
    mask[..., ctx:].masked_fill_(~allowed, float("-inf"))
    return qd, k, v, mask


def run_point(torch, cuda_ops, batch, ctx, n, a, dtype, bw):
    F = torch.nn.functional
    trees, masks, q, kt, vt, kc, vc = make_batch(torch, cuda_ops, batch, ctx, n, a, dtype, seed=batch * 7 + n)
    out = torch.empty_like(q)
    ours = cuda_time_us(torch, lambda: cuda_ops.tree_attention(q, kt, vt, kc, vc, trees, out=out), a.iters)
    elem = q.element_size()
    moved = (2 * kc.numel() + 2 * kt.numel() + 2 * q.numel()) * elem + masks.nbytes
    row = dict(batch=batch, ctx=ctx, tree=n, ours_us=ours, ours_gbs=moved / (ours * 1e-6) / 1e9)
    row["ours_pct_copy_bw"] = 100 * row["ours_gbs"] / bw
    # the plain decode floor: one query per request over the same context
    q1 = q.view(batch, n, a.q_heads, a.head_dim)[:, :1].transpose(1, 2)
    k1, v1 = kc.transpose(1, 2), vc.transpose(1, 2)

    def floor():
        return F.scaled_dot_product_attention(q1, k1, v1, enable_gqa=True)

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            row["floor_us"] = cuda_time_us(torch, floor, a.iters)
    except RuntimeError:  # no fused kernel for this shape: whatever SDPA picks
        row["floor_us"] = cuda_time_us(torch, floor, a.iters)
    row["ours_over_floor"] = ours / row["floor_us"]
    # the generic dense-mask path
    need = 2 * batch * a.q_heads * (ctx + n) * a.head_dim * elem + batch * n * (ctx + n) * elem
    if need / 2**30 > a.sdpa_max_gib:
        row["sdpa_us"] = None
        row["sdpa_note"] = f"skipped: needs {need / 2**30:.1f} GiB"
    else:
        try:
            qd, k, v, mask = sdpa_inputs(torch, masks, q, kt, vt, kc, vc, batch, ctx, n, a)
            row["sdpa_us"] = cuda_time_us(
                torch, lambda: F.scaled_dot_product_attention(qd, k, v, attn_mask=mask), a.iters
            )
            row["speedup_vs_sdpa"] = row["sdpa_us"] / ours
            del qd, k, v, mask
        except torch.OutOfMemoryError:
            row["sdpa_us"], row["sdpa_note"] = None, "out of memory"
    return row


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main():
    a = parse_args()
    torch = need_gpu()
    from sssd.kernels import tree_attention as cuda_ops

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    batches, ctxs, trees = ints(a.batch), ints(a.ctx), ints(a.tree)
    if a.quick:
        batches, ctxs, trees = [1, 8], [2048, 8192], [1, 32, 128]
    bw = copy_bandwidth(torch)
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; measured copy bandwidth {bw:.0f} GB/s; torch {torch.__version__}")
    print(f"shape: {a.q_heads}/{a.kv_heads} heads, D={a.head_dim}, {a.dtype}")
    head = (
        f"{'B':>3} {'ctx':>6} {'tree':>4} | {'ours us':>9} {'GB/s':>6} {'%bw':>5} | "
        f"{'sdpa us':>9} {'x':>6} | {'floor us':>9} {'ours/floor':>10}"
    )
    print(head)
    print("-" * len(head))
    rows = []
    for batch in batches:
        for ctx in ctxs:
            for n in trees:
                r = run_point(torch, cuda_ops, batch, ctx, n, a, dtype, bw)
                rows.append(r)
                torch.cuda.empty_cache()
                print(
                    f"{batch:>3} {ctx:>6} {n:>4} | {r['ours_us']:>9.1f} {r['ours_gbs']:>6.0f} "
                    f"{r['ours_pct_copy_bw']:>5.1f} | "
                    f"{fmt(r.get('sdpa_us'), '>9.1f')} {fmt(r.get('speedup_vs_sdpa'), '>6.2f')} | "
                    f"{r['floor_us']:>9.1f} {r['ours_over_floor']:>10.2f}",
                    flush=True,
                )
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(device=dev, copy_bandwidth_gbs=bw, torch=torch.__version__, python=platform.python_version())
    meta.update(q_heads=a.q_heads, kv_heads=a.kv_heads, head_dim=a.head_dim, dtype=a.dtype, iters=a.iters)
    out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"saved {out}")
    if any(math.isnan(r["ours_us"]) for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
