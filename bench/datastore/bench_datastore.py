"""Datastore benchmark: build throughput and peak memory, file size, open time, search latency.

    PYTHONPATH=python:. python3 bench/datastore/bench_datastore.py                  # zipf1e6 zipf1e7 cpython
    PYTHONPATH=python:. python3 bench/datastore/bench_datastore.py --corpora zipf1e8 --batches 64
    PYTHONPATH=python:. python3 bench/datastore/bench_datastore.py --corpora zipf1e7 --index stored none

--index: build the file with the search index stored in it (the default of build_datastore from 65,536
tokens) and/or without it (then the first search of each process builds it in memory); each is its own
file and row.

Every measurement that needs a clean process runs in a child: the build (peak extra memory = peak RSS
during the build minus RSS with the input tokens loaded, per token) and the search at each thread
count (OMP_NUM_THREADS). Search latency per context = time of one batched call / batch size; the table
shows the median over calls, as wall time and as CPU time of the whole process (all threads), because
the machine may be shared. Prints a markdown table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
import corpora

SEARCH = {"max_samples": 100, "max_depth": 8}  # other SearchConfig fields at their defaults


def _child(args: list[str], threads: int | None = None) -> dict:
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("PYTHONPATH", f"{corpora.ROOT / 'python'}:{corpora.ROOT}")
    cmd = [sys.executable, __file__, *args]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> int:
    """Resets the peak RSS (VmHWM) to the current RSS and returns it. ru_maxrss cannot be used: Linux
    carries it over from the parent across fork + exec."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS")


def child_build(name: str, path: str, index: str) -> dict:
    from sssd import build_datastore

    tokens, offsets = corpora.load(name)
    before = _reset_peak_rss()
    w0, c0 = time.perf_counter(), time.process_time()
    stored = {"stored": None, "none": False}[index]
    info = build_datastore((tokens, offsets), path, vocab_size=corpora.VOCAB, search_index=stored)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    peak = _status_bytes("VmHWM")
    n = len(tokens)
    return {
        "tokens": n,
        "documents": len(offsets) - 1,
        "build_wall_s": wall,
        "build_cpu_s": cpu,
        "build_tokens_per_s": n / wall,
        "peak_extra_bytes_per_token": (peak - before) / n,
        "file_bytes_per_token": info.file_bytes / n,
        "index_bytes_per_token": info.index_bytes / n,
    }


def child_search(name: str, path: str, batches: list[int], contexts: int, repeats: int, dev: bool) -> dict:
    from sssd import Datastore, SearchConfig, max_threads

    ds = Datastore.open(path)
    if dev:
        ctxs = corpora.dev_contexts(contexts)
    else:
        tokens, offsets = corpora.load(name)
        ctxs = corpora.sample_contexts(tokens, offsets, contexts)
        del tokens, offsets
    cfg = SearchConfig(**SEARCH)
    t0 = time.perf_counter()
    # The first search of a mapping loads the stored index, or builds one (csrc/core/search_index.h).
    ds.search(ctxs[:1], cfg)
    first_ms = (time.perf_counter() - t0) * 1e3
    ds.search(ctxs, cfg)  # warm the page cache and the allocator
    out = {"threads": max_threads(), "contexts": len(ctxs), "first_search_ms": first_ms}
    for b in batches:
        walls, cpus, nodes = [], [], 0
        for _ in range(repeats):
            for i in range(0, len(ctxs) - b + 1, b):
                batch = ctxs[i : i + b]
                w0, c0 = time.perf_counter(), time.process_time()
                r = ds.search(batch, cfg)
                walls.append((time.perf_counter() - w0) / b)
                cpus.append((time.process_time() - c0) / b)
                nodes += len(r.tokens)
        out[f"b{b}"] = {
            "wall_us_median": float(np.median(walls) * 1e6),
            "cpu_us_median": float(np.median(cpus) * 1e6),
            "calls": len(walls),
            "mean_trie_nodes": nodes / (len(walls) * b),
        }
    return out


def _evict(path: str) -> None:
    """Drops this file's pages from the page cache (clean pages only; other files are not touched)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def child_first(name: str, path: str, cold: bool) -> dict:
    """A fresh process: open, then one search (which loads the stored index or builds one). cold: the
    datastore file's pages are evicted from the page cache first."""
    from sssd import Datastore, SearchConfig

    tokens, offsets = corpora.load(name)
    ctxs = corpora.sample_contexts(tokens, offsets, 2)
    del tokens, offsets
    if cold:
        _evict(path)
    t0 = time.perf_counter()
    ds = Datastore.open(path)
    t1 = time.perf_counter()
    ds.search(ctxs[:1], SearchConfig(**SEARCH))
    t2 = time.perf_counter()
    ds.search(ctxs[1:], SearchConfig(**SEARCH))
    t3 = time.perf_counter()
    return {"open_ms": (t1 - t0) * 1e3, "first_ms": (t2 - t1) * 1e3, "second_ms": (t3 - t2) * 1e3}


