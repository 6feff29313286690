"""The output head of a verification forward: logits only for the rows verification asks for.

``StepOutput`` is what a forward returns: hidden states plus the model's output head (applied lazily, to
the rows asked for), or the full logits. The head's measured cost (``sssd.policy.head_cost.HeadCost``, the
one model of it, which the budget policy's cost model reads too) decides when verification should ask for
many rows in one call (``sssd.engine.verify``); every call's time is recorded into it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from sssd.policy.head_cost import HeadCost


class StepOutput:
    """What one forward produced: either hidden states ``[N, hidden]`` plus the output head (logits are
    computed only for the rows asked for), or the full logits ``[N, vocab]``. ``prefetch(index)`` computes
    the logits of many rows in one head call and keeps them for later ``logits`` calls."""

    def __init__(
        self,
        rows: torch.Tensor,
        head: Any = None,
        row_of: np.ndarray | None = None,
        head_cost: HeadCost | None = None,
    ):
        self.rows, self.head = rows, head
        self.row_of = row_of  # int64 [N]: row of each packed node (a padded static forward), None = same
        self.head_s = 0.0  # seconds spent in the output head so far (part of the forward's cost)
        self.head_calls = 0
        # None: no choice to make (the logits are all here)
        self.head_cost = head_cost if head is not None else None
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
        if self.head_cost is not None:
            self.head_cost.record(int(x.shape[0]), dt)
        return out
