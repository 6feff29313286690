"""Interleaved A/B of OpenMP's wait policy: the runtime's default against ``OMP_WAIT_POLICY=passive``.

    PYTHONPATH=python:. python3 tools/omp_wait_policy.py --rounds 4

The policy is read once, when the OpenMP runtime starts, and torch and sssd's native drafter share one
runtime (one libgomp per process), so every round runs one fresh child process per policy (A B, then
B A, ...) on the same machine load. Each child loads SmolLM2-135M-Instruct (float32) and measures:

- torch alone: one decode forward (batch 1, one token after a 256-token KV cache), ms; one
  ``F.linear`` of the model's MLP shape ([1, 576] x [576, 1536]), µs;
- the drafter alone: ``Drafter.propose`` for 8 requests, budget 64, 500-token contexts from the bundled
  sample corpus and a datastore built from it, µs per call (every request extended by one token each
  call), with OpenMP's default thread count and with ``DrafterConfig(threads=1)`` (no parallel region);
- a step: ``propose`` then the decode forward, alternating as the engine does, each timed;
- the engine: greedy generation with the retrieval drafter (fixed budget 16, 4 requests of 24 new
  tokens from the sample corpus), tokens/s.

Medians per child (each printed as it ends, with the load average at its start), then the median over
rounds in a table. The machine may be shared: run it
when it is quiet, and read ratios rather than absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICIES = ("default", "passive")
CONTEXT, BATCH, BUDGET = 500, 8, 64


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def child(datastore: str) -> dict[str, float]:
    import torch
    import torch.nn.functional as F
    from sssd import Datastore
    from sssd.models.loading import load_model

    torch.manual_seed(0)
    model, _, _ = load_model(None, "float32")
    out: dict[str, float] = {"load average (1 min) at start": os.getloadavg()[0]}
    with torch.inference_mode():
        past = model(torch.randint(3, 1000, (1, 256)), use_cache=True).past_key_values
        one = torch.tensor([[17]])

        def decode():
            model(one, past_key_values=past, use_cache=True)
            past.crop(-1)  # back to 256 rows: every call measures the same shape

        decode()
        out["torch decode forward, ms"] = 1e3 * _median_time(decode, 15)
        x, w = torch.randn(1, 576), torch.randn(1536, 576)
        out["torch linear 576x1536, us"] = 1e6 * _median_time(lambda: F.linear(x, w), 300)
        ds = Datastore.open(datastore)
        for threads in (0, 1):
            propose = _proposer(ds, threads)
            name = "OpenMP default" if threads == 0 else "1"
            out[f"drafter propose (threads={name}), us"] = 1e6 * _median_time(propose, 200)
            steps = [(_median_time(propose, 1), _median_time(decode, 1)) for _ in range(15)]
            out[f"step: propose (threads={name}) after a forward, us"] = 1e6 * statistics.median(
                p for p, _ in steps
            )
            out[f"step: forward after a propose (threads={name}), ms"] = 1e3 * statistics.median(
                f for _, f in steps
            )
        out["engine, fixed budget 16, tok/s"] = _engine_speed(model, ds)
    return out


def _proposer(ds, threads: int):
    """A drafter with BATCH requests on the sample corpus; the returned call proposes once and extends
    every request by its next corpus token."""
    from sssd import Drafter, DrafterConfig
    from sssd.data import sample_corpus

    tokens, _ = sample_corpus()
    drafter = Drafter(ds, DrafterConfig(threads=threads))
    starts = [i * 20_000 for i in range(BATCH)]
    lens = [CONTEXT] * BATCH
    for rid, s in enumerate(starts):
        drafter.add_request(rid, tokens[s : s + CONTEXT])

    def propose():
        drafter.propose(list(range(BATCH)), budget=BUDGET)
        for rid, s in enumerate(starts):
            drafter.extend(rid, tokens[s + lens[rid] : s + lens[rid] + 1])
            lens[rid] += 1

    return propose


def _engine_speed(model, ds) -> float:
    """Tokens per second of greedy generation, after the first (admission + prefill) step."""
    import numpy as np
    from sssd import Drafter, Engine, EngineConfig
    from sssd.data import sample_corpus

    tokens, _ = sample_corpus()
    engine = Engine(model, drafter=Drafter(ds), config=EngineConfig(budget=16, budget_mode="fixed"))
    for s in np.random.default_rng(0).integers(0, len(tokens) - 200, 4):
        engine.add_request(tokens[s : s + 128].tolist(), max_new_tokens=24, eos_token_ids=[])
    engine.step()
    t0, produced = time.perf_counter(), 0
    while engine.has_unfinished():
        produced += sum(len(e.tokens) for e in engine.step())
    return produced / (time.perf_counter() - t0)


def run_child(policy: str, datastore: str) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    cmd = [sys.executable, __file__, "--child", datastore]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"child ({policy}) failed with status {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="child processes per policy (alternating)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    from sssd import build_datastore
    from sssd.data import sample_corpus, sample_vocab_size

    results: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "sample.sssd")
        build_datastore(sample_corpus(), path, vocab_size=sample_vocab_size())
        for r in range(args.rounds):
            for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
                results[policy].append(run_child(policy, path))
                row = results[policy][-1]
                cells = ", ".join(f"{k}: {v:.1f}" for k, v in row.items())
                print(f"round {r + 1} {policy}: {cells}", flush=True)
    print(f"\ntorch threads: default; {os.cpu_count()} CPUs; medians over {args.rounds} rounds\n")
    print("| measurement | default | passive | passive / default |")
    print("|---|---|---|---|")
    for key in results[POLICIES[0]][0]:
        a, b = (statistics.median(row[key] for row in results[p]) for p in POLICIES)
        print(f"| {key} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
