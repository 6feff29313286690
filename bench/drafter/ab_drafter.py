"""Interleaved A/B of drafter propose latency between two builds of the package (before/after a change).

    PYTHONPATH=python:. python3 bench/drafter/ab_drafter.py /path/to/old/python python --rounds 5

Each row is bench_drafter.py part (a)'s measurement (``_time_propose``: 500-token contexts on the
~1e7-token bench datastore, recent pool warmed with 64 outputs, max(10, 2000 // batch) steps extending
every request by one token, median µs per request per step, wall and CPU) run in a fresh child
process per build, 1 OpenMP thread, through the A/B harness (bench/ab.py): the builds alternate (A B,
then B A, ...) so both see the same machine load; the medians over ``--rounds`` repetitions are printed.
The datastore is built by bench_drafter.big_datastore() into cache/bench/ (by build B's package when
missing).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora, ab)
import ab
import corpora

ROWS = [  # (batch, budget, sources)
    (64, 64, "input,datastore,recent"),
    (1, 64, "input,datastore,recent"),
    (64, 16, "input,datastore,recent"),
    (16, 64, "input,datastore,recent"),
    (64, 64, "datastore"),
]


def child(batch: str, budget: str, sources: str) -> dict:
    """One row with the package on this process's path: {"wall_us_median", "cpu_us_median"}."""
    from bench_drafter import _streams, _time_propose, big_datastore
    from sssd.datastore.store import Datastore
    from sssd.evaluation.fitting import DrafterSpec
    from sssd.evaluation.pairs import load_pairs

    b, n = int(batch), int(budget)
    pairs = load_pairs(corpora.DEV_DATA / "smollm2_dev_pairs.jsonl", vocab_size=corpora.VOCAB)
    path = big_datastore()
    steps = max(10, 2000 // b)
    spec = DrafterSpec(sources=tuple(sources.split(",")), datastore=str(path))
    streams = _streams(pairs, b, 500 + 3 + steps + 1)
    row = _time_propose(spec, Datastore.open(path), pairs, streams, b, n, steps)
    return {"wall_us_median": row["us_median"], "cpu_us_median": row["cpu_us_median"]}


def main() -> None:
    args = ab.parser(__doc__, rounds=5).parse_args()
    labels = ("batch", "budget", "sources")
    ab.interleave(args, ROWS, ab.self_child(__file__), labels=labels, unit="µs/req/step")


if __name__ == "__main__":
    if not ab.child_main(child):
        main()
