"""A long life: many requests through the documented ``while engine.has_unfinished(): engine.step()``
loop (requests join as others finish, the loop reads ``event.result``), with the tiny Llama of the tests,
sssd's retrieval drafter (request tokens and the pool of recent outputs) and the default adaptive policy.

Prints one row per window of finished requests: step time (median and p90 over the window's steps, wall
clock; and the median of the process's CPU time per step, which a loaded machine disturbs less), the
process's RSS, and the per-request state the engine and its policy hold (finished results, policy
records). Flat columns mean bounded memory and no slowdown over the run. Uses public API only (the state
columns read private fields when they exist), so the same script measures an older commit.

    OMP_NUM_THREADS=1 PYTHONPATH=python:tests python3 bench/engine/long_life.py [--requests 10000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import numpy as np
import sssd
import torch
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import VOCAB, tiny_model


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def held(engine: Engine) -> tuple[int, int]:
    """(finished results the engine holds, per-request records of the policy), 0 where absent."""
    results = len(getattr(engine, "_finished", {})) + len(getattr(engine, "_results", {}))
    pol = engine.policy
    records = sum(len(getattr(pol, name, {})) for name in ("_requests", "_finished", "_deferred", "slo"))
    return results, records


def run(engine: Engine, args: argparse.Namespace) -> None:
    """Keep one batch of requests queued behind the running batch until ``args.requests`` finished; print
    a row per ``args.window`` of them."""
    rng = np.random.default_rng(args.seed)
    added = done = steps = 0
    wall: list[float] = []
    cpu: list[float] = []
    while done < args.requests:
        while added < args.requests and added - done < 2 * args.batch:
            prompt = rng.integers(2, VOCAB, size=int(rng.integers(4, 13))).tolist()
            engine.add_request(prompt, max_new_tokens=args.new_tokens, eos_token_ids=())
            added += 1
        t0, c0 = time.perf_counter(), time.process_time()
        events = engine.step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        steps += 1
        for e in events:
            if not e.finished:
                continue
            assert e.result is not None and len(e.result.tokens) == args.new_tokens
            done += 1
            if done % args.window == 0:
                gc.collect()
                ms = sorted(1e3 * t for t in wall)
                res, rec = held(engine)
                p90 = ms[int(0.9 * (len(ms) - 1))]
                print(
                    f"| {done:,} | {steps:,} | {statistics.median(ms):.2f} | {p90:.2f} "
                    f"| {1e3 * statistics.median(cpu):.2f} | {rss_mib():.0f} | {res} | {rec} |",
                    flush=True,
                )
                wall.clear()
                cpu.clear()
    assert not engine.has_unfinished()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--window", type=int, default=1_000, help="finished requests per row (1000)")
    ap.add_argument("--batch", type=int, default=8, help="max batch size (8)")
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens per request (16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drafter", choices=("retrieval", "none"), default="retrieval")
    ap.add_argument(
        "--pool-tokens", type=int, default=None, help="the drafter's pool_max_tokens (default: its own)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    pool = {} if args.pool_tokens is None else {"pool_max_tokens": args.pool_tokens}
    drafter = (
        sssd.Drafter(None, sssd.DrafterConfig(vocab_size=VOCAB, **pool)) if args.drafter != "none" else None
    )
    config = EngineConfig(budget=8, max_batch_size=args.batch)
    engine = Engine(tiny_model("llama"), drafter=drafter, config=config)
    pool_cap = drafter.config.pool_max_tokens if drafter is not None else 0
    print(
        f"drafter: {args.drafter} (pool of {pool_cap:,} tokens), batch {args.batch}, "
        f"{args.new_tokens} tokens per request"
    )
    print(
        "| requests done | steps | step median ms | step p90 ms | CPU ms/step (median) | RSS MiB "
        "| results held | policy records |"
    )
    print("|---|---|---|---|---|---|---|---|")
    run(engine, args)


if __name__ == "__main__":
    main()
