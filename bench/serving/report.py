"""Markdown tables, target checks and plots of the serving benchmark's results (serve.py writes them;
``serve.py report`` reads them back).

Targets (issue 6): adaptive's mean latency is never worse than the better of no-spec and the best fixed
budget by more than 5% at any rate, and beats every fixed budget at some rate; adaptive+SLO gives the
tight class at least 1.5x the attainment of adaptive (throughput-only) at no more than 5% throughput cost.
Plots (matplotlib, PNG): latency vs rate per policy, chosen budget vs batch size, SLO attainment per class.
"""

from __future__ import annotations

import json
from pathlib import Path

FIXED = ("fixed-8", "fixed-16", "fixed-64")
COLUMNS = (
    "mean_latency_s",
    "p90_latency_s",
    "mean_tpot_s",
    "throughput_tok_s",
    "attain_tight",
    "attain_relaxed",
)


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


def print_row(row: dict) -> None:
    """One line per run as it finishes: mode, rate, policy and the COLUMNS."""
    vals = " ".join(f"{row.get(c, float('nan')):>9.3f}" for c in COLUMNS)
    extra = f"budget {row.get('mean_budget', 0):6.1f} batch {row.get('mean_batch', 0):5.1f}"
    print(f"{row['mode']:>4} rate {row['rate']:>6g} {row['policy']:>13} {vals}  {extra}", flush=True)


def report(paths: list[str], out_dir: Path, plot_mode: str | None = None) -> int:
    """Prints the table and the target checks of the results in ``paths`` (several files = one table;
    runs over several seeds: the SLO comparison per seed); ``plot_mode``: also writes its plots from
    these rows into ``out_dir``."""
    rows_all = [r for path in paths for r in json.load(open(path))["rows"] if r.get("requests")]
    if plot_mode:
        for f in plot_all(rows_all, out_dir, plot_mode):
            print(f"wrote {f}")
    if len({r.get("seed") for r in rows_all}) > 1:
        for line in slo_by_seed(rows_all):
            print(f"- {line}")
        return 0
    rows = sorted(rows_all, key=lambda r: r["rate"])
    print(f"### {' + '.join(paths)}\n")
    print(table(rows))
    print()
    for line in check(rows):
        print(f"- {line}")
    for line in sim_errors(rows):
        print(line)
    print()
    return 0


def sim_errors(rows: list[dict]) -> list[str]:
    """The simulator's mean-latency (and throughput) error against each real run it replayed."""
    lines = []
    for tag, what in (("sim", "saved profile"), ("simrefit", "profile refit on the real steps")):
        sims = [r for r in rows if f"{tag}_err_mean_latency_s" in r]
        if not sims:
            continue
        errs = [abs(r[f"{tag}_err_mean_latency_s"]) for r in sims]
        lines.append(f"- simulator ({what}) vs real, mean latency: mean |error| "
                     f"{100 * sum(errs) / len(errs):.0f}% over {len(errs)} runs")  # fmt: skip
        for r in sims:
            e = r.get(f"{tag}_err_mean_latency_s", float("nan"))
            t = r.get(f"{tag}_err_throughput_tok_s", float("nan"))
            lines.append(
                f"  - rate {r['rate']:g} {r['policy']}: latency {100 * e:+.0f}%, throughput {100 * t:+.0f}%"
            )
    return lines


def plot_all(rows: list[dict], out_dir: Path, mode: str, which: str = "all") -> list[Path]:
    """Writes serve_<mode>_{latency,budget,slo}.png (``which="slo"``: only the SLO plot); returns them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [_latency, _budget, _slo] if which == "all" else [_slo]
    files = []
    for plot in plots:
        fig, name = plot(plt, rows, mode)
        fig.tight_layout()
        files.append(out_dir / f"serve_{mode}_{name}.png")
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)
    return files


def _by_rate(rows: list[dict], policy: str) -> list[dict]:
    return sorted((r for r in rows if r["policy"] == policy and r.get("requests")), key=lambda r: r["rate"])


def _latency(plt, rows: list[dict], mode: str):
    """Mean and p90 request latency against the request rate, one line per policy."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for pol in dict.fromkeys(r["policy"] for r in rows):
        rs = _by_rate(rows, pol)
        axes[0].plot([r["rate"] for r in rs], [r["mean_latency_s"] for r in rs], marker="o", label=pol)
        axes[1].plot([r["rate"] for r in rs], [r["p90_latency_s"] for r in rs], marker="o", label=pol)
    for ax, what in zip(axes, ("mean", "p90"), strict=True):
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{what} request latency (s)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _rate_ticks(ax, rows)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"serving latency vs rate ({mode})")
    return fig, "latency"


def _budget(plt, rows: list[dict], mode: str):
    """The adaptive policies' mean chosen global budget against the batch size."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for pol in ("adaptive", "adaptive+slo"):
        pts: dict[int, list[float]] = {}
        for r in rows:
            if r["policy"] == pol:
                for b, k in r.get("budget_by_batch", {}).items():
                    pts.setdefault(int(b), []).append(k)
        if pts:
            xs = sorted(pts)
            ax.plot(xs, [sum(pts[x]) / len(pts[x]) for x in xs], marker="o", label=pol)
    ax.set_xlabel("batch size (active requests)")
    ax.set_ylabel("mean chosen global budget (draft tokens, whole batch)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"adaptive budget vs batch size ({mode})")
    return fig, "budget"


def _slo(plt, rows: list[dict], mode: str):
    """The share of requests meeting their TPOT target against the rate, per class and policy."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, cls in zip(axes, ("tight", "relaxed"), strict=True):
        for pol in dict.fromkeys(r["policy"] for r in rows):
            rs = _by_rate(rows, pol)
            ax.plot([r["rate"] for r in rs], [r.get(f"attain_{cls}") for r in rs], marker="o", label=pol)
        ax.set_xscale("log")
        _rate_ticks(ax, rows)
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(f"{cls} TPOT class")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("SLO attainment (share of requests meeting TPOT)")
    axes[0].legend(fontsize=8)
    return fig, "slo"


def _rate_ticks(ax, rows: list[dict]) -> None:
    rates = sorted({r["rate"] for r in rows})
    ax.set_xticks(rates)
    ax.set_xticklabels([f"{r:g}" for r in rates])
    ax.minorticks_off()
