"""Verify every tree of a step at once: greedy, sampling or SpecInfer per request, on the flat batch.

The walks of all requests advance together, one depth level at a time, on batch (global) node indices:
each level asks the forward's output for the logits of the node every walk stands on (one output-head
call for the whole batch), finds the children carrying the greedy requests' argmax in one vectorised
lookup (``ChildLookup``: sorted ``(parent, token)`` keys and ``searchsorted``), and draws the sampling
requests' tokens one request at a time (each has its own positional random stream, ``req.draws``).

Only nodes on accepted paths need the LLM's distribution. On a CPU the output head (vocab x hidden) is a
large part of a small model's forward; computing it for ``1 + accepted`` rows instead of every draft node
saves most of it when the head's cost grows with its rows (float32). Where it does not (bfloat16 on matrix
units, a GPU), one call per level costs more than one call for every row still needed: the head's measured
cost (``sssd.policy.head_cost.HeadCost``) decides at each level whether to ask for the rows of the subtrees
below the walks' nodes at once. Either way each row's logits come from the same head.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sssd.engine.acceptance import specinfer_node
from sssd.engine.recycle import argmax_from_top
from sssd.engine.rowops import argmax_rows
from sssd.engine.sampling import sample_from, target_probs
from sssd.engine.trees import AcceptedPaths, TreeBatch


class ChildLookup:
    """``(node, token) -> child`` over a whole ``TreeBatch`` (batch indices; the first child wins where a
    drafter repeats a sibling token), and each node's children in node order."""

    def __init__(self, batch: TreeBatch):
        gp = batch.global_parents
        inner = np.flatnonzero(gp >= 0)
        self._batch = batch
        self._width = int(batch.tokens.max(initial=0)) + 1  # tokens at or past it have no child
        keys = gp[inner] * self._width + batch.tokens[inner]
        order = np.argsort(keys, kind="stable")  # stable: among equal keys the lowest node first
        self._keys, self._child = keys[order], inner[order]
        self._kids: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, nodes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """[k] int64: the child of ``nodes[j]`` carrying ``tokens[j]``, -1 where there is none."""
        nodes, tokens = np.asarray(nodes, np.int64), np.asarray(tokens, np.int64)
        if not len(self._keys):
            return np.full(len(nodes), -1, np.int64)
        valid = (tokens >= 0) & (tokens < self._width)
        keys = nodes * self._width + np.where(valid, tokens, 0)
        at = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        return np.where(valid & (self._keys[at] == keys), self._child[at], -1)

    def children(self, node: int) -> np.ndarray:
        """The children of ``node`` (batch indices, in node order)."""
        if self._kids is None:
            gp = self._batch.global_parents
            order = np.argsort(gp, kind="stable")
            self._kids = (gp[order], order)
        parents, order = self._kids
        a, e = np.searchsorted(parents, [node, node + 1])
        return order[a:e]


def subtrees(batch: TreeBatch, nodes: np.ndarray) -> np.ndarray:
    """The nodes of the subtrees rooted at ``nodes`` (batch indices, ascending; a node's subtree holds
    itself). One vectorised pass per depth level."""
    inside = np.zeros(batch.num_nodes, bool)
    inside[nodes] = True
    gp = batch.global_parents
    for level in batch.levels[int(batch.depth[nodes].min(initial=0)) :]:
        inside[level] |= inside[gp[level]]
    return np.flatnonzero(inside)


