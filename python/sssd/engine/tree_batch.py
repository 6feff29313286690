"""The step's trees as one flat batch, from validation to commit, and the accepted paths in the same form.

A ``TreeBatch`` holds one tree per active request (slot ``i`` = tree ``i``), all nodes packed in one
order, which is the order of the forward's rows and of the nodes' scratch rows: tree ``i`` is
``slice(offsets[i], offsets[i + 1])``, node 0 of each tree its root (the request's last context token),
``parents`` index within the own tree (-1 for roots, always before the child). Masks
(``sssd.engine.masks``), the attention plans (``sssd.engine.backends``), the static forward, verification
(``sssd.engine.verify``) and the commit all read these arrays whole; nothing is split per tree on the way.

``AcceptedPaths`` is what verification returns: the accepted nodes of every tree (root first), flat, and
the model's own next token per request. The KV commit and the engine's bookkeeping read it as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np


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
        counts = np.bincount(self.tree_of[keep], minlength=self.num_trees)
        offsets = np.zeros(self.num_trees + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        new_index = np.cumsum(keep) - 1
        inner = keep.copy()
        inner[self.offsets[:-1]] = False  # kept non-root nodes: their parents are checked ones
        parents = np.full(self.num_nodes, -1, np.int64)
        parents[inner] = new_index[self.global_parents[inner]] - offsets[self.tree_of[inner]]
        tokens, depth = self.tokens[keep], np.where(inner, self.depth, 0)[keep]
        if roots is not None:
            tokens[offsets[:-1]] = roots
        q, q_index = self.q, None if self.q_index is None else self.q_index[keep]
        if q_index is not None and not (q_index >= 0).any():
            q = q_index = None
        return TreeBatch(tokens, parents[keep], depth, offsets, q, q_index)

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