def open_time(path: str, n: int = 50) -> float:
    from sssd import Datastore

    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        Datastore.open(path)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def fresh_process(name: str, path: str, runs: int) -> dict:
    """Medians over `runs` fresh processes, page cache warm and with the file evicted (cold)."""
    out: dict = {}
    for mode in ("warm", "cold"):
        firsts = [_child(["_first", name, path, mode], 1) for _ in range(runs)]
        out.update({f"{k}_{mode}": float(np.median([f[k] for f in firsts])) for k in firsts[0]})
    out["runs"] = runs
    return out


def run(args: argparse.Namespace) -> dict:
    results = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "search_config": SEARCH,
        "contexts": "dev pairs (prompt + output prefix)" if args.dev_contexts else "corpus positions",
        "corpora": {},
    }
    for name in args.corpora:
        corpora.load(name)  # generate / tokenize once (cached), outside any measurement
        for index in args.index:
            path = str(corpora.CACHE / f"{name}-index-{index}.sssd")
            r = {} if args.only_first else _child(["_build", name, path, index])
            r["index"] = index
            if args.only_first:
                r = {"index": index, "fresh_process": fresh_process(name, path, args.first_runs)}
                results["corpora"][f"{name}/{index}"] = r
                continue
            r["open_ms_median"] = open_time(path)
            r["fresh_process"] = fresh_process(name, path, args.first_runs)
            r["search"] = {}
            for t in args.threads:
                batches = ",".join(map(str, args.batches))
                kind = "dev" if args.dev_contexts else "corpus"
                cmd = ["_search", name, path, batches, str(args.contexts), str(args.repeats), kind]
                r["search"][t] = _child(cmd, t)
            key = name if len(args.index) == 1 and index == "stored" else f"{name}/{index}"
            results["corpora"][key] = r
            print(f"# {name} ({index} index): done", file=sys.stderr)
    return results


def table(results: dict, batches: list[int]) -> str:
    head = "| corpus | index | tokens | build s (cpu s) | Mtok/s | peak B/tok | file B/tok | open ms |"
    head += " 1st search ms | threads |"
    head += "".join(f" b={b} µs wall (cpu) |" for b in batches)
    lines = [head, "|" + "---|" * (10 + len(batches))]
    for name, r in results["corpora"].items():
        for t, s in r.get("search", {}).items():
            lines.append(
                f"| {name.split('/')[0]} | {r.get('index', 'none')} | {r['tokens']:.2e} | "
                f"{r['build_wall_s']:.2f} ({r['build_cpu_s']:.2f}) | "
                f"{r['build_tokens_per_s'] / 1e6:.2f} | {r['peak_extra_bytes_per_token']:.2f} | "
                f"{r['file_bytes_per_token']:.2f} | {r['open_ms_median']:.3f} | "
                f"{s['first_search_ms']:.1f} | {t} |"
                + "".join(
                    f" {s[f'b{b}']['wall_us_median']:.1f} ({s[f'b{b}']['cpu_us_median']:.1f}) |"
                    for b in batches
                )
            )
    lines += ["", "Fresh processes (median): open, first search, second search (ms)", ""]
    lines += [
        "| corpus | index | page cache | runs | open ms | 1st search ms | 2nd search ms |",
        "|---" * 7 + "|",
    ]
    for name, r in results["corpora"].items():
        f = r.get("fresh_process")
        for mode in ("warm", "cold") if f else ():
            lines.append(
                f"| {name.split('/')[0]} | {r.get('index', 'none')} | {mode} | {f['runs']} | "
                f"{f[f'open_ms_{mode}']:.3f} | {f[f'first_ms_{mode}']:.2f} | {f[f'second_ms_{mode}']:.3f} |"
            )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_build":
        print(json.dumps(child_build(sys.argv[2], sys.argv[3], sys.argv[4])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_first":
        print(json.dumps(child_first(sys.argv[2], sys.argv[3], sys.argv[4] == "cold")))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_search":
        batches = [int(x) for x in sys.argv[4].split(",")]
        args = [*sys.argv[2:4], batches, int(sys.argv[5]), int(sys.argv[6]), sys.argv[7] == "dev"]
        print(json.dumps(child_search(*args)))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", nargs="+", default=["zipf1e6", "zipf1e7", "cpython"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64, 256])
    ap.add_argument(
        "--index",
        nargs="+",
        choices=("stored", "none"),
        default=["stored"],
        help="build with the search index stored in the file and/or without it (default: stored)",
    )
    ap.add_argument(
        "--first-runs",
        type=int,
        default=5,
        help="fresh processes timing open + first + second search, page cache warm and cold (medians)",
    )
    ap.add_argument(
        "--only-first",
        action="store_true",
        help="only the fresh-process timings, on the files an earlier run built",
    )
    ap.add_argument("--contexts", type=int, default=1024, help="distinct contexts searched per batch size")
    ap.add_argument("--repeats", type=int, default=3, help="passes over the contexts per batch size")
    ap.add_argument(
        "--dev-contexts",
        action="store_true",
        help="search live contexts from the dev pairs (../shared/data) instead of corpus positions",
    )
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/datastore-<time>.json)")
    args = ap.parse_args()
    results = run(args)
    out = Path(args.out or corpora.RESULTS / f"datastore-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(table(results, args.batches))
    print(f"\nload average {results['machine']['load_avg']}; JSON: {out}")


if __name__ == "__main__":
    main()
