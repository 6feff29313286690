"""The output head of a verification forward: logits only for the rows verification asks for.

``StepOutput`` is what a forward returns: hidden states plus the model's output head (applied lazily, to
the rows asked for), or the full logits. ``HeadPlan`` decides from measured call costs when verification
should ask for many rows in one call (``sssd.engine.verify``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch


class HeadPlan:
    """When verification should ask the output head for many rows at once: a measured cost per call by
    row count and the measured chance that the walk goes one level deeper.

    Verification needs logits only on the accepted paths, one depth at a time, so it can ask for the rows
    of one level per call (few rows, one call per accepted depth) or for every row it may still need at
    once (the subtrees below the nodes the walks stand on: one call, more rows). Where the head is bound by
    reading its weights (a CPU in bfloat16, a GPU) a call of 32 rows costs about as much as one of a
    single row, and one call replaces all the levels; where it is bound by arithmetic (float32 on a CPU) the
    many rows cost more than the levels usually saved. With ``p`` the chance that a level is followed by
    another, the lazy walk expects ``1 / (1 - p)`` calls from here, so asking for all ``R`` remaining rows
    pays when ``cost(R) <= cost(k) / (1 - p)``, ``k`` the rows of this level. Both come from the steps
    seen so far: call times by row count (powers of two, the newest weighing a quarter), ``p`` over about
    ``memory`` levels.
    A row count never measured is taken to cost as much as the largest smaller one measured (so it is
    tried once and then known), and every ``reprobe`` refusals one call for all rows is made anyway, so a
    cost measured under a passing load is measured again.
    """

    def __init__(self, *, memory: float = 32.0, reprobe: int = 64):
        self.memory = float(memory)
        self.reprobe = int(reprobe)
        self.cost: dict[int, float] = {}  # rows rounded up to a power of two -> seconds per call
        self.p_continue = 0.5  # chance that a level of the walk is followed by another
        self._refused = 0

    @staticmethod
    def bucket(rows: int) -> int:
        return 1 << max(0, int(rows) - 1).bit_length()

    def record(self, rows: int, seconds: float) -> None:
        """One head call over ``rows`` rows took ``seconds``."""
        if rows < 1 or not seconds >= 0:
            return
        b = self.bucket(rows)
        old = self.cost.get(b)
        self.cost[b] = seconds if old is None else old + 0.25 * (seconds - old)

    def level(self, continued: bool) -> None:
        """A level of the walk was verified; ``continued``: some request's walk went one level deeper."""
        self.p_continue += (float(continued) - self.p_continue) / self.memory

    def estimate(self, rows: int) -> float | None:
        b = self.bucket(rows)
        if b in self.cost:
            return self.cost[b]
        smaller = [k for k in self.cost if k < b]
        return self.cost[max(smaller)] if smaller else None

    def all_at_once(self, rows_now: int, rows_all: int) -> bool:
        """Ask for all ``rows_all`` remaining rows now rather than the ``rows_now`` of this level?"""
        if rows_all <= rows_now:
            return False
        now, every = self.estimate(rows_now), self.estimate(rows_all)
        if now is None:
            return False  # measure a plain level first
        p = min(max(self.p_continue, 0.0), 0.95)
        if every is None or every <= now / (1.0 - p):
            return True
        self._refused += 1
        if self.reprobe > 0 and self._refused % self.reprobe == 0:
            return True
        return False


class StepOutput:
    """What one forward produced: either hidden states ``[N, hidden]`` plus the output head (logits are
    computed only for the rows asked for), or the full logits ``[N, vocab]``. ``prefetch(index)`` computes
    the logits of many rows in one head call and keeps them for later ``logits`` calls."""

    def __init__(
        self,
        rows: torch.Tensor,
        head: Any = None,
        row_of: np.ndarray | None = None,
        plan: HeadPlan | None = None,
    ):
        self.rows, self.head = rows, head
        self.row_of = row_of  # int64 [N]: row of each packed node (a padded static forward), None = same
        self.head_s = 0.0  # seconds spent in the output head so far (part of the forward's cost)
        self.head_calls = 0
        self.plan = plan if head is not None else None  # None: no choice to make (the logits are all here)
        self._kept: dict[int, int] = {}  # packed row -> its row in self._kept_logits
        self._kept_logits: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.rows.shape[0]) if self.row_of is None else len(self.row_of)

    def logits(self, index: Any = None) -> torch.Tensor:
        """Logits ``[k, vocab]`` of the packed rows ``index`` (all rows when None)."""
        if index is not None and self._kept:
            where = [self._kept.get(int(i)) for i in index]
            if all(w is not None for w in where):
                return self._kept_logits[torch.as_tensor(where, device=self._kept_logits.device)]
        return self._head_of(index)

    def prefetch(self, index: Any) -> None:
        """Computes the logits of the packed rows ``index`` in one head call and keeps them."""
        if self.head is None:
            return
        index = [int(i) for i in index]
        self._kept_logits = self._head_of(index)
        self._kept = {r: j for j, r in enumerate(index)}

    def _head_of(self, index: Any) -> torch.Tensor:
        if self.row_of is not None:
            index = self.row_of if index is None else self.row_of[np.asarray(index, dtype=np.int64)]
        x = self.rows if index is None else self.rows[torch.as_tensor(index, device=self.rows.device)]
        if self.head is None:
            return x
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.head(x)
        if out.device.type == "cuda":  # its time, not its launch time (the caller reads it at once anyway)
            torch.cuda.synchronize(out.device)
        dt = time.perf_counter() - t0
        self.head_s += dt
        self.head_calls += 1
        if self.plan is not None:
            self.plan.record(int(x.shape[0]), dt)
        return out
