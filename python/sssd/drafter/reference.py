"""Slow, obviously-correct Python versions of the drafter's native selection, allocation, tree buffers
and recycled candidates: the test oracle. Not for production use.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Collection, Sequence

import numpy as np

RECYCLED, RESCORED, ABSENT_RANK = 3, 4, 63  # source ids and the rank of an absent candidate (calibration.h)
RESCORE_MAX_MATCH = 9  # retrieval nodes with a match this long keep their scores (recycled.h)
PAIR_RANK_BASE = 8
STALE_ROW_MATCH = 2 * PAIR_RANK_BASE + 1  # a stale row's candidates, whatever their rank


def recycled_match(rank: int, pair: bool, stale: bool = False) -> int:
    """The match-length feature of a recycled candidate of rank ``rank`` (calibration.h)."""
    if stale:
        return STALE_ROW_MATCH
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


def select_recycled(
    tree: dict,
    table: dict,
    cal_p: Callable[[int, int, int, float], float] | None,
    *,
    max_depth: int,
    min_f: float,
    cap: int,
    max_width: int = 0,
    from_every_node: bool = True,
    match_edges: Sequence[int] = (1,),
    pairs: dict | None = None,
    root_prev: int = -1,
    trust_match: int = 0,
    stale: Collection[int] = (),
    stale_pairs: Collection[tuple[int, int]] = (),
) -> dict:
    """Best-first selection in a merged tree with the recycled candidates added as it reaches them
    (csrc/core/recycled.h): taking a node rescores its children found in its row, normalizes their p
    (scaled to sum 1 when above), gives them f = f(node) * p and puts its first candidate not a child yet
    on the frontier, with p = min(calibrated p, the room its children and recycled children leave).
    tree: lists ``tokens``, ``parents``, ``p`` (the fused p before normalization), ``f`` (the root's is
    used), ``source`` (node 0 the root), optionally ``match_len`` (default 0: nodes of RESCORE_MAX_MATCH or
    more are not rescored); table: token -> (ids, probs), best first; pairs: (previous token, token) ->
    (ids, probs), the pair rows the table holds, preferred to the token's row; root_prev: the token before
    the root (-1: none); cal_p(source, depth, match, raw) -> p (None: p = raw); match_edges: the
    calibration's match-length bins (for the bound on a candidate's p); trust_match > 0: a node with a
    retrieval child of at least that match length neither rescores its children nor gets candidates;
    stale / stale_pairs: the tokens / pairs whose rows are older than the request (their candidates and
    rescored children have the match feature STALE_ROW_MATCH).
    Returns the tree's lists, with ``depth``, ``raw``, ``match_len``, ``source_mask`` and ``seq`` (the
    selected nodes) added."""

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
    t["p"] = [float(np.float32(x)) for x in t["p"]]
    n = len(t["tokens"])
    t["depth"] = [0] * n
    for v in range(1, n):
        t["depth"][v] = t["depth"][t["parents"][v]] + 1
    t["raw"], t["source_mask"] = [1.0] + [0.0] * (n - 1), [0] * n  # the root: raw 1
    t["match_len"] = [int(x) for x in tree["match_len"]] if "match_len" in tree else [0] * n
    t["seq"] = []
    if cap <= 0 or max_depth < 0:
        return t
    children: list[list[int]] = [[] for _ in range(n)]
    for v in range(n - 1, 0, -1):  # the native child lists: the latest child first
        children[t["parents"][v]].append(v)

    def f32(x: float) -> float:
        return float(np.float32(x))

    def cal(source: int, depth: int, match: int, raw: float) -> float:
        return f32(raw if cal_p is None else cal_p(source, depth, match, raw))

    def row_of(v: int) -> tuple[list, list, bool, bool]:  # the pair's row if any, else the token's; stale
        a, b = root_prev if v == 0 else t["tokens"][t["parents"][v]], t["tokens"][v]
        if a >= 0 and (a, b) in pairs:
            return (*pairs[(a, b)], True, (a, b) in stale_pairs)
        return (*table.get(b, ((), ())), False, b in stale)

    bound = [1.0] + [
        1.0 if cal_p is None else max(cal(RECYCLED, d, max(m, 1), 1.0) for m in match_edges)
        for d in range(1, max_depth + 1)
    ]
    opened: dict[int, dict] = {}  # node -> its row, room and the ranks of its children
    heap: list[tuple[float, int, int, int]] = []  # (-f, node, 0 for a tree node / 1 for a candidate, rank)

    def good(f: float) -> bool:
        return f > 0 and f >= min_f

    def candidate_p(o: dict, d: int, j: int) -> float:
        return min(
            cal(RECYCLED, d, recycled_match(j, o["pair"], o["stale"]), float(o["probs"][j])), o["room"]
        )

    def push_next(v: int, j: int) -> None:  # the first candidate from rank j whose token is not a child
        o = opened[v]
        while j < len(o["ids"]) and j in o["taken"]:
            j += 1
        if j < len(o["ids"]):
            f = t["f"][v] * candidate_p(o, t["depth"][v] + 1, j)
            if good(f):
                heapq.heappush(heap, (-max(f, 0.0), v, 1, j))

    def open_node(v: int) -> None:
        d = t["depth"][v] + 1
        if d > max_depth:
            return
        wants = (from_every_node or v == 0 or t["source"][v] == RECYCLED) and good(t["f"][v] * bound[d])
        trusted = trust_match > 0 and any(
            0 <= t["source"][c] < RECYCLED and t["match_len"][c] >= trust_match for c in children[v]
        )
        ids, probs, pair, old = ((), (), False, False) if trusted else row_of(v)
        wants = wants and not trusted
        o = {
            "ids": ids,
            "probs": probs,
            "pair": pair,
            "stale": old and len(ids) > 0,
            "room": 0.0,
            "taken": set(),
        }
        opened[v] = o
        total = np.float32(0.0)
        for c in children[v]:
            tok = t["tokens"][c]
            if tok in ids:
                rank = list(ids).index(tok)
                o["taken"].add(rank)
                if 0 <= t["source"][c] < RECYCLED and t["match_len"][c] < RESCORE_MAX_MATCH:
                    match = recycled_match(rank, pair, o["stale"])
                    t["raw"][c] = t["p"][c]
                    t["p"][c] = cal(RESCORED, d, match, t["p"][c])
                    t["source"][c], t["match_len"][c] = RESCORED, match
                    t["source_mask"][c] |= 1 << RECYCLED
            total = np.float32(total + np.float32(t["p"][c]))
        for c in children[v]:
            if total > 1:
                t["p"][c] = f32(np.float32(t["p"][c]) / total)
            t["f"][c] = t["f"][v] * t["p"][c]
            heapq.heappush(heap, (-max(t["f"][c], 0.0), c, 0, 0))
        if wants:
            o["room"] = f32(max(np.float32(0.0), np.float32(1.0) - min(total, np.float32(1.0))))
            push_next(v, 0)

    width: dict[int, int] = {}
    open_node(0)
    while heap and len(t["seq"]) < cap:
        neg_f, u, kind, j = heapq.heappop(heap)
        d = t["depth"][u] + kind
        if max_width > 0 and width.get(d, 0) >= max_width:
            continue
        width[d] = width.get(d, 0) + 1
        v = u
        if kind == 1:  # a candidate: its node is created
            o = opened[u]
            p = candidate_p(o, d, j)
            o["room"] = f32(max(np.float32(0.0), np.float32(o["room"]) - np.float32(p)))
            o["taken"].add(j)
            push_next(u, j + 1)
            v = len(t["tokens"])
            children.append([])
            children[u].insert(0, v)
            match = recycled_match(j, o["pair"], o["stale"])
            for key, val in (("tokens", int(o["ids"][j])), ("parents", u), ("depth", d), ("source", RECYCLED),
                             ("raw", float(o["probs"][j])), ("match_len", match),
                             ("p", p), ("source_mask", 1 << RECYCLED), ("f", -neg_f)):  # fmt: skip
                t[key].append(val)
        t["seq"].append(v)
        if len(t["seq"]) < cap:
            open_node(v)
    return t
