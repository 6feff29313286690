"""Quick drafter measurements: MAL of a teacher-forced batch-1 replay and propose time per request.

Usage: OMP_NUM_THREADS=2 PYTHONPATH=python python3 tools/drafter_sanity.py [--subset all|odd] [--variants ...]
Datastore: smollm2_other_outputs (bench/corpora.py, built once into the bench cache). Pairs: the dev
pairs (all 244, or the odd-indexed half that the default calibration was not fitted on). The replay is
``sssd.evaluation.simulator`` with batch 1 and online calibration: requests run in file order, so the
recent-outputs pool holds the outputs of the pairs replayed before.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import sssd
from sssd.batch import on_path_mask
from sssd.evaluation.pairs import load_pairs
from sssd.evaluation.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import corpora

PAIRS = (
    Path(os.environ.get("SSSD_DEV_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    / "smollm2_dev_pairs.jsonl"
)

VARIANTS = {
    "fused+pool, calibrated": {},
    "fused, no pool, calibrated": {"use_pool": False},
    "fused+pool, uncalibrated": {"calibration": None, "online_calibration": False},
    "input only": {"use_datastore": False, "use_pool": False},
    "datastore only": {"use_input": False, "use_pool": False},
}


def time_propose(ds: sssd.Datastore, pairs, batch: int, budget: int, reps: int) -> tuple[float, float, float]:
    """(wall, CPU) microseconds per request per propose call with a per-request budget, and observe's
    wall microseconds per call; contexts = prompt + 200 output tokens, the pool holds 100 outputs."""
    d = sssd.Drafter(ds, sssd.DrafterConfig())
    for pair in pairs[-100:]:
        d.add_to_pool(pair.output_ids)
    rids = list(range(batch))
    for r in rids:
        pair = pairs[r % len(pairs)]
        d.add_request(r, np.concatenate([pair.prompt_ids, pair.output_ids[:200]]))
    b = [budget] * batch
    batch_out = d.propose(rids, b)
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        d.propose(rids, b)
    wall = (time.perf_counter() - w0) / reps / batch * 1e6
    cpu = (time.process_time() - c0) / reps / batch * 1e6
    roots = on_path_mask(batch_out, paths=[[0]] * batch)  # nothing accepted
    w0 = time.perf_counter()
    for _ in range(reps):
        d.observe(rids, batch_out, roots)
    return wall, cpu, (time.perf_counter() - w0) / reps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--subset", choices=["all", "odd"], default="all")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    pairs = load_pairs(PAIRS)
    if args.subset == "odd":
        pairs = pairs[1::2]
    ds = sssd.Datastore.open(corpora.outputs_datastore())
    print(f"{len(pairs)} pairs, datastore {ds}, OpenMP threads {sssd.max_threads()}")
    print(f"| variant | {' | '.join(f'MAL @{b}' for b in args.budgets)} |")
    print(f"|---|{'---|' * len(args.budgets)}")
    for name in args.variants:
        mals = []
        for budget in args.budgets:
            d = sssd.Drafter(ds, sssd.DrafterConfig(**VARIANTS[name]))
            mals.append(simulate(d, pairs, budget=budget, batch_size=1, observe=True).mal)
        print(f"| {name} | {' | '.join(f'{m:.3f}' for m in mals)} |", flush=True)
    print()
    print("| batch | budget per request | µs/request/propose (wall) | (CPU, all threads) | observe µs/call |")
    print("|---|---|---|---|---|")
    for batch, budget in ((1, 16), (1, 64), (64, 16), (64, 64), (256, 64)):
        wall, cpu, obs = time_propose(ds, load_pairs(PAIRS), batch, budget, args.reps)
        print(f"| {batch} | {budget} | {wall:.1f} | {cpu:.1f} | {obs:.0f} |", flush=True)


if __name__ == "__main__":
    main()
