"""The acceptance rules at one node, and verification of one whole tree (the references).

The engine verifies a step's trees together on the flat batch (``sssd.engine.verify``), applying
``specinfer_node`` where a sampling request's tree carries draft distributions. The whole-tree functions
below are the per-tree references the tests drive with many random draws; they return ``(path, next_token)``:
``path`` int64 ``[1 + accepted]`` = tree node indices from the root (node 0) along the accepted nodes,
``next_token`` = the LLM's own token after the last accepted node (a bonus token after a leaf, a
recovered one where drafted children were rejected). The committed output of the step is
``tokens[path[1:]] + [next_token]``.
"""

from __future__ import annotations

import numpy as np

from sssd.engine.sampling import sample_from


def children_lists(parents: np.ndarray) -> list[list[int]]:
    """Children of each node, in node order."""
    kids: list[list[int]] = [[] for _ in range(len(parents))]
    for v in range(1, len(parents)):
        kids[int(parents[v])].append(v)
    return kids


def child_index(tokens: np.ndarray, parents: np.ndarray) -> dict[tuple[int, int], int]:
    """(parent, token) → child; the first child wins if a drafter repeats a sibling token."""
    index: dict[tuple[int, int], int] = {}
    for v in range(len(tokens) - 1, 0, -1):
        index[(int(parents[v]), int(tokens[v]))] = v
    return index


# -- one node at a time (verification computes logits lazily, only for nodes on the accepted path) ----
def sampling_node(
    index: dict, node: int, probs: np.ndarray, rng: np.random.Generator
) -> tuple[int | None, int]:
    """Draw the LLM's token at ``node`` from ``probs`` ``[V]``: (the child carrying it or None, token)."""
    x = sample_from(probs, rng)
    return index.get((node, x)), x


def specinfer_node(
    tokens: np.ndarray,
    kids: list[int],
    probs: np.ndarray,
    draft_probs: np.ndarray,
    rng: np.random.Generator,
) -> tuple[int | None, int]:
    """Multi-step speculative sampling (SpecInfer) at one node with target ``probs`` ``[V]``.

    ``kids``: the node's children; ``draft_probs[c]`` is the draft distribution ``q`` child ``c`` was drawn
    from given the earlier children: independent draws from the same ``q`` (a repeated token is then a
    separate child), or draws without replacement with row ``c`` = ``q`` without the earlier siblings'
    tokens, renormalized (each try is then an exact one-draft step against the residual, which already
    gives rejected tokens probability 0). Try the children in order, accept child ``x`` with probability
    ``min(1, p(x)/q_c(x))`` (``q_c(x) > 0``: ValueError otherwise); after a rejection
    ``p ← normalize(max(p - q_c, 0))``. If every child is rejected the token is drawn from the residual
    ``p``.
    Returns (accepted child or None, token).
    """
    p = np.array(probs, dtype=np.float64)
    for c in kids:
        q = np.asarray(draft_probs[c], dtype=np.float64)
        x = int(tokens[c])
        if not q[x] > 0:  # a token cannot have been drawn from q: the engine refuses such drafts earlier
            raise ValueError(f"draft distribution of node {c} gives its own token {x} probability {q[x]}")
        if rng.random() * q[x] < p[x]:
            return c, x
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        if total > 0:
            p = residual / total
    return None, sample_from(p, rng)


# -- whole trees (references; the tests drive them with many random draws) ---------------------------
def verify_sampling(
    tokens: np.ndarray, parents: np.ndarray, probs: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """Lossless for deterministic drafts: at each node draw the LLM's token from ``probs[node]``
    (``[n, V]``) and move to the child carrying it; the first draw no child matches is the next token."""
    index = child_index(tokens, parents)
    node, path = 0, [0]
    while True:
        nxt, x = sampling_node(index, node, probs[node], rng)
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
    """SpecInfer over a whole tree: ``probs``, ``draft_probs`` ``[n, V]`` (see ``specinfer_node``)."""
    kids = children_lists(parents)
    node, path = 0, [0]
    while True:
        nxt, x = specinfer_node(tokens, kids[node], probs[node], draft_probs, rng)
        if nxt is None:
            return np.asarray(path, dtype=np.int64), x
        path.append(nxt)
        node = nxt
