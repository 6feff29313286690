"""The benchmarks' shared paths and corpora. Corpora are (tokens int32 [N], offsets int64 [D + 1]) pairs,
cached as .npy files.

Scripts in the groups (bench/datastore, bench/drafter, ...) import this module after putting bench/ on
``sys.path`` (the first lines of each script); tools/ does the same.

- ``ROOT``: the repository; ``RESULTS``: bench/results; ``DEV_DATA``: the development data
  (``$SSSD_DEV_DATA``, default ``../shared/data`` relative to the repository); ``CACHE``: generated corpora
  and datastores (``$SSSD_BENCH_CACHE``, default ``~/.cache/sssd/bench``).

- ``zipf(n)``: a seeded synthetic stream of Zipf-distributed token ids (exponent 1.1, SmolLM2's vocabulary
  size 49152, frequent ranks spread over the id space), cut into documents of ~1000 tokens on average.
- ``save_rows(path, rows)``: a benchmark's result rows as JSON, with the command that made them.
- ``cpython()``: the CPython standard library (``/usr/lib/python3.11/**/*.py``, plus the Debian
  ``python3.11-doc`` text files when installed), one document per file, tokenized with the SmolLM2
  tokenizer (``sssd.models.local.load_tokenizer()``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

VOCAB = 49_152
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DEV_DATA = Path(os.environ.get("SSSD_DEV_DATA", ROOT.parent / "shared" / "data"))  # ../shared/data
CACHE = Path(os.environ.get("SSSD_BENCH_CACHE", Path.home() / ".cache" / "sssd" / "bench"))
PY_LIB = Path("/usr/lib/python3.11")
PY_DOC = Path("/usr/share/doc/python3.11-doc")


def _cached(name: str) -> tuple[Path, Path]:
    CACHE.mkdir(parents=True, exist_ok=True)
    return CACHE / f"{name}.tokens.npy", CACHE / f"{name}.offsets.npy"


def _load(name: str) -> tuple[np.ndarray, np.ndarray] | None:
    tp, op = _cached(name)
    if tp.is_file() and op.is_file():
        return np.load(tp), np.load(op)
    return None


def _save(name: str, tokens: np.ndarray, offsets: np.ndarray) -> None:
    tp, op = _cached(name)
    for path, arr in ((tp, tokens), (op, offsets)):
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, arr)
        tmp.replace(path)


def zipf(n: int, seed: int = 0, exponent: float = 1.1, mean_doc: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    name = f"zipf_{n}_s{seed}"
    if (hit := _load(name)) is not None:
        return hit
    rng = np.random.default_rng(seed)
    ids = rng.permutation(VOCAB).astype(np.int32)  # rank -> token id
    tokens = np.empty(n, dtype=np.int32)
    chunk = 1 << 22
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        ranks = np.minimum(rng.zipf(exponent, size=hi - lo) - 1, VOCAB - 1)
        tokens[lo:hi] = ids[ranks]
    lengths = rng.geometric(1.0 / mean_doc, size=n // mean_doc * 2 + 16)
    ends = np.cumsum(lengths)
    ends = ends[ends < n]
    offsets = np.concatenate([[0], ends, [n]]).astype(np.int64)
    _save(name, tokens, offsets)
    return tokens, offsets


def _cpython_texts() -> list[str]:
    files = sorted(PY_LIB.rglob("*.py"))
    if PY_DOC.is_dir():
        files += sorted(p for p in PY_DOC.rglob("*.txt") if p.is_file())
    texts = []
    for f in files:
        try:
            texts.append(f.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return [t for t in texts if t]


def cpython() -> tuple[np.ndarray, np.ndarray]:
    if (hit := _load("cpython311_smollm2")) is not None:
        return hit
    from sssd.models.local import load_tokenizer

    backend = load_tokenizer().backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    texts = _cpython_texts()
    docs: list[np.ndarray] = []
    for i in range(0, len(texts), 64):
        encoded = encode(texts[i : i + 64], add_special_tokens=False)
        docs += [np.asarray(e.ids, dtype=np.int32) for e in encoded]
    tokens = np.concatenate(docs).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    _save("cpython311_smollm2", tokens, offsets)
    return tokens, offsets


def outputs() -> tuple[np.ndarray, np.ndarray]:
    """SmolLM2's greedy outputs on 1,500 prompts (../shared/data/README.md), one document each."""
    tokens = np.load(DEV_DATA / "smollm2_other_outputs.tokens.npy").astype(np.int32)
    return tokens, np.load(DEV_DATA / "smollm2_other_outputs.offsets.npy").astype(np.int64)


