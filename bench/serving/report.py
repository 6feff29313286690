"""Markdown tables and target checks from serve.py results JSON.

    PYTHONPATH=python:bench python3 bench/serve_report.py bench/results/serve_sim.json

Targets (issue 6): adaptive's mean latency is never worse than the better of no-spec and the best fixed
budget by more than 5% at any rate, and beats every fixed budget at some rate; adaptive+SLO gives the
tight class at least 1.5x the attainment of adaptive (throughput-only) at no more than 5% throughput cost.
"""

from __future__ import annotations

import json
import sys

FIXED = ("fixed-8", "fixed-16", "fixed-64")


def table(rows: list[dict]) -> str:
    head = (
        "| rate (req/s) | policy | mean latency (s) | p90 latency (s) | mean TPOT (s) | throughput (tok/s) "
        "| tight attained | relaxed attained | mean budget | mean batch |"
    )
    out = [head, "|" + "---|" * 10]
    for r in rows:
        out.append(
            f"| {r['rate']:g} | {r['policy']} | {r['mean_latency_s']:.2f} | {r['p90_latency_s']:.2f} "
            f"| {r['mean_tpot_s']:.3f} | {r['throughput_tok_s']:.2f} | {_pct(r.get('attain_tight'))} "
            f"| {_pct(r.get('attain_relaxed'))} | {r.get('mean_budget', 0):.1f} "
            f"| {r.get('mean_batch', 0):.1f} |"
        )
    return "\n".join(out)


def _pct(x) -> str:
    return "–" if x is None or x != x else f"{100 * x:.0f}%"


def check(rows: list[dict]) -> list[str]:
    by = {(r["rate"], r["policy"]): r for r in rows}
    rates = sorted({r["rate"] for r in rows})
    lines = []
    worst = 0.0
    beats = dict.fromkeys(FIXED, False)
    for rate in rates:
        a = by.get((rate, "adaptive"))
        others = [by[(rate, p)] for p in ("no-spec", *FIXED) if (rate, p) in by]
        if a is None:
            continue
        head = f"rate {rate:g}: "
        if others:
            best = min(others, key=lambda r: r["mean_latency_s"])
            rel = a["mean_latency_s"] / best["mean_latency_s"] - 1.0
            worst = max(worst, rel)
            for p in FIXED:
                if (rate, p) in by and a["mean_latency_s"] < by[(rate, p)]["mean_latency_s"]:
                    beats[p] = True
            head += (
                f"adaptive {a['mean_latency_s']:.2f} s vs best other {best['policy']} "
                f"{best['mean_latency_s']:.2f} s ({100 * rel:+.1f}%); "
            )
        s = by.get((rate, "adaptive+slo"))
        if s is not None and a.get("attain_tight") == a.get("attain_tight"):
            ratio = s["attain_tight"] / a["attain_tight"] if a["attain_tight"] else float("inf")
            cost = 1.0 - s["throughput_tok_s"] / a["throughput_tok_s"]
            head += (
                f"SLO: tight attainment {_pct(a['attain_tight'])} -> {_pct(s['attain_tight'])} "
                f"(x{ratio:.2f}), throughput cost {100 * cost:+.1f}%"
            )
        lines.append(head.rstrip("; "))
    if any((r, p) in by for r in rates for p in ("no-spec", *FIXED)):
        lines.append(f"worst adaptive excess over the best other policy: {100 * worst:+.1f}% (target <= +5%)")
        lines.append(
            "adaptive beats at some rate: "
            + ", ".join(f"{p} {'yes' if v else 'NO'}" for p, v in beats.items())
        )
    return lines


def slo_by_seed(rows: list[dict]) -> list[str]:
    """Tight-class attainment of adaptive+slo vs adaptive and the throughput cost, per (rate, seed), and
    per rate over the seeds (rows from ``serve.py sim --seeds``)."""
    by = {(r["rate"], r.get("seed"), r["policy"]): r for r in rows}
    lines = []
    for rate in sorted({r["rate"] for r in rows}):
        att, cost, met = [], [], 0
        seeds = sorted({r.get("seed") for r in rows if r["rate"] == rate})
        for seed in seeds:
            a, s = by.get((rate, seed, "adaptive")), by.get((rate, seed, "adaptive+slo"))
            if a is None or s is None:
                continue
            ratio = s["attain_tight"] / a["attain_tight"] if a["attain_tight"] else float("inf")
            c = 1.0 - s["throughput_tok_s"] / a["throughput_tok_s"]
            att.append((a["attain_tight"], s["attain_tight"]))
            cost.append(c)
            met += ratio >= 1.5 and c <= 0.05
            n = by.get((rate, seed, "adaptive+slo-noadmit"))
            extra = "" if n is None else f"; without SLO admission {_pct(n['attain_tight'])}"
            lines.append(
                f"rate {rate:g} seed {seed}: tight attainment {_pct(a['attain_tight'])} -> "
                f"{_pct(s['attain_tight'])} (x{ratio:.2f}), throughput cost {100 * c:+.1f}%{extra}"
            )
        if att:
            mean_a = sum(x for x, _ in att) / len(att)
            mean_s = sum(y for _, y in att) / len(att)
            lines.append(
                f"rate {rate:g}, {len(att)} seeds: mean tight attainment {_pct(mean_a)} -> {_pct(mean_s)} "
                f"(x{mean_s / mean_a:.2f}), mean throughput cost {100 * sum(cost) / len(cost):+.1f}% "
                f"(max {100 * max(cost):+.1f}%); target (x1.5 at <= 5%) met on {met} of {len(att)}"
            )
    return lines


def main(argv=None) -> int:
    """Usage: serve_report.py [--merge-plots MODE] RESULTS.json... (several files = one table)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    plot_mode = None
    if argv[:1] == ["--merge-plots"]:
        plot_mode, argv = argv[1], argv[2:]
    rows_all = [r for path in argv for r in json.load(open(path))["rows"] if r.get("requests")]
    if plot_mode:
        from pathlib import Path

        from serve_plots import plot_all

        for f in plot_all(rows_all, Path(__file__).resolve().parent / "results", plot_mode):
            print(f"wrote {f}")
    if len({r.get("seed") for r in rows_all}) > 1:
        for line in slo_by_seed(rows_all):
            print(f"- {line}")
        return 0
    for path, rows in [(" + ".join(argv), sorted(rows_all, key=lambda r: r["rate"]))]:
        print(f"### {path}\n")
        print(table(rows))
        print()
        for line in check(rows):
            print(f"- {line}")
        for tag, what in (("sim", "saved profile"), ("simrefit", "profile refit on the real steps")):
            sims = [r for r in rows if f"{tag}_err_mean_latency_s" in r]
            if not sims:
                continue
            errs = [abs(r[f"{tag}_err_mean_latency_s"]) for r in sims]
            print(f"- simulator ({what}) vs real, mean latency: mean |error| "
                  f"{100 * sum(errs) / len(errs):.0f}% over {len(errs)} runs")  # fmt: skip
            for r in sims:
                e = r.get(f"{tag}_err_mean_latency_s", float("nan"))
                t = r.get(f"{tag}_err_throughput_tok_s", float("nan"))
                print(
                    f"  - rate {r['rate']:g} {r['policy']}: latency {100 * e:+.0f}%, "
                    f"throughput {100 * t:+.0f}%"
                )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
