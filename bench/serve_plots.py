"""Plots of the serving benchmark (matplotlib, PNG): latency vs rate per policy, chosen budget vs batch
size, SLO attainment per class."""

from __future__ import annotations

from pathlib import Path


def plot_all(rows: list[dict], out_dir: Path, mode: str, which: str = "all") -> list[Path]:
    """Writes serve_<mode>_{latency,budget,slo}.png (``which="slo"``: only the SLO plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    rates = sorted({r["rate"] for r in rows})
    files = []

    if which == "all":  # latency vs rate, budget vs batch size
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for pol in policies:
            rs = sorted(
                (r for r in rows if r["policy"] == pol and r.get("requests")), key=lambda r: r["rate"]
            )
            axes[0].plot([r["rate"] for r in rs], [r["mean_latency_s"] for r in rs], marker="o", label=pol)
            axes[1].plot([r["rate"] for r in rs], [r["p90_latency_s"] for r in rs], marker="o", label=pol)
        for ax, what in zip(axes, ("mean", "p90"), strict=True):
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(f"{what} request latency (s)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            _rate_ticks(ax, rates)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(f"serving latency vs rate ({mode})")
        fig.tight_layout()
        files.append(out_dir / f"serve_{mode}_latency.png")
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)

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
        fig.tight_layout()
        files.append(out_dir / f"serve_{mode}_budget.png")
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, cls in zip(axes, ("tight", "relaxed"), strict=True):
        for pol in policies:
            rs = sorted(
                (r for r in rows if r["policy"] == pol and r.get("requests")), key=lambda r: r["rate"]
            )
            ax.plot([r["rate"] for r in rs], [r.get(f"attain_{cls}") for r in rs], marker="o", label=pol)
        ax.set_xscale("log")
        _rate_ticks(ax, rates)
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(f"{cls} TPOT class")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("SLO attainment (share of requests meeting TPOT)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    files.append(out_dir / f"serve_{mode}_slo.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    return files


def _rate_ticks(ax, rates) -> None:
    ax.set_xticks(rates)
    ax.set_xticklabels([f"{r:g}" for r in rates])
    ax.minorticks_off()
