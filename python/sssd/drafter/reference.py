"""Slow, obviously-correct Python versions of the drafter's native selection, allocation and tree
buffers: the test oracle. Not for production use.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence


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
