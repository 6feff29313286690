"""Slow, obviously-correct Python versions of the drafter's native selection, allocation, tree buffers
and recycled candidates: the test oracle. Not for production use.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

RECYCLED, RESCORED, ABSENT_RANK = 3, 4, 63  # source ids and the rank of an absent candidate (calibration.h)
RESCORE_MAX_MATCH = 9  # retrieval nodes with a match this long keep their scores (recycled.h)
PAIR_RANK_BASE = 8


def recycled_match(rank: int, pair: bool) -> int:
    """The match-length feature of a recycled candidate of rank ``rank`` (calibration.h)."""
    return (PAIR_RANK_BASE + 1 if pair else 1) + min(rank, PAIR_RANK_BASE - 1)


def pair_slot(a: int, b: int, slots: int) -> int:
    """The slot of pair (a, b) in a direct-mapped pair table of ``slots`` slots (recycled.h)."""
    key = (a << 32) | b
    return ((key * 0x9E3779B97F4A7C15) % 2**64) >> (64 - (slots.bit_length() - 1))


def select_sequence(
    parents: Sequence[int],
    f: Sequence[float],
    depth: Sequence[int],
    cap: int,
    max_depth: int,
    max_width: int = 0,
) -> list[int]:
    """Best-first order of non-root nodes: repeatedly take the frontier node of largest f (ties: lower
    index), skipping nodes deeper than max_depth and nodes whose depth already holds max_width nodes."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[parents[i]].append(i)
    heap: list[tuple[float, int]] = []
    width: dict[int, int] = {}
    seq: list[int] = []

    def push(v: int) -> None:
        for c in children[v]:
            if depth[c] <= max_depth:
                heapq.heappush(heap, (-f[c], c))

    push(0)
    while heap and len(seq) < cap:
        _, v = heapq.heappop(heap)
        if max_width > 0 and width.get(depth[v], 0) >= max_width:
            continue
        width[depth[v]] = width.get(depth[v], 0) + 1
        seq.append(v)
        push(v)
    return seq


def best_connected_sum(parents: Sequence[int], f: Sequence[float], k: int, max_depth: int = 1 << 30) -> float:
    """Brute force: the largest sum of f over k non-root nodes forming, with the root, a connected
    subtree with depth <= max_depth. Exponential; for small trees only."""
    n = len(parents)
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    nodes = [i for i in range(1, n) if depth[i] <= max_depth]
    best = 0.0 if k == 0 else -math.inf
    for combo in itertools.combinations(nodes, min(k, len(nodes))):
        chosen = set(combo) | {0}
        if all(parents[v] in chosen for v in combo):
            best = max(best, sum(f[v] for v in combo))
    return best


def allocate_budget(
    seq_f: Sequence[Sequence[float]],
    budget: int,
    tpot: Sequence[float] | None = None,
    step_time: float = 0.0,
    slack: float = 0.0,
) -> list[int]:
    """The tree that takes each rank (see csrc/core/draft_tree.h: SLO phase, then merge by f)."""
    b = len(seq_f)
    taken = [0] * b
    order: list[int] = []
    if tpot is not None:
        expected = [1.0] * b

        def need(i: int) -> float:
            t = tpot[i]
            if not (t > 0 and math.isfinite(t)) or taken[i] >= len(seq_f[i]):
                return -math.inf
            return (step_time + slack) / t - expected[i]

        while len(order) < budget:
            needs = [need(i) for i in range(b)]
            i = max(range(b), key=lambda j: (needs[j], -j), default=-1)
            if i < 0 or needs[i] <= 0:
                break
            expected[i] += seq_f[i][taken[i]]
            taken[i] += 1
            order.append(i)
    while len(order) < budget:
        live = [i for i in range(b) if taken[i] < len(seq_f[i])]
        if not live:
            break
        i = max(live, key=lambda j: (seq_f[j][taken[j]], -j))
        taken[i] += 1
        order.append(i)
    return order


