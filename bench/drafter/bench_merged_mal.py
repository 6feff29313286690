"""Teacher-forced MAL of retrieval, a tuned draft model, and both merged, on the development pairs.

    PYTHONPATH=python:. python bench/drafter/bench_merged_mal.py --draft DRAFT_DIR \\
        [--pairs 24] [--budgets 16,64]

Drafters (all with online calibration, ``observe=True``, as the engine runs them):
- ``retrieval``: ``sssd.Drafter`` over a datastore of SmolLM2's outputs on other prompts (the bundled
  corpus; no development prompt is among them) plus the request's own tokens and the recent-outputs pool;
- ``model``: ``sssd.ModelDrafter`` with the draft model in DRAFT_DIR (``sssd tune-drafter`` output:
  trained on the same corpus, never on the development pairs), dynamic trees;
- ``merged``: ``sssd.MergedDrafter([retrieval, model])``, one tree per request under the same budget.

The replay is ``sssd.simulate`` (the target's recorded greedy outputs decide acceptance, so no target
forward runs): MAL = tokens per step at ``budget`` draft nodes per request, batch 8. The pairs are the
first ``--pairs`` of the development set, MT-Bench and HumanEval alternating. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import sssd
import torch
from sssd.data import sample_corpus, sample_tokenizer_fingerprint, sample_vocab_size
from sssd.evaluation.pairs import Pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
from corpora import dev_rows


def dev_pairs(n: int, max_new: int) -> list[Pair]:
    picked = dev_rows(n)
    return [
        Pair(
            str(r["id"]),
            r["subset"],
            np.asarray(r["prompt_ids"], np.int32),
            np.asarray(r["output_ids"][:max_new], np.int32),
        )
        for r in picked
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", required=True, type=Path, help="draft model directory (sssd tune-drafter)")
    ap.add_argument("--pairs", type=int, default=24)
    ap.add_argument("--max-new", type=int, default=256, help="output tokens replayed per pair")
    ap.add_argument("--budgets", default="16,64")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=4, help="model drafter: children per expanded node")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    pairs = dev_pairs(args.pairs, args.max_new)
    tmp = tempfile.mkdtemp(prefix="sssd-bench-")
    path = Path(tmp) / "outputs.sssd"
    sssd.build_datastore(sample_corpus(), path, vocab_size=sample_vocab_size(),
                         tokenizer=sample_tokenizer_fingerprint())  # fmt: skip
    ds = sssd.Datastore.open(path)

    def make(name: str):
        retrieval = sssd.Drafter(ds)
        model = sssd.ModelDrafter(draft, sssd.ModelDrafterConfig(top_k=args.top_k))
        return {"retrieval": retrieval, "model": model, "merged": sssd.MergedDrafter([retrieval, model])}[
            name
        ]

    print(f"{len(pairs)} development pairs x <= {args.max_new} output tokens, batch {args.batch}, "
          f"draft {args.draft.name}", file=sys.stderr)  # fmt: skip
    table = {}
    for budget in [int(b) for b in args.budgets.split(",")]:
        for name in ("retrieval", "model", "merged"):
            t0 = time.perf_counter()
            res = sssd.simulate(make(name), pairs, budget=budget, batch_size=args.batch, observe=True)
            table[(name, budget)] = res.mal
            print(
                f"  {name} @ {budget}: MAL {res.mal:.3f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr
            )
    budgets = sorted({b for _, b in table})
    print("| drafter | " + " | ".join(f"MAL @ {b} nodes" for b in budgets) + " |")
    print("|---|" + "---|" * len(budgets))
    for name in ("retrieval", "model", "merged"):
        print(f"| {name} | " + " | ".join(f"{table[(name, b)]:.2f}" for b in budgets) + " |")
    best = {b: max(table[("retrieval", b)], table[("model", b)]) for b in budgets}
    print(
        "| merged / best single | "
        + " | ".join(f"{table[('merged', b)] / best[b]:.3f}x" for b in budgets)
        + " |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
