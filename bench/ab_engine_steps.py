"""Engine steps/s on a tiny random model (tests/tiny_models.py), for A/B comparisons of two checkouts of
the engine's Python code (the native core must be built in both; it only serves the drafter here).

    OMP_NUM_THREADS=1 python bench/ab_engine_steps.py --python python --repeats 5
    OMP_NUM_THREADS=1 python bench/ab_engine_steps.py --python ../other/python --repeats 5

Rows: budget 0 (plain decoding) and budget 8 (random trees from tests/toy_drafters.py), batch 4; each
row is the best of ``--repeats`` runs (the machine is shared). Also: the cost of switching the model's
attention implementation there and back (what the engine does around each of its forwards).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


def run(engine_cls, config_cls, model, drafter, budget: int, prompts) -> tuple[int, float]:
    engine = engine_cls(model, drafter=drafter, config=config_cls(budget=budget, budget_mode="fixed"))
    t = time.perf_counter()
    engine.generate(prompts, max_new_tokens=160, eos_token_ids=())
    return engine.stats.steps, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="python", help="the sssd package's parent folder to measure")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sys.path[:0] = [str(Path(args.python).resolve()), str(TESTS)]
    import numpy as np
    import torch
    from sssd.engine.adapter import ATTENTION_NAME
    from sssd.engine.engine import Engine, EngineConfig
    from tiny_models import VOCAB, tiny_model
    from toy_drafters import RandomTreeDrafter

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, VOCAB, size=12).tolist() for _ in range(4)]
    print(f"engine from {Path(args.python).resolve()}")
    print(f"{'budget':>6} {'steps':>6} {'best s':>8} {'steps/s':>8}")
    for budget in (0, 8):
        best = None
        for r in range(args.repeats):
            drafter = RandomTreeDrafter(VOCAB, "random", seed=r) if budget else None
            steps, dt = run(Engine, EngineConfig, tiny_model("llama"), drafter, budget, prompts)
            best = dt if best is None else min(best, dt)
        print(f"{budget:>6} {steps:>6} {best:>8.3f} {steps / best:>8.1f}")
    model, n = tiny_model("llama"), 2000
    own = model.config._attn_implementation
    t = time.perf_counter()
    for _ in range(n):
        model.set_attn_implementation(ATTENTION_NAME)
        model.set_attn_implementation(own)
    us = (time.perf_counter() - t) / n * 1e6
    print(f"attention switch there and back (set_attn_implementation): {us:.1f} us")


if __name__ == "__main__":
    main()
