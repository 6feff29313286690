"""End-to-end engine benchmark: SmolLM2-135M-Instruct on the CPU, MT-Bench + HumanEval prompts.

Rows: (a) transformers' generate (greedy; batches left-padded), (b) the engine with budget 0 (plain
decoding through the same engine), (c) speculation with sssd's Drafter over a datastore of the model's
own outputs on other prompts (../shared/data/smollm2_other_outputs.*) at several budgets.
Columns: tokens/s, MAL (tokens per step), speedup over (a) and (b), % outputs identical to (b) and (a).

    OMP_NUM_THREADS=1 PYTHONPATH=python python3 bench/engine/bench_engine.py --prompts 2 \\
        --max-new-tokens 64 --batches 1 --budgets 0,8,16 --dtypes float32

Speed is whatever this machine gives at the time (it is shared); the table records the command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
import corpora
import numpy as np
import sssd
import torch
from sssd.models.local import ensure_hf_model, load_tokenizer

DATA = corpora.DEV_DATA  # ../shared/data ($SSSD_DEV_DATA)


def datastore(tok) -> sssd.Datastore:
    return sssd.Datastore.open(corpora.outputs_datastore(tok), tokenizer=tok)


def prompts(n_per_subset: int) -> list[list[int]]:
    rows = [json.loads(line) for line in open(DATA / "smollm2_dev_pairs.jsonl", encoding="utf-8")]
    out = []
    for subset in ("mtbench", "humaneval"):
        out += [r["prompt_ids"] for r in rows if r["subset"] == subset][:n_per_subset]
    return out


def hf_generate(model, batch: list[list[int]], new: int, eos: int) -> list[list[int]]:
    width = max(map(len, batch))
    ids = torch.tensor([[eos] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=eos)
    res = []
    for row in out[:, width:].tolist():
        res.append(row[: row.index(eos) + 1] if eos in row else row)
    return res


def run_hf(model, ps, batch, new, eos):
    t = time.perf_counter()
    outs = []
    for i in range(0, len(ps), batch):
        outs += hf_generate(model, ps[i : i + batch], new, eos)
    return outs, time.perf_counter() - t, None


def run_engine(model, tok, ds, ps, batch, budget, new):
    drafter = sssd.Drafter(datastore=ds) if budget else None
    engine = sssd.Engine(
        model,
        tok,
        drafter=drafter,
        config=sssd.EngineConfig(budget=budget, max_batch_size=batch, budget_mode="fixed"),
    )
    t = time.perf_counter()
    res = engine.generate(ps, max_new_tokens=new)
    secs = time.perf_counter() - t
    mal = sum(r.stats.tokens for r in res) / max(1, sum(r.stats.steps for r in res))
    return [r.tokens for r in res], secs, (mal, engine.stats)


def identical(a: list, b: list | None) -> str:
    """% identical outputs and the mean length of the common prefix (tokens)."""
    if b is None:
        return "-"
    prefix = [
        next((i for i, (x, y) in enumerate(zip(u, v, strict=True)) if x != y), min(len(u), len(v)))
        for u, v in zip(a, b, strict=True)
    ]
    same = 100 * sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
    return f"{same:.0f}% ({np.mean(prefix):.0f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2, help="prompts per subset (MT-Bench, HumanEval)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--budgets", default="0,8,16,32,64")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--out", help="append the markdown table to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    path = ensure_hf_model()
    tok = load_tokenizer(path)
    ds = datastore(tok)
    ps = prompts(args.prompts)
    eos = int(tok.eos_token_id)
    lines = [
        f"`{' '.join(sys.argv)}` — {len(ps)} prompts ({args.prompts} MT-Bench + {args.prompts} HumanEval), "
        f"{args.max_new_tokens} new tokens, {args.threads} thread(s)",
        "",
        "| dtype | batch | run | tokens/s | MAL | vs HF | vs budget 0 | identical to b0 (mean common prefix) "
        "| identical to HF |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for dtype in args.dtypes.split(","):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        for batch in map(int, args.batches.split(",")):
            rates, outs = {}, {}
            runs = [("HF generate", None)] if not args.no_hf else []
            runs += [(f"budget {b}", int(b)) for b in args.budgets.split(",")]
            for name, budget in runs:
                if budget is None:
                    o, secs, extra = run_hf(hf_model, ps, batch, args.max_new_tokens, eos)
                else:
                    o, secs, extra = run_engine(model, tok, ds, ps, batch, budget, args.max_new_tokens)
                rates[name] = sum(map(len, o)) / secs
                outs[name] = o
                mal = f"{extra[0]:.2f}" if extra else "1.00"
                hf, b0 = rates.get("HF generate"), rates.get("budget 0")
                line = f"| {dtype} | {batch} | {name} | {rates[name]:.2f} | {mal} | "
                line += f"{rates[name] / hf:.2f}x | " if hf else "- | "
                line += f"{rates[name] / b0:.2f}x | " if b0 else "- | "
                line += f"{identical(o, outs.get('budget 0'))} | {identical(o, outs.get('HF generate'))} |"
                lines.append(line)
                print(line, flush=True)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
