"""Serving benchmark: Poisson arrivals, policies no-spec / fixed 8,16,64 / adaptive / adaptive+SLO.

    # simulated (event clock + fitted cost profile + the drafter's real acceptance on recorded pairs)
    PYTHONPATH=python:bench python3 bench/serve.py sim --profile bench/results/profile_cpu.json \
        --rates 1,2,4,8,16 --requests 200
    # real (the engine on SmolLM2-135M on this CPU, low rates, few requests)
    PYTHONPATH=python:bench python3 bench/serve.py real --rates 0.5,1 --requests 8 --max-new-tokens 48

Prints one table row per (rate, policy), writes results JSON and PNG plots to bench/results/.
Tight/relaxed TPOT targets (20%/80%) are set from the profile's predicted plain-decoding step time at
a typical batch, unless given explicitly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from serve_workload import EXTRA_POLICIES, POLICIES, poisson_workload, summarize
from sssd.evaluation.pairs import load_pairs
from sssd.policy.adaptive import BudgetConfig, BudgetPolicy
from sssd.policy.cost_model import CostModel

DATA = Path(
    os.environ.get("SSSD_DEV_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data")
)  # ../shared/data
RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = (
    "mean_latency_s",
    "p90_latency_s",
    "mean_tpot_s",
    "throughput_tok_s",
    "attain_tight",
    "attain_relaxed",
)


def make_policy(name: str, cost: CostModel) -> tuple[BudgetPolicy, bool]:
    mode, budget, slo = {**POLICIES, **EXTRA_POLICIES}[name]
    fresh = CostModel.from_dict(cost.to_dict())  # each run learns online from the same seed
    cfg = BudgetConfig(
        mode=mode,
        budget=budget,
        slo_via_drafter=name.endswith("-drafter"),
        slo_admission=not name.endswith("-noadmit"),
    )
    return BudgetPolicy(cfg, fresh), slo


def bench_cache() -> Path:
    from sssd.models.local import cache_dir

    return cache_dir() / "bench"


def datastore_path(cache: Path) -> Path:
    """The datastore of the other-outputs corpus with the SmolLM2 tokenizer's fingerprint (built once)."""
    import corpora
    from sssd.models.local import load_tokenizer

    return corpora.outputs_datastore(load_tokenizer(), cache)


def drafter_factory(kind: str, cache: Path):
    """A callable making a fresh drafter: the sssd Drafter with the datastore, or a baseline."""
    import sssd

    if kind == "sssd" and hasattr(sssd, "Drafter"):
        ds = sssd.Datastore.open(datastore_path(cache))
        return lambda: sssd.Drafter(datastore=ds, config=sssd.DrafterConfig()), "sssd"
    from sssd.evaluation.baselines import PromptLookupDrafter

    return PromptLookupDrafter, "prompt-lookup"


def slo_targets(cost: CostModel, batch: int, args) -> tuple[float, float]:
    """Tight = ``--tight`` x the predicted plain step at ``batch`` requests (of ~300 context tokens);
    relaxed = ``--relaxed`` x it, unless given in seconds."""
    step = float(cost.predict(batch, 300 * batch, 0).total)
    tight = args.tight_s or args.tight * step
    relaxed = args.relaxed_s or args.relaxed * step
    return tight, relaxed


def run_sim(args) -> list[dict]:
    from serve_sim import simulate_serving

    cost = CostModel.load(args.profile)
    pairs = load_pairs(args.pairs, limit=args.pairs_limit)
    make_drafter, dname = drafter_factory(args.drafter, bench_cache())
    tight, relaxed = slo_targets(cost, args.max_batch // 2 or 1, args)
    print(f"sim: {len(pairs)} pairs, drafter {dname}, profile {args.profile}: {cost}")
    print(f"TPOT targets: tight {tight * 1e3:.1f} ms, relaxed {relaxed * 1e3:.1f} ms")
    rows = []
    for rate, seed in [(r, s) for r in args.rates for s in args.seeds or [args.seed]]:
        wl = poisson_workload(
            len(pairs), rate, args.requests, seed=seed, tight_tpot_s=tight, relaxed_tpot_s=relaxed
        )
        for name in args.policies:
            policy, slo = make_policy(name, cost)
            t0 = time.perf_counter()
            done, log = simulate_serving(
                wl, pairs, make_drafter, policy, cost, max_batch=args.max_batch,
                max_new_tokens=args.max_new_tokens, use_slo=slo,
            )  # fmt: skip
            row = {"mode": "sim", "rate": rate, "policy": name, **summarize(done, log)}
            if args.seeds:
                row["seed"] = seed
            row["acceptance_ratio_policy"] = policy.acceptance.ratio
            row["wall_s"] = time.perf_counter() - t0
            row["budget_by_batch"] = _budget_by_batch(log)
            rows.append(row)
            _print_row(row)
    return rows


def _budget_by_batch(log) -> dict[int, float]:
    b = np.array(log.batch_size)
    k = np.array(log.budget)
    return {int(x): float(k[b == x].mean()) for x in np.unique(b)}


def _print_row(row: dict) -> None:
    vals = " ".join(f"{row.get(c, float('nan')):>9.3f}" for c in COLUMNS)
    extra = f"budget {row.get('mean_budget', 0):6.1f} batch {row.get('mean_batch', 0):5.1f}"
    print(f"{row['mode']:>4} rate {row['rate']:>6g} {row['policy']:>13} {vals}  {extra}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("sim", "real"))
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 2.0, 4.0])
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    p.add_argument("--profile", default=str(RESULTS / "profile_cpu.json"))
    p.add_argument("--pairs", default=str(DATA / "smollm2_dev_pairs.jsonl"))
    p.add_argument("--pairs-limit", type=int, default=None)
    p.add_argument("--drafter", choices=("sssd", "prompt-lookup"), default="sssd")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--tight", type=float, default=1.0, help="tight TPOT = this x plain step time")
    p.add_argument("--relaxed", type=float, default=3.0, help="relaxed TPOT = this x plain step time")
    p.add_argument("--tight-s", type=float, default=None)
    p.add_argument("--relaxed-s", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="sim mode: one workload per seed (rows carry the seed)")  # fmt: skip
    p.add_argument("--threads", type=int, default=1, help="real mode: torch threads")
    p.add_argument("--model", default=None, help="real mode: model dir or .gguf (default SmolLM2-135M)")
    p.add_argument("--out", default=None, help="results JSON (default bench/results/serve_<mode>.json)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--plots", choices=("all", "slo"), default="all", help="slo: only serve_<mode>_slo.png")
    args = p.parse_args(argv)
    bad = [x for x in args.policies if x not in POLICIES and x not in EXTRA_POLICIES]
    if bad:
        p.error(f"unknown policies {bad}; choose from {list(POLICIES)}")
    if args.mode == "sim":
        rows = run_sim(args)
    else:
        from serve_real import run_real

        rows = run_real(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(args.out or RESULTS / f"serve_{args.mode}.json")
    out.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    if not args.no_plots:
        from serve_plots import plot_all

        for f in plot_all(rows, RESULTS, args.mode, args.plots):
            print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
