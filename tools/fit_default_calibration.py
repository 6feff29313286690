"""Fits python/sssd/data/calibration_default.json from a teacher-forced replay of the dev pairs.

Usage: OMP_NUM_THREADS=2 PYTHONPATH=python python3 tools/fit_default_calibration.py [--budget 64] [--recycled]
       [--engine --pairs 16 --new 96 [--budget-mode adaptive]]
Fits on the even-indexed dev pairs only (the odd-indexed ones stay held out for evaluation), datastore =
smollm2_other_outputs (bench/corpora.py). Two rounds: observations from uncalibrated trees, then from
trees drafted with the first fit (so the table also sees the nodes a calibrated drafter proposes); the
second fit uses both.
--recycled: fit only the rows of the recycled candidates (sources recycled and rescored) into the
shipped table, the other rows kept as they are, replaying with the source on: the model's top-8 along
the pairs comes from a teacher-forced forward of the bundled SmolLM2 in float32 (sssd.models.teacher,
cached).
--recycled --engine: the same rows fitted from the engine instead (greedy, float32, batch 1, the
bundled SmolLM2 generating --new tokens for each training prompt) with the drafter given every verified
node's top-k (``recycle_rows="all"``): the table the source is drafted from in the engine, which a
teacher-forced replay cannot feed (it knows the rows along the reference text only). The observations are
the nodes the engine tested (their parent accepted), as the drafter's ``observe`` receives them. The budget
is --budget every step, or with --budget-mode adaptive the adaptive policy's (capped at --budget): then the
observations are the nodes that policy buys (its small trees test only the best-scored ones), not all a
fixed budget tests. The shipped rows: --recycled --engine --pairs 16 --new 96 (fixed, 64), with the
rows older than each request in groups of their own (DrafterConfig.recycle_split_stale; --shared-stale:
not); rows fitted under the adaptive policy measured no better end to end (docs/drafter.md).
Prints the expected calibration error (ECE) of raw and calibrated scores on the held-out pairs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import sssd
from sssd.batch import reached_nodes
from sssd.drafter.calibration import SOURCES, CalibrationTable, calibration_error, default_table, fit
from sssd.evaluation.pairs import load_pairs
from sssd.evaluation.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import corpora

RECYCLED_ROWS = slice(SOURCES.index("recycled"), len(SOURCES))
OUT = Path(__file__).resolve().parent.parent / "python" / "sssd" / "data" / "calibration_default.json"
PAIRS = (
    Path(os.environ.get("SSSD_DEV_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    / "smollm2_dev_pairs.jsonl"
)


def collect(ds, pairs, budget: int, table, top_k=None) -> dict[str, np.ndarray]:
    """Tested nodes (parent accepted) of a teacher-forced batch-1 replay: features and outcomes."""
    cfg = sssd.DrafterConfig(calibration=table, online_calibration=False, use_recycled=top_k is not None)
    res = simulate(
        sssd.Drafter(ds, cfg), pairs, budget=budget, batch_size=1, collect_records=True, top_k=top_k
    )
    f = res.records.features
    return {
        "source": f["source"],
        "depth": f["depth"],
        "match_len": f["match_len"],
        "raw": f["raw_score"],
        "prob": f["probs"],
        "accepted": res.records.accepted.astype(np.int8),
    }


class _Recording(sssd.Drafter):
    """A drafter that keeps the features and outcomes of the nodes the engine tested."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: list[dict[str, np.ndarray]] = []

    def observe(self, request_ids, batch, on_path):
        on_path = np.asarray(on_path, bool)
        tested = reached_nodes(batch, on_path)
        self.seen.append({
            "source": np.asarray(batch.source)[tested], "depth": np.asarray(batch.depth)[tested],
            "match_len": np.asarray(batch.match_len)[tested], "raw": np.asarray(batch.raw_score)[tested],
            "prob": np.asarray(batch.probs)[tested], "accepted": on_path[tested].astype(np.int8),
        })  # fmt: skip
        return super().observe(request_ids, batch, on_path)


def collect_engine(
    ds, pairs, budget: int, table, model, tok, new: int, mode: str = "fixed", split_stale: bool = True
) -> dict[str, np.ndarray]:
    """Tested nodes of the engine generating ``new`` tokens for each pair's prompt (see the docstring)."""
    cfg = sssd.DrafterConfig(
        calibration=table,
        online_calibration=False,
        use_recycled=True,
        recycle_rows="all",
        recycle_split_stale=split_stale,
    )
    drafter = _Recording(ds, cfg)
    engine = sssd.Engine(
        model, tok, drafter=drafter, config=sssd.EngineConfig(budget=budget, budget_mode=mode)
    )
    for i, p in enumerate(pairs):
        engine.generate([list(p.prompt_ids)], max_new_tokens=new)
        print(f"\r  engine: {i + 1}/{len(pairs)} prompts", end="", flush=True)
    print()
    return {k: np.concatenate([o[k] for o in drafter.seen]) for k in drafter.seen[0]}


def fit_from(obs: dict[str, np.ndarray], keep=None):
    """The fitted table; with ``keep`` (a table), only the recycled sources' rows are the fit's."""
    table = fit(obs["source"], obs["depth"], obs["match_len"], obs["raw"], obs["accepted"])
    if keep is None:
        return table
    values, weights = keep.values.copy(), keep.weights.copy()
    values[RECYCLED_ROWS], weights[RECYCLED_ROWS] = table.values[RECYCLED_ROWS], table.weights[RECYCLED_ROWS]
    return CalibrationTable(keep.depth_edges, keep.match_edges, keep.num_knots, values, weights)


