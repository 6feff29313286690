"""sssd simulate: replay (prompt, output) pairs through a drafter and print MAL per budget."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from sssd.cli import recycled as recycled_args
from sssd.cli.argtypes import from_value_error, integer, integer_list
from sssd.evaluation.fitting import (
    BASELINES,
    DEFAULT_SOURCES,
    SOURCES,
    DrafterSpec,
    make_drafter,
    parse_sources,
)


def open_datastore(path: str | None):
    if path is None:
        return None
    from sssd.datastore.store import Datastore

    return Datastore.open(path)


NAME = "simulate"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", required=True, help="pairs JSONL (fields prompt_ids, output_ids, id, subset)")
    p.add_argument("--datastore", help="datastore file or shard directory (for the datastore source)")
    p.add_argument(
        "--budget",
        type=integer_list(lo=0),
        default=[16, 64],
        help="draft nodes per request; a comma list runs each",
    )
    p.add_argument("--batch-size", type=integer(lo=1), default=16, help="requests advancing together")
    p.add_argument(
        "--allocation",
        choices=("per-request", "global"),
        default="per-request",
        help="per-request: every request gets BUDGET nodes; global: the batch shares BUDGET x batch",
    )
    p.add_argument("--baseline", choices=BASELINES, help="simulate a baseline instead of the sssd drafter")
    p.add_argument(
        "--compare", action="store_true", help="also run the prompt-lookup baseline (same budgets)"
    )
    p.add_argument(
        "--sources",
        type=from_value_error(parse_sources),
        default=DEFAULT_SOURCES,
        help=f"comma list of {','.join(SOURCES)} (recycled: the verifier's own top-k, see --model)",
    )
    p.add_argument(
        "--recycled",
        action="store_true",
        help="also run the drafter with the recycled candidates (the model's top-k along the pairs, "
        "from a cached teacher-forced forward of --model): rows without and with them",
    )
    p.add_argument(
        "--calibration",
        help="calibration table JSON, or 'none' for raw estimates (default: the shipped table)",
    )
    p.add_argument("--online", action="store_true", help="update the calibration online (drafter.observe)")
    p.add_argument(
        "--subsets", help="comma list of pair subsets to keep, e.g. mtbench,humaneval (default: all)"
    )
    p.add_argument("--limit", type=integer(lo=1), help="use only the first N pairs (default: all)")
    p.add_argument(
        "--draft-model",
        help="a draft model directory (e.g. from sssd tune-drafter): adds the model drafter's rows and "
        "those of the retrieval drafter and the model merged into one tree (calibrated online)",
    )
    p.add_argument(
        "--draft-top-k", type=integer(lo=1), default=4, help="model drafter: children per expanded node"
    )
    recycled_args.add_arguments(p)
    p.add_argument("--details", action="store_true", help="also print acceptance per source and per depth")
    p.add_argument("--json", dest="json_out", help="write the results as JSON to this file")


def _check(args: argparse.Namespace) -> None:
    if args.baseline is None and "datastore" in args.sources and args.datastore is None:
        if args.sources is DEFAULT_SOURCES:  # the default: quietly drop the datastore source
            args.sources = tuple(s for s in DEFAULT_SOURCES if s != "datastore")
        else:
            raise ValueError("--sources includes datastore: give --datastore PATH")


def run(args: argparse.Namespace) -> int:
    from sssd.evaluation.pairs import load_pairs, total_tokens
    from sssd.evaluation.simulator import simulate

    _check(args)
    ds = open_datastore(args.datastore) if args.baseline is None else None
    pairs = load_pairs(
        args.pairs, subsets=args.subsets, vocab_size=ds.vocab_size if ds else None, limit=args.limit
    )
    specs = [DrafterSpec(args.baseline, tuple(args.sources), args.calibration, args.datastore, args.online)]
    if args.recycled and args.baseline is None and "recycled" not in args.sources:
        specs.append(replace(specs[0], sources=(*args.sources, "recycled")))
    if args.compare and args.baseline is None:
        specs.append(DrafterSpec(baseline=BASELINES[0]))
    top_k = None
    if any("recycled" in spec.sources for spec in specs if spec.baseline is None):
        top_k = recycled_args.teacher_top_k(args, pairs)
    rows = [
        (spec.label(), lambda spec=spec: make_drafter(spec, ds, recycle_k=args.recycle_k), spec.online)
        for spec in specs
    ]
    for _, factory, _ in rows:
        factory()  # fail early (before the table header) on a bad configuration
    if args.draft_model:
        rows += _model_rows(args, specs[0], ds)
    n_prompt, n_out = total_tokens(pairs)
    print(f"pairs: {len(pairs)} ({n_prompt:,} prompt tokens, {n_out:,} output tokens)")
    print(f"batch size {args.batch_size}, allocation {args.allocation}, {_calibration_words(args)}\n")
    subsets = [s for s in sorted({p.subset for p in pairs}) if s]
    head = [
        "drafter",
        "budget",
        "MAL",
        *[f"MAL {s}" for s in subsets],
        "drafted/step",
        "accepted/drafted",
        "µs/req/step",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    results = []
    for label, factory, online in rows:
        for budget in args.budget:
            r = simulate(
                factory(),
                pairs,
                budget=budget,
                batch_size=args.batch_size,
                allocation=args.allocation,
                observe=online,
                top_k=top_k,
            )
            cells = [label, str(budget), f"{r.mal:.3f}", *[f"{r.subset_mal(s):.3f}" for s in subsets]]
            cells += [
                f"{r.drafted_tokens / r.steps:.1f}",
                f"{r.acceptance_rate:.3f}" if r.drafted_tokens else "- (none drafted)",
                f"{r.us_per_request_step:.1f}",
            ]
            print("| " + " | ".join(cells) + " |")
            sys.stdout.flush()
            results.append((label, r))
    if args.details:
        for label, r in results:
            _print_details(label, r)
    if args.json_out:
        doc = {
            "pairs": args.pairs,
            "batch_size": args.batch_size,
            "results": [{"drafter": label, **result_to_json(r)} for label, r in results],
        }
        from sssd.fileio import write_text_atomic

        write_text_atomic(args.json_out, json.dumps(doc, indent=1))
    return 0


def _calibration_words(args: argparse.Namespace) -> str:
    """How the drafters' node scores are calibrated in this run, in words."""
    if args.baseline is not None:
        return f"baseline {args.baseline} (no calibration)"
    table = {None: "the shipped calibration table", "none": "raw scores (no calibration table)"}
    words = table.get(args.calibration, f"calibration table {args.calibration}")
    return words + (", updated online from the replayed outcomes" if args.online else ", fixed")


