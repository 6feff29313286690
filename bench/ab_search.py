"""Interleaved A/B of search latency between two builds of the package (e.g. before/after a change).

    PYTHONPATH=python:. python3 bench/ab_search.py /path/to/other/checkout/python python

Runs bench_datastore.py's search child (batch 64, 1 thread, 1,024 contexts, 3 passes) alternately with
each PYTHONPATH, `--rounds` times, on datastores already built by bench_datastore.py, and prints the
median per-context CPU and wall µs of each build. Alternating makes both see the same machine load.
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
sys.path.insert(0, str(HERE))
import corpora  # noqa: E402

CASES = [("zipf1e7", "corpus"), ("cpython", "corpus"), ("cpython", "dev")]


def run_child(pythonpath: str, name: str, kind: str, cache: str | None) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{pythonpath}:{HERE.parent}", OMP_NUM_THREADS="1")
    if cache:
        env["SSSD_BENCH_CACHE"] = cache
    path = str(Path(cache or corpora.CACHE) / f"{name}.sssd")
    cmd = [sys.executable, str(HERE / "bench_datastore.py"), "_search", name, path, "64", "1024", "3", kind]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["b64"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="PYTHONPATH entry of build A (the package directory's parent)")
    ap.add_argument("b", help="PYTHONPATH entry of build B")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--cache-a",
        help="SSSD_BENCH_CACHE for A (datastores built by A, when the builds' file formats differ)",
    )
    args = ap.parse_args()
    print("| corpus | contexts | A µs/ctx cpu (wall) | B µs/ctx cpu (wall) | A / B (cpu) |")
    print("|---|---|---|---|---|")
    for name, kind in CASES:
        res: dict[str, list[dict]] = {"a": [], "b": []}
        for _ in range(args.rounds):
            for key in ("a", "b"):
                cache = args.cache_a if key == "a" else None
                res[key].append(run_child(getattr(args, key), name, kind, cache))
        cpu = {k: statistics.median(r["cpu_us_median"] for r in v) for k, v in res.items()}
        wall = {k: statistics.median(r["wall_us_median"] for r in v) for k, v in res.items()}
        print(
            f"| {name} | {kind} | {cpu['a']:.1f} ({wall['a']:.1f}) | {cpu['b']:.1f} ({wall['b']:.1f}) | "
            f"{cpu['a'] / cpu['b']:.2f} |"
        )
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
