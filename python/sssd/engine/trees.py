"""Turn a drafter's batch of trees into the per-request trees the model scores, checking everything first.

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


@dataclass(frozen=True)
class Tree:
    """One request's part of a forward, nodes in topological order (parents first): stored after the
    request's committed cache rows, in this order. Masks and kernel metadata: ``sssd.engine.masks``."""

    tokens: np.ndarray  # [n] token ids; node 0 = root (the request's last context token)
    parents: np.ndarray  # [n] parent index within the tree (< own index), -1 for the root
    depth: np.ndarray  # [n] root = 0, the parent's + 1 elsewhere


def root_tree(token: int) -> Tree:
    """A tree of the root alone: a plain decoding step."""
    return Tree(np.array([token], np.int64), np.array([-1], np.int64), np.array([0], np.int64))


def chain_tree(tokens: np.ndarray) -> Tree:
    """The tokens as one path (a prefill chunk)."""
    n = len(tokens)
    return Tree(np.asarray(tokens, np.int64), np.arange(-1, n - 1), np.arange(n))


class MalformedDraftError(ValueError):
    """The drafter returned trees the engine cannot verify."""


@dataclass(frozen=True)
class DraftTree(Tree):
    """A checked tree; ``q`` float64 ``[n, V]``: node v's token was drawn from ``q[v]`` (row 0, the root's,
    is unused), or None for deterministic drafts (verified by plain sampling acceptance)."""

    q: np.ndarray | None = None


@dataclass
class CheckedDrafts:
    """What ``check_drafts`` kept: per request its checked tree, or None when its draft was refused, with
    the reason in ``errors``. Which of the batch's nodes the trees hold is ``verified`` (what the drafter
    observes, ``sssd.batch.take_nodes``)."""

    trees: list[DraftTree | None]
    errors: list[str | None]
    verified: np.ndarray  # [N] bool: the batch's nodes in ``trees`` and the roots of the refused ones
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
    """Check ``batch`` (one tree per request) and cut it into the trees the forward scores.

    ``max_depth[i]``: nodes deeper than this are dropped (no point scoring tokens past what request ``i``
    may still produce); ``budget``: drafted nodes allowed for the whole batch (int) or per request;
    ``sampling[i]``: request ``i`` samples, so its tree carries the checked ``draft_probs`` rows if the
    batch has them. Raises ``MalformedDraftError`` for a batch that cannot be split into trees."""
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
    errors = _node_errors(
        tokens, parents, depth, offsets, tree_of, np.asarray(last_tokens, np.int64), vocab_size
    )
    limits = np.maximum(np.asarray(max_depth, np.int64), 0)
    deep = np.bincount(tree_of[depth > limits[tree_of]], minlength=b) > 0  # trees with nodes too deep
    kept: list[np.ndarray | None] = [
        None if errors[i] is not None
        else np.flatnonzero(depth[offsets[i] : offsets[i + 1]] <= limits[i]) if deep[i]
        else np.arange(sizes[i])
        for i in range(b)
    ]  # fmt: skip
    before = sum(len(k) - 1 for k in kept if k is not None)
    kept = _budget_cut(kept, parents, offsets, budget, lambda: _scores(batch, n, tree_of, offsets))
    cut = before - sum(len(k) - 1 for k in kept if k is not None)
    q_rows = _DraftProbs(batch, n, vocab_size) if any(sampling) else None
    trees: list[DraftTree | None] = []
    verified = np.zeros(n, bool)
    verified[offsets[:-1]] = True
    for i, k in enumerate(kept):
        if k is None:
            trees.append(None)
            continue
        a, e = int(offsets[i]), int(offsets[i + 1])
        if len(k) == e - a:  # the whole tree: its arrays as they are
            t, p, d, idx = tokens[a:e], parents[a:e], depth[a:e], np.arange(a, e)
        else:  # a prefix-closed subset: parents renumbered
            idx = a + k
            remap = np.full(e - a, -1, np.int64)
            remap[k] = np.arange(len(k))
            t, p, d = tokens[idx], parents[idx], depth[idx]
            p = np.where(p >= 0, remap[np.maximum(p, 0)], -1)
        q = None
        if sampling[i] and len(k) > 1 and q_rows is not None and q_rows.present:
            q, errors[i] = q_rows.rows(idx, t, i)
            if errors[i] is not None:
                trees.append(None)
                continue
        trees.append(DraftTree(t, p, d, q))
        verified[idx] = True
    return CheckedDrafts(trees, errors, verified, cut, n - b)


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


