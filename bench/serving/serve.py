"""Serving benchmark: Poisson arrivals, policies no-spec / fixed 8,16,64 / adaptive / adaptive+SLO.

    # simulated (event clock + fitted cost profile + the drafter's real acceptance on recorded pairs)
    PYTHONPATH=python python3 bench/serving/serve.py sim --profile bench/results/profile_cpu.json \\
        --rates 1,2,4,8,16 --requests 200
    # real (the engine on SmolLM2-135M on this CPU, low rates, few requests)
    PYTHONPATH=python python3 bench/serving/serve.py real --rates 0.5,1 --requests 8 --max-new-tokens 48
    # tables and target checks of saved results (several files = one table), optionally their plots
    PYTHONPATH=python python3 bench/serving/serve.py report [--merge-plots sim] RESULTS.json...

sim and real print one table row per (rate, policy) and write results JSON and PNG plots to
bench/results/. Tight/relaxed TPOT targets (20%/80%) are set from the profile's predicted plain-decoding
step time at a typical batch, unless given explicitly. Method and results: bench/SERVING.md. The modules
beside this script: workload.py (arrivals, policies, metrics), simulator.py (the event clock), real.py
(the engine on a wall clock), report.py (tables, checks, plots).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
from corpora import DEV_DATA, RESULTS
from report import plot_all, print_row, report
from simulator import simulate_serving
from sssd.evaluation.pairs import load_pairs
from sssd.policy.cost_model import CostModel
from workload import (
    EXTRA_POLICIES,
    POLICIES,
    budget_by_batch,
    datastore_path,
    make_policy,
    slo_targets,
    summarize,
    workload_for,
)


def drafter_factory(kind: str):
    """A callable making a fresh drafter: the sssd Drafter with the datastore, or a baseline."""
    import sssd

    if kind == "sssd" and hasattr(sssd, "Drafter"):
        ds = sssd.Datastore.open(datastore_path())
        return lambda: sssd.Drafter(datastore=ds, config=sssd.DrafterConfig()), "sssd"
    from sssd.evaluation.baselines import PromptLookupDrafter

    return PromptLookupDrafter, "prompt-lookup"


def run_sim(args) -> list[dict]:
    cost = CostModel.load(args.profile)
    pairs = load_pairs(args.pairs, limit=args.pairs_limit)
    make_drafter, dname = drafter_factory(args.drafter)
    targets = slo_targets(cost, args.max_batch // 2 or 1, args)
    print(f"sim: {len(pairs)} pairs, drafter {dname}, profile {args.profile}: {cost}")
    print(f"TPOT targets: tight {targets[0] * 1e3:.1f} ms, relaxed {targets[1] * 1e3:.1f} ms")
    rows = []
    for rate, seed in [(r, s) for r in args.rates for s in args.seeds or [args.seed]]:
        wl = workload_for(args, len(pairs), rate, seed, targets)
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
            row["budget_by_batch"] = budget_by_batch(log)
            rows.append(row)
            print_row(row)
    return rows


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",")]


def make_parser() -> argparse.ArgumentParser:
    run = argparse.ArgumentParser(add_help=False)  # the options of sim and real
    run.add_argument("--rates", type=_floats, default=[1.0, 2.0, 4.0])
    run.add_argument("--requests", type=int, default=100)
    run.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    run.add_argument("--profile", default=str(RESULTS / "profile_cpu.json"))
    run.add_argument("--pairs", default=str(DEV_DATA / "smollm2_dev_pairs.jsonl"))
    run.add_argument("--pairs-limit", type=int, default=None)
    run.add_argument("--drafter", choices=("sssd", "prompt-lookup"), default="sssd")
    run.add_argument("--max-batch", type=int, default=16)
    run.add_argument("--max-new-tokens", type=int, default=None)
    run.add_argument("--tight", type=float, default=1.0, help="tight TPOT = this x plain step time")
    run.add_argument("--relaxed", type=float, default=3.0, help="relaxed TPOT = this x plain step time")
    run.add_argument("--tight-s", type=float, default=None)
    run.add_argument("--relaxed-s", type=float, default=None)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=None,
                     help="sim mode: one workload per seed (rows carry the seed)")  # fmt: skip
    run.add_argument("--threads", type=int, default=1, help="real mode: torch threads")
    run.add_argument("--model", default=None, help="real mode: model dir or .gguf (default SmolLM2-135M)")
    run.add_argument("--out", default=None, help="results JSON (default bench/results/serve_<mode>.json)")
    run.add_argument("--no-plots", action="store_true")
    run.add_argument("--plots", choices=("all", "slo"), default="all", help="slo: only serve_<mode>_slo.png")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    sub.add_parser("sim", parents=[run], help="simulated: event clock + cost profile + real acceptance")
    sub.add_parser("real", parents=[run], help="the engine on SmolLM2-135M, wall clock")
    rep = sub.add_parser("report", help="tables and target checks of results JSON files")
    rep.add_argument(
        "--merge-plots", choices=("sim", "real"), help="also plot these rows as serve_<MODE>_*.png"
    )
    rep.add_argument("results", nargs="+", help="results JSON written by sim or real")
    return p


def main(argv=None) -> int:
    p = make_parser()
    args = p.parse_args(argv)
    if args.mode == "report":
        return report(args.results, RESULTS, args.merge_plots)
    bad = [x for x in args.policies if x not in POLICIES and x not in EXTRA_POLICIES]
    if bad:
        p.error(f"unknown policies {bad}; choose from {list(POLICIES)}")
    if args.mode == "sim":
        rows = run_sim(args)
    else:
        from real import run_real

        rows = run_real(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(args.out or RESULTS / f"serve_{args.mode}.json")
    out.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    if not args.no_plots:
        for f in plot_all(rows, RESULTS, args.mode, args.plots):
            print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
