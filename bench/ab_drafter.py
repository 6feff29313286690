"""Interleaved A/B of drafter propose latency between two builds of the package (before/after a change).

    PYTHONPATH=python:. python3 bench/ab_drafter.py /path/to/old/python python --rounds 5

Each row is bench_drafter.py part (a)'s measurement (``_time_propose``: 500-token contexts on the
~1e7-token bench datastore, recent pool warmed with 64 outputs, max(10, 2000 // batch) steps extending
every request by one token, median µs per request per step, wall and CPU) run in a fresh child
process per build, 1 OpenMP thread. The builds alternate (A B, then B A, ...) so both see the same
machine load; the medians over ``--rounds`` repetitions are printed. The datastore is built by
bench_drafter.big_datastore() into cache/bench/ (by build B's package when missing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = [  # (batch, budget, sources)
    (64, 64, "input,datastore,recent"),
    (1, 64, "input,datastore,recent"),
    (64, 16, "input,datastore,recent"),
    (16, 64, "input,datastore,recent"),
    (64, 64, "datastore"),
]


def child(batch: int, budget: int, sources: str) -> None:
    sys.path.insert(0, str(HERE))
    from bench_drafter import DATA, VOCAB, _streams, _time_propose, big_datastore
    from sssd.datastore.store import Datastore
    from sssd.evaluation.fitting import DrafterSpec
    from sssd.evaluation.pairs import load_pairs

    pairs = load_pairs(DATA / "smollm2_dev_pairs.jsonl", vocab_size=VOCAB)
    path = big_datastore()
    steps = max(10, 2000 // batch)
    spec = DrafterSpec(sources=tuple(sources.split(",")), datastore=str(path))
    streams = _streams(pairs, batch, 500 + 3 + steps + 1)
    row = _time_propose(spec, Datastore.open(path), pairs, streams, batch, budget, steps)
    print(json.dumps(row))


def run(pythonpath: str, batch: int, budget: int, sources: str) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=f"{pythonpath}:{HERE.parent}", OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "_child", str(batch), str(budget), sources]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=HERE.parent)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    return row["us_median"], row["cpu_us_median"]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="PYTHONPATH entry of build A (the package directory's parent)")
    ap.add_argument("b", help="PYTHONPATH entry of build B")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    medians = []
    for batch, budget, sources in ROWS:
        got: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
        for r in range(args.rounds):
            order = [("A", args.a), ("B", args.b)] if r % 2 == 0 else [("B", args.b), ("A", args.a)]
            for name, pp in order:
                wall, cpu = run(pp, batch, budget, sources)
                got[name].append((wall, cpu))
                tag = f"batch {batch:>3} budget {budget} {sources}: {name}"
                print(f"{tag} wall {wall:.1f} cpu {cpu:.1f}", flush=True)
        med = {}
        for k, v in got.items():
            med[k] = (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
        medians.append((batch, budget, sources, med))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print("\n| batch | budget | sources | A wall / CPU µs | B wall / CPU µs | CPU speed-up |")
    print("|---|---|---|---|---|---|")
    for batch, budget, sources, med in medians:
        (aw, ac), (bw, bc) = med["A"], med["B"]
        speed = f"{ac / bc:.2f}x"
        print(f"| {batch} | {budget} | {sources} | {aw:.1f} / {ac:.1f} | {bw:.1f} / {bc:.1f} | {speed} |")


if __name__ == "__main__":
    main()
