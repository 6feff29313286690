"""Markdown tables and the MAL plot of bench_drafter.py's results (see that file for what is measured)."""

from __future__ import annotations

from pathlib import Path

BAR = {16: 2.43, 64: 2.63}  # SSSD's published drafter, ../shared/data/README.md


def _md(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def report_latency(rows: list[dict]) -> str:
    single = [r for r in rows if "+" not in r["drafter"] and r["drafter"] != "prompt-lookup"]
    rows = [r for r in rows if r not in single]
    drafters = list(dict.fromkeys(r["drafter"] for r in rows))
    keys = sorted({(r["batch"], r["budget"]) for r in rows})
    by = {(r["drafter"], r["batch"], r["budget"]): r for r in rows}
    head = ["batch", "budget", *[f"{d}: wall median (p90) / CPU median, µs" for d in drafters]]

    def cell(r: dict) -> str:
        return f"{r['us_median']:.1f} ({r['us_p90']:.1f}) / {r['cpu_us_median']:.1f}"

    body = [[str(b), str(n), *[cell(by[d, b, n]) for d in drafters]] for b, n in keys]
    text = _md(head, body)
    if single:
        text += "\n\nOne source at a time (batch 64, budget 64): " + ", ".join(
            f"{r['drafter']} {r['us_median']:.1f} / CPU {r['cpu_us_median']:.1f} µs" for r in single
        )
    return text


def report_mal(rows: list[dict], budgets: list[int]) -> str:
    names = list(dict.fromkeys(r["drafter"] for r in rows))
    by = {(r["drafter"], r["budget"]): r for r in rows}
    head = ["drafter", *[f"MAL @{b}" for b in budgets], *[f"vs bar @{b}" for b in budgets if b in BAR]]
    body = []
    for n in names:
        cells = [n, *[f"{by[n, b]['mal']:.3f}" for b in budgets]]
        cells += [f"{100 * (by[n, b]['mal'] / BAR[b] - 1):+.1f}%" for b in budgets if b in BAR]
        body.append(cells)
    body.append(
        [
            "bar: SSSD published",
            *[f"{BAR[b]:.2f}" if b in BAR else "" for b in budgets],
            *["" for b in budgets if b in BAR],
        ]
    )
    return _md(head, body) + _margin(by, names, budgets)


SINGLE = ("prompt lookup (baseline)", "input only", "datastore only", "recent pool only")
HEADLINE = "fused, calibrated (cross-fit)"


def _margin(by: dict, names: list[str], budgets: list[int]) -> str:
    """The calibrated fused row against the best single source / baseline at each budget."""
    single = [n for n in names if n in SINGLE]
    if HEADLINE not in names or not single:
        return ""
    cells = []
    for b in budgets:
        best = max(single, key=lambda n: by[n, b]["mal"])
        gain = by[HEADLINE, b]["mal"] / by[best, b]["mal"] - 1
        cells.append(f"@{b}: {100 * gain:+.1f}% over {best}")
    return f"\n\n{HEADLINE} vs the best single source or baseline: " + "; ".join(cells) + "."


def report_allocation(rows: list[dict]) -> str:
    by = {(r["budget"], r["allocation"]): r for r in rows}
    body = []
    for b in sorted({r["budget"] for r in rows}):
        even, glob = by[b, "per-request"], by[b, "global"]
        body.append(
            [
                str(b),
                f"{even['mal']:.3f}",
                f"{glob['mal']:.3f}",
                f"{100 * (glob['mal'] / even['mal'] - 1):+.1f}%",
                f"{even['drafted_per_step']:.1f} / {glob['drafted_per_step']:.1f}",
            ]
        )
    head = [
        "nodes per request (total = x batch)",
        "MAL even split",
        "MAL global",
        "gain",
        "nodes used per step (even / global)",
    ]
    return _md(head, body)


def plot_mal(rows: list[dict], path: Path) -> None:
    """MAL vs budget per drafter row, with the bar (needs matplotlib: the ``bench`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name in dict.fromkeys(r["drafter"] for r in rows):
        pts = sorted((r["budget"], r["mal"]) for r in rows if r["drafter"] == name)
        ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ax.plot(list(BAR), list(BAR.values()), "k*", markersize=12, label="bar: SSSD published")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["budget"] for r in rows}), [str(b) for b in sorted({r["budget"] for r in rows})])
    ax.set_xlabel("draft nodes per request (budget)")
    ax.set_ylabel("MAL (tokens per step)")
    ax.set_title("SmolLM2-135M dev pairs (244), teacher-forced replay, batch 16")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _how(part: dict) -> str:
    m = part["machine"]
    return (
        f"`{m['command'].strip()}` — {m['cpus']} CPUs, {m['omp_threads']} OpenMP threads "
        f"(OMP_WAIT_POLICY={m.get('omp_wait_policy') or 'unset'}), "
        f"load average {m['loadavg_at_start'][0]} at start"
        + (f", commit {m['git_commit']}" if m.get("git_commit") else "")
    )


def render(out: dict, budgets: list[int]) -> str:
    """Markdown of every part present in the results (so partial reruns keep the others)."""
    text = ["# Drafter benchmarks\n"]
    for key in sorted(k for k in out if k.startswith("latency_omp")):
        lat = out[key]
        text += [
            f"## (a) propose latency, {lat['machine']['omp_threads']} OpenMP thread(s): µs per request per "
            f"step, 500-token contexts, datastore {lat['tokens']:,} tokens ({lat['datastore']})\n",
            _how(lat) + "\n",
            report_latency(lat["rows"]) + "\n",
        ]
    if "mal" in out:
        mal = out["mal"]
        text += [
            f"## (b) MAL, {mal['pairs']} dev pairs, batch {mal['batch_size']}\n",
            _how(mal) + "\n",
            report_mal(mal["rows"], budgets) + "\n",
        ]
    if "allocation" in out:
        al = out["allocation"]
        text += [
            f"## (c) global vs even allocation (fused, calibrated cross-fit), batch {al['batch_size']}\n",
            _how(al) + "\n",
            report_allocation(al["rows"]) + "\n",
        ]
    return "\n".join(text)
