"""Follow a serving engine's batch rows to drafter requests, incrementally.

vLLM hands its proposer, each step, the batch *rows*: for row ``i`` the committed token ids
``token_ids[i, :num_tokens[i]]`` (prompt + output) and the tokens sampled this step (empty while the row
is still prefilling or its step was discarded). Rows are slots, not request ids: a finished request's row
is reused, rows are compacted when requests leave, a preempted request comes back in another row.

:class:`RowTracker` keeps the drafter's requests in step with the rows without re-reading whole
contexts: a row that still holds the request it held last step (checked by a fingerprint: the last
tokens and a few sampled positions of what the drafter has) gets only the tokens added since; a row
whose content moved is matched against the other known requests by the same fingerprint; anything else
is a new request (its tokens are indexed once). Requests no row holds for ``max_absent`` steps (finished
or preempted) are removed; their output joins the drafter's recent-outputs pool.

The mapping only affects draft quality, never correctness: the serving engine verifies every draft.

numpy only; the drafter is anything with the drafter API (``add_request``, ``extend``,
``remove_request``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

TAIL = 16  # last tokens compared to recognise a request in a row


@dataclass
class _Tracked:
    rid: int
    length: int  # tokens the drafter has for it
    tail: np.ndarray  # [<= TAIL] int32: its last tokens
    probes: np.ndarray  # [P] int64 positions below `length` ...
    probe_tokens: np.ndarray  # [P] int32 ... and the tokens there
    absent: int = 0  # steps in a row no batch row held it


@dataclass
class RowUpdate:
    """What :meth:`RowTracker.update` did to one step's rows (for tests and statistics)."""

    rids: list[int | None] = field(default_factory=list)  # [rows] drafter request per row (None: skip)
    new: int = 0  # requests added (indexed whole)
    moved: int = 0  # requests found in another row
    extended_tokens: int = 0  # tokens appended to known requests
    removed: int = 0  # requests dropped (no row held them for max_absent steps)


def _fingerprint(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(tokens)
    probes = np.unique(np.asarray([0, n // 4, n // 2, (3 * n) // 4], dtype=np.int64)[: max(n, 0)])
    probes = probes[probes < n]
    return tokens[max(0, n - TAIL) :].copy(), probes, tokens[probes].copy()


class RowTracker:
    """Maps batch rows to drafter requests (see the module docstring)."""

    def __init__(self, drafter: Any, *, max_absent: int = 2, first_rid: int = 0):
        if max_absent < 1:
            raise ValueError(f"max_absent must be >= 1, got {max_absent}")
        self.drafter = drafter
        self.max_absent = max_absent
        self._next_rid = first_rid
        self._by_row: dict[int, _Tracked] = {}  # row -> request it held last step
        self._all: dict[int, _Tracked] = {}  # rid -> tracked request

    def __len__(self) -> int:
        return len(self._all)

    @staticmethod
    def _holds(t: _Tracked, row_tokens: np.ndarray, n: int) -> bool:
        """Does a row with ``n`` committed tokens continue request ``t``?"""
        if n < t.length:
            return False
        k = len(t.tail)
        if not np.array_equal(row_tokens[t.length - k : t.length], t.tail):
            return False
        return bool(np.array_equal(row_tokens[t.probes], t.probe_tokens))

    def _refresh(self, t: _Tracked, row_tokens: np.ndarray, n: int) -> None:
        t.length = n
        t.tail, t.probes, t.probe_tokens = _fingerprint(row_tokens[:n])
        t.absent = 0

    def update(self, token_ids: np.ndarray, num_tokens: np.ndarray, active: list[bool]) -> RowUpdate:
        """Bring the drafter up to date with this step's rows.

        token_ids ``[rows_max, max_len]`` int32 (only ``[:rows]`` is read), num_tokens ``[>= rows]``
        committed tokens per row, active ``[rows]``: whether the row takes a draft this step (it sampled
        tokens). Returns the drafter request id of every row (None for inactive rows).
        """
        rows = len(active)
        out = RowUpdate(rids=[None] * rows)
        claimed: set[int] = set()
        pending: list[int] = []
        new_by_row: dict[int, _Tracked] = {}
        for i in range(rows):  # first pass: rows that still hold last step's request
            n = int(num_tokens[i])
            t = self._by_row.get(i)
            if t is not None and t.rid not in claimed and n > 0 and self._holds(t, token_ids[i], n):
                claimed.add(t.rid)
                new_by_row[i] = t
                if active[i]:
                    self._catch_up(t, token_ids[i], n, out)
                    out.rids[i] = t.rid
            elif active[i] and n > 0:
                pending.append(i)
        for i in pending:  # second pass: moved requests, then new ones
            n = int(num_tokens[i])
            row = token_ids[i]
            t = next((t for t in self._all.values() if t.rid not in claimed and self._holds(t, row, n)), None)
            if t is not None:
                out.moved += 1
                self._catch_up(t, row, n, out)
            else:
                t = self._add(row, n)
                out.new += 1
            claimed.add(t.rid)
            new_by_row[i] = t
            out.rids[i] = t.rid
        self._by_row = new_by_row
        for t in list(self._all.values()):
            if t.rid in claimed:
                continue
            t.absent += 1
            if t.absent >= self.max_absent:
                self.remove(t.rid)
                out.removed += 1
        return out

    def _catch_up(self, t: _Tracked, row: np.ndarray, n: int, out: RowUpdate) -> None:
        if n > t.length:
            self.drafter.extend(t.rid, np.ascontiguousarray(row[t.length : n], dtype=np.int32))
            out.extended_tokens += n - t.length
        self._refresh(t, row, n)

    def _add(self, row: np.ndarray, n: int) -> _Tracked:
        rid = self._next_rid
        self._next_rid += 1
        self.drafter.add_request(rid, np.ascontiguousarray(row[:n], dtype=np.int32))
        t = _Tracked(rid, 0, np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int32))
        self._refresh(t, row, n)
        self._all[rid] = t
        return t

    def remove(self, rid: int) -> None:
        """Forget a request (its output joins the drafter's pool)."""
        t = self._all.pop(rid, None)
        if t is None:
            return
        self._by_row = {r: x for r, x in self._by_row.items() if x.rid != rid}
        self.drafter.remove_request(rid)

    def forget(self, rid: int) -> None:
        """Forget a request whose drafter state is gone (the drafter failed on it): no drafter call."""
        self._all.pop(rid, None)
        self._by_row = {r: x for r, x in self._by_row.items() if x.rid != rid}

    def clear(self) -> None:
        for rid in list(self._all):
            self.remove(rid)
