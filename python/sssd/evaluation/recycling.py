"""The model's top-k along replayed texts, for drafters that learn from the verifier (recycled candidates).

In the engine, verification computes the model's distribution at every node it walks (the root and the
accepted nodes) and hands the drafter their top-k (``Drafter.recycle``). A teacher-forced replay has no
model; :class:`TeacherTopK` holds what it would have computed at each committed position (made by one
forward per pair, ``sssd.models.teacher``), and ``step_rows`` picks a step's rows: exactly the positions
the engine's verification reads, so the replay feeds the drafter what the engine would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sssd.evaluation.pairs import Pair


@dataclass(frozen=True, eq=False)
class TeacherTopK:
    """Top-k next tokens along each pair's output, flat: pair i's rows are ``offsets[i]:offsets[i + 1]``,
    one per output token; row r is the model's top-k after reading prompt + output[:r] (so its best id is
    output[r] when the pair is the model's own greedy output)."""

    ids: np.ndarray  # [R, k] int32, best first
    probs: np.ndarray  # [R, k] float32, the model's probabilities of ids
    offsets: np.ndarray  # [P + 1] int64

    def __post_init__(self) -> None:
        if self.ids.ndim != 2 or self.ids.dtype != np.int32 or self.probs.shape != self.ids.shape:
            raise ValueError("TeacherTopK: ids must be int32 [R, k] and probs of the same shape")
        if self.probs.dtype != np.float32 or self.offsets.dtype != np.int64 or self.offsets.ndim != 1:
            raise ValueError("TeacherTopK: probs must be float32 and offsets int64 [P + 1]")
        if self.offsets.size == 0 or self.offsets[0] != 0 or self.offsets[-1] != self.ids.shape[0]:
            raise ValueError("TeacherTopK: offsets must run from 0 to the number of rows")

    @property
    def k(self) -> int:
        return int(self.ids.shape[1])

    def take(self, index: Sequence[int]) -> TeacherTopK:
        """The rows of the pairs at positions ``index`` (of the pairs it was computed for), in that order."""
        index = np.asarray(index, dtype=np.int64)
        lens = self.offsets[index + 1] - self.offsets[index]
        starts = np.repeat(self.offsets[index] - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
        offsets = np.zeros(index.size + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        return TeacherTopK(self.ids[starts], self.probs[starts], offsets)

    def bind(self, pairs: Sequence[Pair]) -> _BoundTopK:
        """The rows of ``pairs`` (the ones the top-k was computed for, in order), ready for replay."""
        lens = np.fromiter((p.output_ids.size for p in pairs), dtype=np.int64, count=len(pairs))
        if len(pairs) != self.offsets.size - 1 or np.any(np.diff(self.offsets) != lens):
            raise ValueError(
                "the top-k was computed for other pairs (a row per output token of each pair, in order): "
                "recompute it for these pairs"
            )
        # the token the model reads at row r: the prompt's last token, then output[:-1]
        read = [np.concatenate([p.prompt_ids[-1:], p.output_ids[:-1]]) for p in pairs if p.output_ids.size]
        flat = np.concatenate(read).astype(np.int32) if read else np.zeros(0, np.int32)
        # the token before it: the prompt's second-to-last (-1 for a one-token prompt), then read[:-1]
        before = [
            np.concatenate([p.prompt_ids[-2:-1] if p.prompt_ids.size >= 2 else [-1], r[:-1]])
            for p, r in zip((p for p in pairs if p.output_ids.size), read, strict=True)
        ]
        prev = np.concatenate(before).astype(np.int32) if before else np.zeros(0, np.int32)
        return _BoundTopK(self, flat, prev)


@dataclass(frozen=True, eq=False)
class _BoundTopK:
    top: TeacherTopK
    read: np.ndarray  # [R] int32: the token read at each row
    prev: np.ndarray  # [R] int32: the token before it (-1: none)

    def step_rows(self, rids: np.ndarray, pos: np.ndarray, advance: np.ndarray) -> tuple[np.ndarray, ...]:
        """(tokens [n], ids [n, k], probs [n, k], prev [n]) of one step: request i (a pair index) at output
        position pos[i] verified its root and advance[i] - 1 accepted nodes, rows pos[i] .. pos[i] +
        advance[i] - 1."""
        start = self.top.offsets[rids] + pos
        rows = np.repeat(start - np.cumsum(advance) + advance, advance) + np.arange(int(advance.sum()))
        return self.read[rows], self.top.ids[rows], self.top.probs[rows], self.prev[rows]
