"""Verify every tree of a step: greedy, sampling or SpecInfer per request, walking all trees at once.

Only nodes on accepted paths need the LLM's distribution, so the walk asks the forward's output for
logits one depth at a time (one output-head call per level for the whole batch, only for the node each
request stands on). On a CPU the output head (vocab x hidden) is a large part of a small model's
forward; computing it for ``1 + accepted`` rows instead of every draft node saves most of it when the
head's cost grows with its rows (float32). Where it does not (bfloat16 on matrix units, a GPU), one call
per level costs more than one call for every row still needed: the forward's ``HeadPlan``
(``sssd.engine.adapter``) decides at each level from measured call costs whether to ask for the rows of
the subtrees below the walks' nodes at once. Either way each row's logits come from the same head.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sssd.engine.acceptance import child_index, children_lists, sampling_node, specinfer_node
from sssd.engine.sampling import target_probs


class _Walk:
    __slots__ = ("bonus", "draft_probs", "index", "kids", "node", "path", "req", "start", "tree")

    def __init__(self, tree: Any, req: Any, start: int):
        self.tree, self.req, self.start = tree, req, start
        self.node, self.path, self.bonus = 0, [0], -1
        # checked draft distributions (sssd.engine.trees.DraftTree.q, [n, V]); None: deterministic drafts
        self.draft_probs = getattr(tree, "q", None) if not req.params.greedy else None
        self.kids = children_lists(tree.parents) if self.draft_probs is not None else None
        self.index = child_index(tree.tokens, tree.parents) if len(tree.tokens) > 1 else {}

    def token_before(self) -> int:
        """The token before the current node's: its parent's, or for the root the request's token
        before its last (-1: none)."""
        if self.node > 0:
            return int(self.tree.tokens[self.tree.parents[self.node]])
        out, prompt = self.req.output, self.req.prompt
        if len(out) >= 2:
            return int(out[-2])
        if out:
            return int(prompt[-1])
        return int(prompt[-2]) if len(prompt) >= 2 else -1

    def decide(self, logits_row: Any, argmax: int | None) -> bool:
        """Consume the LLM's output at the current node; True while the walk goes on."""
        p = self.req.params
        if p.greedy:
            x = int(argmax)
            nxt = self.index.get((self.node, x))
        else:
            probs = target_probs(logits_row[None], p)[0]
            # the draws of the token after this node: keyed by its position, never by the step
            rng = self.req.draws(self.req.context_len + int(self.tree.depth[self.node]))
            if self.draft_probs is not None:
                nxt, x = specinfer_node(self.tree.tokens, self.kids[self.node], probs, self.draft_probs, rng)
            else:
                nxt, x = sampling_node(self.index, self.node, probs, rng)
        if nxt is None:
            self.bonus = x
            return False
        self.path.append(nxt)
        self.node = nxt
        return True


def verify_step(
    output: Any, trees: list[Any], reqs: list[Any], top_k: Any = None
) -> tuple[list[np.ndarray], list[int]]:
    """output: the forward's ``StepOutput`` (rows packed in tree order); trees: one ``Tree`` per request,
    checked by ``sssd.engine.trees.check_drafts`` (a ``DraftTree`` with ``q`` is verified by SpecInfer
    when its request samples); top_k: a ``sssd.engine.recycle.TopKRecorder`` that keeps the top-k of
    every row read (None: none kept).

    Returns the accepted path (root first) and the bonus token of every request.
    """
    starts = np.cumsum([0] + [len(t.tokens) for t in trees])
    walks = [_Walk(t, r, int(s)) for t, r, s in zip(trees, reqs, starts[:-1], strict=True)]
    active = list(range(len(walks)))
    plan = getattr(output, "plan", None)
    fetched = False
    while active:
        rows = [walks[i].start + walks[i].node for i in active]
        if plan is not None and not fetched:
            below = np.concatenate(
                [walks[i].start + _subtree(walks[i].tree.parents, walks[i].node) for i in active]
            )
            if plan.all_at_once(len(rows), len(below)):
                output.prefetch(below)
                fetched = True
        logits = output.logits(rows)  # [k, V]
        greedy = any(walks[i].req.params.greedy for i in active)
        if top_k is not None:  # the argmax comes with the top-k where the largest logit is unique
            read = [int(walks[i].tree.tokens[walks[i].node]) for i in active]
            argmax = top_k.add(read, [walks[i].token_before() for i in active], logits, greedy)
        else:
            argmax = logits.argmax(dim=-1).tolist() if greedy else None
        active = [
            i
            for j, i in enumerate(active)
            if walks[i].decide(logits[j], None if argmax is None else argmax[j])
        ]
        if plan is not None:
            plan.level(bool(active))
    return [np.asarray(w.path, dtype=np.int64) for w in walks], [w.bonus for w in walks]


def _subtree(parents: np.ndarray, node: int) -> np.ndarray:
    """The nodes of the subtree rooted at ``node`` (itself first), parents preceding children."""
    parents = np.asarray(parents)
    inside = np.zeros(len(parents), dtype=bool)
    inside[node] = True
    for v in range(node + 1, len(parents)):
        inside[v] = inside[parents[v]]
    return np.flatnonzero(inside)
