"""The A/B harness: two builds of the package measured in turn, in fresh processes, round after round.

A build is the PYTHONPATH entry that holds its ``sssd`` package: ``python`` of a checkout after
``tools/dev_build.sh`` there, or a copy of that directory with its compiled modules. A caller gives its
rows (what differs between measurements: a batch size, a corpus, a budget) and a function that measures
one row with one build, usually through :func:`run_child`; :func:`interleave` runs every row
``rounds`` times per build, the builds alternating (A B, then B A, ...) so that both see the same
machine load, prints each measurement as it comes, and ends with a table of the medians side by side and
the ratio A / B of the CPU times (above 1: B is faster).

Callers: datastore/ab_search.py, drafter/ab_drafter.py, engine/ab_engine.py. They put bench/ on
``sys.path`` and ``import ab``, like ``corpora``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("A", "B")
CHILD = "_child"  # argv[1] of a script run as a measuring child


def parser(doc: str, rounds: int) -> argparse.ArgumentParser:
    """The options every A/B script takes: builds ``a`` and ``b`` and ``--rounds``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="PYTHONPATH entry of build A (the package directory's parent)")
    ap.add_argument("b", help="PYTHONPATH entry of build B")
    ap.add_argument("--rounds", type=int, default=rounds, help=f"measurements per build and row ({rounds})")
    return ap


def run_child(argv: Sequence[str], build: str, env: dict[str, str] | None = None) -> dict:
    """Runs ``python argv...`` in a fresh process from the repository root, with ``build`` first on
    PYTHONPATH (then the repository), one OpenMP thread and ``env`` added; returns the JSON object that
    the child printed as its last line of output."""
    full = dict(os.environ, PYTHONPATH=f"{build}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1", **(env or {}))
    cmd = [sys.executable, *map(str, argv)]
    out = subprocess.run(cmd, env=full, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def self_child(script: str | Path) -> Callable[[tuple, str, str], dict]:
    """The ``measure`` of a script that measures a row in a child of its own: ``script _child ROW...``
    run with the build (see :func:`child_main`)."""

    def measure(row: tuple, arm: str, build: str) -> dict:
        return run_child([Path(script).resolve(), CHILD, *map(str, row)], build)

    return measure


def child_main(measure: Callable[..., dict]) -> bool:
    """In a process started as ``script.py _child ARGS...``: prints ``measure(*ARGS)`` as JSON and returns
    True (the script then exits); otherwise returns False."""
    if len(sys.argv) < 2 or sys.argv[1] != CHILD:
        return False
    print(json.dumps(measure(*sys.argv[2:])))
    return True


def interleave(
    args: argparse.Namespace,
    rows: Sequence[tuple],
    measure: Callable[[tuple, str, str], dict],
    *,
    labels: Sequence[str],
    unit: str,
    cpu: str = "cpu_us_median",
    wall: str = "wall_us_median",
) -> list[dict[str, tuple[float, float]]]:
    """Measures every row ``args.rounds`` times with each build, alternating; ``measure(row, arm, build)``
    (arm "A" or "B", build its PYTHONPATH entry) returns a dict holding the ``cpu`` and ``wall`` times.
    Prints the measurements, then the table (one column per entry of ``labels``, the row's values); returns
    per row {arm: (median CPU, median wall)}."""
    builds = {"A": args.a, "B": args.b}
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    medians = []
    for row in rows:
        got: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for r in range(args.rounds):
            for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                m = measure(row, arm, builds[arm])
                got[arm].append(m)
                name = " ".join(f"{k} {v}" for k, v in zip(labels, row, strict=True))
                print(f"{name}: {arm} cpu {_num(m[cpu])} wall {_num(m[wall])} {unit}", flush=True)
        medians.append(
            {
                arm: (statistics.median(m[cpu] for m in ms), statistics.median(m[wall] for m in ms))
                for arm, ms in got.items()
            }
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}\n")
    print(table(rows, medians, labels, unit))
    return medians


def table(rows: Sequence[tuple], medians: list[dict], labels: Sequence[str], unit: str) -> str:
    """Markdown: the row's labels, each build's median CPU (wall), and A / B of the CPU times."""
    head = [*labels, *(f"{arm} {unit} cpu (wall)" for arm in ARMS), "A / B (cpu)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, med in zip(rows, medians, strict=True):
        (ac, aw), (bc, bw) = med["A"], med["B"]
        cells = [*map(str, row), f"{_num(ac)} ({_num(aw)})", f"{_num(bc)} ({_num(bw)})", f"{ac / bc:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(x: float) -> str:
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"
