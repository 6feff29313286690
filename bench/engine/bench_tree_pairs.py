"""What a tree costs beyond its tokens: the attention, one padded SDPA call per layer (the engine's CPU
path) for a batch of requests whose trees differ in size, against the cost model's tree attention pairs
``P_tree``; and one call of the output head by rows, which verification makes once per accepted depth or
once for all the rows it still needs (``HeadCost``: where 32 rows cost about what 1 does, one call pays).

    PYTHONPATH=python python3 bench/engine/bench_tree_pairs.py --dtype bfloat16

SmolLM2-135M's attention shape (9 query heads, 3 key/value heads, head size 64), 30 layers, 1 thread.
Prints per row: the trees' sizes (nodes per request, root included), cache rows per request, the
milliseconds of the 30 layers' attention (median of ``--repeats``) and ``P_tree``; then the milliseconds
of one output-head call (hidden 576, vocabulary 49152) for 1 to 64 rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from sssd.policy.cost_model import tree_pairs_of

CASES = (  # (nodes per request, cache rows per request)
    ((1, 1, 1, 1), 600),
    ((5, 5, 5, 5), 600),
    ((17, 1, 1, 1), 600),
    ((17, 17, 17, 17), 600),
    ((33, 1, 1, 1), 600),
    ((17, 1, 1, 1), 200),
    ((17, 1, 1, 1), 1200),
    ((17,), 600),
    ((65,), 600),
)


def attention_ms(sizes, rows: int, dtype, layers: int, repeats: int) -> float:
    b, n = len(sizes), max(sizes)
    q = torch.randn(b, 9, n, 64, dtype=dtype)
    k = torch.randn(b, 3, rows + n, 64, dtype=dtype)
    v = torch.randn_like(k)
    mask = torch.ones(b, 1, n, rows + n, dtype=torch.bool)
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(layers):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    print(f"{args.dtype}, {args.layers} layers, torch {torch.__version__}, 1 thread\n")
    print("| nodes per request | rows per request | attention ms | P_tree |")
    print("|---|---|---|---|")
    for sizes, rows in CASES:
        ms = attention_ms(sizes, rows, dtype, args.layers, args.repeats)
        pairs = tree_pairs_of(sizes, [rows] * len(sizes))
        print(f"| {', '.join(map(str, sizes))} | {rows} | {ms:.1f} | {pairs:.0f} |", flush=True)
    head = torch.nn.Linear(576, 49152, bias=False).to(dtype)
    print("\n| output-head rows | ms per call |\n|---|---|")
    with torch.inference_mode():
        for rows in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(rows, 576, dtype=dtype)
            for _ in range(3):
                head(x)
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                head(x)
                times.append(time.perf_counter() - t)
            print(f"| {rows} | {1e3 * statistics.median(times):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
