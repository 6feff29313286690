"""The options of the commands that replay pairs with the recycled candidates (simulate, calibrate).

A replay has no model, but the recycled source learns from the model's top-k at every verified position;
it is computed once per (model, dtype, k, pairs) by a teacher-forced forward and cached in
``$SSSD_CACHE_DIR/teacher_topk`` (``sssd.models.teacher``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sssd.cli.argtypes import integer

TEACHER_HELP = (
    "the model whose outputs the pairs are, for the recycled candidates' top-k along them (a "
    "teacher-forced forward per pair, cached): a directory, a .gguf file or a hub id in the Hugging Face "
    "cache (default: the bundled SmolLM2-135M-Instruct)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sssd.models.loading import DTYPE_CHOICES

    p.add_argument("--model", help=TEACHER_HELP)
    p.add_argument(
        "--dtype", default="float32", choices=DTYPE_CHOICES, help="the model's dtype for that forward"
    )
    p.add_argument(
        "--recycle-k", type=integer(lo=1, hi=32), default=8, help="recycled candidates kept per token"
    )


def teacher_top_k(args: argparse.Namespace, pairs: list) -> Any:
    """The model's top-k along ``pairs`` (a ``TeacherTopK``), from the cache or one forward per pair."""
    from sssd.evaluation.recycling import TeacherTopK
    from sssd.models.loading import load_model, resolve_dtype, resolve_model
    from sssd.models.local import cache_dir
    from sssd.models.teacher import cache_key
    from sssd.models.teacher import teacher_top_k as compute

    dtype = resolve_dtype(args.dtype, "cpu")
    path = resolve_model(args.model)
    seqs = [(p.prompt_ids, p.output_ids) for p in pairs]
    cache = cache_dir() / "teacher_topk" / f"{cache_key(path, dtype, args.recycle_k, seqs)}.npz"
    model = None
    if not cache.is_file():
        print(f"top-{args.recycle_k} of {path.name} along {len(pairs)} pairs (once; cached in {cache})")
        model, _, _ = load_model(path, dtype, "auto")

    def progress(done: int, total: int) -> None:
        if done % 20 == 0 or done == total:
            print(f"  {done}/{total} pairs", file=sys.stderr, flush=True)

    ids, probs, offsets = compute(model, seqs, args.recycle_k, cache_file=cache, progress=progress)
    return TeacherTopK(ids, probs, offsets)
