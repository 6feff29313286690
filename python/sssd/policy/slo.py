"""TPOT targets in the budget choice: who gets draft nodes first (``slo_first``) and which global budget
serves the targets best without giving up more than a set share of goodput (``slo_choice``). The adaptive
policy (``sssd.policy.adaptive``) calls them when some request of the batch has a target; the targets
themselves and each request's TPOT so far are the ledger's (``sssd.policy.requests``), admission under
targets is ``sssd.policy.admission``."""

from __future__ import annotations

import numpy as np

from sssd.batch import accumulated_probs, tree_index
from sssd.policy.cost_model import CostModel
from sssd.policy.goodput import (
    BudgetChoice,
    candidate_tree_pairs,
    choose_budget,
    expected_head_levels,
    request_gain_table,
    rerank,
)


def slo_first(batch, step_s: float, targets: np.ndarray, *, slack_s: float = 0.0, priority=None):
    """SLO-aware re-ranking (used when the drafter has no SLO selection of its own).

    A request is *short* when its expected tokens per step × TPOT target falls short of the step time:
    (1 + Σf of its nodes so far) · target < step_s + slack_s. Nodes go first to short requests that can
    still reach their target with their candidates (higher priority first, then the most short), each
    node moving its request towards its target, until no such request is short; the remaining nodes
    follow in the original (throughput-optimal) order.
    ``targets`` [B] seconds (inf = no target), ``priority`` [B] (larger = first; default 0).
    """
    f = accumulated_probs(batch)
    rank = np.asarray(batch.rank)
    offsets = np.asarray(batch.offsets)
    b = len(offsets) - 1
    targets = np.asarray(targets, dtype=np.float64)
    prio = np.zeros(b) if priority is None else np.asarray(priority, dtype=np.float64)
    if targets.shape != (b,) or prio.shape != (b,):
        raise ValueError(f"targets and priority must have one entry per request ({b})")
    tree = tree_index(offsets)
    queues = []
    for i in range(b):
        nodes = np.flatnonzero((tree == i) & (rank >= 0))
        queues.append(list(nodes[np.argsort(rank[nodes], kind="stable")]))
    expected = np.ones(b)  # tokens per step so far: the next token
    need = step_s + slack_s
    # A request that cannot reach its target this step even with all of its nodes gets no SLO priority:
    # pouring nodes into it would cost everyone step time and still miss.
    total = 1.0 + np.array([f[q].sum() if q else 0.0 for q in queues])
    reachable = total * targets >= need
    key = np.asarray(rank, dtype=np.float64).copy() + len(rank)  # default: after every SLO node
    next_key = 0
    while True:
        short = np.flatnonzero(
            (expected * targets < need) & reachable & np.array([len(q) > 0 for q in queues])
        )
        if len(short) == 0:
            break
        deficit = need - expected * targets  # most short first within the same priority
        i = short[np.lexsort((-deficit[short], -prio[short]))[0]]
        node = queues[i].pop(0)
        key[node] = next_key
        next_key += 1
        expected[i] += f[node]
    key[rank < 0] = -1  # roots are ignored by rerank
    return rerank(batch, key)


def slo_choice(
    batch,
    choice: BudgetChoice,
    cost: CostModel,
    config,
    context: tuple[int, np.ndarray],
    targets: np.ndarray,
    priority: np.ndarray,
    correction: float,
    *,
    drafter_ranked: bool = False,
) -> tuple[object, BudgetChoice]:
    """Re-ranks ``batch`` SLO-first for the throughput ``choice``'s step time (unless the drafter already
    did: ``drafter_ranked``), then picks, among budgets whose expected goodput is within
    ``config.slo_goodput_tolerance`` of the best, the one meeting the most priority-weighted targets (then
    the best goodput). ``config``: the policy's ``BudgetConfig``; ``context``: (committed tokens of the
    batch, [B] per request); ``targets`` [B] per-step TPOT targets (inf = none), ``priority`` [B];
    ``correction``: the acceptance correction. Returns the batch as ranked and the choice (the throughput
    choice unchanged when no budget is within the tolerance)."""
    n_context, ctx_lens = context
    b = len(ctx_lens)
    step_s = max(choice.predicted_s, 1e-9)
    ranked = (
        batch
        if drafter_ranked
        else slo_first(batch, step_s, targets, slack_s=config.slo_slack_s, priority=priority)
    )
    c2 = choose_budget(
        ranked.gain, b, n_context, cost, correction=correction, draft_budget=config.budget,
        tree_pairs=candidate_tree_pairs(ranked, ctx_lens),
        head_levels=expected_head_levels(ranked, np.full(b, correction)),
    )  # fmt: skip
    best_gp = float(choice.goodput.max())
    table = request_gain_table(ranked, accumulated_probs(ranked))  # [K+1, B]
    tpot = c2.step_s[:, None] / (1.0 + correction * table)  # predicted TPOT per budget and request
    weight = np.where(np.isfinite(targets), 1.0 + np.maximum(priority, 0.0), 0.0)
    met = ((tpot <= targets[None, :]) * weight[None, :]).sum(axis=1)
    ok = c2.goodput >= (1.0 - config.slo_goodput_tolerance) * best_gp
    if not ok.any():
        return batch, choice
    score = np.where(ok, met, -1.0)
    cand = np.flatnonzero(score == score.max())
    k = int(cand[np.argmax(c2.goodput[cand])])  # most targets met, then the best goodput
    return ranked, BudgetChoice(
        k, float(correction * ranked.gain[k]), float(c2.step_s[k]), c2.goodput, c2.step_s
    )
