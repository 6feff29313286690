"""Fits python/sssd/data/calibration_default.json from a teacher-forced replay of the dev pairs.

Usage: OMP_NUM_THREADS=2 PYTHONPATH=python python3 tools/fit_default_calibration.py [--budget 64]
Fits on the even-indexed dev pairs only (the odd-indexed ones stay held out for evaluation), datastore =
smollm2_other_outputs (bench/corpora.py). Two rounds: observations from uncalibrated trees, then from
trees drafted with the first fit (so the table also sees the nodes a calibrated drafter proposes); the
second fit uses both.
Prints the expected calibration error (ECE) of raw and calibrated scores on the held-out pairs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import sssd
from sssd.drafter.calibration import calibration_error, fit
from sssd.evaluation.pairs import load_pairs
from sssd.evaluation.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import corpora

OUT = Path(__file__).resolve().parent.parent / "python" / "sssd" / "data" / "calibration_default.json"
PAIRS = (
    Path(os.environ.get("SSSD_DEV_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    / "smollm2_dev_pairs.jsonl"
)


def collect(ds, pairs, budget: int, table) -> dict[str, np.ndarray]:
    """Tested nodes (parent accepted) of a teacher-forced batch-1 replay: features and outcomes."""
    cfg = sssd.DrafterConfig(calibration=table, online_calibration=False)
    res = simulate(sssd.Drafter(ds, cfg), pairs, budget=budget, batch_size=1, collect_records=True)
    f = res.records.features
    return {
        "source": f["source"],
        "depth": f["depth"],
        "match_len": f["match_len"],
        "raw": f["raw_score"],
        "prob": f["probs"],
        "accepted": res.records.accepted.astype(np.int8),
    }


def fit_from(obs: dict[str, np.ndarray]):
    return fit(obs["source"], obs["depth"], obs["match_len"], obs["raw"], obs["accepted"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    pairs = load_pairs(PAIRS)
    train, held_out = pairs[0::2], pairs[1::2]
    ds = sssd.Datastore.open(corpora.outputs_datastore())
    first = collect(ds, train, args.budget, None)
    table = fit_from(first)
    second = collect(ds, train, args.budget, table)
    both = {k: np.concatenate([first[k], second[k]]) for k in first}
    table = fit_from(both)
    table.save(args.out)
    print(f"fitted on {len(train)} pairs, {both['accepted'].size} observations -> {args.out}")

    test = collect(ds, held_out, args.budget, table)
    raw_ece = calibration_error(test["raw"], test["accepted"])
    cal = table.apply(test["source"], test["depth"], test["match_len"], test["raw"])
    print(f"held-out ({len(held_out)} pairs, {test['accepted'].size} observations):")
    print(f"  ECE raw scores        {raw_ece:.4f}")
    print(f"  ECE calibrated        {calibration_error(cal, test['accepted']):.4f}")
    print(f"  ECE fused p (drafted) {calibration_error(test['prob'], test['accepted']):.4f}")
    for s, name in enumerate(sssd.drafter.calibration.SOURCES):
        sel = test["source"] == s
        if sel.any():
            print(
                f"  {name:9s} n={int(sel.sum()):7d} accept={test['accepted'][sel].mean():.3f} "
                f"raw={test['raw'][sel].mean():.3f} calibrated={cal[sel].mean():.3f}"
            )


if __name__ == "__main__":
    main()
