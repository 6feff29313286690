"""Turn a drafter's batch of trees into the flat batch the model scores (``TreeBatch``), checked first.

The engine accepts any object with ``tokens``, ``parents``, ``depth`` (``[N]``) and ``offsets``
(``[B + 1]``) laid out as the shared contract says (tree ``i`` = ``slice(offsets[i], offsets[i+1])``,
node 0 of each tree is its root = the request's last context token, ``parents`` index within the own
tree, -1 for roots), optionally ``draft_probs`` (``[N, V]``: the distribution each node's token was drawn
from, for SpecInfer) and ``acc_prob`` (``[N]``: node scores f(v), used to cut oversized trees best-first).

Nothing a drafter returns is trusted:

- a batch that cannot be split into one tree per request (a missing field, arrays of the wrong type or
  length, offsets that do not cover the nodes) is refused whole: ``MalformedDraftError`` (a ValueError);
- a tree with a bad node (a token outside the vocabulary, a parent that is not an earlier node of the
  same tree, a wrong depth, a root that is not the request's last token), or, for a sampling request, bad
  draft distributions (wrong shape, not finite, negative, q = 0 for a drafted token), is refused alone:
  that request decodes plainly this step, the others keep their trees;
- trees larger than the step's budget (per request, or for the whole batch) are cut to a prefix-closed
  subset: best-first by ``acc_prob`` when the batch carries finite scores, else in node order (which is
  prefix-closed, parents come first), then closed under parents. The forward's size and memory are so
  bounded by the budget whatever a drafter returns; checking costs O(N) array operations on its arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sssd.batch import tree_index
from sssd.engine.tree_batch import AcceptedPaths, Tree, TreeBatch, chain_tree, root_trees

__all__ = [
    "AcceptedPaths", "CheckedDrafts", "MalformedDraftError", "Tree", "TreeBatch", "chain_tree",
    "check_drafts", "root_trees",
]  # fmt: skip


class MalformedDraftError(ValueError):
    """The drafter returned trees the engine cannot verify."""


@dataclass
class CheckedDrafts:
    """What ``check_drafts`` kept: ``trees``, one per request of the drafter's batch (the root alone where
    its draft was refused, with the reason in ``errors``), the nodes ``verified`` of the batch in the same
    order (what the drafter observes, ``sssd.batch.take_nodes``): ``trees`` is exactly those nodes."""

    trees: TreeBatch
    errors: list[str | None]
    verified: np.ndarray  # [N] bool: the batch's nodes in ``trees`` (the roots of the refused ones too)
    cut: int  # drafted nodes dropped to fit the budget (0 for a drafter that honours it)
    proposed: int  # drafted (non-root) nodes the batch held


def _field(batch: Any, name: str, n: int | None) -> np.ndarray:
    x = getattr(batch, name, None)
    if x is None:
        raise MalformedDraftError(f"draft batch has no '{name}' field")
    try:
        x = np.asarray(x)
    except Exception as e:
        raise MalformedDraftError(f"draft batch '{name}' is not an array: {e}") from e
    if x.ndim != 1 or (x.size and not np.issubdtype(x.dtype, np.integer)):
        raise MalformedDraftError(
            f"draft batch '{name}' must be a 1-D integer array, got {x.dtype} {x.shape}"
        )
    if n is not None and len(x) != n:
        raise MalformedDraftError(f"draft batch '{name}' has {len(x)} entries, expected {n}")
    return x.astype(np.int64)


def check_drafts(
    batch: Any,
    last_tokens: Sequence[int],
    vocab_size: int,
    max_depth: Sequence[int],
    budget: int | Sequence[int],
    sampling: Sequence[bool],
) -> CheckedDrafts:
    """Check ``batch`` (one tree per request) and cut it to the nodes the forward scores.

    ``max_depth[i]``: nodes deeper than this are dropped (no point scoring tokens past what request ``i``
    may still produce); ``budget``: drafted nodes allowed for the whole batch (int) or per request;
    ``sampling[i]``: request ``i`` samples, so its tree carries the checked ``draft_probs`` rows if the
    batch has them. Only nodes are dropped (the rest keeps its order). Raises ``MalformedDraftError`` for
    a batch that cannot be split into trees."""
    b = len(last_tokens)
    offsets = _field(batch, "offsets", b + 1)
    tokens = _field(batch, "tokens", None)
    n = len(tokens)
    parents = _field(batch, "parents", n)
    depth = _field(batch, "depth", n)
    sizes = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != n or (sizes < 1).any():
        raise MalformedDraftError(
            f"draft batch offsets {offsets[:8].tolist()}{'...' if b > 7 else ''} do not split {n} nodes "
            f"into {b} trees"
        )
    tree_of = tree_index(offsets)
    want = np.asarray(last_tokens, np.int64)
    errors = _node_errors(tokens, parents, depth, offsets, tree_of, want, vocab_size)
    refused = np.array([e is not None for e in errors], bool)
    root = np.zeros(n, bool)
    root[offsets[:-1]] = True
    limits = np.maximum(np.asarray(max_depth, np.int64), 0)
    keep = root | (~refused[tree_of] & (depth <= limits[tree_of]))  # closed: a parent is shallower
    before = int(keep.sum()) - b
    keep = _budget_cut(
        keep, tree_of, parents, depth, offsets, budget, lambda: _scores(batch, n, tree_of, offsets)
    )
    cut = before - (int(keep.sum()) - b)
    q = q_index = None
    sampled = np.asarray(sampling, bool)[tree_of] & keep & ~root  # the nodes whose q would be read
    if sampled.any() and getattr(batch, "draft_probs", None) is not None:
        q, q_index, bad = _draft_probs(batch, n, vocab_size, sampled, tokens, tree_of, offsets, errors)
        keep &= ~(bad[tree_of] & ~root)
    flat = TreeBatch(tokens, parents, depth, offsets, q, q_index)
    return CheckedDrafts(flat.subset(keep, want), errors, keep, cut, n - b)


def _node_errors(tokens, parents, depth, offsets, tree_of, want, vocab_size: int) -> list[str | None]:
    """The first problem of each tree (None: well formed), all trees checked at once."""
    b, n = len(offsets) - 1, len(tokens)
    local = np.arange(n) - offsets[tree_of]
    root, inner = local == 0, local != 0
    parent_of = np.clip(np.where(inner, parents + offsets[tree_of], 0), 0, max(n - 1, 0))
    checks = [
        ((tokens < 0) | (tokens >= vocab_size),
         lambda v: f"draft token {tokens[v]} is outside the model's vocabulary [0, {vocab_size})"),
        (root & (parents != -1), lambda v: "node 0 of every tree must be its root (parent -1)"),
        (inner & ((parents < 0) | (parents >= local)),
         lambda v: f"parents are not topological: node {local[v]} of tree {tree_of[v]} has parent "
                   f"{parents[v]}"),
        (root & (depth != 0), lambda v: "root depth must be 0"),
        (inner & (depth != depth[parent_of] + 1), lambda v: "depth must be the parent's depth + 1"),
        (root & (tokens != want[tree_of]),
         lambda v: f"root of tree {tree_of[v]} is token {tokens[v]}, expected the last context token "
                   f"{want[tree_of[v]]}"),
    ]  # fmt: skip
    errors: list[str | None] = [None] * b
    if not np.logical_or.reduce([bad for bad, _ in checks]).any():
        return errors  # the common case: one pass, no per-tree work
    for bad, message in checks:
        idx = np.flatnonzero(bad)
        if len(idx):
            hit, first = np.unique(tree_of[idx], return_index=True)
            for t, j in zip(hit.tolist(), first.tolist(), strict=True):
                if errors[t] is None:
                    errors[t] = message(int(idx[j]))
    return errors


def _scores(batch: Any, n: int, tree_of: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Node priorities for cutting, higher first: the batch's ``acc_prob`` when it is a finite ``[N]``
    array, else minus the node's index in its tree (node order)."""
    acc = getattr(batch, "acc_prob", None)
    if acc is not None:
        try:
            acc = np.asarray(acc, dtype=np.float64)
        except (TypeError, ValueError):
            acc = None
        if acc is not None and acc.shape == (n,) and np.isfinite(acc).all():
            return acc
    return -(np.arange(n) - offsets[tree_of]).astype(np.float64)


