"""The interrupt sweep (tests/interrupt_sweep.py) in CI: ``KeyboardInterrupt`` and ``RuntimeError`` at a
stride of the lines of one step that joins, drafts, stops on a stop string and finishes a request, eager
and compiled (``backend:aot_eager``); after each the run resumes with no wrong token, no lost request,
streams equal to the results and the user's model intact. Each case prints the points it covered (and
records them as a junit property); ``SSSD_SWEEP_STRIDE=1`` sweeps every line (as ``tests/fault_soak.py
sweep`` does)."""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch
from interrupt_sweep import Scenario, sweep

torch.set_num_threads(1)

# (compile, exception, stride, offset): about 570 points, staggered so the cases meet different lines
CASES = [
    (False, KeyboardInterrupt, 9, 0),
    (False, RuntimeError, 23, 5),
    ("backend:aot_eager", KeyboardInterrupt, 23, 11),
    ("backend:aot_eager", RuntimeError, 53, 23),
]
FULL = os.environ.get("SSSD_SWEEP_STRIDE") == "1"


@pytest.fixture(scope="module", params=[False, "backend:aot_eager"], ids=["eager", "compiled"])
def scenario(request):
    return Scenario(request.param)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError], ids=["KeyboardInterrupt", "RuntimeError"])
def test_an_exception_at_any_line_of_a_step_costs_nothing(scenario, exc, record_property, caplog):
    _, _, stride, offset = next(c for c in CASES if c[0] == scenario.compile and c[1] is exc)
    if FULL:
        stride, offset = 1, 0
    t0 = time.perf_counter()
    with caplog.at_level(logging.CRITICAL, logger="sssd.engine"):  # the injected faults' warnings
        rep = sweep(scenario, exc, stride=stride, offset=offset)
    seconds = time.perf_counter() - t0
    mode = "compiled" if scenario.compile else "eager"
    print(
        f"interrupt sweep {mode} {exc.__name__}: {rep.points} points of {rep.lines} lines "
        f"({rep.spared} spared by design, {rep.unreached} past the step's end), {seconds:.1f} s"
    )
    record_property("interrupt_points", rep.points)
    assert rep.points + rep.spared + rep.unreached == len(range(offset + 1, rep.lines + 1, stride))
    # the sweep raises at nearly every point it visits: lines spared by design (the tokenizer's decode and
    # the compiler's first call) are a few percent of a step's lines, so a stride may land on a few
    assert rep.points > 8 * (rep.spared + rep.unreached)
    assert not rep.problems, "\n".join(rep.problems[:20])


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError], ids=["KeyboardInterrupt", "RuntimeError"])
def test_an_exception_while_recycling_costs_nothing(exc, caplog):
    """The same with a drafter that asks for every verified node's top-k (the recorder in verification,
    the hand-over after the step), at a coarser stride."""
    scn = Scenario(False, recycle_rows="all")
    engine, _ = scn.prepare()
    engine.step()
    assert engine.drafter.recycled > 0  # the swept step records and hands over rows
    with caplog.at_level(logging.CRITICAL, logger="sssd.engine"):
        rep = sweep(scn, exc, stride=1 if FULL else 31, offset=3)
    assert rep.points > 8 * (rep.spared + rep.unreached)
    assert not rep.problems, "\n".join(rep.problems[:20])
