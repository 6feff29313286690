"""What the datastore's safety checks cost: verify() on repetitive text, the content checksum on first
use, and the per-call checks of a search (the file's size under the map).

    PYTHONPATH=python:. python3 bench/datastore/bench_robustness.py               # 320k period-7, 1e7 random
    PYTHONPATH=python:. python3 bench/datastore/bench_robustness.py --random-tokens 100000000

Runs against whatever sssd is on the path, so the same script measures an older build for a before /
after comparison (an older build has no content checksum: its "first use" row shows the plain cost).
Times are wall-clock medians of --repeats runs on a file in the page cache; prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import sssd


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def verify_periodic(tmp: Path, tokens: int, period: int, repeats: int) -> dict:
    """verify() of one document of `tokens` tokens repeating a period-`period` pattern."""
    path = tmp / "periodic.sssd"
    doc = (np.arange(tokens, dtype=np.int64) % period).astype(np.int32)
    sssd.build_datastore((doc, np.array([0, tokens])), path, vocab_size=period)
    ds = sssd.Datastore.open(path)
    ds.verify()  # warm: pages in, content checked once
    return {
        "what": f"verify(), {tokens:,} tokens of period {period}",
        "s": _median_seconds(ds.verify, repeats),
    }


def first_use(tmp: Path, tokens: int, repeats: int) -> list[dict]:
    """Open + document(0) in a fresh Datastore each time (the content checksum runs on the first use of
    each opened file), against document(0) on one that is already open."""
    path = tmp / "random.sssd"
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50_000, size=tokens, dtype=np.int32)
    sssd.build_datastore((ids, np.arange(0, tokens + 1, 1000, dtype=np.int64)), path, vocab_size=50_000)
    open_ds = sssd.Datastore.open(path)
    open_ds.document(0)
    size = path.stat().st_size
    cold = _median_seconds(lambda: sssd.Datastore.open(path).document(0), repeats)
    warm = _median_seconds(lambda: open_ds.document(0), repeats)
    ctx = [ids[:3].tolist()]
    search = _median_seconds(lambda: open_ds.search(ctx), max(repeats, 200))
    return [
        {"what": f"open + first document(): {tokens:,} tokens, {size / 1e6:.0f} MB", "s": cold},
        {"what": "document() on an open file", "s": warm},
        {
            "what": f"first use minus later use ({(size / 1e9) / max(cold - warm, 1e-9):.1f} GB/s)",
            "s": cold - warm,
        },
        {"what": "search() of one 3-token context (per call)", "s": search},
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--periodic-tokens", type=int, default=320_000)
    p.add_argument("--period", type=int, default=7)
    p.add_argument("--random-tokens", type=int, default=10_000_000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [verify_periodic(Path(tmp), args.periodic_tokens, args.period, args.repeats)]
        rows += first_use(Path(tmp), args.random_tokens, args.repeats)
    print(f"sssd from {Path(sssd.__file__).parent}")
    print("| measurement | time |\n|---|---|")
    for r in rows:
        s = r["s"]
        shown = f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"
        print(f"| {r['what']} | {shown} |")


if __name__ == "__main__":
    main()
