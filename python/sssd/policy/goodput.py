"""Pure functions behind the budget policy: goodput-optimal global budget, per-request expectations,
per-request caps and re-ranking of a proposed batch (SLO-first re-ranking: ``sssd.policy.slo``).

They work on any object with the contract's ``DraftBatch`` fields (``parents``, ``probs``, ``offsets``,
``rank``, ``gain``); re-ranked batches are made with :func:`dataclasses.replace`, so the batch's own
``truncate(k)`` keeps working on the new ranking. A prefix of the new ranking is still a valid selection
(connected subtrees containing the roots) because every re-ranking here keeps the original relative order
of the nodes *within* each tree, and the original order within a tree is parent-before-child.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

# accumulated_probs (f(v)) lives with the batch algebra; importing it from here keeps working
from sssd.batch import accumulated_probs, take_nodes, tree_index, tree_sums
from sssd.policy.cost_model import CostModel


@dataclass(frozen=True)
class BudgetChoice:
    """The outcome of evaluating every global budget 0..K of one proposed batch."""

    budget: int  # chosen global budget (non-root nodes kept)
    expected_accepted: float  # Σ f over the kept nodes (after the acceptance correction)
    predicted_s: float  # predicted step time at the chosen budget
    goodput: np.ndarray  # [K+1] expected tokens per second for each candidate budget
    step_s: np.ndarray  # [K+1] predicted step time for each candidate budget


def choose_budget(
    gain: np.ndarray,
    batch_size: int,
    n_context: int,
    cost: CostModel,
    *,
    max_budget: int | None = None,
    drafted: bool = True,
    correction: float = 1.0,
    min_gain: float = 0.0,
    draft_budget: int | None = None,
    tree_pairs: np.ndarray | None = None,
    head_levels: np.ndarray | None = None,
) -> BudgetChoice:
    """Highest expected goodput = (batch_size + correction·gain[k]) / predicted_time(k) over k = 0..K.

    ``gain`` [M+1] from the batch (gain[0] = 0). ``drafted``: the propose call is part of this step
    (its time is then in every candidate, including k = 0, as it has been spent) and ``draft_budget`` the
    budget it was called with (default: each candidate's own); ``tree_pairs`` [M+1]: each candidate's tree
    attention pairs (:func:`candidate_tree_pairs`; default the cost model's even-spread estimate) and
    ``head_levels`` [M+1] the expected output-head calls beyond the first (:func:`expected_head_levels`;
    default none). Ties and candidates
    within ``min_gain`` (relative) of budget 0 go to the smaller budget, so noise never buys speculation.
    """
    gain = np.asarray(gain, dtype=np.float64)
    if gain.ndim != 1 or len(gain) == 0:
        raise ValueError("gain must be a non-empty 1-D array (gain[0] = 0)")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    k_max = len(gain) - 1 if max_budget is None else min(len(gain) - 1, max(0, int(max_budget)))
    ks = np.arange(k_max + 1)
    pairs = None if tree_pairs is None else np.asarray(tree_pairs, dtype=np.float64)[: k_max + 1]
    levels = None if head_levels is None else np.asarray(head_levels, dtype=np.float64)[: k_max + 1]
    step = cost.predict(
        batch_size, n_context, ks, drafted=drafted, draft_budget=draft_budget, tree_pairs=pairs,
        head_levels=levels,
    ).total  # fmt: skip
    step = np.maximum(step, 1e-9)
    tokens = batch_size + correction * gain[: k_max + 1]
    goodput = tokens / step
    best = int(np.argmax(goodput))  # first maximum: the smallest budget among equals
    if best > 0 and goodput[best] <= goodput[0] * (1.0 + min_gain):
        best = 0
    return BudgetChoice(best, float(correction * gain[best]), float(step[best]), goodput, step)


def explore_budget(
    choice: BudgetChoice, gain: np.ndarray, correction: float, tick: int, every: int, *,
    plain: bool = False, warmup: int = 0,
) -> BudgetChoice:  # fmt: skip
    """Local exploration around the goodput-optimal budget ``k`` at drafted step ``tick`` (1, 2, ...): on
    one of every ``every`` steps half of it (0 instead with ``plain``), ``every`` steps later one and a half
    times it (within the batch); during the first ``warmup`` steps every other step.

    A cost model fitted only on the sizes the policy picks cannot tell their cost from the constant while
    it always picks the same size, so a wrong slope would never be corrected. Goodput is flat around its
    optimum, so these steps cost little, and they give the model sizes on both sides of it (and, with
    ``plain``, a plain decoding step when the engine has had none for a while). ``gain`` [K+1] as in
    :func:`choose_budget`; returns the (possibly) moved choice."""
    every = 2 if tick <= warmup else every
    if every <= 0 or tick % every != 0 or choice.budget == 0:
        return choice
    k_max = len(choice.goodput) - 1
    if (tick // every) % 2 == 0:
        k = 0 if plain else choice.budget // 2
    else:
        k = min(k_max, (3 * choice.budget + 1) // 2)
    if k == choice.budget:
        return choice
    return BudgetChoice(
        k, float(correction * gain[k]), float(choice.step_s[k]), choice.goodput, choice.step_s
    )


def request_gain_table(batch, f: np.ndarray | None = None) -> np.ndarray:
    """Expected accepted tokens of every request for every global budget: [K+1, B] float64, where row k
    sums f over the request's nodes with rank < k (the batch's ``truncate(k)``)."""
    f = accumulated_probs(batch) if f is None else f
    rank = np.asarray(batch.rank)
    offsets = np.asarray(batch.offsets)
    b = len(offsets) - 1
    k_total = len(batch.gain) - 1
    tree = tree_index(offsets)
    table = np.zeros((k_total + 1, b), dtype=np.float64)
    nodes = np.flatnonzero(rank >= 0)
    np.add.at(table, (rank[nodes] + 1, tree[nodes]), f[nodes])
    return np.cumsum(table, axis=0)


def candidate_tree_pairs(batch, context_lens) -> np.ndarray:
    """The tree attention pairs (``sssd.policy.cost_model.tree_pairs_of``) of every global budget: [K+1]
    float64, row k for the batch's ``truncate(k)``, with ``context_lens`` [B] the requests' committed
    tokens. The attention runs padded to the largest tree, so where the nodes go matters, not only how many
    there are."""
    rank = np.asarray(batch.rank)
    offsets = np.asarray(batch.offsets)
    b = len(offsets) - 1
    ctx = np.asarray(context_lens, dtype=np.int64)
    if ctx.shape != (b,):
        raise ValueError(f"context_lens must have one entry per request ({b}), got {ctx.shape}")
    tree = tree_index(offsets)
    counts = np.zeros((len(batch.gain), b), dtype=np.int64)
    nodes = np.flatnonzero((rank >= 0) & (rank < len(batch.gain) - 1))
    np.add.at(counts, (rank[nodes] + 1, tree[nodes]), 1)
    counts = np.cumsum(counts, axis=0)  # [K+1, B] draft nodes of each request in each prefix
    n_max = 1 + counts.max(axis=1)
    rows = (ctx[None, :] + 1 + counts).max(axis=1)
    return (b * (n_max - 1) * rows).astype(np.float64)


def expected_head_levels(batch, scale=None) -> np.ndarray:
    """The output-head calls beyond the first that verifying each global budget's trees is expected to take:
    [K+1] float64, the expected longest accepted path over the requests. The walk asks the head for one
    depth at a time, so the longest path sets the calls. A request's path reaches depth ``d`` with the
    summed probability of its kept nodes at that depth (paths to different nodes exclude each other), each
    node's ``f`` times its request's acceptance correction ``scale`` [B] (default 1); requests are taken
    as independent: E[longest] = Σ_d (1 - Π_r (1 - P(request r reaches d))). One pass over the nodes in
    rank order, each updating its depth's product (O(K), whatever the batch and the trees' depth)."""
    rank = np.asarray(batch.rank)
    offsets = np.asarray(batch.offsets)
    k_total = len(batch.gain) - 1
    f = accumulated_probs(batch)
    tree = tree_index(offsets)
    if scale is not None:
        f = f * np.asarray(scale, dtype=np.float64)[tree]
    depth = np.asarray(batch.depth)
    nodes = np.flatnonzero((rank >= 0) & (rank < k_total))
    nodes = nodes[np.argsort(rank[nodes], kind="stable")]
    out = np.zeros(k_total + 1)
    reach: dict[tuple[int, int], float] = {}  # P(request r reaches depth d)
    prod: dict[int, float] = {}  # Π_r (1 - P) over the requests below 1 at depth d
    full: dict[int, int] = {}  # requests certain to reach depth d
    total = 0.0
    for i, v in enumerate(nodes.tolist()):
        d, key = int(depth[v]), (int(tree[v]), int(depth[v]))
        old = reach.get(key, 0.0)
        new = min(1.0, old + float(f[v]))
        reach[key] = new
        before = 1.0 if full.get(d, 0) else 1.0 - prod.get(d, 1.0)
        if old >= 1.0:
            full[d] -= 1
        else:
            prod[d] = prod.get(d, 1.0) / (1.0 - old)
        if new >= 1.0:
            full[d] = full.get(d, 0) + 1
        else:
            prod[d] *= 1.0 - new
        total += (1.0 if full.get(d, 0) else 1.0 - prod[d]) - before
        out[i + 1] = total
    out[len(nodes) + 1 :] = total
    return out


def rerank(batch, order_key: np.ndarray):
    """A copy of ``batch`` whose ``rank``/``gain`` follow the non-root nodes sorted by ``order_key`` [N]
    (ascending, stable; ties keep the original rank order). Nodes with key = +inf are dropped (rank -1
    would make them roots, so they get ranks after every kept node and the gain stops before them)."""
    rank = np.asarray(batch.rank)
    nodes = np.flatnonzero(rank >= 0)
    nodes = nodes[np.argsort(rank[nodes], kind="stable")]  # original order
    key = np.asarray(order_key, dtype=np.float64)[nodes]
    order = nodes[np.argsort(key, kind="stable")]
    kept = int(np.count_nonzero(np.isfinite(key)))
    new_rank = rank.copy()
    new_rank[order] = np.arange(len(order), dtype=rank.dtype)
    f = accumulated_probs(batch)
    gain = np.concatenate([[0.0], np.cumsum(f[order[:kept]])])
    return dataclasses.replace(batch, rank=new_rank, gain=gain)


def scale_by_request(batch, scale: np.ndarray):
    """A copy of ``batch`` whose nodes are valued ``min(f(v) · scale[r], 1)`` for their request ``r`` (each
    request's own acceptance correction, ``scale`` [B]) and ranked by that value; ``gain`` [K+1] is the
    running sum of the values in the new order. One factor per tree keeps each tree's order (f never grows
    from parent to child, ties keep the original order), so every prefix is still connected subtrees."""
    f = accumulated_probs(batch)
    rank = np.asarray(batch.rank)
    offsets = np.asarray(batch.offsets)
    scale = np.asarray(scale, dtype=np.float64)
    if scale.shape != (len(offsets) - 1,):
        raise ValueError(f"scale must have one entry per request ({len(offsets) - 1}), got {scale.shape}")
    tree = tree_index(offsets)
    value = np.minimum(f * scale[tree], 1.0)
    nodes = np.flatnonzero(rank >= 0)
    nodes = nodes[np.argsort(rank[nodes], kind="stable")]  # the drafter's order: best first
    order = nodes[np.argsort(-value[nodes], kind="stable")]
    new_rank = rank.copy()
    new_rank[order] = np.arange(len(order), dtype=rank.dtype)
    gain = np.concatenate([[0.0], np.cumsum(value[order])])
    return dataclasses.replace(batch, rank=new_rank, gain=gain)


def kept_per_request(batch) -> np.ndarray:
    """Σ f(v) over each request's non-root nodes of a (truncated) batch: [B] float64, the drafter's own
    expected accepted tokens per request."""
    f = np.where(np.asarray(batch.parents) >= 0, accumulated_probs(batch), 0.0)
    return tree_sums(f, batch.offsets)


def cap_per_request(batch, cap: int):
    """Re-ranks so that no request gets more than ``cap`` nodes in any prefix: each tree's nodes beyond
    its first ``cap`` (in rank order) are dropped from the gain curve."""
    if cap < 0:
        raise ValueError(f"per-request cap must be >= 0, got {cap}")
    rank = np.asarray(batch.rank)
    offsets = np.asarray(batch.offsets)
    tree = tree_index(offsets)
    key = np.full(len(rank), np.inf)
    nodes = np.flatnonzero(rank >= 0)
    nodes = nodes[np.argsort(rank[nodes], kind="stable")]
    # position of each node within its own tree's rank order: a stable sort by tree keeps the rank order
    # inside each tree, and a node's position is its distance from its tree's first node there
    owner = tree[nodes]
    by_tree = np.argsort(owner, kind="stable")
    sorted_owner = owner[by_tree]
    pos = np.empty(len(nodes), dtype=np.int64)
    pos[by_tree] = np.arange(len(nodes)) - np.searchsorted(sorted_owner, sorted_owner, side="left")
    keep = pos < cap
    key[nodes[keep]] = rank[nodes[keep]]
    return rerank(batch, key)


def truncate_batch(batch, k: int):
    """The batch restricted to its roots and the nodes with rank < ``k`` (parents re-indexed).

    Uses the batch's own ``truncate`` when it has one (the drafter's DraftBatch); this generic version
    serves contract-conforming stand-ins (baseline drafters). Per-node arrays of length N are filtered;
    ``offsets`` recomputed; ``gain`` cut to [k+1].
    """
    if hasattr(batch, "truncate"):
        return batch.truncate(k)
    k = int(k)
    if k < 0:
        raise ValueError(f"truncate: k must be >= 0, got {k}")
    out = take_nodes(batch, np.asarray(batch.rank) < k)  # roots have rank -1
    return dataclasses.replace(out, gain=np.asarray(batch.gain)[: k + 1])
