"""The recycled candidates on the bundled prompts, teacher-forced (deterministic: MAL only, no timing).

    OMP_NUM_THREADS=1 PYTHONPATH=python:. python3 bench/drafter/recycled_bundled.py [--budgets 4,8,16,32]

The pairs: the bundled prompts (every kind) and --dev development prompts, each with SmolLM2-135M-Instruct's
float32 greedy output of --new tokens (generated once by the engine, lossless, and cached beside the
teacher top-k), the model's top-8 along them (sssd.models.teacher, cached). Each budget replays them at
batch 1 in bench_recycled.py (c)'s order with online calibration and the bundled datastore, with and
without the recycled candidates (what the engine's drafter sees at that fixed budget): MAL per prompt kind.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import sssd
from sssd.evaluation.pairs import Pair
from sssd.evaluation.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
import corpora


def bundled_pairs(n_dev: int, new: int) -> list[Pair]:
    from sssd.models.local import cache_dir

    path = cache_dir() / "bench" / f"bundled_pairs_f32_once_{n_dev}_{new}.jsonl"  # each prompt once
    if not path.is_file():
        _generate(path, n_dev, new)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [
        Pair(
            r["id"], r["subset"], np.asarray(r["prompt_ids"], np.int32), np.asarray(r["output_ids"], np.int32)
        )
        for r in rows
    ]


def _generate(path: Path, n_dev: int, new: int) -> None:
    import torch
    from bench_recycled_engine import _prompts
    from sssd.integrations.vllm_demo import demo_datastore
    from sssd.models.loading import load_model

    torch.set_num_threads(1)
    model, tok, _ = load_model(None, "float32")
    drafter = sssd.Drafter(
        sssd.Datastore.open(demo_datastore()), sssd.DrafterConfig(vocab_size=corpora.VOCAB)
    )
    engine = sssd.Engine(model, tok, drafter=drafter, config=sssd.EngineConfig(budget=16, max_batch_size=1))
    lines = []
    for kind, pid, ids in _prompts(tok, n_dev):
        out = engine.generate([ids], max_new_tokens=new)[0].tokens
        lines.append(
            json.dumps({"prompt_ids": list(ids), "output_ids": list(out), "id": pid, "subset": kind})
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def teacher(pairs):
    from bench_recycled import teacher as teacher_of

    return teacher_of(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budgets", default="4,8,16,32")
    ap.add_argument("--dev", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    args = ap.parse_args()
    pairs = bundled_pairs(args.dev, args.new)
    top = teacher(pairs)
    from sssd.integrations.vllm_demo import demo_datastore

    ds = sssd.Datastore.open(demo_datastore())
    kinds = list(dict.fromkeys(p.subset for p in pairs))
    print("| budget | arm | MAL | " + " | ".join(f"MAL {k}" for k in kinds) + " |")
    print("|---|---|---|" + "---|" * len(kinds))
    for budget in map(int, args.budgets.split(",")):
        for rec in (False, True):
            d = sssd.Drafter(ds, sssd.DrafterConfig(use_recycled=rec, vocab_size=corpora.VOCAB))
            r = simulate(d, pairs, budget=budget, batch_size=1, observe=True, top_k=top if rec else None)
            cells = [budget, "+recycled" if rec else "sssd", f"{r.mal:.3f}"]
            cells += [f"{r.subset_mal(k):.3f}" for k in kinds]
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)


if __name__ == "__main__":
    main()
