"""Every fault at once, for thousands of steps: drafter exceptions in every method, malformed drafter
outputs of every kind (tests/chaos.py: None, wrong types, missing fields, bad tokens / parents / depths /
offsets, 2,000-node trees, draft_probs of the wrong shape, NaN, negative, q = 0), ``KeyboardInterrupt`` at
random lines of the engine's code, failing forwards (prefill, tree forward, output head; RuntimeError and
torch.OutOfMemoryError) and ``abort()`` from a second thread. Half the requests are greedy, half seeded
sampling; the reference is fault-free plain decoding with the same seeds. After the fault phase every
request must finish.

Prints the totals over the runs: steps, faults injected, and the damage (wrong tokens, lost requests,
unfinished, streams differing from their results). Aborted requests count as wrong if their partial
output is not a prefix of the reference.

    OMP_NUM_THREADS=1 PYTHONPATH=python:tests python3 bench/fault_soak_full.py [--seeds 20]
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch
from chaos import ChaosRates, reference, run_chaos
from sssd.engine.sampling import SamplingParams

PROMPTS = [[9, 3, 4], [2, 8], [5, 5, 6, 7], [11, 12], [20, 21, 22], [30, 4], [40, 41], [7, 7, 7]]


def requests(n: int, new_tokens: int) -> tuple[list[list[int]], list[SamplingParams]]:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    params = [
        SamplingParams(max_new_tokens=new_tokens, temperature=0.9, top_k=40, seed=1000 + i, eos_token_ids=())
        if i % 2
        else SamplingParams(max_new_tokens=new_tokens, eos_token_ids=())
        for i in range(n)
    ]
    return prompts, params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20, help="runs (default 20)")
    ap.add_argument("--requests", type=int, default=48, help="requests per run (48)")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens per request (32)")
    ap.add_argument("--fault-steps", type=int, default=400, help="step calls with faults per run (400)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("sssd.engine").setLevel(logging.ERROR)  # the injected faults' warnings
    prompts, params = requests(args.requests, args.new_tokens)
    refs = reference(prompts, params)
    rates = ChaosRates(fault_steps=args.fault_steps)
    total: dict[str, int] = {}
    for seed in range(args.seeds):
        rep = asdict(run_chaos(prompts, params, refs, seed, rates))
        for rid, what in rep.pop("extra").items():  # the requests that went wrong, for a bug report
            print(f"run {seed}, request {rid}: {what}", file=sys.stderr)
        for k, v in rep.items():
            total[k] = total.get(k, 0) + int(v)
    print(f"rates: {asdict(rates)}; {args.seeds} runs x {args.requests} requests x {args.new_tokens} tokens")
    print("| " + " | ".join(total) + " |")
    print("|" + "---|" * len(total))
    print("| " + " | ".join(f"{v:,}" for v in total.values()) + " |")


if __name__ == "__main__":
    main()
