"""The step's trees as one flat batch (``TreeBatch``), from validation to commit; the accepted paths in the
same form (``AcceptedPaths``); and the check that turns a drafter's batch into it (``check_drafts``).

A ``TreeBatch`` holds one tree per active request (slot ``i`` = tree ``i``), all nodes packed in one
order, which is the order of the forward's rows and of the nodes' scratch rows: tree ``i`` is
``slice(offsets[i], offsets[i + 1])``, node 0 of each tree its root (the request's last context token),
``parents`` index within the own tree (-1 for roots, always before the child). The masks and attention
plans (``sssd.engine.backends``), the static forward, verification (``sssd.engine.verify``) and the commit
all read these arrays whole; nothing is split per tree on the way. ``AcceptedPaths`` is what verification
returns: the accepted nodes of every tree (root first), flat, and the model's own next token per request.
The KV commit and the engine's bookkeeping read it as it is.

The engine accepts from a drafter any object with ``tokens``, ``parents``, ``depth`` (``[N]``) and
``offsets`` (``[B + 1]``) laid out the same way, optionally ``draft_probs`` (``[N, V]``: the distribution
each node's token was drawn from, for SpecInfer) and ``acc_prob`` (``[N]``: node scores f(v), used to cut
oversized trees best-first). Nothing a drafter returns is trusted:

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
  Checking only drops nodes, never reorders them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from sssd.batch import renumbered, tree_index


@dataclass(frozen=True)
class Tree:
    """One tree on its own (tests, tools, ``TreeBatch.of``; the engine keeps trees flat)."""

    tokens: np.ndarray  # [n] token ids; node 0 = root (the request's last context token)
    parents: np.ndarray  # [n] parent index within the tree (< own index), -1 for the root
    depth: np.ndarray  # [n] root = 0, the parent's + 1 elsewhere
    q: np.ndarray | None = None  # float64 [n, V]: draft distribution of each node's token (row 0 unused)


@dataclass(frozen=True, eq=False)
class TreeBatch:
    """B checked trees, flat. ``q``/``q_index``: the draft distributions of the trees verified by
    multi-step speculative sampling (SpecInfer): node ``v``'s token was drawn from ``q[q_index[v]]``;
    ``q_index`` is -1 for roots and for the nodes of every other tree (deterministic drafts)."""

    tokens: np.ndarray  # [N] int64
    parents: np.ndarray  # [N] int64, within the own tree, -1 for roots
    depth: np.ndarray  # [N] int64, 0 for roots
    offsets: np.ndarray  # [B + 1] int64
    q: np.ndarray | None = None  # float64 [M, V], rows normalised
    q_index: np.ndarray | None = None  # [N] int64 row of q, -1: none

    @property
    def num_trees(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @cached_property
    def sizes(self) -> np.ndarray:
        """[B] nodes per tree."""
        return np.diff(self.offsets)

    @cached_property
    def tree_of(self) -> np.ndarray:
        """[N] the tree of each node."""
        return np.repeat(np.arange(self.num_trees), self.sizes)

    @cached_property
    def local(self) -> np.ndarray:
        """[N] each node's index within its tree."""
        return np.arange(self.num_nodes) - self.offsets[self.tree_of]

    @cached_property
    def global_parents(self) -> np.ndarray:
        """[N] each node's parent as a batch index, -1 for roots."""
        return np.where(self.parents >= 0, self.parents + self.offsets[self.tree_of], -1)

    @cached_property
    def max_size(self) -> int:
        return int(self.sizes.max()) if self.num_trees else 0

    @cached_property
    def levels(self) -> list[np.ndarray]:
        """The non-root nodes by depth: ``levels[d - 1]`` = the batch indices of depth ``d`` (ascending).
        Parents precede children, so walking the levels in order sees every parent first."""
        order = np.argsort(self.depth, kind="stable")
        bounds = np.searchsorted(self.depth[order], np.arange(1, int(self.depth.max(initial=0)) + 2))
        return [order[bounds[d] : bounds[d + 1]] for d in range(len(bounds) - 1)]

    @cached_property
    def is_chains(self) -> bool:
        """Every tree is one path (prefill chunks, single-path drafts): its masks are lower triangles."""
        return bool((self.parents == self.local - 1).all())

    @cached_property
    def uses_q(self) -> np.ndarray:
        """[B] bool: the trees that carry draft distributions (verified by SpecInfer when sampling)."""
        out = np.zeros(self.num_trees, bool)
        if self.q_index is not None:
            out[self.tree_of[self.q_index >= 0]] = True
        return out

    def tree(self, i: int) -> Tree:
        """Tree ``i`` on its own (a copy of its slices)."""
        a, e = int(self.offsets[i]), int(self.offsets[i + 1])
        q = None
        if self.uses_q[i]:
            idx = self.q_index[a:e]
            q = np.zeros((e - a, self.q.shape[1]))
            q[idx >= 0] = self.q[idx[idx >= 0]]
        return Tree(self.tokens[a:e], self.parents[a:e], self.depth[a:e], q)

    def trees(self) -> list[Tree]:
        return [self.tree(i) for i in range(self.num_trees)]

    @classmethod
    def of(cls, trees: Sequence[Tree]) -> TreeBatch:
        """The batch of ``trees`` in order (tests, tools): nothing is checked here (``check_drafts`` does)."""
        if not trees:
            raise ValueError("a TreeBatch needs at least one tree")
        offsets = np.zeros(len(trees) + 1, np.int64)
        np.cumsum([len(t.tokens) for t in trees], out=offsets[1:])
        cat = lambda name: np.concatenate([np.asarray(getattr(t, name), np.int64) for t in trees])  # noqa: E731
        q = q_index = None
        with_q = [i for i, t in enumerate(trees) if t.q is not None and len(t.tokens) > 1]
        if with_q:
            q_index = np.full(int(offsets[-1]), -1, np.int64)
            rows = [np.asarray(trees[i].q, np.float64)[1:] for i in with_q]
            for i, start in zip(with_q, np.cumsum([0] + [len(r) for r in rows[:-1]]).tolist(), strict=True):
                q_index[offsets[i] + 1 : offsets[i + 1]] = start + np.arange(len(trees[i].tokens) - 1)
            q = np.concatenate(rows)
        return cls(cat("tokens"), cat("parents"), cat("depth"), offsets, q, q_index)

    def subset(self, keep: np.ndarray, roots: np.ndarray | None = None) -> TreeBatch:
        """The nodes ``keep`` (bool ``[N]``, every root kept, closed under parents) in the same order,
        parents renumbered; ``roots`` (``[B]``): the root tokens to set (a refused tree's root is the
        request's token). ``q`` keeps the rows of kept nodes."""
        keep = np.asarray(keep, bool)
        offsets, parents = renumbered(self.offsets, self.parents, keep)  # a refused root may be malformed
        tokens, depth = self.tokens[keep], self.depth[keep]
        depth[parents < 0] = 0
        if roots is not None:
            tokens[offsets[:-1]] = roots
        q, q_index = self.q, None if self.q_index is None else self.q_index[keep]
        if q_index is not None and not (q_index >= 0).any():
            q = q_index = None
        return TreeBatch(tokens, parents, depth, offsets, q, q_index)

    def placed(self, at: np.ndarray, last_tokens: np.ndarray) -> TreeBatch:
        """A batch of ``len(last_tokens)`` trees: this batch's trees at positions ``at`` (ascending), a
        root alone (token ``last_tokens[i]``) at every other position ``i``."""
        at = np.asarray(at, np.int64)
        b = len(last_tokens)
        if len(at) == b:
            return self
        sizes = np.ones(b, np.int64)
        sizes[at] = self.sizes
        offsets = np.zeros(b + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        dest = offsets[at][self.tree_of] + self.local  # [N] where this batch's nodes go
        n = int(offsets[-1])
        tokens = np.asarray(last_tokens, np.int64)[np.repeat(np.arange(b), sizes)]
        parents, depth = np.full(n, -1, np.int64), np.zeros(n, np.int64)
        tokens[dest], parents[dest], depth[dest] = self.tokens, self.parents, self.depth
        q_index = None
        if self.q_index is not None:
            q_index = np.full(n, -1, np.int64)
            q_index[dest] = self.q_index
        return TreeBatch(tokens, parents, depth, offsets, self.q, q_index)


def root_trees(tokens: Sequence[int] | np.ndarray) -> TreeBatch:
    """One root alone per request (``tokens``: their last tokens): a plain decoding step."""
    tokens = np.asarray(tokens, np.int64).reshape(-1)
    b = len(tokens)
    return TreeBatch(tokens.copy(), np.full(b, -1, np.int64), np.zeros(b, np.int64), np.arange(b + 1))


def chain_tree(tokens: Sequence[int] | np.ndarray) -> TreeBatch:
    """The tokens as one path, a batch of one tree (a prefill chunk)."""
    tokens = np.asarray(tokens, np.int64).reshape(-1)
    n = len(tokens)
    return TreeBatch(tokens, np.arange(-1, n - 1), np.arange(n), np.array([0, n], np.int64))


@dataclass(frozen=True, eq=False)
class AcceptedPaths:
    """Verification's result for a ``TreeBatch``: path ``i`` = ``nodes[offsets[i]:offsets[i+1]]``, the
    accepted nodes of tree ``i`` as batch indices from its root down; ``next_tokens[i]``: the model's own
    token after the path (bonus or recovered). The step's new tokens of request ``i`` are
    ``batch.tokens[path[1:]]`` then ``next_tokens[i]``."""

    nodes: np.ndarray  # [A] int64 batch indices, each path root first
    offsets: np.ndarray  # [B + 1] int64
    next_tokens: np.ndarray  # [B] int64
    local: np.ndarray  # [A] int64 the same nodes as indices within their trees (what the commit moves)

    @classmethod
    def build(cls, batch: TreeBatch, nodes, offsets, next_tokens) -> AcceptedPaths:
        nodes = np.asarray(nodes, np.int64)
        offsets = np.asarray(offsets, np.int64)
        next_tokens = np.asarray(next_tokens, np.int64)
        if offsets.shape != (batch.num_trees + 1,) or next_tokens.shape != (batch.num_trees,):
            raise ValueError(f"{batch.num_trees} trees need {batch.num_trees + 1} path offsets and tokens")
        local = nodes - batch.offsets[batch.tree_of[nodes]] if len(nodes) else nodes
        return cls(nodes, offsets, next_tokens, local)

    @classmethod
    def from_paths(cls, batch: TreeBatch, paths: Sequence, next_tokens: Sequence[int]) -> AcceptedPaths:
        """From one path per tree as node indices within the tree (root first; tests, benchmarks)."""
        offsets = np.zeros(len(paths) + 1, np.int64)
        np.cumsum([len(p) for p in paths], out=offsets[1:])
        starts = np.repeat(batch.offsets[: len(paths)], np.diff(offsets))
        nodes = np.concatenate([np.asarray(p, np.int64) for p in paths]) + starts if paths else starts
        return cls.build(batch, nodes, offsets, next_tokens)

    @property
    def lengths(self) -> np.ndarray:
        """[B] nodes per path (1 + accepted)."""
        return np.diff(self.offsets)

    def path(self, i: int) -> np.ndarray:
        """Path ``i`` as node indices within its tree."""
        return self.local[self.offsets[i] : self.offsets[i + 1]]

    def on_path(self, num_nodes: int) -> np.ndarray:
        """bool ``[num_nodes]`` over the batch: the nodes on an accepted path."""
        mask = np.zeros(num_nodes, bool)
        mask[self.nodes] = True
        return mask


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
