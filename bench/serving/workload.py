"""What the simulated and the real mode of the serving benchmark share: workloads, policies, metrics.

A workload is a list of requests arriving as a Poisson process at a given rate (requests/s), each
taking a (prompt, output) pair and, for SLO runs, a TPOT target class. Metrics per finished request:
latency (arrival → last token), TPOT ((last token − first token) / (tokens − 1)), and whether the TPOT
target was met. Each policy under test is a fresh ``BudgetPolicy`` seeded with the same cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import corpora
import numpy as np
from sssd.policy.adaptive import BudgetConfig, BudgetPolicy
from sssd.policy.cost_model import CostModel

# Policies compared by the benchmark: name -> (mode, budget, use SLO targets).
POLICIES: dict[str, tuple[str, int, bool]] = {
    "no-spec": ("fixed", 0, False),
    "fixed-8": ("fixed", 8, False),
    "fixed-16": ("fixed", 16, False),
    "fixed-64": ("fixed", 64, False),
    "adaptive": ("adaptive", 64, False),
    "adaptive+slo": ("adaptive", 64, True),
}
# Variants run only when named with --policies: SLO-first ranking by the drafter instead of the policy;
# SLO mode without SLO-aware admission (FIFO admission, SLO-aware speculation only).
EXTRA_POLICIES: dict[str, tuple[str, int, bool]] = {
    "adaptive+slo-drafter": ("adaptive", 64, True),
    "adaptive+slo-noadmit": ("adaptive", 64, True),
}


@dataclass(frozen=True)
class Arrival:
    rid: int
    arrival_s: float
    pair: int  # index into the pair list
    slo_class: str  # "tight" | "relaxed"
    tpot_target_s: float


@dataclass
class Finished:
    rid: int
    arrival_s: float
    first_token_s: float
    finish_s: float
    tokens: int
    slo_class: str
    tpot_target_s: float

    @property
    def latency_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        if self.tokens <= 1:
            return self.finish_s - self.first_token_s
        return (self.finish_s - self.first_token_s) / (self.tokens - 1)


def poisson_workload(
    n_pairs: int,
    rate: float,
    n_requests: int,
    *,
    seed: int = 0,
    tight_frac: float = 0.2,
    tight_tpot_s: float = 0.05,
    relaxed_tpot_s: float = 0.2,
) -> list[Arrival]:
    """``n_requests`` arrivals at ``rate`` per second (exponential gaps), pairs drawn without
    replacement (cycling), a ``tight_frac`` share of them in the tight TPOT class."""
    if rate <= 0 or n_requests < 1 or n_pairs < 1:
        raise ValueError("rate, n_requests and n_pairs must be positive")
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n_requests))
    order = np.concatenate([rng.permutation(n_pairs) for _ in range(-(-n_requests // n_pairs))])
    tight = rng.random(n_requests) < tight_frac
    return [
        Arrival(
            rid=i,
            arrival_s=float(t[i]),
            pair=int(order[i]),
            slo_class="tight" if tight[i] else "relaxed",
            tpot_target_s=tight_tpot_s if tight[i] else relaxed_tpot_s,
        )
        for i in range(n_requests)
    ]


@dataclass
class StepLog:
    batch_size: list[int] = field(default_factory=list)
    budget: list[int] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    expected: list[float] = field(default_factory=list)

    def add(self, batch_size: int, budget: int, step_s: float, accepted: int, expected: float) -> None:
        self.batch_size.append(batch_size)
        self.budget.append(budget)
        self.step_s.append(step_s)
        self.accepted.append(accepted)
        self.expected.append(expected)


def summarize(done: list[Finished], steps: StepLog | None = None) -> dict:
    """Mean/p90 latency and TPOT, throughput (output tokens / makespan) and attainment per class."""
    if not done:
        return {"requests": 0}
    lat = np.array([d.latency_s for d in done])
    tpot = np.array([d.tpot_s for d in done])
    tokens = sum(d.tokens for d in done)
    span = max(d.finish_s for d in done) - min(d.arrival_s for d in done)
    out = {
        "requests": len(done),
        "tokens": tokens,
        "mean_latency_s": float(lat.mean()),
        "p90_latency_s": float(np.percentile(lat, 90)),
        "mean_tpot_s": float(tpot.mean()),
        "p90_tpot_s": float(np.percentile(tpot, 90)),
        "throughput_tok_s": tokens / span if span > 0 else float("nan"),
    }
    for cls in ("tight", "relaxed"):
        sel = [d for d in done if d.slo_class == cls]
        out[f"attain_{cls}"] = (
            float(np.mean([d.tpot_s <= d.tpot_target_s for d in sel])) if sel else float("nan")
        )
        out[f"mean_latency_{cls}_s"] = float(np.mean([d.latency_s for d in sel])) if sel else float("nan")
    if steps is not None and steps.step_s:
        out["steps"] = len(steps.step_s)
        out["mean_budget"] = float(np.mean(steps.budget))
        out["mean_batch"] = float(np.mean(steps.batch_size))
        exp = float(np.sum(steps.expected))
        out["accept_ratio"] = float(np.sum(steps.accepted)) / exp if exp > 0 else float("nan")
    return out


def budget_by_batch(log: StepLog) -> dict[int, float]:
    """Mean chosen global budget per batch size (for the budget plot)."""
    b = np.array(log.batch_size)
    k = np.array(log.budget)
    return {int(x): float(k[b == x].mean()) for x in np.unique(b)}


def make_policy(name: str, cost: CostModel) -> tuple[BudgetPolicy, bool]:
    """A fresh policy of ``name`` (POLICIES, EXTRA_POLICIES) and whether it uses the TPOT targets."""
    mode, budget, slo = {**POLICIES, **EXTRA_POLICIES}[name]
    fresh = CostModel.from_dict(cost.to_dict())  # each run learns online from the same seed
    cfg = BudgetConfig(
        mode=mode,
        budget=budget,
        slo_via_drafter=name.endswith("-drafter"),
        slo_admission=not name.endswith("-noadmit"),
    )
    return BudgetPolicy(cfg, fresh), slo


def slo_targets(cost: CostModel, batch: int, args) -> tuple[float, float]:
    """Tight = ``--tight`` x the predicted plain step at ``batch`` requests (of ~300 context tokens);
    relaxed = ``--relaxed`` x it, unless given in seconds."""
    step = float(cost.predict(batch, 300 * batch, 0).total)
    tight = args.tight_s or args.tight * step
    relaxed = args.relaxed_s or args.relaxed * step
    return tight, relaxed


def workload_for(args, n_pairs: int, rate: float, seed: int, targets: tuple[float, float]) -> list[Arrival]:
    """The run's workload at ``rate``: ``args.requests`` arrivals with the tight / relaxed targets."""
    tight, relaxed = targets
    return poisson_workload(
        n_pairs, rate, args.requests, seed=seed, tight_tpot_s=tight, relaxed_tpot_s=relaxed
    )


def datastore_path() -> Path:
    """The datastore of the other-outputs corpus with the SmolLM2 tokenizer's fingerprint (built once
    into the bench cache, ``~/.cache/sssd/bench``)."""
    from sssd.models.local import cache_dir, load_tokenizer

    return corpora.outputs_datastore(load_tokenizer(), cache_dir() / "bench")
