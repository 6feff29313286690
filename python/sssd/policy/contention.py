"""Was the machine busy while something was timed? A speed figure measured while other processes took
CPU time from the run says as much about them as about the run: on a shared 2-core machine a demo once
printed 0.58x for a run that verified no draft on 96% of its steps. :class:`ContentionMeter` measures,
over the intervals it wraps, the CPU time other processes used (Linux ``/proc/stat``: every core's busy
time, including time the hypervisor gave to other guests, less this process's own CPU time), the time
the cores sat waiting for the disk, this process's CPU time against the wall time, and the 1-minute load
average against the cores. Its :class:`Contention` reading says whether the figure is trustworthy and,
if not, why, in a few words that the programs print next to the figure.

Two signs, either enough: other processes took a share of the cores the run wanted, or a CPU-bound run
got far less CPU time than its threads could use. The second catches what the first misses: on the
project's shared VM a one-thread demo once got 0.35 cores (its whole process) while the other processes
used about one core of two, and its plain decoding ran at a fifth of its speed.

Only the standard library: the meter costs two file reads per interval.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

# Busy: other processes took at least this share of the cores the run wanted. A run of torch's threads
# waits at every parallel region for its slowest thread, so even a small share taken from one core slows
# it by more than that share; below it the background noise of an idle machine (about 1%) stays quiet.
BUSY_SHARE = 0.15
# Starved: a CPU-bound run got less than this share of its threads' time (torch's threads keep their cores
# busy through a forward, and stay spinning between forwards: 1.9-2.0 cores of 2 on a quiet machine).
STARVED_SHARE = 0.7


def _system_times() -> tuple[float, float] | None:
    """(seconds all cores together spent on anything but idling, seconds they idled waiting for the disk)
    since boot, from ``/proc/stat``; busy counts user, nice, system, irq, softirq and steal (time the
    hypervisor gave to other guests). None where there is none (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if fields[0] != "cpu" or len(ticks) < 8:
        return None
    user, nice, system, _idle, iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / hz, iowait / hz


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return None


@dataclass(frozen=True)
class Contention:
    """What a :class:`ContentionMeter` saw over its intervals. ``others_cores`` is the mean number of
    cores other processes kept busy and ``iowait_cores`` the mean number idling on the disk (None: not
    measurable here; others are then estimated from the load average); ``own_cores`` this process's CPU
    time over the wall time; ``wanted`` the cores the run could use (its threads, at most the cores);
    ``cpu_bound``: the run keeps its threads busy (a CPU forward), so getting less CPU says it waited."""

    wall_s: float
    own_cores: float
    others_cores: float | None
    load: float | None  # the highest 1-minute load average sampled (at the start and end of intervals)
    cores: int
    wanted: int
    iowait_cores: float | None = None
    cpu_bound: bool = True

    @property
    def taken(self) -> float:
        """Cores other processes took from those the run wanted (beyond the cores it left idle)."""
        others = self.others_cores
        if others is None:  # the load average counts this process's runnable threads too
            others = 0.0 if self.load is None else max(self.load - self.own_cores, 0.0)
        return max(others - (self.cores - self.wanted), 0.0)

    @property
    def lost(self) -> float:
        """Share of the wanted cores the run did not have: taken by others, or (CPU-bound) not used."""
        share = self.taken / self.wanted
        return max(share, 1 - self.own_cores / self.wanted) if self.cpu_bound else share

    @property
    def starved(self) -> bool:
        return self.cpu_bound and self.own_cores < STARVED_SHARE * self.wanted

    @property
    def busy(self) -> bool:
        return self.wall_s > 0 and (self.taken >= BUSY_SHARE * self.wanted or self.starved)

    def why(self) -> str:
        """The evidence in a few words: what other processes used, the disk waits, the load average, and
        the CPU this process got."""
        parts = []
        if self.others_cores is not None:
            parts.append(f"other processes used {self.others_cores:.1f} of {self.cores} cores")
        if self.iowait_cores is not None and self.iowait_cores >= 0.05:
            parts.append(f"{self.iowait_cores:.1f} cores waited for the disk")
        if self.load is not None:
            parts.append(f"load average {self.load:.1f} on {self.cores} cores")
        parts.append(f"this process got {self.own_cores:.1f} cores for {self.wanted} thread(s)")
        return ", ".join(parts)

    def mark(self) -> str:
        """'' on a quiet machine, else ``unreliable (machine busy: WHY)`` to print beside the figure."""
        return f"unreliable (machine busy: {self.why()})" if self.busy else ""


def worst(*readings: Contention) -> Contention:
    """The reading that lost the most: a ratio of two runs is off when either run was slowed (a busy
    reading first, then the larger share of its cores lost)."""
    return max(readings, key=lambda c: (c.busy, c.lost))


class ContentionMeter:
    """Measures contention over the intervals it wraps (``with meter: ...``, any number of times: a run
    that takes turns with others is measured over its own turns only). ``threads``: the threads the timed
    work runs (torch's), None for every core; ``cpu_bound``: False where the work waits on something else
    by design (a GPU), so that little CPU time is not read as starvation."""

    def __init__(self, threads: int | None = None, cpu_bound: bool = True) -> None:
        self.cores = os.cpu_count() or 1
        self.wanted = max(1, min(int(threads or self.cores), self.cores))
        self.cpu_bound = cpu_bound
        self.wall_s = self.own_s = 0.0
        self.others_s: float | None = 0.0
        self.iowait_s: float | None = 0.0
        self.load: float | None = None
        self._start: tuple[float, float, tuple[float, float] | None] | None = None

    def __enter__(self) -> ContentionMeter:
        self._sample_load()
        self._start = (time.perf_counter(), time.process_time(), _system_times())
        return self

    def __exit__(self, *exc: object) -> None:
        wall0, own0, sys0 = self._start or (time.perf_counter(), time.process_time(), None)
        sys1 = _system_times()
        own = time.process_time() - own0
        self.wall_s += time.perf_counter() - wall0
        self.own_s += own
        if self.others_s is not None and self.iowait_s is not None and sys0 is not None and sys1 is not None:
            # /proc/stat counts in clock ticks (10 ms): a short interval may show less than the process's
            # own, finer, CPU time
            self.others_s += max(sys1[0] - sys0[0] - own, 0.0)
            self.iowait_s += max(sys1[1] - sys0[1], 0.0)
        else:
            self.others_s = self.iowait_s = None
        self._sample_load()
        self._start = None

    def _sample_load(self) -> None:
        load = _load()
        if load is not None:
            self.load = load if self.load is None else max(self.load, load)

    def reading(self) -> Contention:
        wall = max(self.wall_s, 1e-9)
        others = None if self.others_s is None else self.others_s / wall
        iowait = None if self.iowait_s is None else self.iowait_s / wall
        own, cores, wanted = self.own_s / wall, self.cores, self.wanted
        return Contention(self.wall_s, own, others, self.load, cores, wanted, iowait, self.cpu_bound)
