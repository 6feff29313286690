"""sssd calibrate: fit the drafter's calibration table on pairs with the simulator, check it held out.

The pairs are split (deterministically, by id) into a fitting part and a held-out part. The fitting
part is replayed with the identity table (raw scores); every draft node whose parent was accepted is
an observation (source, depth, match length, raw score -> accepted or not), and the monotone maps per
(source, depth bin, match-length bin) are fitted to them. With --rounds 2 (default) the fitting
part is replayed again with that table and the fit is redone on both rounds' observations, so it also
sees the nodes a calibrated drafter proposes. The held-out part is then replayed with
the identity table, the shipped default and the new table: expected calibration error (ECE) of the
probabilities the drafter reported, and MAL.
"""

from __future__ import annotations

import argparse
import sys
import time

from sssd.cli import recycled as recycled_args
from sssd.cli.argtypes import add_count, from_value_error, real
from sssd.evaluation.fitting import DEFAULT_SOURCES, SOURCES, DrafterSpec, parse_sources

NAME = "calibrate"
# Below these the fit and its check rest on too few observations to mean much: the table has a monotone
# map per (source, depth bin, match-length bin), and a held-out MAL over a few pairs moves with
# each one (two pairs gave a "MAL 8.000"). The command still runs, with a warning.
MIN_FIT_PAIRS = 20
MIN_HELD_OUT_PAIRS = 10
MIN_TESTED_NODES = 1000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", required=True, help="pairs JSONL (fields prompt_ids, output_ids, id, subset)")
    p.add_argument("--datastore", help="datastore file or shard directory (needed for the datastore source)")
    p.add_argument("--output", required=True, help="calibration table JSON to write")
    p.add_argument(
        "--sources",
        type=from_value_error(parse_sources),
        default=DEFAULT_SOURCES,
        help=f"comma list of drafting sources: {','.join(SOURCES)} (datastore is left out when no "
        "--datastore is given; recycled needs the model's top-k along the pairs, see --model)",
    )
    add_count(p, "--budget", 64, "draft nodes per request while collecting")
    add_count(p, "--batch-size", 16, "requests replayed together")
    add_count(p, "--rounds", 2, "replay rounds (1: with the identity table only; 2: then again)")
    p.add_argument(
        "--holdout",
        type=real(0, 1, lo_open=True, hi_open=True),
        default=0.3,
        help="share of pairs held out for the check",
    )
    p.add_argument("--subsets", help="comma list of pair subsets to use (default: all)")
    recycled_args.add_arguments(p)


def _warn_if_little_data(fit_pairs: int, held_pairs: int, tested_nodes: float) -> None:
    short = []
    if fit_pairs < MIN_FIT_PAIRS:
        short.append(f"{fit_pairs} pairs to fit (fewer than {MIN_FIT_PAIRS})")
    if held_pairs < MIN_HELD_OUT_PAIRS:
        short.append(f"{held_pairs} held out (fewer than {MIN_HELD_OUT_PAIRS})")
    if tested_nodes < MIN_TESTED_NODES:
        short.append(f"{tested_nodes:,.0f} tested nodes (fewer than {MIN_TESTED_NODES:,})")
    if short:
        print(
            f"sssd calibrate: warning: too little data: {', '.join(short)}; the fitted table and the "
            "check below are noise at this size: fit on more pairs (sssd generate --output on more prompts)",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    from sssd.drafter import calibration
    from sssd.evaluation.fitting import calibration_error, collect_records, fit_calibration
    from sssd.evaluation.pairs import load_pairs, split_pairs

    sources = tuple(args.sources)
    if "datastore" in sources and args.datastore is None:
        if args.sources is DEFAULT_SOURCES:
            sources = tuple(s for s in sources if s != "datastore")
        else:
            raise ValueError("--sources includes datastore: give --datastore PATH")
    ds = None
    if args.datastore is not None:
        from sssd.datastore.store import Datastore

        ds = Datastore.open(args.datastore)
    pairs = load_pairs(args.pairs, subsets=args.subsets, vocab_size=ds.vocab_size if ds else None)
    held, fit_on = split_pairs(pairs, args.holdout)
    if not held or not fit_on:
        raise ValueError(f"{len(pairs)} pairs are too few to hold {args.holdout:.0%} out")
    spec = DrafterSpec(sources=sources, datastore=args.datastore)
    fit_top_k = held_top_k = None
    if "recycled" in sources:  # the model's top-k along all pairs, then each part's rows
        top_k = recycled_args.teacher_top_k(args, pairs)
        where = {id(p): i for i, p in enumerate(pairs)}
        fit_top_k, held_top_k = (top_k.take([where[id(p)] for p in part]) for part in (fit_on, held))
    print(
        f"pairs: {len(fit_on)} to fit, {len(held)} held out; sources {'+'.join(sources)}; "
        f"budget {args.budget}, batch {args.batch_size}"
    )
    t0 = time.perf_counter()
    table = fit_calibration(
        spec, ds, fit_on, budget=args.budget, batch_size=args.batch_size, rounds=args.rounds, top_k=fit_top_k
    )
    table.save(args.output)
    n_obs = float(table.weights.sum())
    print(f"fitted on {n_obs:,.0f} tested nodes in {time.perf_counter() - t0:.1f} s -> {args.output}\n")
    _warn_if_little_data(len(fit_on), len(held), n_obs)
    print("| table (held-out pairs) | ECE | tested nodes | MAL |")
    print("|---|---|---|---|")
    for name, tab in (
        ("identity (raw scores)", calibration.CalibrationTable.identity()),
        ("shipped default", calibration.default_table()),
        ("fitted", table),
    ):
        r = collect_records(
            spec, ds, held, budget=args.budget, batch_size=args.batch_size, table=tab, top_k=held_top_k
        )
        print(f"| {name} | {calibration_error(r.records):.4f} | {len(r.records):,} | {r.mal:.3f} |")
    return 0