def _budget_cut(keep, tree_of, parents, depth, offsets, budget, get_scores) -> np.ndarray:
    """Cut ``keep`` (bool ``[N]``) to ``budget`` drafted nodes (an int for the whole batch, or one per
    tree): the best nodes by ``get_scores()`` (computed only when something is cut; ties: lower node
    index, then lower tree), closed under parents."""
    n, b = len(keep), len(offsets) - 1
    root = np.zeros(n, bool)
    root[offsets[:-1]] = True
    cand = keep & ~root
    local = np.arange(n) - offsets[tree_of]
    if not isinstance(budget, (int, np.integer)):  # one budget per tree
        caps = np.maximum(np.asarray([int(x) for x in budget], np.int64), 0)
        over = np.bincount(tree_of[cand], minlength=b) > caps
        if not over.any():
            return keep
        scores = get_scores()
        idx = np.flatnonzero(cand & over[tree_of])
        order = idx[np.lexsort((local[idx], -scores[idx], tree_of[idx]))]  # by tree, best first
        first = np.searchsorted(tree_of[order], tree_of[order])  # where each tree's run starts
        picked = keep & ~(cand & over[tree_of])
        picked[order[np.arange(len(order)) - first < caps[tree_of[order]]]] = True
    else:
        if int(cand.sum()) <= int(budget):
            return keep
        scores = get_scores()
        idx = np.flatnonzero(cand)
        picked = keep & root
        picked[idx[np.lexsort((tree_of[idx], local[idx], -scores[idx]))][: max(int(budget), 0)]] = True
    gp = np.where(parents >= 0, parents + offsets[tree_of], 0)
    for d in range(1, int(depth[picked].max(initial=0)) + 1):  # closed under parents, level by level
        level = np.flatnonzero(picked & (depth == d))
        picked[level] &= picked[gp[level]]
    return picked


