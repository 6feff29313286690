"""Fault soak: many engine steps under random faults, outputs checked against fault-free greedy decoding.

Faults, at random: KeyboardInterrupt at any line of the engine's own code inside ``step()`` (a trace
function) and exceptions from every drafter method (tokenizer decode failures are covered by
tests/test_engine_faults.py). The drafter is either the test oracle (drafts the true continuation,
corrupted) or sssd's retrieval drafter over the requests' own tokens. After the faults stop, the engine
must finish every request.

Prints, per drafter: steps, faults injected, wrong tokens, lost and unfinished requests, requests whose
cache rows were rebuilt.

    PYTHONPATH=python:tests python3 bench/fault_soak.py [--seeds 20] [--rate 0.004] [--drafter-p 0.05]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import sssd
import torch
from sssd.engine.engine import Engine, EngineConfig
from test_engine_faults import FaultyDrafter, _Interrupter, _run_to_end
from tiny_models import VOCAB, hf_greedy, tiny_model

PROMPTS = [[9, 3, 4], [2, 8], [5, 5, 6, 7], [11, 12], [20, 21, 22], [30, 4], [40, 41], [7, 7, 7]]


def soak(kind: str, seed: int, refs: list[list[int]], args) -> dict:
    if kind == "oracle":
        inner = _oracle_for(refs, seed)
    else:
        inner = sssd.Drafter(None, sssd.DrafterConfig(vocab_size=VOCAB))
    drafter = FaultyDrafter(inner, p=args.drafter_p, seed=seed)
    engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=8, max_batch_size=4))
    rids = [engine.add_request(p, max_new_tokens=args.new_tokens, eos_token_ids=()) for p in PROMPTS]
    trace = _Interrupter(rate=args.rate, seed=seed)

    def stop_faults(step: int) -> None:
        if step == args.fault_steps:  # the faults stop; every request must then finish
            trace.on, drafter.armed = False, False

    streamed: dict[int, list[int]] = {}
    results, interrupts = _run_to_end(
        engine, len(rids), max_steps=5000, trace=trace, before_step=stop_faults, streamed=streamed
    )
    wrong = sum(
        sum(a != b for a, b in zip(results[r].tokens, refs[r], strict=False))
        + abs(len(results[r].tokens) - len(refs[r]))
        for r in rids
        if r in results
    )
    return dict(
        steps=engine.stats.steps, interrupts=interrupts, drafter_faults=drafter.raised, wrong=wrong,
        lost=len(rids) - len(results), unfinished=int(engine.has_unfinished()),
        stream=sum(streamed.get(r, []) != refs[r] for r in rids),
        repaired=engine.stats.repaired,
    )  # fmt: skip


def _oracle_for(refs, seed):
    from toy_drafters import OracleDrafter

    return OracleDrafter(
        VOCAB, {i: p + r for i, (p, r) in enumerate(zip(PROMPTS, refs, strict=True))}, 0.2, seed
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20, help="runs per drafter (default 20)")
    ap.add_argument("--rate", type=float, default=0.01, help="chance of an interrupt per engine line (0.01)")
    ap.add_argument("--drafter-p", type=float, default=0.05, help="chance a drafter call raises (0.05)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens per request (64)")
    ap.add_argument("--fault-steps", type=int, default=150, help="steps with faults before they stop (150)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = tiny_model("llama")
    refs = [hf_greedy(model, p, args.new_tokens) for p in PROMPTS]
    logging.getLogger("sssd.engine").setLevel(logging.ERROR)  # the injected faults' warnings
    head = (
        "| drafter | runs | steps | interrupts | drafter faults | wrong tokens | lost requests | unfinished"
    )
    print(head + " | streams differing | rebuilt |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in ("oracle", "retrieval"):
        tot: dict[str, int] = {}
        for seed in range(args.seeds):
            for k, v in soak(kind, seed, refs, args).items():
                tot[k] = tot.get(k, 0) + v
        print(
            f"| {kind} | {args.seeds} | {tot['steps']} | {tot['interrupts']} | {tot['drafter_faults']} | "
            f"{tot['wrong']} | {tot['lost']} | {tot['unfinished']} | {tot['stream']} | {tot['repaired']} |"
        )


if __name__ == "__main__":
    main()