def expand_recycled(
    tree: dict,
    table: dict,
    cal_p: Callable[[int, int, int, float], float] | None,
    *,
    max_depth: int,
    min_f: float,
    max_new: int,
    from_every_node: bool = True,
    match_edges: Sequence[int] = (1,),
    pairs: dict | None = None,
    root_prev: int = -1,
) -> dict:
    """The recycled candidates added to a merged tree (csrc/core/recycled.h): rescoring, then best-first
    expansion. tree: lists ``tokens``, ``parents``, ``p``, ``f``, ``source`` (node 0 the root), optionally
    ``match_len`` (the retrieval match length, default 0: nodes of RESCORE_MAX_MATCH or more are not
    rescored); table:
    token -> (ids, probs), best first; pairs: (previous token, token) -> (ids, probs), the pair rows the
    table holds, preferred to the token's row; root_prev: the token before the root (-1: none);
    cal_p(source, depth, match, raw) -> p (None: p = raw); match_edges: the calibration's match-length
    bins (for the bound on a new candidate's p). Returns the tree's lists, with ``depth``, ``raw``,
    ``match_len`` and ``source_mask`` added."""

    def distinct(rows: dict) -> dict:  # a token repeated in a row is kept once, at its best rank
        out = {}
        for key, (ids, probs) in rows.items():
            first = {}
            for i, p in zip(ids, probs, strict=True):
                first.setdefault(int(i), float(p))
            out[key] = (list(first), list(first.values()))
        return out

    table, pairs = distinct(table), distinct(pairs or {})
    t = {k: list(tree[k]) for k in ("tokens", "parents", "p", "f", "source")}
    n = len(t["tokens"])
    t["depth"] = [0] * n
    for v in range(1, n):
        t["depth"][v] = t["depth"][t["parents"][v]] + 1
    t["raw"], t["source_mask"] = [1.0] + [0.0] * (n - 1), [0] * n  # the root: raw 1
    t["match_len"] = [int(x) for x in tree["match_len"]] if "match_len" in tree else [0] * n
    if max_new <= 0 or max_depth < 1:
        return t
    kids = {}
    for v in range(1, n):
        kids[(t["parents"][v], t["tokens"][v])] = v  # the latest child with a token is the one found

    def cal(source: int, depth: int, match: int, raw: float) -> float:
        return float(np.float32(raw if cal_p is None else cal_p(source, depth, match, raw)))

    def row_of(v: int) -> tuple[list, list, bool]:  # the pair's row when there is one, else the token's
        a = root_prev if v == 0 else t["tokens"][t["parents"][v]]
        if a >= 0 and (a, t["tokens"][v]) in pairs:
            return (*pairs[(a, t["tokens"][v])], True)
        return (*table.get(t["tokens"][v], ((), ())), False)

    rest = sorted(t["f"][1:], reverse=True)
    relevant_f = 0.25 * (rest[max_new - 1] if len(rest) >= max_new else 0.0)
    relevant = [v for v in range(1, n) if t["f"][v] >= relevant_f]  # pre-rescoring f, parents first
    for v in relevant:  # 1. rescoring
        u = t["parents"][v]
        ids, _, pair = row_of(u)
        # a node absent from the row keeps its retrieval score
        if 0 <= t["source"][v] < RECYCLED and t["tokens"][v] in ids and t["match_len"][v] < RESCORE_MAX_MATCH:
            match = recycled_match(list(ids).index(t["tokens"][v]), pair)
            t["raw"][v] = t["p"][v]
            t["p"][v] = cal(RESCORED, t["depth"][v], match, t["p"][v])
            t["source"][v], t["match_len"][v] = RESCORED, match
            t["source_mask"][v] |= 1 << RECYCLED
        t["f"][v] = t["f"][u] * t["p"][v]
    best: list[float] = []  # the max_new largest f (a min-heap); the floor only rises
    floor = [0.0]

    def keep_best(f: float) -> None:
        if len(best) < max_new:
            heapq.heappush(best, f)
        elif f > best[0]:
            heapq.heapreplace(best, f)
        if len(best) == max_new:
            floor[0] = max(floor[0], best[0])

    def good(f: float) -> bool:
        return f >= min_f and f > floor[0]

    for v in relevant:
        keep_best(t["f"][v])
    bound = [1.0] + [
        1.0 if cal_p is None else max(cal(RECYCLED, d, max(m, 1), 1.0) for m in match_edges)
        for d in range(1, max_depth + 1)
    ]
    heap: list[tuple[float, int, int]] = []  # (-f, node, rank): the larger f first

    def push_next(v: int, j: int) -> None:  # 2. the first candidate after v from rank j not a child yet
        d = t["depth"][v] + 1
        if d > max_depth or not good(t["f"][v] * bound[d]):
            return
        ids, probs, pair = row_of(v)
        while j < len(ids) and (v, int(ids[j])) in kids:
            j += 1
        if j < len(ids):
            f = t["f"][v] * cal(RECYCLED, d, recycled_match(j, pair), float(probs[j]))
            if good(f):
                heapq.heappush(heap, (-f, v, j))

    for v in [0, *relevant] if from_every_node else [0]:
        push_next(v, 0)
    added = 0
    while heap and added < max_new:
        neg_f, u, j = heapq.heappop(heap)
        if not good(-neg_f):
            break
        ids, probs, pair = row_of(u)
        push_next(u, j + 1)
        if (u, int(ids[j])) in kids:
            continue
        v = len(t["tokens"])
        kids[(u, int(ids[j]))] = v
        added += 1
        d = t["depth"][u] + 1
        for key, val in (("tokens", int(ids[j])), ("parents", u), ("depth", d), ("source", RECYCLED),
                         ("raw", float(probs[j])), ("match_len", recycled_match(j, pair)),
                         ("p", cal(RECYCLED, d, recycled_match(j, pair), float(probs[j]))),
                         ("source_mask", 1 << RECYCLED),
                         ("f", -neg_f)):  # fmt: skip
            t[key].append(val)
        keep_best(-neg_f)
        push_next(v, 0)
    return t
