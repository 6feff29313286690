"""sssd generate: run a model with speculative decoding on prompts; print outputs and a stats summary."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

NAME = "generate"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model directory or .gguf file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--datastore", help="datastore file/directory (default: drafting from the prompt only)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help=".jsonl (prompt_ids or text per line) or a text file (one per line)")
    src.add_argument("--prompt", help="one text prompt")
    p.add_argument("--chat", action="store_true", help="wrap text prompts in the model's chat template")
    p.add_argument("--output", help="write (prompt, output) token pairs as JSONL (build-datastore input)")
    p.add_argument("--batch-size", type=int, default=1, help="requests verified together (default 1)")
    p.add_argument(
        "--budget",
        type=int,
        default=16,
        help="draft nodes per step for the batch (adaptive: at most); 0 = plain",
    )
    p.add_argument(
        "--budget-mode",
        choices=("adaptive", "fixed"),
        default="adaptive",
        help="adaptive (default): the best-goodput budget in 0..--budget each step; fixed: --budget",
    )
    p.add_argument(
        "--cost-profile", default=None, help="cost profile from `sssd profile` (adaptive mode seed)"
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto (a GPU when torch sees one), cpu, cuda, cuda:1")
    p.add_argument(
        "--attention",
        default="auto",
        help="verification attention: auto (the CUDA tree kernel where it can run, else sdpa), sdpa, "
        "packed, emulated (see docs/cuda.md)",
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--baseline", action="store_true", help="also run plain decoding: measured speedup")
    p.add_argument("--quiet", action="store_true", help="do not print the outputs")


def _prompt_ids(args: argparse.Namespace, tokenizer: Any) -> list[dict[str, Any]]:
    from sssd.models.loading import chat_ids, read_prompts

    items = [{"id": "prompt", "text": args.prompt, "ids": None}] if args.prompt is not None else None
    items = items or read_prompts(args.prompts)
    for it in items:
        if it["ids"] is None:
            if not it["text"]:
                raise ValueError(f"prompt {it['id']} is empty")
            it["ids"] = chat_ids(tokenizer, it["text"]) if args.chat else tokenizer(it["text"])["input_ids"]
        it["ids"] = [int(x) for x in it["ids"]]
    return items


def _engine(model: Any, tokenizer: Any, ds: Any, args: argparse.Namespace, budget: int) -> Any:
    import sssd

    drafter = sssd.Drafter(datastore=ds) if budget > 0 else None
    cfg = sssd.EngineConfig(
        budget=budget,
        max_batch_size=args.batch_size,
        budget_mode=getattr(args, "budget_mode", "adaptive"),
        cost_profile=getattr(args, "cost_profile", None),
        attention=getattr(args, "attention", "auto"),
    )
    return sssd.Engine(model, tokenizer, drafter=drafter, config=cfg)


def _run(engine: Any, prompts: list[list[int]], args: argparse.Namespace) -> tuple[list[Any], float]:
    t0 = time.perf_counter()
    res = engine.generate(
        prompts,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    return res, time.perf_counter() - t0


def summary(engine: Any, results: list[Any], seconds: float) -> dict[str, float]:
    s = engine.stats
    tokens = sum(len(r.tokens) for r in results)
    return {
        "requests": len(results),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "steps": s.steps,
        "mal": sum(r.stats.tokens for r in results) / max(1, sum(r.stats.steps for r in results)),
        "draft_ms_per_step": 1e3 * s.draft_time / max(1, s.steps),
        "forward_ms_per_step": 1e3 * s.forward_time / max(1, s.steps),
        "verify_ms_per_step": 1e3 * s.verify_time / max(1, s.steps),
        "prefill_s": s.prefill_time,
    }


def _compare(model: Any, tokenizer: Any, prompts: list, results: list, engine: Any, args) -> None:
    """Speedup over plain decoding: measured on all prompts with --baseline, else estimated from a short
    plain run (8 tokens of the first batch) as the ratio of tokens per second of step time."""
    base_engine = _engine(model, tokenizer, None, args, 0)
    if args.baseline:
        base, _ = _run(base_engine, prompts, args)
        same = sum(x.tokens == y.tokens for x, y in zip(results, base, strict=True))
        label = f"measured; identical outputs {same}/{len(base)}"
    else:
        short = argparse.Namespace(**{**vars(args), "max_new_tokens": min(8, args.max_new_tokens)})
        base, _ = _run(base_engine, prompts[: args.batch_size], short)
        label = "estimated from a short plain run; --baseline measures it"
    b, s = base_engine.stats, engine.stats
    plain_rate = b.tokens / b.step_time if b.step_time else 0.0
    rate = s.tokens / s.step_time if s.step_time else 0.0
    speedup = rate / plain_rate if plain_rate else float("nan")
    print(f"speedup over plain decoding (step time): {speedup:.2f}x ({label})")


def run(args: argparse.Namespace) -> int:
    for name in ("batch_size", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.budget < 0:
        raise ValueError("--budget must be >= 0")
    import torch

    import sssd
    from sssd.models.loading import load_model

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, tokenizer, _ = load_model(args.model, args.dtype, args.device)
    ds = sssd.Datastore.open(args.datastore, tokenizer=tokenizer) if args.datastore else None
    items = _prompt_ids(args, tokenizer)
    prompts = [it["ids"] for it in items]
    engine = _engine(model, tokenizer, ds, args, args.budget)
    results, seconds = _run(engine, prompts, args)
    stats = summary(engine, results, seconds)
    if not args.quiet:
        for it, r in zip(items, results, strict=True):
            print(
                f"=== {it['id']} ({len(r.tokens)} tokens, {r.finish_reason}, "
                f"MAL {r.stats.tokens_per_step:.2f})"
            )
            print(r.text)
    print(
        f"\n{stats['requests']} requests, {stats['tokens']} tokens in {seconds:.2f} s: "
        f"{stats['tokens_per_s']:.1f} tokens/s, {stats['steps']} steps, MAL {stats['mal']:.2f} "
        f"(batch {args.batch_size}, budget {args.budget}, {args.dtype}, {model.device}, "
        f"attention {engine.adapter.attention})"
    )
    print(
        f"per step: draft {stats['draft_ms_per_step']:.2f} ms, "
        f"forward {stats['forward_ms_per_step']:.1f} ms, "
        f"verify+commit {stats['verify_ms_per_step']:.2f} ms; prefill {stats['prefill_s']:.2f} s"
    )
    if args.budget > 0:
        _compare(model, tokenizer, prompts, results, engine, args)
    if args.output:
        from sssd.evaluation.pairs import Pair, save_pairs

        pairs = [
            Pair.make(
                it["ids"],
                r.tokens,
                id=str(it["id"]),
                extra={"text": it["text"], "finished": r.finish_reason in ("eos", "stop")},
            )
            for it, r in zip(items, results, strict=True)
        ]
        save_pairs(pairs, args.output)
        print(f"wrote {len(results)} pairs to {args.output}", file=sys.stderr)
    return 0