def _model_rows(args: argparse.Namespace, spec: DrafterSpec, ds) -> list:
    """Rows for ``--draft-model``: the model drafter alone, and merged with the retrieval drafter of
    ``spec``. Both calibrate online (the model drafter's scores start as raw draft probabilities)."""
    import torch
    from transformers import AutoModelForCausalLM

    from sssd.drafter.merge import MergedDrafter
    from sssd.drafter.model import ModelDrafter, ModelDrafterConfig

    model = AutoModelForCausalLM.from_pretrained(args.draft_model, dtype=torch.float32).eval()
    cfg = ModelDrafterConfig(top_k=args.draft_top_k)
    name = f"model({args.draft_model.rstrip('/').split('/')[-1]})"

    def merged():
        return MergedDrafter([make_drafter(spec, ds), ModelDrafter(model, cfg)])

    return [(name, lambda: ModelDrafter(model, cfg), True), (f"merged(sssd+{name})", merged, True)]


def _print_details(label: str, r) -> None:
    print(f"\n{label}, budget {r.budget}: acceptance P(accepted | parent accepted)")
    for title, table in (("source", r.by_source), ("depth", r.by_depth)):
        if not table:
            continue
        cells = [f"{k}: {v.rate:.3f} ({v.accepted}/{v.reached} of {v.nodes})" for k, v in table.items()]
        print(f"  by {title}: " + ", ".join(cells))


def result_to_json(r) -> dict:
    return {
        "budget": r.budget,
        "batch_size": r.batch_size,
        "allocation": r.allocation,
        "mal": r.mal,
        "steps": r.steps,
        "generated_tokens": r.generated_tokens,
        "drafted_tokens": r.drafted_tokens,
        "accepted_tokens": r.accepted_tokens,
        "us_per_request_step": r.us_per_request_step,
        "by_subset": {k: {"steps": v[0], "tokens": v[1]} for k, v in r.by_subset.items()},
        "by_source": {k: vars(v) for k, v in r.by_source.items()},
        "by_depth": {str(k): vars(v) for k, v in r.by_depth.items()},
    }
