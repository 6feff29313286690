"""Where build-datastore's "loading the tokenizer" time goes, and what the tokenizer cache saves.

Every measurement runs in a fresh Python process (the cost a user pays per command), the two ways
interleaved round by round on the same machine:

- ``transformers``: the default tokenizer (SmolLM2, converted) without a cache entry: import
  transformers (which imports torch), ``AutoTokenizer.from_pretrained``, fingerprint;
- ``cache``: the same with the entry the first run wrote (``datastore_tools.tokenizer_cache``).

It prints, per way, the seconds of ``load_tokenizer`` + fingerprint (min / median over the rounds) and
the process's wall time for a whole ``build-datastore`` of a one-line text. ``--first-time`` adds, once
each, the first run on an empty cache: converting the whole model for its tokenizer (what the default
tokenizer used to do) against converting the GGUF vocabulary alone (what it does now).

    PYTHONPATH=python:. python3 bench/datastore/bench_tokenizer_load.py [--rounds 5] [--first-time]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOAD = """
import sys, time
t0 = time.perf_counter()
from datastore_tools.pipeline import BuildConfig, _vocabulary
from datastore_tools.inputs import detect_inputs, ReadOptions
inputs = detect_inputs([sys.argv[1]], ReadOptions())
tok, vocab, fingerprint = _vocabulary(BuildConfig(inputs=(sys.argv[1],), output=None), inputs)
print(time.perf_counter() - t0, type(tok).__name__, fingerprint)
"""
FIRST = {
    "whole model converted (before)": "from sssd.models.local import ensure_hf_model, load_tokenizer; "
    "load_tokenizer(ensure_hf_model())",
    "tokenizer alone converted (now)": "from datastore_tools.tokenizing import load_tokenizer; "
    "load_tokenizer(None)",
}


def _env(cache: Path) -> dict[str, str]:
    return dict(os.environ, SSSD_CACHE_DIR=str(cache), PYTHONPATH=f"{ROOT / 'python'}{os.pathsep}{ROOT}")


def _run(argv: list[str], cache: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=_env(cache), capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - t0, out


def rounds(n: int, work: Path) -> dict[str, dict[str, list[float]]]:
    """{way: {"load": seconds, "build": process seconds}} over n interleaved rounds."""
    from sssd.models.local import cache_dir, ensure_hf_model

    ensure_hf_model()  # the converted model this measures (converted once, outside the timing)
    cache = work / "cache"
    (cache / "models").mkdir(parents=True)
    for entry in (cache_dir() / "models").iterdir():  # the real converted models, a private fast cache
        (cache / "models" / entry.name).symlink_to(entry)
    text = work / "one-line.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.\n")
    out: dict[str, dict[str, list[float]]] = {w: {"load": [], "build": []} for w in ("transformers", "cache")}
    for _ in range(n):
        for way in ("transformers", "cache"):
            if way == "transformers":
                shutil.rmtree(cache / "tokenizers" / "fast", ignore_errors=True)
            _, line = _run([sys.executable, "-c", LOAD, str(text)], cache)
            seconds, kind, _ = line.split()
            assert (kind == "CachedTokenizer") == (way == "cache"), kind
            out[way]["load"].append(float(seconds))
            if way == "transformers":
                shutil.rmtree(cache / "tokenizers" / "fast", ignore_errors=True)
            argv = [sys.executable, "-m", "datastore_tools.cli", str(text), "-o", str(work / "x.sssd")]
            wall, _ = _run([*argv, "-q", "--force"], cache)
            out[way]["build"].append(wall)
    return out


def first_time(work: Path) -> dict[str, float]:
    from sssd.models.local import find_smollm2_gguf

    find_smollm2_gguf()  # fails early without the wheel
    out = {}
    for label, code in FIRST.items():
        cache = work / f"empty-{len(out)}"
        out[label], _ = _run([sys.executable, "-c", code], cache)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--first-time", action="store_true", help="also the first run on an empty cache")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        res = rounds(args.rounds, work)
        print(f"default tokenizer (SmolLM2), {args.rounds} interleaved rounds, fresh process each, seconds")
        print("| way | load + fingerprint, min | median | build-datastore process, min | median |")
        print("|---|---|---|---|---|")
        for way, r in res.items():
            cells = [
                min(r["load"]),
                statistics.median(r["load"]),
                min(r["build"]),
                statistics.median(r["build"]),
            ]
            print(f"| {way} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
        if args.first_time:
            print("\nfirst run on an empty cache (once each), process seconds")
            for label, seconds in first_time(work).items():
                print(f"| {label} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
