"""The fault soaks (tests/fault_soak.py) through their command line, on a few seeds each: the same runs
as their long versions (docs/engine.md, "Faults"), shorter. Marked slow: about 15 s on one core."""

from __future__ import annotations

import pytest
from fault_soak import DRAFTERS, main

pytestmark = pytest.mark.slow

DAMAGE = ("wrong", "lost", "unfinished")


def test_faults_soak_costs_no_token_and_no_request(capsys):
    totals = main(["faults", "--seeds", "8"])
    table = capsys.readouterr().out
    for kind in DRAFTERS:
        tot = totals[kind]
        assert tot["interrupts"] > 100 and tot["drafter_faults"] > 0, (kind, tot)
        assert [tot[k] for k in (*DAMAGE, "stream")] == [0, 0, 0, 0], (kind, tot)
        assert f"| {kind} | 8 | {tot['steps']} | {tot['interrupts']} |" in table


def test_chaos_soak_costs_no_token_and_no_request(capsys):
    tot = main(["chaos", "--seeds", "4"])
    table = capsys.readouterr().out
    faults = ("interrupts", "drafter_faults", "malformed", "forward_faults", "aborted")
    assert all(tot[k] > 0 for k in faults), tot
    assert tot["sampled"] == 4 * 24  # the odd half of 48 requests, per run
    assert [tot[k] for k in (*DAMAGE, "stream_mismatch")] == [0, 0, 0, 0], tot
    assert f"| {tot['steps']:,} | {tot['interrupts']:,} |" in table
