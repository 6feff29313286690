"""The verifier's own top-k, handed to the drafter (its recycled candidates) instead of discarded.

Verification computes the model's logits at every node it walks (each request's root and accepted
nodes). A drafter that asks for them (``drafter.recycle_k > 0``, e.g. ``DrafterConfig(use_recycled=True)``)
gets, after the step, one row per such node: the token the model read there (and the one before it),
its top-k next tokens and their probabilities within the top-k (a softmax over the k largest logits: the
full softmax would cost a pass over the vocabulary per row). The rows are collected where verification
already has the logits, so nothing is computed twice; the drafter's ``recycle`` takes the whole step in
one call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sssd.engine.rowops import argmax_rows, topk_rows


class TopKRecorder:
    """The rows of one step: ``add`` per verification level, ``arrays`` once after the step."""

    def __init__(self, k: int, every_node: bool = False):
        self.k = int(k)
        self.every_node = bool(every_node)  # every verified node's row, not only the walked ones
        self._tokens: list[int] = []
        self._prev: list[int] = []
        self._ids: list[torch.Tensor] = []
        self._logits: list[torch.Tensor] = []

    @classmethod
    def for_drafter(cls, drafter: Any) -> TopKRecorder | None:
        """A recorder when ``drafter`` wants the top-k (``recycle_k`` > 0 and a ``recycle`` method), of
        every verified node when its ``recycle_rows`` is "all"."""
        k = getattr(drafter, "recycle_k", 0) if drafter is not None else 0
        if not isinstance(k, int) or k <= 0 or not callable(getattr(drafter, "recycle", None)):
            return None
        return cls(k, getattr(drafter, "recycle_rows", "walked") == "all")

    def top(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k (values, ids), ``[r, k]`` each, of ``logits [r, vocab]``: what ``add_top`` keeps."""
        return topk_rows(logits, min(self.k, int(logits.shape[-1])))

    def add_top(self, tokens: list[int], prev: list[int], values: torch.Tensor, ids: torch.Tensor) -> None:
        """tokens [r]: the token read at each row; prev [r]: the token before it (-1: none); values, ids
        [r, k]: the top-k of those rows (``top``)."""
        self._tokens.extend(tokens)
        self._prev.extend(prev)
        self._ids.append(ids)
        self._logits.append(values)

    def add(
        self, tokens: list[int], prev: list[int], logits: torch.Tensor, want_argmax: bool = False
    ) -> list[int] | None:
        """``add_top`` of the top-k of ``logits [r, vocab]``. With want_argmax, returns
        ``logits.argmax(-1)`` as a list, read off the top-k where it can be (``argmax_from_top``)."""
        values, ids = self.top(logits)
        self.add_top(tokens, prev, values, ids)
        return argmax_from_top(values, ids, logits).tolist() if want_argmax else None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tokens [n] int32, ids [n, k] int32, probs [n, k] float32, prev [n] int32):
        ``drafter.recycle``'s arguments."""
        if not self._ids:
            empty = np.zeros(0, np.int32)
            return empty, np.zeros((0, self.k), np.int32), np.zeros((0, self.k), np.float32), empty
        ids = torch.cat(self._ids).to(torch.int32).cpu().numpy()
        probs = torch.softmax(torch.cat(self._logits).float(), dim=-1).cpu().numpy()
        # a row of NaN logits (a broken model) has no probabilities to give: uniform, never NaN
        probs = np.where(np.isfinite(probs), probs, np.float32(1.0 / probs.shape[-1]))
        tokens = np.asarray(self._tokens, dtype=np.int32)
        return tokens, ids, probs.astype(np.float32, copy=False), np.asarray(self._prev, dtype=np.int32)


def argmax_from_top(values: torch.Tensor, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` (int64 ``[r]``) given the rows' top-k (values, ids ``[r, k]``): a row's best id
    where its largest logit is unique (then it is the argmax), the argmax itself where it is not or
    cannot be told (a tie, a NaN, k = 1). Saves verification a pass over the vocabulary per row."""
    if values.shape[-1] < 2:
        return argmax_rows(logits)
    out = ids[:, 0].clone()
    unsure = torch.nonzero(~(values[:, 0] > values[:, 1])).flatten()  # NaN compares False: unsure too
    if len(unsure):
        out[unsure] = argmax_rows(logits[unsure])
    return out
