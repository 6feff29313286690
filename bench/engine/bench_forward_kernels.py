"""What the engine's CPU kernels save: one verification forward of SmolLM2-135M-Instruct (the output head
over every row included) timed with each linear kernel plan and each attention backend, by tree size, at
batch 1 and 4 (contexts of 300 to 600 committed tokens), side by side in one process.

    OMP_NUM_THREADS=1 PYTHONPATH=python python3 bench/engine/bench_forward_kernels.py --threads 1

Columns: ``torch`` (torch's F.linear, SDPA with a dense tree mask: the engine before its CPU kernels),
``linear`` (the measured linear plan, SDPA), ``linear+attention`` (the measured linear plan and sssd's CPU
tree attention: the engine's default in float32). Each cell is the median of ``--reps`` forwards (chains
of n nodes per request; the configurations take turns, so a passing load slows them alike). The header
prints the linear plan the engine measured and the load average; do not run it beside anything else.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
from sssd.engine.adapter import ModelAdapter
from sssd.engine.trees import TreeBatch, chain_tree
from sssd.models.loading import load_model

CONFIGS = {"torch": ("torch", "sdpa"), "linear": ("auto", "sdpa"), "linear+attention": ("auto", "packed")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--nodes", default="1,2,4,8,12,16,32", help="nodes per request (a chain)")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, _, _ = load_model(None, args.dtype)
    adapters = {name: ModelAdapter(model, linear=lin, attention=att) for name, (lin, att) in CONFIGS.items()}
    plan = adapters["linear"].linear_plan
    print(f"SmolLM2-135M-Instruct {args.dtype}, {args.threads} thread(s), load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    print(plan.describe() if plan is not None else "linear kernels: torch's only")
    rng = np.random.default_rng(0)
    for batch in (int(b) for b in args.batches.split(",")):
        contexts = [rng.integers(100, 40000, c) for c in np.linspace(300, 600, batch).astype(int)]
        for ad in adapters.values():
            ad.cache.clear()
            for c in contexts:
                ad.prefill(ad.cache.add(), c)
        print(f"\nbatch {batch}: ms per forward (speedup over torch)\n")
        print("| nodes per request | rows | " + " | ".join(CONFIGS) + " |")
        print("|---" * (len(CONFIGS) + 2) + "|")
        for n in (int(x) for x in args.nodes.split(",")):
            trees = TreeBatch.of([chain_tree(np.arange(n) + 100).tree(0) for _ in contexts])
            rows = np.arange(n * batch)
            times: dict[str, list[float]] = {name: [] for name in adapters}
            for rep in range(args.reps + 1):
                for name, ad in adapters.items():
                    t0 = time.perf_counter()
                    ad.forward_trees(trees).logits(rows)
                    if rep:  # the first round warms up
                        times[name].append(time.perf_counter() - t0)
            ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
            cells = " | ".join(f"{ms[k]:.1f} ({ms['torch'] / ms[k]:.2f}x)" for k in CONFIGS)
            print(f"| {n} | {n * batch} | {cells} |", flush=True)
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
