"""The output head's cost: one model (``HeadCost``) for the two questions it answers.

Verification needs logits only on the accepted paths, one depth at a time, so a step calls the output
head once per level of its longest accepted path (one row per request still walking), or, once it pays,
once for every row it may still need (the subtrees below the nodes the walks stand on: one call, more
rows). Where the head is bound by reading its weights (a CPU in bfloat16, a GPU) a call of 32 rows costs
about as much as one of a single row, and one call replaces all the levels; where it is bound by
arithmetic (float32 on a CPU) the many rows cost more than the levels usually saved.

- Verification asks ``all_at_once(rows_now, rows_all)`` at each level (``sssd.engine.verify``): with ``p``
  the chance that a level is followed by another, the walk expects ``1 / (1 - p)`` calls from here, so
  asking for all ``R`` remaining rows pays when ``cost(R) <= cost(k) / (1 - p)``, ``k`` the rows of this
  level.
- The budget policy's cost model prices a step's head with ``step_s(batch_size, levels, nodes)``: a call
  of one row per request for the first level and for each expected level beyond it
  (``sssd.policy.goodput.expected_head_levels``), or one call of every row of the step where that is
  cheaper (or always asked for); the rest of the forward is fitted without the head
  (``sssd.policy.cost_model``). The engine shares one instance between the two
  (``CostModel.share_head``): the output head records each call it makes by its own rows.

Both read the same measurements: call times by row count (powers of two, the newest weighing a quarter,
``record``) and ``p`` over about ``memory`` levels (``level``). A row count never measured is taken to cost
as much as the largest smaller one measured (so it is tried once and then known), and every ``reprobe``
refusals one call for all rows is made anyway, so a cost measured under a passing load is measured again.
Times are seconds.
"""

from __future__ import annotations

import numpy as np


class HeadCost:
    """Measured output-head call costs by row count, and the chance that the walk goes one level deeper."""

    def __init__(self, *, memory: float = 32.0, reprobe: int = 64):
        self.memory = float(memory)
        self.reprobe = int(reprobe)
        self.cost: dict[int, float] = {}  # rows rounded up to a power of two -> seconds per call
        self.p_continue = 0.5  # chance that a level of the walk is followed by another
        self._refused = 0

    @staticmethod
    def rows_class(rows: int) -> int:
        return 1 << max(0, int(rows) - 1).bit_length()

    # -- measurements ------------------------------------------------------------------------------
    def record(self, rows: int, seconds: float) -> None:
        """One head call over ``rows`` rows took ``seconds``."""
        if rows < 1 or not seconds >= 0:
            return
        b = self.rows_class(rows)
        old = self.cost.get(b)
        self.cost[b] = seconds if old is None else old + 0.25 * (seconds - old)

    def level(self, continued: bool) -> None:
        """A level of the walk was verified; ``continued``: some request's walk went one level deeper."""
        self.p_continue += (float(continued) - self.p_continue) / self.memory

    # -- what they say -----------------------------------------------------------------------------
    def estimate(self, rows: int) -> float | None:
        """Seconds of one call over ``rows`` rows (None: no call of that many rows or fewer measured)."""
        b = self.rows_class(rows)
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

    @property
    def measured(self) -> bool:
        """Some call was measured (before that, ``step_s`` predicts nothing)."""
        return bool(self.cost)

    def step_s(self, batch_size: int, levels=0.0, nodes=None, one_call: bool = False) -> np.ndarray:
        """Predicted head time of a step of ``batch_size`` requests whose longest accepted path is expected
        to take ``levels`` (scalar or [K]) calls beyond the first; 0 while no call was measured.

        ``nodes`` (scalar or [K], like ``levels``; None: not known) the draft nodes of the step, for calls
        measured by their own row counts: a step then costs one call of ``batch_size`` rows per level or
        one call of all ``batch_size + nodes`` rows, whichever is cheaper (what verification's
        ``all_at_once`` chooses between), or that one call alone where verification always asks for
        every row (``one_call``: the recycled candidates' every-node rows)."""
        b = max(int(batch_size), 1)
        per_call = self.estimate(b) or 0.0
        per_level = (1.0 + np.asarray(levels, dtype=np.float64)) * per_call
        if nodes is None:
            return per_level
        # estimate() of every row count at once: the largest measured power of two at or below its own
        rows = b + np.maximum(np.asarray(nodes, dtype=np.int64), 0)
        classes = np.left_shift(1, np.ceil(np.log2(rows)).astype(np.int64))
        keys = np.array(sorted(self.cost), dtype=np.int64)
        vals = np.array([self.cost[k] for k in keys.tolist()], dtype=np.float64)
        at = np.searchsorted(keys, classes, side="right") - 1
        every = np.where(at >= 0, vals[np.maximum(at, 0)], per_call)
        return every + np.zeros_like(per_level) if one_call else np.minimum(every, per_level)

    # -- persistence (a cost profile's "head") -----------------------------------------------------
    def to_dict(self) -> dict:
        return {"rows": sorted(self.cost), "call_s": [self.cost[b] for b in sorted(self.cost)]}

    @classmethod
    def from_dict(cls, d: dict) -> HeadCost:
        if not isinstance(d, dict):
            raise ValueError("cost profile's head must be an object with 'rows' and 'call_s'")
        out = cls()
        rows, secs = d.get("rows", []), d.get("call_s", [])
        if len(rows) != len(secs):
            raise ValueError("cost profile's head: 'rows' and 'call_s' must have the same length")
        for r, s in zip(rows, secs, strict=True):
            if not (int(r) >= 1 and float(s) >= 0):
                raise ValueError(f"cost profile's head: a call of {r} rows cannot take {s} s")
            out.cost[cls.rows_class(int(r))] = float(s)
        return out
