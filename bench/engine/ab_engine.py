"""Interleaved A/B of the engine's time per step between two builds of the package (before/after a change
of the engine's Python code; the native core must be built in both, it serves the drafter here).

    OMP_NUM_THREADS=1 PYTHONPATH=python:. python3 bench/engine/ab_engine.py /path/to/old/python python

Rows: budget 0 (plain decoding) and budget 8 (random trees from tests/toy_drafters.py, seeded, so both
builds verify the same trees), batch 4, 160 new tokens per request, the tiny random Llama of
tests/tiny_models.py, fixed budget; ms per engine step, CPU and wall, each measurement in a fresh process
through the A/B harness (bench/ab.py): the builds alternate for ``--rounds`` rounds, medians printed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora, ab)
import ab

TESTS = Path(__file__).resolve().parents[2] / "tests"
BUDGETS = [(0,), (8,)]


def child(budget: str) -> dict:
    """One run with the package on this process's path: {"cpu_ms", "wall_ms"} per step, "steps"."""
    sys.path.insert(0, str(TESTS))
    import numpy as np
    import sssd
    import torch
    from tiny_models import VOCAB, tiny_model
    from toy_drafters import RandomTreeDrafter

    torch.set_num_threads(1)
    b = int(budget)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, VOCAB, size=12).tolist() for _ in range(4)]
    drafter = RandomTreeDrafter(VOCAB, "random", seed=0) if b else None
    if drafter is not None:  # the toy drafter's own bookkeeping is not the engine's cost, and builds that
        drafter.observe = lambda *args: None  # hand observe its feedback in different forms compare alike
    config = sssd.EngineConfig(budget=b, budget_mode="fixed")
    engine = sssd.Engine(tiny_model("llama"), drafter=drafter, config=config)
    w0, c0 = time.perf_counter(), time.process_time()
    engine.generate(prompts, max_new_tokens=160, eos_token_ids=())
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    steps = engine.stats.steps
    return {"cpu_ms": 1e3 * cpu / steps, "wall_ms": 1e3 * wall / steps, "steps": steps}


def main() -> None:
    args = ab.parser(__doc__, rounds=5).parse_args()
    measure = ab.self_child(__file__)
    ab.interleave(args, BUDGETS, measure, labels=("budget",), unit="ms/step", cpu="cpu_ms", wall="wall_ms")


if __name__ == "__main__":
    if not ab.child_main(child):
        main()
