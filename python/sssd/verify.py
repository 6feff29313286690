"""Verification of one request's scored tree: which nodes are accepted, and the bonus token.

Every function returns ``(path, bonus)``: ``path`` int64 ``[1 + accepted]`` = tree node indices from the
root (node 0) along the accepted nodes, ``bonus`` = the LLM's own token after the last accepted node.
The committed output of the step is ``tokens[path[1:]] + [bonus]``.
"""

from __future__ import annotations

import numpy as np

from sssd.sampling import sample_from


def children_lists(parents: np.ndarray) -> list[list[int]]:
    """Children of each node, in node order."""
    kids: list[list[int]] = [[] for _ in range(len(parents))]
    for v in range(1, len(parents)):
        kids[int(parents[v])].append(v)
    return kids


def verify_greedy(tokens: np.ndarray, parents: np.ndarray, argmax: np.ndarray) -> tuple[np.ndarray, int]:
    """Follow the child equal to the LLM's argmax at each node; stop at the first miss.

    tokens, parents: ``[n]``; argmax: ``[n]`` the LLM's greedy token after each node.
    """
    n = len(tokens)
    path = [0]
    if n > 1:
        # child lookup by (parent, token); the first child wins if a drafter repeats a sibling token
        index: dict[tuple[int, int], int] = {}
        for v in range(n - 1, 0, -1):
            index[(int(parents[v]), int(tokens[v]))] = v
        node = 0
        while True:
            nxt = index.get((node, int(argmax[node])))
            if nxt is None:
                break
            path.append(nxt)
            node = nxt
    return np.asarray(path, dtype=np.int64), int(argmax[path[-1]])


def verify_sampling(
    tokens: np.ndarray, parents: np.ndarray, probs: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """Lossless for deterministic drafts: at each node draw the LLM's token from ``probs[node]``
    (``[n, V]``) and move to the child carrying it; the first draw no child matches is the bonus."""
    kids = children_lists(parents)
    node, path = 0, [0]
    while True:
        x = sample_from(probs[node], rng)
        nxt = next((c for c in kids[node] if tokens[c] == x), None)
        if nxt is None:
            return np.asarray(path, dtype=np.int64), x
        path.append(nxt)
        node = nxt


def verify_specinfer(
    tokens: np.ndarray,
    parents: np.ndarray,
    probs: np.ndarray,
    draft_probs: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, int]:
    """Multi-step speculative sampling (SpecInfer) for drafts that carry their distributions.

    ``draft_probs[c]`` (``[n, V]``) is the draft distribution ``q`` that child ``c``'s token was drawn
    from at its parent; the children of one node must be independent draws from the same ``q``. At node
    ``u`` with target ``p``: try the children in order, accept child ``x`` with probability
    ``min(1, p(x)/q(x))``; after a rejection ``p ← normalize(max(p - q, 0))``. If every child is rejected,
    the bonus is drawn from the residual ``p``. The output follows the target distribution exactly.
    """
    kids = children_lists(parents)
    node, path = 0, [0]
    while True:
        p = np.array(probs[node], dtype=np.float64)
        accepted = None
        for c in kids[node]:
            q = np.asarray(draft_probs[c], dtype=np.float64)
            x = int(tokens[c])
            ok = p[x] > 0 if q[x] <= 0 else rng.random() * q[x] < p[x]  # accept with prob min(1, p/q)
            if ok:
                accepted = c
                break
            residual = np.maximum(p - q, 0.0)
            total = residual.sum()
            if total > 0:
                p = residual / total
        if accepted is None:
            return np.asarray(path, dtype=np.int64), sample_from(p, rng)
        path.append(accepted)
        node = accepted
