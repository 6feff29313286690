"""End to end on this machine: SmolLM2-135M-Instruct with retrieval alone, a draft model alone, and both
merged, the draft model's own cost included, against plain decoding through the same engine.

    PYTHONPATH=python:. python bench/drafter/bench_merged_engine.py --draft DRAFT_DIR \\
        [--prompts 2] [--new 128]

Rows (greedy, float32, batch 1, the development prompts, MT-Bench and HumanEval alternating): plain
(budget 0), then each drafter under the default adaptive policy (goodput-optimal budget each step,
from a cost model fitted online that includes the drafter's own time) and under a fixed budget.
Columns: tokens/s, speedup over plain, MAL, outputs identical to plain. Speed is whatever this shared
machine gives at the time: compare rows of one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import sssd
import torch
from sssd.data import sample_corpus, sample_tokenizer_fingerprint, sample_vocab_size
from sssd.models.local import cache_dir, ensure_hf_model, load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
from corpora import dev_rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", required=True, type=Path, help="draft model directory (sssd tune-drafter)")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--budget", type=int, default=16, help="fixed budget, and the adaptive policy's largest")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    path = ensure_hf_model()
    tok = load_tokenizer(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    ds_path = cache_dir() / "datastores" / "smollm2-outputs.sssd"
    if not ds_path.is_file():
        ds_path.parent.mkdir(parents=True, exist_ok=True)
        sssd.build_datastore(sample_corpus(), ds_path, vocab_size=sample_vocab_size(),
                             tokenizer=sample_tokenizer_fingerprint())  # fmt: skip
    ds = sssd.Datastore.open(ds_path)
    prompts = [r["prompt_ids"] for r in dev_rows(args.prompts)]

    def drafter(kind: str):
        if kind == "retrieval":
            return sssd.Drafter(ds)
        model = sssd.ModelDrafter(draft, sssd.ModelDrafterConfig(top_k=4))
        return model if kind == "model" else sssd.MergedDrafter([sssd.Drafter(ds), model])

    runs = [("plain", None, "fixed")]
    for kind in ("retrieval", "model", "merged"):
        runs += [(kind, kind, "adaptive"), (kind, kind, "fixed")]
    print(f"SmolLM2-135M-Instruct float32, batch 1, {len(prompts)} development prompts x {args.new} "
          f"new tokens, {args.threads} threads, draft {args.draft.name}\n")  # fmt: skip
    print("| drafter | policy | tokens/s | vs plain | MAL | draft s/step | identical to plain |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for name, kind, mode in runs:
        d = drafter(kind) if kind else None
        budget = args.budget if kind else 0
        cfg = sssd.EngineConfig(budget=budget, max_batch_size=1, budget_mode=mode)
        engine = sssd.Engine(target, tok, drafter=d, config=cfg)
        t0 = time.perf_counter()
        res = engine.generate(prompts, max_new_tokens=args.new)
        secs = time.perf_counter() - t0
        tokens = [r.tokens for r in res]
        rate = sum(map(len, tokens)) / secs
        mal = sum(r.stats.tokens for r in res) / max(1, sum(r.stats.steps for r in res))
        st = engine.stats
        if base is None:
            base = (rate, tokens)
        same = sum(a == b for a, b in zip(tokens, base[1], strict=True))
        policy = f"{mode} {budget}" if kind else "-"
        draft_s = st.draft_s / max(st.steps, 1)
        print(f"| {name} | {policy} | {rate:.2f} | {rate / base[0]:.2f}x | {mal:.2f} | {draft_s:.4f} | "
              f"{same}/{len(tokens)} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
