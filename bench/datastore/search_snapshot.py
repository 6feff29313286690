"""Snapshot of search outputs, to check that a faster search returns exactly the same tries.

    PYTHONPATH=python:. python3 bench/datastore/search_snapshot.py record /tmp/search_snapshot.npz
    # ... change csrc/core/search.cpp, rebuild with tools/dev_build.sh ...
    PYTHONPATH=python:. python3 bench/datastore/search_snapshot.py compare /tmp/search_snapshot.npz

Covers small and repetitive alphabets, uint16 and uint32 token widths, 32- and 64-bit suffix arrays,
several shards opened together and many parameter combinations; contexts are taken from real positions
(with random lengths, sometimes perturbed) and at random.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np
from sssd.datastore.store import Datastore, SearchConfig, build_datastore

PARAMS = [
    SearchConfig(),
    SearchConfig(max_query_len=16, min_query_len=1, min_occurrences=1, max_samples=100, max_depth=8),
    SearchConfig(max_query_len=8, min_query_len=2, min_occurrences=1000, max_samples=7, max_depth=5),
    SearchConfig(max_query_len=32, min_query_len=1, min_occurrences=4, max_samples=1, max_depth=20),
    SearchConfig(max_query_len=4, min_query_len=4, min_occurrences=0, max_samples=100, max_depth=0),
    SearchConfig(max_query_len=1, min_query_len=1, min_occurrences=4, max_samples=3, max_depth=1),
    SearchConfig(max_query_len=24, min_query_len=3, min_occurrences=50, max_samples=64, max_depth=12),
]


def zipf_docs(rng: np.random.Generator, n: int, vocab: int, a: float, mean_doc: int) -> list[np.ndarray]:
    toks = np.minimum(rng.zipf(a, size=n) - 1, vocab - 1).astype(np.int64)
    toks = rng.permutation(vocab)[toks]  # frequent ids spread over the vocabulary
    cuts = np.sort(rng.choice(np.arange(1, n), size=max(n // mean_doc, 1), replace=False))
    return np.split(toks, cuts)


def corpora(rng: np.random.Generator) -> list[tuple[str, list[list[np.ndarray]], int, bool]]:
    """(name, shards (each a list of documents), vocab_size, force_sa64)."""
    rep = [np.tile(rng.integers(0, 3, size=rng.integers(1, 6)), rng.integers(1, 40)) for _ in range(300)]
    rep += [np.zeros(rng.integers(0, 60), np.int64) for _ in range(50)]
    big = zipf_docs(rng, 60_000, 70_000, 1.3, 200)
    big += [rng.integers(65_530, 70_000, size=50) for _ in range(40)]
    return [
        ("zipf16", [zipf_docs(rng, 200_000, 49_152, 1.2, 300)], 49_152, False),
        ("repetitive", [rep], 3, False),
        ("small_alpha_sa64", [zipf_docs(rng, 30_000, 8, 1.5, 50)], 8, True),
        ("uint32", [big], 70_000, False),
        ("shards", [zipf_docs(rng, 40_000, 500, 1.4, 80) for _ in range(3)], 500, False),
    ]


def contexts(rng: np.random.Generator, docs: list[np.ndarray], vocab: int, n: int) -> list[np.ndarray]:
    flat = np.concatenate([d for d in docs if len(d)])
    out = []
    for _ in range(n):
        kind = rng.integers(0, 6)
        if kind == 0:
            out.append(rng.integers(0, vocab, size=rng.integers(0, 20)).astype(np.int32))
            continue
        end = int(rng.integers(1, len(flat) + 1))
        length = int(rng.integers(0, 40)) if kind != 1 else int(rng.integers(0, 3))
        ctx = flat[max(0, end - length) : end].astype(np.int32).copy()
        if kind == 2 and len(ctx) > 2:
            ctx[rng.integers(0, len(ctx) - 1)] = rng.integers(0, vocab)
        out.append(ctx)
    return out


def run_all(tmp: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    results: dict[str, np.ndarray] = {}
    for name, shards, vocab, sa64 in corpora(rng):
        paths = []
        for k, docs in enumerate(shards):
            p = tmp / f"{name}_{k}.sssd"
            build_datastore(docs, p, vocab_size=vocab, force_sa64=sa64)
            paths.append(p)
        ds = Datastore.open(paths if len(paths) > 1 else paths[0])
        ctxs = contexts(rng, [d for s in shards for d in s], vocab, 400)
        for j, cfg in enumerate(PARAMS):
            r = ds.search(ctxs, cfg)
            for field in ("tokens", "parents", "counts", "depth", "match_len", "offsets"):
                results[f"{name}/{j}/{field}"] = getattr(r, field).copy()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["record", "compare"])
    ap.add_argument("path")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = run_all(Path(tmp))
    digest = hashlib.sha256(b"".join(results[k].tobytes() for k in sorted(results))).hexdigest()[:16]
    nodes = sum(len(v) for k, v in results.items() if k.endswith("/tokens"))
    if args.mode == "record":
        np.savez_compressed(args.path, **results)
        print(f"recorded {len(results)} arrays, {nodes} trie nodes, digest {digest}")
        return 0
    old = np.load(args.path)
    bad = [
        k
        for k in sorted(set(old.files) | set(results))
        if k not in old.files or k not in results or not np.array_equal(old[k], results[k])
    ]
    print(
        f"compared {len(results)} arrays, {nodes} trie nodes, digest {digest}: "
        + ("IDENTICAL" if not bad else f"{len(bad)} DIFFER, e.g. {bad[:5]}")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