def teacher_top_k(pairs):
    """The bundled SmolLM2's top-8 along every pair (float32), from the cache or one forward per pair."""
    from sssd.evaluation.recycling import TeacherTopK
    from sssd.models.loading import load_model, resolve_model
    from sssd.models.local import cache_dir
    from sssd.models.teacher import cache_key
    from sssd.models.teacher import teacher_top_k as compute

    seqs = [(p.prompt_ids, p.output_ids) for p in pairs]
    path = cache_dir() / "teacher_topk" / f"{cache_key(resolve_model(None), 'float32', 8, seqs)}.npz"
    model = None if path.is_file() else load_model(None, "float32")[0]
    return TeacherTopK(*compute(model, seqs, 8, cache_file=path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--recycled", action="store_true", help="fit the recycled sources' rows only")
    ap.add_argument(
        "--engine", action="store_true", help="(with --recycled) observe the engine, every node's rows"
    )
    ap.add_argument(
        "--pairs", type=int, default=None, help="(--engine) training prompts (default: all even pairs)"
    )
    ap.add_argument("--new", type=int, default=128, help="(--engine) tokens generated per prompt")
    ap.add_argument(
        "--budget-mode",
        choices=("fixed", "adaptive"),
        default="fixed",
        help="(--engine) the engine's budget: --budget every step, or the adaptive policy capped at --budget",
    )
    ap.add_argument(
        "--shared-stale",
        action="store_true",
        help="(--engine) DrafterConfig(recycle_split_stale=False): rows older than the request in the groups "
        "of the request's own (default: groups of their own, as the drafter drafts by default)",
    )
    args = ap.parse_args()
    pairs = load_pairs(PAIRS)
    train, held_out = pairs[0::2], pairs[1::2]
    ds = sssd.Datastore.open(corpora.outputs_datastore())
    keep = default_table() if args.recycled else None
    if args.engine:
        if not args.recycled:
            ap.error("--engine fits the recycled sources' rows: give --recycled too")
        fit_engine(args, ds, train[: args.pairs], held_out[: args.pairs], keep)
        return
    top = teacher_top_k(pairs) if args.recycled else None
    train_top, held_top = (
        (None, None)
        if top is None
        else (top.take(range(0, len(pairs), 2)), top.take(range(1, len(pairs), 2)))
    )
    first = collect(ds, train, args.budget, keep, train_top)
    table = fit_from(first, keep)
    second = collect(ds, train, args.budget, table, train_top)
    both = {k: np.concatenate([first[k], second[k]]) for k in first}
    table = fit_from(both, keep)
    table.save(args.out)
    print(f"fitted on {len(train)} pairs, {both['accepted'].size} observations -> {args.out}")

    test = collect(ds, held_out, args.budget, table, held_top)
    raw_ece = calibration_error(test["raw"], test["accepted"])
    cal = table.apply(test["source"], test["depth"], test["match_len"], test["raw"])
    print(f"held-out ({len(held_out)} pairs, {test['accepted'].size} observations):")
    print(f"  ECE raw scores        {raw_ece:.4f}")
    print(f"  ECE calibrated        {calibration_error(cal, test['accepted']):.4f}")
    print(f"  ECE fused p (drafted) {calibration_error(test['prob'], test['accepted']):.4f}")
    by_source(test, cal, raw=True)


def by_source(test: dict[str, np.ndarray], cal: np.ndarray, raw: bool = False) -> None:
    """Per source: tested nodes, their acceptance rate, mean raw score (with ``raw``) and calibrated p."""
    for s, name in enumerate(SOURCES):
        sel = test["source"] == s
        if sel.any():
            mean_raw = f"raw={test['raw'][sel].mean():.3f} " if raw else ""
            print(
                f"  {name:9s} n={int(sel.sum()):7d} accept={test['accepted'][sel].mean():.3f} "
                f"{mean_raw}calibrated={cal[sel].mean():.3f}"
            )


def fit_engine(args, ds, train, held_out, keep) -> None:
    """--recycled --engine: two rounds on the training prompts (the shipped table, then the first fit),
    the second fit from both; then the held-out prompts' tested nodes with the old and the new table."""
    import torch
    from sssd.models.loading import load_model

    torch.manual_seed(0)
    model, tok, _ = load_model(None, "float32")
    first = collect_engine(
        ds, train, args.budget, keep, model, tok, args.new, args.budget_mode, not args.shared_stale
    )
    table = fit_from(first, keep)
    second = collect_engine(
        ds, train, args.budget, table, model, tok, args.new, args.budget_mode, not args.shared_stale
    )
    both = {k: np.concatenate([first[k], second[k]]) for k in first}
    table = fit_from(both, keep)
    table.save(args.out)
    print(f"fitted on {len(train)} prompts, {both['accepted'].size} observations -> {args.out}")
    for name, t in (("shipped", keep), ("refitted", table)):
        test = collect_engine(
            ds, held_out, args.budget, t, model, tok, args.new, args.budget_mode, not args.shared_stale
        )
        cal = t.apply(test["source"], test["depth"], test["match_len"], test["raw"])
        print(f"held-out, {name} table ({len(held_out)} prompts, {test['accepted'].size} tested nodes):")
        print(f"  ECE calibrated {calibration_error(cal, test['accepted']):.4f}")
        by_source(test, cal)


if __name__ == "__main__":
    main()
