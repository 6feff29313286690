"""Cost of a stream event's text: incremental detokenization vs decoding the whole output each event.

A 10,000-token output is made by concatenating SmolLM2's real outputs on the development prompts
(``../shared/data/smollm2_dev_pairs.jsonl``); it is fed to the engine's ``Request`` (the code path of every
``StreamEvent``) a few tokens per event, as a speculative step accepts them. The table gives µs per event
(mean over the events around each output length) for the engine's incremental text (with and without a stop
string to watch) and for the former approach, a full ``decode`` of the output at every event.

    PYTHONPATH=python python3 bench/engine/bench_detokenize.py [--tokens-per-event 3] [--window 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from sssd.engine.requests import Request
from sssd.engine.sampling import SamplingParams
from sssd.models import local

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
from corpora import DEV_DATA

DEV_PAIRS = DEV_DATA / "smollm2_dev_pairs.jsonl"

MARKS = (100, 1000, 3000, 10000)


def long_output(pairs: Path, n: int, eos: int) -> list[int]:
    out: list[int] = []
    with open(pairs) as f:
        for line in f:
            out += [t for t in json.loads(line)["output_ids"] if t != eos]
            if len(out) >= n:
                return out[:n]
    raise SystemExit(f"{pairs} holds fewer than {n} output tokens")


def run_request(tok, tokens: list[int], per_event: int, stop: tuple[str, ...]) -> np.ndarray:
    """Seconds per event for the engine's Request (append, then the event's text as a step hands it out)."""
    params = SamplingParams(max_new_tokens=len(tokens) + 1, stop=stop)
    req = Request(0, np.array([1], dtype=np.int64), params, frozenset(), None, 10**9, tok)
    times = []
    for i in range(0, len(tokens), per_event):
        t0 = time.perf_counter()
        req.append(tokens[i : i + per_event])
        req.peek_text()
        req.handed_out()
        times.append(time.perf_counter() - t0)
    return np.array(times)


def run_full_decode(tok, tokens: list[int], per_event: int, marks: tuple[int, ...], window: int):
    """Seconds per event of the former stream(): decode the whole output at every event (timed only
    around each mark: the whole run would be quadratic)."""
    out = {}
    for m in marks:
        times = []
        for end in range(max(per_event, m - window * per_event // 2), m + 1, per_event):
            t0 = time.perf_counter()
            tok.decode(tokens[:end], skip_special_tokens=True)
            times.append(time.perf_counter() - t0)
        out[m] = float(np.mean(times))
    return out


def around(times: np.ndarray, per_event: int, mark: int, window: int) -> float:
    e = mark // per_event
    return float(np.mean(times[max(0, e - window // 2) : e + window // 2 + 1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens-per-event", type=int, default=3, help="tokens a step accepts (default 3)")
    ap.add_argument("--pairs", type=Path, default=DEV_PAIRS, help="pairs JSONL (../shared/data's)")
    ap.add_argument("--window", type=int, default=50, help="events averaged around each length (50)")
    args = ap.parse_args()
    tok = local.load_tokenizer(local.find_smollm2_gguf())
    tokens = long_output(args.pairs, max(MARKS), tok.eos_token_id)
    k, w = args.tokens_per_event, args.window
    incremental = run_request(tok, tokens, k, ())
    with_stop = run_request(tok, tokens, k, ("\n\n\n\n\n",))
    full = run_full_decode(tok, tokens, k, MARKS, w)
    print(f"µs per stream event ({k} tokens per event, mean of {w} events around each output length)")
    print("| output tokens | incremental | incremental + stop string | full decode per event |")
    print("|---|---|---|---|")
    for m in MARKS:
        print(
            f"| {m:,} | {around(incremental, k, m, w) * 1e6:.1f} | {around(with_stop, k, m, w) * 1e6:.1f} "
            f"| {full[m] * 1e6:.1f} |"
        )
    total = incremental.sum()
    per_token = total / len(tokens) * 1e6
    print(f"\nwhole 10,000-token output, incremental: {total * 1e3:.1f} ms ({per_token:.1f} µs/token)")


if __name__ == "__main__":
    main()