def verify_step(output: Any, batch: TreeBatch, reqs: list[Any], top_k: Any = None) -> AcceptedPaths:
    """output: the forward's ``StepOutput`` (rows in the batch's order); batch: the step's ``TreeBatch``,
    checked by ``sssd.engine.trees.check_drafts`` (trees with draft distributions are verified by SpecInfer
    when their request samples); reqs: the requests, tree ``i`` = ``reqs[i]``; top_k: a
    ``sssd.engine.recycle.TopKRecorder`` that keeps the top-k of every row read (None: none kept).

    Returns the accepted path (root first) and the model's next token of every request."""
    b = batch.num_trees
    if len(reqs) != b:
        raise ValueError(f"{b} trees for {len(reqs)} requests")
    greedy = np.fromiter((r.params.greedy for r in reqs), bool, count=b)
    lookup = ChildLookup(batch)
    spec = batch.uses_q & ~greedy
    root_prev = _root_prev(reqs) if top_k is not None else None
    node = batch.offsets[:-1].copy()  # [B] where each walk stands
    next_tokens = np.full(b, -1, np.int64)
    walked, walks = [node.copy()], [np.arange(b)]  # per level: the nodes stood on, by whom
    active = np.arange(b)
    head = getattr(output, "head_cost", None)
    fetched = False
    every = top_k is not None and top_k.every_node
    if every:  # every node's row in one head call, its top-k once; the walk's argmax read off them
        full = output.all_logits()
        top = top_k.top(full)
        best = argmax_from_top(*top, full).cpu().numpy()
        fetched = True
    while len(active):
        rows = node[active]
        if head is not None and not fetched:
            below = subtrees(batch, rows)
            if head.all_at_once(len(rows), len(below)):
                output.prefetch(below)
                fetched = True
        g = greedy[active]
        if every:  # the rows themselves only for sampling
            logits = None if g.all() else full[torch.as_tensor(rows)]
            argmax = best[rows].tolist() if g.any() else None
        elif top_k is not None:  # the argmax comes with the top-k where it is unique
            logits = output.logits(rows)  # [k, V]
            prev = np.where(
                batch.depth[rows] > 0, batch.tokens[batch.global_parents[rows]], root_prev[active]
            )
            argmax = top_k.add(batch.tokens[rows].tolist(), prev.tolist(), logits, bool(g.any()))
        else:
            logits = output.logits(rows)
            argmax = argmax_rows(logits).tolist() if g.any() else None
        child, token = np.full(len(active), -1, np.int64), np.zeros(len(active), np.int64)
        if argmax is not None:
            sel = np.flatnonzero(g)
            token[sel] = np.asarray(argmax, np.int64)[sel]
            child[sel] = lookup(rows[sel], token[sel])
        for j in np.flatnonzero(~g).tolist():  # sampling: each request's own random stream
            child[j], token[j] = _draw(
                batch, lookup, reqs[active[j]], int(rows[j]), logits[j], spec[active[j]]
            )
        stop = child < 0
        next_tokens[active[stop]] = token[stop]
        node[active[~stop]] = child[~stop]
        active = active[~stop]
        if len(active):
            walked.append(node[active].copy())
            walks.append(active)
        if head is not None:
            head.level(bool(len(active)))
    owner, nodes = np.concatenate(walks), np.concatenate(walked)
    if every:
        _record_every_node(batch, nodes, root_prev, top, top_k)
    order = np.argsort(owner, kind="stable")  # by request, root first (levels were appended in order)
    offsets = np.zeros(b + 1, np.int64)
    np.cumsum(np.bincount(owner, minlength=b), out=offsets[1:])
    return AcceptedPaths.build(batch, nodes[order], offsets, next_tokens)


def _record_every_node(batch: TreeBatch, walked: np.ndarray, root_prev: np.ndarray, top: tuple, top_k: Any):
    """Every node's row to ``top_k`` (top: the top-k of every node, in node order): the nodes off the
    accepted paths first, then the walked ones (a later row of the same token wins in the drafter's
    table: the accepted context's prediction is kept)."""
    off_path = np.ones(batch.num_nodes, bool)
    off_path[walked] = False
    order = np.concatenate([np.flatnonzero(off_path), walked])
    prev = np.where(batch.depth > 0, batch.tokens[batch.global_parents], root_prev[batch.tree_of])
    at = torch.as_tensor(order)
    top_k.add_top(batch.tokens[order].tolist(), prev[order].tolist(), top[0][at], top[1][at])


def _draw(batch: TreeBatch, lookup: ChildLookup, req: Any, node: int, logits_row: Any, spec: bool):
    """(child or -1, token) of a sampling request at ``node``: the model's token drawn from its
    distribution there, and the child carrying it (SpecInfer: the children tried in order against their
    draft distributions, the token from the residual if all are rejected)."""
    probs = target_probs(logits_row[None], req.params)[0]
    # the draws of the token after this node: keyed by its position, never by the step
    rng = req.draws(req.context_len + int(batch.depth[node]))
    if spec:
        kids = lookup.children(node)
        rows = batch.q[batch.q_index[kids]]
        nxt, x = specinfer_node(batch.tokens[kids], list(range(len(kids))), probs, rows, rng)
        return (-1 if nxt is None else int(kids[nxt])), x
    x = sample_from(probs, rng)
    return int(lookup(np.array([node]), np.array([x]))[0]), x


def _root_prev(reqs: list[Any]) -> np.ndarray:
    """[B] the token before each request's last one (-1: none): what the top-k rows of roots record."""
    out = np.full(len(reqs), -1, np.int64)
    for i, req in enumerate(reqs):
        o, prompt = req.output, req.prompt
        if len(o) >= 2:
            out[i] = o[-2]
        elif o:
            out[i] = prompt[-1]
        elif len(prompt) >= 2:
            out[i] = prompt[-2]
    return out
