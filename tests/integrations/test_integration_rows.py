"""Following a serving engine's batch rows to drafter requests (sssd.integrations.rows), without vLLM.

A small simulation of vLLM's input batch drives the tracker: requests join in free rows, grow by a few
tokens a step, finish (their row is refilled by compaction: the last row moves into the hole), are
preempted and come back in another row. The drafter must hold exactly each running request's tokens,
having been sent each token once (no re-indexing of whole contexts).
"""

from __future__ import annotations

import numpy as np
import pytest
from sssd.integrations.rows import RowTracker

MAX_LEN = 400


class RecordingDrafter:
    """Keeps every request's tokens as the drafter would and counts the tokens it was sent."""

    def __init__(self):
        self.ctx: dict[int, list[int]] = {}
        self.sent = 0
        self.removed: list[int] = []

    def add_request(self, rid, ids):
        assert rid not in self.ctx and ids.dtype == np.int32
        self.ctx[rid] = ids.tolist()
        self.sent += len(ids)

    def extend(self, rid, ids):
        assert ids.dtype == np.int32 and len(ids) > 0
        self.ctx[rid].extend(ids.tolist())
        self.sent += len(ids)

    def remove_request(self, rid, add_to_pool=None):
        del self.ctx[rid]
        self.removed.append(rid)


class FakeBatch:
    """vLLM's input batch as the proposer sees it: token rows, committed lengths, compaction."""

    def __init__(self, rows: int, rng: np.random.Generator):
        self.token_ids = np.zeros((rows, MAX_LEN), np.int32)
        self.num = np.zeros(rows, np.int32)
        self.reqs: list[list[int]] = []  # running requests' tokens, index = row
        self.rng = rng

    def add(self, tokens: list[int]) -> None:
        i = len(self.reqs)
        self.reqs.append(list(tokens))
        self.token_ids[i, : len(tokens)] = tokens
        self.num[i] = len(tokens)

    def remove(self, i: int) -> list[int]:
        gone = self.reqs[i]
        last = len(self.reqs) - 1
        if i != last:  # compaction: the last row moves into the hole
            self.reqs[i] = self.reqs[last]
            self.token_ids[i] = self.token_ids[last]
            self.num[i] = self.num[last]
        self.reqs.pop()
        self.num[last] = 0
        return gone

    def grow(self) -> None:
        for i, r in enumerate(self.reqs):
            add = self.rng.integers(0, 50, size=int(self.rng.integers(1, 5))).tolist()
            r.extend(add)
            self.token_ids[i, len(r) - len(add) : len(r)] = add
            self.num[i] = len(r)


def check(tracker: RowTracker, drafter: RecordingDrafter, batch: FakeBatch, rids) -> None:
    for i, r in enumerate(batch.reqs):
        assert rids[i] is not None
        assert drafter.ctx[rids[i]] == r
    assert len(set(rids)) == len(rids)


@pytest.mark.parametrize("seed", range(4))
def test_rows_follow_requests_through_joins_leaves_and_preemption(seed):
    rng = np.random.default_rng(seed)
    drafter = RecordingDrafter()
    tracker = RowTracker(drafter, max_absent=2)
    batch = FakeBatch(8, rng)
    preempted: list[list[int]] = []
    total = 0
    for _step in range(120):
        if len(batch.reqs) < 8 and rng.random() < 0.5:
            if preempted and rng.random() < 0.5:
                batch.add(preempted.pop(0))  # resumes, maybe in another row
            else:
                batch.add(rng.integers(0, 50, size=int(rng.integers(3, 40))).tolist())
        if batch.reqs and rng.random() < 0.15:
            gone = batch.remove(int(rng.integers(len(batch.reqs))))
            if rng.random() < 0.3 and len(gone) < MAX_LEN - 60:
                preempted.append(gone)
        batch.grow()
        if any(len(r) > MAX_LEN - 10 for r in batch.reqs):
            batch.remove(next(i for i, r in enumerate(batch.reqs) if len(r) > MAX_LEN - 10))
        upd = tracker.update(batch.token_ids, batch.num, [True] * len(batch.reqs))
        total += sum(len(r) for r in batch.reqs)
        check(tracker, drafter, batch, upd.rids)
    # each token is sent about once (new and resumed requests are indexed whole once): far below
    # re-sending every context each step
    assert drafter.sent < 0.2 * total
    assert len(drafter.ctx) <= 8 + len(preempted) + 8  # absent ones are dropped after max_absent steps


def test_moved_request_keeps_its_drafter_state():
    drafter = RecordingDrafter()
    tracker = RowTracker(drafter)
    batch = FakeBatch(4, np.random.default_rng(0))
    for p in ([1, 2, 3], [4, 5, 6, 7], [8, 9]):
        batch.add(p)
    first = tracker.update(batch.token_ids, batch.num, [True] * 3).rids
    batch.remove(0)  # row 2 moves to row 0
    batch.grow()
    upd = tracker.update(batch.token_ids, batch.num, [True] * 2)
    assert upd.rids == [first[2], first[1]] and upd.moved == 1 and upd.new == 0
    check(tracker, drafter, batch, upd.rids)
    for _ in range(2):  # the finished request is dropped after max_absent steps
        tracker.update(batch.token_ids, batch.num, [True] * 2)
    assert drafter.removed == [first[0]]


def test_inactive_rows_get_no_request_but_stay_known():
    drafter = RecordingDrafter()
    tracker = RowTracker(drafter, max_absent=1)
    batch = FakeBatch(2, np.random.default_rng(0))
    batch.add([1, 2, 3])
    batch.add([7, 8])
    rid0 = tracker.update(batch.token_ids, batch.num, [True, True]).rids[0]
    upd = tracker.update(batch.token_ids, batch.num, [False, True])  # row 0 prefills or was discarded
    assert upd.rids[0] is None and upd.removed == 0
    assert tracker.update(batch.token_ids, batch.num, [True, True]).rids[0] == rid0


def test_identical_prompts_in_two_rows_get_two_requests():
    drafter = RecordingDrafter()
    tracker = RowTracker(drafter)
    batch = FakeBatch(2, np.random.default_rng(0))
    batch.add([5, 6, 7])
    batch.add([5, 6, 7])
    upd = tracker.update(batch.token_ids, batch.num, [True, True])
    assert upd.rids[0] != upd.rids[1] and upd.new == 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_absent"):
        RowTracker(RecordingDrafter(), max_absent=0)
