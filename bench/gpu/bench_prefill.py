"""Chunked prefill through the cache (GPU only): the tree kernel on chain "trees" vs torch SDPA.

A prompt chunk of n <= 128 tokens attends the request's committed cache rows plus itself causally, which
is the tree kernel's job when the tree is a chain. This measures, for the Llama-3-8B attention shape,
whether that is faster than SDPA with a bottom-right causal mask over [cache + chunk] (K/V concatenated
and repeated to the query heads outside the timed region, which favours SDPA). The faster one should
serve the engine's prefill.

    python bench/gpu/bench_prefill.py [--batch 1,8] [--ctx 0,2048,8192] [--chunk 64,128]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from bench_tree_attention import cuda_time_us, grid_parser, ints, need_gpu


def run_point(torch, cuda_ops, batch, ctx, n, iters, hq=32, hkv=8, d=128):
    from sssd.kernels.reference import ancestor_masks  # the masks' oracle serves as their builder here
    from torch.nn.attention.bias import causal_lower_right

    F = torch.nn.functional
    dt = torch.bfloat16
    offsets = np.arange(batch + 1, dtype=np.int64) * n
    parents = np.tile(np.arange(-1, n - 1), batch)  # chains: causal inside the chunk
    masks = ancestor_masks(parents, offsets)
    trees = cuda_ops.PackedTrees.from_numpy(offsets, np.full(batch, ctx), np.arange(batch), masks, "cuda")
    q = torch.randn(batch * n, hq, d, device="cuda", dtype=dt)
    kt, vt = (torch.randn(batch * n, hkv, d, device="cuda", dtype=dt) for _ in range(2))
    kc, vc = (torch.randn(batch, max(ctx, 1), hkv, d, device="cuda", dtype=dt) for _ in range(2))
    out = torch.empty_like(q)
    ours = cuda_time_us(torch, lambda: cuda_ops.tree_attention(q, kt, vt, kc, vc, trees, out=out), iters)
    qd = q.view(batch, n, hq, d).transpose(1, 2)
    k = torch.cat([kc[:, :ctx], kt.view(batch, n, hkv, d)], 1).transpose(1, 2)
    v = torch.cat([vc[:, :ctx], vt.view(batch, n, hkv, d)], 1).transpose(1, 2)
    k, v = (x.repeat_interleave(hq // hkv, dim=1).contiguous() for x in (k, v))
    mask = causal_lower_right(n, ctx + n)
    sdpa = cuda_time_us(torch, lambda: F.scaled_dot_product_attention(qd, k, v, attn_mask=mask), iters)
    return dict(batch=batch, ctx=ctx, chunk=n, ours_us=ours, sdpa_us=sdpa)


def main():
    p = grid_parser(__doc__, "bench/results/prefill.json", batch="1,8", ctx="0,2048,8192", chunk="64,128")
    a = p.parse_args()
    torch = need_gpu("bench_prefill")
    from sssd.kernels import tree_attention as cuda_ops

    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; 32/8 heads, D=128, bf16")
    print(f"{'B':>3} {'ctx':>6} {'chunk':>5} | {'ours us':>9} | {'sdpa us':>9} | {'sdpa/ours':>9}")
    rows = []
    for batch in ints(a.batch):
        for ctx in ints(a.ctx):
            for n in ints(a.chunk):
                r = run_point(torch, cuda_ops, batch, ctx, n, a.iters)
                rows.append(r)
                torch.cuda.empty_cache()
                ours, sdpa = r["ours_us"], r["sdpa_us"]
                print(
                    f"{batch:>3} {ctx:>6} {n:>5} | {ours:>9.1f} | {sdpa:>9.1f} | {sdpa / ours:>9.2f}",
                    flush=True,
                )
    out_path = Path(a.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(dict(meta=dict(device=dev, torch=torch.__version__), rows=rows), indent=1))
    print(f"saved {out_path}")


if __name__ == "__main__":
    main()
