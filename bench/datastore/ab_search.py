"""Interleaved A/B of search latency between two builds of the package (e.g. before/after a change).

    PYTHONPATH=python:. python3 bench/datastore/ab_search.py /path/to/other/checkout/python python

Each measurement is bench_datastore.py's search child (batch 64, 1 thread, 1,024 contexts, 3 passes:
median µs per context, CPU and wall) in a fresh process, on the datastores bench_datastore.py built
(its default file, ``NAME-index-stored.sssd`` in the bench cache), through the A/B harness (bench/ab.py):
the builds alternate for ``--rounds`` rounds and the medians are printed side by side.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora, ab)
import ab
import corpora

CASES = [("zipf1e7", "corpus"), ("cpython", "corpus"), ("cpython", "dev")]  # (corpus, contexts)
SEARCH = Path(__file__).resolve().parent / "bench_datastore.py"


def main() -> None:
    ap = ab.parser(__doc__, rounds=3)
    ap.add_argument(
        "--cache-a",
        help="SSSD_BENCH_CACHE for A (datastores built by A, when the builds' file formats differ)",
    )
    args = ap.parse_args()

    def measure(case: tuple[str, str], arm: str, build: str) -> dict:
        name, kind = case
        cache = args.cache_a if arm == "A" else None
        path = Path(cache or corpora.CACHE) / f"{name}-index-stored.sssd"
        argv = [SEARCH, "_search", name, path, "64", "1024", "3", kind]
        return ab.run_child(argv, build, {"SSSD_BENCH_CACHE": cache} if cache else None)["b64"]

    ab.interleave(args, CASES, measure, labels=("corpus", "contexts"), unit="µs/ctx")


if __name__ == "__main__":
    main()
