"""A synthetic engine loop for budget-policy tests: a known forward-cost curve, a drafter whose node
probabilities are the true acceptance probabilities (calibrated), seeded acceptance and timing noise.

``run_policy(policy, curve, batch, steps)`` drives ``policy`` as the engine does (plan, propose, select,
observe) and returns the chosen budgets and the tokens and seconds of every step; ``best_fixed(curve,
batch, budgets)`` gives the expected goodput of each fixed budget, so a test knows the best one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from sssd.policy.adaptive import StepRecord, StepView
from sssd.policy.goodput import accumulated_probs, request_gain_table

from tests.fake_drafts import FakeDrafter

DRAFT_S = 2e-4  # one propose call
OTHER_S = 5e-3  # verification and bookkeeping of a step
CONTEXT = 300  # committed tokens per request (constant: the curves ignore it)


def piecewise(points: dict[int, float], tree_s: float = 0.0):
    """Forward seconds as a function of scored tokens: linear interpolation between ``points`` {n: s}
    (linear extrapolation past the last two), plus ``tree_s`` when any draft node is scored."""
    ns = np.array(sorted(points), dtype=np.float64)
    ts = np.array([points[int(n)] for n in ns])

    def curve(n_batched: int, batch_size: int) -> float:
        n = float(n_batched)
        t = np.interp(n, ns, ts)
        if n > ns[-1]:
            t = ts[-1] + (n - ns[-1]) * (ts[-1] - ts[-2]) / (ns[-1] - ns[-2])
        return float(t) + (tree_s if n_batched > batch_size else 0.0)

    return curve


def _accepted(kept, u: np.ndarray) -> list[int]:
    """Accepted draft nodes per request with the model's token at depth ``d`` of request ``r`` drawn by
    ``u[r, d]`` (uniform): among the children of the last accepted node, the one whose probability
    interval (p's of its earlier siblings summed, then its own) holds the draw is accepted. The same
    draws for every policy (common random numbers) make their realized goodputs comparable."""
    out = []
    for r in range(len(kept.offsets) - 1):
        lo, hi = int(kept.offsets[r]), int(kept.offsets[r + 1])
        parents, probs = kept.parents[lo:hi], kept.probs[lo:hi]
        node, depth = 0, 0
        while True:
            children = np.flatnonzero(parents == node)
            edges = np.cumsum(probs[children])
            hit = np.flatnonzero(u[r, depth] < edges)
            if len(hit) == 0:
                break
            node, depth = int(children[hit[0]]), depth + 1
        out.append(depth)
    return out


def run_policy(policy, curve, batches, steps: int, *, seed: int = 0, noise: float = 0.05, truth=None):
    """Drives ``policy`` for ``steps`` steps; at step i the drafter holds ``batches[i % len(batches)]`` (one
    batch: always the same). ``truth(kept)``: the true acceptance probability of each kept node (default:
    the drafter's own, i.e. calibrated). Returns (budgets [steps], tokens [steps], seconds [steps])."""
    batches = batches if isinstance(batches, list) else [batches]
    b = len(batches[0].offsets) - 1
    depth = max(int(np.max(x.depth)) for x in batches) + 1
    view = StepView(list(range(b)), [CONTEXT] * b, [10_000] * b, [None] * b)
    budgets, tokens, seconds = [], [], []
    for i in range(steps):
        rng = np.random.default_rng([seed, i])  # this step's draws, whatever the policy does
        u, jitter = rng.random((b, depth)), float(np.exp(rng.normal(0.0, noise)))
        k_plan = int(policy.plan(view))
        proposed, draft_s = None, 0.0
        if k_plan > 0:
            drafter = FakeDrafter(batches[i % len(batches)])
            proposed, draft_s = drafter.propose(view.request_ids, budget=k_plan), DRAFT_S
        decision = policy.decide(view, proposed)
        kept = decision.batch
        k = 0 if kept is None else int(len(kept.tokens) - b)
        if kept is not None and truth is not None:
            kept = dataclasses.replace(kept, probs=np.asarray(truth(kept), dtype=np.float64))
        acc = _accepted(kept, u) if kept is not None and k > 0 else [0] * b
        fwd = curve(b + k, b) * jitter
        record = StepRecord(
            b, CONTEXT * b, b + k, k_plan, acc, draft_s=draft_s, forward_s=fwd, verify_s=OTHER_S
        )
        step = record.step_s
        policy.observe(decision, record)
        budgets.append(k)
        tokens.append(b + sum(acc))
        seconds.append(step)
    return np.array(budgets), np.array(tokens), np.array(seconds)


def gains_per_request(batch) -> np.ndarray:
    """[K+1, B] expected accepted tokens per request at each global budget (for assertions)."""
    return request_gain_table(batch, accumulated_probs(batch))