def dev_contexts(n: int, length: int = 64, seed: int = 1) -> list[np.ndarray]:
    """n live-decoding contexts from the dev pairs (none of which is in any datastore): the last
    `length` tokens of prompt + output[:j] for a random pair and a random j."""
    import json

    pairs = [json.loads(line) for line in (DEV_DATA / "smollm2_dev_pairs.jsonl").read_text().splitlines()]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        pair = pairs[int(rng.integers(0, len(pairs)))]
        j = int(rng.integers(0, len(pair["output_ids"]) + 1))
        ctx = (pair["prompt_ids"] + pair["output_ids"][:j])[-length:]
        out.append(np.asarray(ctx, dtype=np.int32))
    return out


def dev_rows(n: int) -> list[dict]:
    """The first ``n`` development pairs as JSON rows, MT-Bench and HumanEval alternating (fields
    ``prompt_ids``, ``output_ids``, ``id``, ``subset``, ...)."""
    import json

    rows = [json.loads(line) for line in (DEV_DATA / "smollm2_dev_pairs.jsonl").read_text().splitlines()]
    by = {s: [r for r in rows if r["subset"] == s] for s in ("mtbench", "humaneval")}
    return [by["mtbench" if i % 2 == 0 else "humaneval"][i // 2] for i in range(n)]


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    """'zipf1e6', 'zipf1e7', 'zipf1e8', 'cpython' or 'outputs'."""
    if name == "cpython":
        return cpython()
    if name == "outputs":
        return outputs()
    if name.startswith("zipf"):
        return zipf(int(float(name[4:])))
    raise ValueError(f"unknown corpus {name!r}")


def sample_contexts(tokens: np.ndarray, offsets: np.ndarray, n: int, length: int = 32, seed: int = 1):
    """n contexts tokens[p - length : p] at random real positions p (inside one document when it is long
    enough, otherwise from the document's start)."""
    rng = np.random.default_rng(seed)
    docs = rng.integers(0, len(offsets) - 1, size=4 * n)
    out = []
    for d in docs:
        lo, hi = int(offsets[d]), int(offsets[d + 1])
        if hi - lo < 2:
            continue
        p = int(rng.integers(lo + 1, hi))
        out.append(np.ascontiguousarray(tokens[max(lo, p - length) : p], dtype=np.int32))
        if len(out) == n:
            break
    return out


def outputs_datastore(tokenizer=None, cache: Path | None = None) -> Path:
    """The datastore of :func:`outputs` (with the tokenizer's fingerprint when one is given), built once
    into the cache; a cached file that no longer opens (e.g. written by an older build) is rebuilt."""
    import sssd

    cache = CACHE if cache is None else Path(cache)
    path = cache / ("smollm2_other_outputs" + (".fp" if tokenizer is not None else "") + ".sssd")
    if path.exists():
        try:
            sssd.Datastore.open(path, tokenizer=tokenizer)
            return path
        except sssd.DatastoreError as e:
            print(f"rebuilding {path}: {e}")
    cache.mkdir(parents=True, exist_ok=True)
    sssd.build_datastore(outputs(), path, vocab_size=VOCAB, tokenizer=tokenizer)
    return path


def save_rows(path: Path, rows: list[dict]) -> None:
    """Writes a benchmark's ``rows`` to ``path`` (JSON, atomically) with the command line that made them."""
    import json
    import sys

    from sssd.fileio import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
