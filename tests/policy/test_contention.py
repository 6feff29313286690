"""Speed figures a user can trust: the contention meter (others' CPU time, this process's, the load
average), its verdict and words, and the notes a speedup line carries (busy machine, a loss despite
accepted drafts and what cost it). Timings are faked: nothing here depends on this machine's load."""

from __future__ import annotations

import time

import pytest
from sssd.cli.speedup import TreeCost, speedup_notes, tree_cost
from sssd.policy import contention
from sssd.policy.contention import BUSY_SHARE, Contention, ContentionMeter, worst
from sssd.policy.interface import StepRecord


def reading(others, own=2.0, load=None, cores=2, wanted=2):
    return Contention(10.0, own, others, load, cores, wanted)


def test_a_quiet_machine_is_not_busy_and_says_nothing():
    quiet = reading(0.02)
    assert not quiet.busy and quiet.mark() == ""


@pytest.mark.parametrize(
    "others,cores,wanted,busy",
    [
        (1.0, 2, 2, True),  # half the machine went to others
        (0.9, 4, 2, False),  # others ran on the two cores this run left idle
        (2.5, 4, 2, True),  # ... and beyond them
        (BUSY_SHARE * 2 - 0.01, 2, 2, False),
        (BUSY_SHARE * 2 + 0.01, 2, 2, True),
    ],
)
def test_busy_means_others_took_cores_the_run_wanted(others, cores, wanted, busy):
    assert reading(others, cores=cores, wanted=wanted).busy is busy


def test_without_proc_stat_the_load_average_less_this_process_decides():
    assert not reading(None, own=2.0, load=2.1).busy  # the load is this process's own threads
    busy = reading(None, own=1.1, load=3.2)
    assert busy.busy
    assert busy.why() == "load average 3.2 on 2 cores, this process got 1.1 cores for 2 thread(s)"


def test_the_mark_says_why_in_one_line():
    mark = reading(1.3, own=0.6, load=3.1).mark()
    assert mark == (
        "unreliable (machine busy: other processes used 1.3 of 2 cores, load average 3.1 on 2 cores, "
        "this process got 0.6 cores for 2 thread(s))"
    )


def test_a_cpu_bound_run_that_got_little_cpu_was_starved_whatever_others_used():
    # a one-thread run that got a third of a core while the others used one core of two
    starved = Contention(10.0, 0.35, 1.1, 2.0, 2, 1, iowait_cores=0.4)
    assert starved.busy and starved.taken < BUSY_SHARE and starved.lost == pytest.approx(0.65)
    assert starved.why() == (
        "other processes used 1.1 of 2 cores, 0.4 cores waited for the disk, load average 2.0 on 2 cores, "
        "this process got 0.3 cores for 1 thread(s)"
    )
    assert not Contention(10.0, 0.95, 1.1, 2.0, 2, 1).busy
    # a run that waits on a GPU by design uses little CPU: only other processes count
    gpu = Contention(10.0, 0.2, 0.1, 1.0, 16, 1, cpu_bound=False)
    assert not gpu.busy and gpu.lost == 0.0


def test_worst_is_the_reading_that_lost_most():
    a, b = reading(0.0), reading(1.2)
    assert worst(a, b) is b and worst(b, a) is b
    starved = reading(0.0, own=0.8)
    assert worst(a, starved) is starved


def test_the_meter_adds_up_its_intervals_and_counts_others_from_proc_stat(monkeypatch):
    # /proc/stat: 0.1 s of all cores' time per interval, and 0.01 s of waiting for the disk
    times = iter([(100.0, 5.0), (100.1, 5.01), (200.0, 6.0), (200.1, 6.01)])
    monkeypatch.setattr(contention, "_system_times", lambda: next(times))
    monkeypatch.setattr(contention, "_load", lambda: 1.5)
    meter = ContentionMeter(threads=8)
    assert meter.wanted == min(8, meter.cores)
    for _ in range(2):
        with meter:
            time.sleep(0.02)  # no CPU time of ours: the 0.1 s were other processes'
    r = meter.reading()
    assert r.wall_s >= 0.04 and r.own_cores < 0.5 and r.load == 1.5
    assert r.others_cores == pytest.approx(0.2 / r.wall_s, rel=0.05)
    assert r.iowait_cores == pytest.approx(0.02 / r.wall_s, rel=0.05)


def test_the_meter_without_proc_stat_has_no_others(monkeypatch):
    monkeypatch.setattr(contention, "_system_times", lambda: None)
    meter = ContentionMeter(1)
    with meter:
        pass
    assert meter.reading().others_cores is None and meter.reading().iowait_cores is None


def test_proc_stat_is_read_where_there_is_one():
    times = contention._system_times()
    assert times is None or (times[0] > 0 and times[1] >= 0)


def steps(*rows):
    """Step records (batch size, nodes in the forward, forward seconds)."""
    return [StepRecord(b, 100, n, n - b, forward_s=f) for b, n, f in rows]


def test_tree_cost_is_the_median_tree_forward_over_the_median_plain_one():
    history = steps((1, 17, 0.060), (1, 17, 0.058), (1, 9, 0.050), (1, 1, 0.010))
    plain = steps((1, 1, 0.011), (1, 1, 0.012))
    cost = tree_cost(history, plain)
    assert cost == TreeCost(17, 1, pytest.approx(0.058 / 0.011))
    assert cost.text() == "a 17-token forward cost 5.3x a one-token forward here"
    assert tree_cost(steps((1, 1, 0.01))) is None  # no tree forward
    assert tree_cost(steps((1, 17, 0.06))) is None  # no plain forward to compare with
    batch = tree_cost(steps((4, 36, 0.09), (4, 4, 0.03)))
    assert batch.text() == "a 36-token forward cost 3.0x a 4-token plain forward here"


def test_speedup_notes():
    quiet, busy = reading(0.0), reading(1.2, own=0.8, load=3.0)
    cost = TreeCost(17, 1, 5.8)
    assert speedup_notes(1.4, 1.9, quiet, cost) == ""
    assert speedup_notes(0.58, 6.0, quiet, cost) == (
        "slower despite 6.00 tokens per forward: a 17-token forward cost 5.8x a one-token forward here"
    )
    assert speedup_notes(0.95, 1.02, quiet, cost) == ""  # hardly any draft accepted: nothing to explain
    both = speedup_notes(0.58, 6.0, busy, cost)
    assert both.startswith("unreliable (machine busy: other processes used 1.2 of 2 cores")
    assert both.endswith("5.8x a one-token forward here")
    assert speedup_notes(1.2, 2.0, busy, None).startswith("unreliable")