def _draft_probs(batch, n, vocab_size, sampled, tokens, tree_of, offsets, errors):
    """The batch's ``draft_probs`` rows of the nodes ``sampled`` (bool ``[N]``), checked and normalised:
    ``(q [M, V] float64, q_index [N], bad [B])``, ``bad`` the trees refused for their rows (the reason
    written to ``errors``). Only these rows are read: memory is bounded by the budget."""
    bad = np.zeros(len(errors), bool)
    trees = np.unique(tree_of[sampled])
    error, dp = None, None
    try:
        dp = np.asarray(batch.draft_probs)
    except Exception as e:
        error = f"draft_probs is not an array: {e}"
    if dp is not None and (dp.ndim != 2 or dp.shape != (n, vocab_size) or dp.dtype.kind not in "fiu"):
        error = (
            f"draft_probs must be a numeric [N, V] = [{n}, {vocab_size}] array, got {dp.dtype} "
            f"{list(dp.shape)}"
        )
    if error is not None:
        for t in trees.tolist():
            errors[t] = error
        bad[trees] = True
        return None, None, bad
    idx = np.flatnonzero(sampled)
    q = dp[idx].astype(np.float64)
    own = q[np.arange(len(idx)), tokens[idx]]
    checks = [
        (~np.isfinite(q).all(axis=1), lambda t, v: f"draft_probs rows of tree {t} are not finite"),
        ((q < 0).any(axis=1), lambda t, v: f"draft_probs rows of tree {t} have negative entries"),
        (~(own > 0), lambda t, g: f"draft_probs give node {g - offsets[t]} of tree {t} its own token "
                                  f"{tokens[g]} probability 0"),
    ]  # fmt: skip
    for rows_bad, message in checks:
        for j in np.flatnonzero(rows_bad).tolist():
            t = int(tree_of[idx[j]])
            if not bad[t]:
                bad[t] = True
                errors[t] = message(t, int(idx[j]))
    q /= np.where(bad[tree_of[idx]], 1.0, q.sum(axis=1))[:, None]
    q_index = np.full(n, -1, np.int64)
    q_index[idx] = np.arange(len(idx))
    q_index[bad[tree_of]] = -1
    return q, q_index, bad
