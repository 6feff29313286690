"""Verify every tree of a step from the packed logits: greedy, sampling or SpecInfer per request."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sssd.sampling import target_probs
from sssd.verify import verify_greedy, verify_sampling, verify_specinfer


def verify_step(
    logits: torch.Tensor, trees: list[tuple[Any, np.ndarray]], reqs: list[Any], draft_probs: Any = None
) -> tuple[list[np.ndarray], list[int]]:
    """logits: ``[N, V]`` packed in tree order; trees: ``(Tree, kept global indices)`` per request;
    draft_probs: optional ``[N_batch, V]`` draft distributions indexed by the batch's global node ids.

    Returns the accepted path (root first) and the bonus token of every request.
    """
    paths: list[np.ndarray] = []
    bonus: list[int] = []
    argmax = None
    if any(r.params.greedy for r in reqs):
        argmax = logits.argmax(dim=-1).cpu().numpy()
    start = 0
    for req, (tree, kept) in zip(reqs, trees, strict=True):
        n = len(tree.tokens)
        if req.params.greedy:
            path, b = verify_greedy(tree.tokens, tree.parents, argmax[start : start + n])
        else:
            probs = target_probs(logits[start : start + n], req.params)
            if draft_probs is not None and n > 1:
                q = np.asarray(draft_probs)[kept]
                path, b = verify_specinfer(tree.tokens, tree.parents, probs, q, req.rng)
            else:
                path, b = verify_sampling(tree.tokens, tree.parents, probs, req.rng)
        paths.append(path)
        bonus.append(b)
        start += n
    return paths, bonus