def _budget_cut(kept, parents, offsets, budget, get_scores) -> list[np.ndarray | None]:
    """Cut the trees to ``budget`` drafted nodes (an int for the whole batch, or one per tree): the best
    nodes by ``get_scores()`` (computed only when something is cut; ties: lower node index, then lower
    tree), closed under parents. ``kept[i]``: sorted node indices within tree ``i`` (node 0 first) or
    None."""
    per_tree = not isinstance(budget, (int, np.integer))
    caps = [int(x) for x in budget] if per_tree else None
    total = sum(len(k) - 1 for k in kept if k is not None)
    if not per_tree and total <= int(budget):
        return kept
    # candidates: (tree, local index) of every non-root node still in play
    trees = [i for i, k in enumerate(kept) if k is not None and len(k) > 1]
    out = list(kept)
    if per_tree:
        over = [i for i in trees if len(kept[i]) - 1 > max(caps[i], 0)]
        scores = get_scores() if over else None
        for i in over:
            own = np.full(len(kept[i]) - 1, i)
            out[i] = _best(kept[i][1:], own, offsets, scores, caps[i], parents)[i]
        return out
    cand = np.concatenate([kept[i][1:] for i in trees]) if trees else np.zeros(0, np.int64)
    owner = np.concatenate([np.full(len(kept[i]) - 1, i) for i in trees]) if trees else cand
    chosen = _best(cand, owner, offsets, get_scores(), int(budget), parents)
    for i in trees:
        out[i] = chosen.get(i, np.zeros(1, np.int64))
    return out


def _best(local, owner, offsets, scores, k: int, parents) -> dict[int, np.ndarray]:
    """The ``k`` best candidates (node ``local[j]`` of tree ``owner[j]``), closed under parents, as sorted
    node indices per tree (root included)."""
    local = np.asarray(local, np.int64)
    owner = np.asarray(owner, np.int64)
    glob = offsets[owner] + local
    order = np.lexsort((owner, local, -scores[glob]))[: max(k, 0)]
    out: dict[int, np.ndarray] = {}
    for t in np.unique(owner).tolist():
        picked = np.sort(local[order][owner[order] == t])
        a = int(offsets[t])
        keep, nodes = {0}, [0]
        for v in picked.tolist():  # closed under parents: at most k nodes, each visited once
            if int(parents[a + v]) in keep:
                keep.add(v)
                nodes.append(v)
        out[t] = np.asarray(nodes, np.int64)
    return out


class _DraftProbs:
    """The batch's ``draft_probs``, checked once for shape and then per tree for values."""

    def __init__(self, batch: Any, n: int, vocab_size: int):
        raw = getattr(batch, "draft_probs", None)
        self.present, self.error, self.dp = raw is not None, None, None
        if raw is None:
            return
        try:
            dp = np.asarray(raw)
        except Exception as e:
            self.error = f"draft_probs is not an array: {e}"
            return
        if dp.ndim != 2 or dp.shape != (n, vocab_size) or dp.dtype.kind not in "fiu":
            self.error = (
                f"draft_probs must be a numeric [N, V] = [{n}, {vocab_size}] array, got {dp.dtype} "
                f"{list(dp.shape)}"
            )
            return
        self.dp = dp

    def rows(self, idx: np.ndarray, tokens: np.ndarray, tree: int) -> tuple[np.ndarray | None, str | None]:
        """float64 ``[n, V]`` rows of the nodes ``idx`` (batch indices, root first), each normalized; or
        the reason they cannot be used. Only these rows are read: memory is bounded by the budget."""
        if self.error is not None:
            return None, self.error
        q = self.dp[idx[1:]].astype(np.float64)
        if not np.isfinite(q).all():
            return None, f"draft_probs rows of tree {tree} are not finite"
        if (q < 0).any():
            return None, f"draft_probs rows of tree {tree} have negative entries"
        own = q[np.arange(len(q)), tokens[1:]]
        if not (own > 0).all():
            v = int(np.flatnonzero(~(own > 0))[0]) + 1
            return None, f"draft_probs give node {v} of tree {tree} its own token {tokens[v]} probability 0"
        q /= q.sum(axis=1, keepdims=True)
        return np.concatenate([np.zeros((1, q.shape[1])), q]), None
