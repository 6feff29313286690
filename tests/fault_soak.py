"""Fault soaks: many engine steps under random faults, outputs checked against fault-free decoding.

``faults``: KeyboardInterrupt at any line of the engine's own code inside ``step()`` (a trace function)
and exceptions from every drafter method (tokenizer decode failures are covered by
tests/engine/test_engine_faults.py). The drafter is either the test oracle (drafts the true continuation,
corrupted) or sssd's retrieval drafter over the requests' own tokens; the reference is greedy decoding.
Prints, per drafter: steps, faults injected, wrong tokens, lost and unfinished requests, streams
differing from their results, requests whose cache rows were rebuilt.

``chaos``: every fault at once (tests/chaos.py): drafter exceptions in every method, malformed drafter
outputs of every kind (None, wrong types, missing fields, bad tokens / parents / depths / offsets,
2,000-node trees, draft_probs of the wrong shape, NaN, negative, q = 0), ``KeyboardInterrupt`` at random
lines of the engine's code, failing forwards (prefill, tree forward, output head; RuntimeError and
torch.OutOfMemoryError) and ``abort()`` from a second thread. Half the requests are greedy, half seeded
sampling; the reference is fault-free plain decoding with the same seeds. Prints the totals over the runs:
steps, faults injected, and the damage (wrong tokens, lost requests, unfinished, streams differing from
their results). Aborted requests count as wrong if their partial output is not a prefix of the reference.

In both, after the faults stop the engine must finish every request. The suite runs both on a few seeds
(tests/engine/test_fault_soak.py, marked slow); the long versions:

    OMP_NUM_THREADS=1 PYTHONPATH=python:tests python3 tests/fault_soak.py faults [--seeds 100]
    OMP_NUM_THREADS=1 PYTHONPATH=python:tests python3 tests/fault_soak.py chaos [--seeds 40]

``sweep``: not random at all: ``KeyboardInterrupt`` and ``RuntimeError`` at every line of one step, eager
and compiled (tests/interrupt_sweep.py; the suite runs a stride of it,
tests/engine/test_engine_interrupt_sweep.py):

    OMP_NUM_THREADS=1 PYTHONPATH=python:tests python3 tests/fault_soak.py sweep [--stride 1]
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/: the fault injectors and tiny models

import sssd
import torch
from chaos import ChaosRates, reference, run_chaos
from faults import FaultyDrafter, Interrupter, run_to_end
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.sampling import SamplingParams
from tiny_models import VOCAB, hf_greedy, tiny_model

PROMPTS = [[9, 3, 4], [2, 8], [5, 5, 6, 7], [11, 12], [20, 21, 22], [30, 4], [40, 41], [7, 7, 7]]
DRAFTERS = ("oracle", "retrieval")


def soak(kind: str, seed: int, refs: list[list[int]], args) -> dict[str, int]:
    """One ``faults`` run of the 8 PROMPTS with drafter ``kind``; counts of steps, faults and damage."""
    if kind == "oracle":
        inner = _oracle_for(refs, seed)
    else:
        inner = sssd.Drafter(None, sssd.DrafterConfig(vocab_size=VOCAB))
    drafter = FaultyDrafter(inner, p=args.drafter_p, seed=seed)
    engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=8, max_batch_size=4))
    rids = [engine.add_request(p, max_new_tokens=args.new_tokens, eos_token_ids=()) for p in PROMPTS]
    trace = Interrupter(rate=args.rate, seed=seed)

    def stop_faults(step: int) -> None:
        if step == args.fault_steps:  # the faults stop; every request must then finish
            trace.on, drafter.armed = False, False

    streamed: dict[int, list[int]] = {}
    results, interrupts = run_to_end(
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


def _add(total: dict[str, int], rep: dict) -> None:
    for k, v in rep.items():
        total[k] = total.get(k, 0) + int(v)


def faults(args) -> dict[str, dict[str, int]]:
    """The ``faults`` soak: totals over ``args.seeds`` runs per drafter, printed as a table row each."""
    model = tiny_model("llama")
    refs = [hf_greedy(model, p, args.new_tokens) for p in PROMPTS]
    head = "| drafter | runs | steps | interrupts | drafter faults | wrong tokens | lost requests"
    print(head + " | unfinished | streams differing | rebuilt |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    totals = {}
    for kind in DRAFTERS:
        tot = totals[kind] = {}
        for seed in range(args.seeds):
            _add(tot, soak(kind, seed, refs, args))
        print(
            f"| {kind} | {args.seeds} | {tot['steps']} | {tot['interrupts']} | {tot['drafter_faults']} | "
            f"{tot['wrong']} | {tot['lost']} | {tot['unfinished']} | {tot['stream']} | {tot['repaired']} |"
        )
    return totals


def chaos_requests(n: int, new_tokens: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """``n`` requests over PROMPTS, odd ones seeded sampling (temperature 0.9, top-k 40), even greedy."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    params = [
        SamplingParams(max_new_tokens=new_tokens, temperature=0.9, top_k=40, seed=1000 + i, eos_token_ids=())
        if i % 2
        else SamplingParams(max_new_tokens=new_tokens, eos_token_ids=())
        for i in range(n)
    ]
    return prompts, params


def chaos(args) -> dict[str, int]:
    """The ``chaos`` soak: totals of tests/chaos.py's report over ``args.seeds`` runs, printed as a table."""
    prompts, params = chaos_requests(args.requests, args.new_tokens)
    refs = reference(prompts, params)
    rates = ChaosRates(fault_steps=args.fault_steps)
    total: dict[str, int] = {}
    for seed in range(args.seeds):
        rep = asdict(run_chaos(prompts, params, refs, seed, rates))
        for rid, what in rep.pop("extra").items():  # the requests that went wrong, for a bug report
            print(f"run {seed}, request {rid}: {what}", file=sys.stderr)
        _add(total, rep)
    print(f"rates: {asdict(rates)}; {args.seeds} runs x {args.requests} requests x {args.new_tokens} tokens")
    print("| " + " | ".join(total) + " |")
    print("|" + "---|" * len(total))
    print("| " + " | ".join(f"{v:,}" for v in total.values()) + " |")
    return total


def sweep(args) -> dict[str, dict[str, int]]:
    """The ``sweep``: per (forward, exception) the lines of the swept step, the points and the problems."""
    import time

    from interrupt_sweep import Scenario
    from interrupt_sweep import sweep as run_sweep

    head = "| forward | exception | lines of the step | exceptions raised | spared by design | not reached"
    print(head + " | problems | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    out = {}
    for compile in (False, "backend:aot_eager"):
        scn = Scenario(compile)
        for exc in (KeyboardInterrupt, RuntimeError):
            t0 = time.perf_counter()
            rep = run_sweep(scn, exc, stride=args.stride)
            forward = "compiled (aot_eager)" if compile else "eager"
            for p in rep.problems:
                print(f"{forward}: {p}", file=sys.stderr)
            seconds = time.perf_counter() - t0
            print(f"| {forward} | {exc.__name__} | {rep.lines:,} | {rep.points:,} | {rep.spared} | "
                  f"{rep.unreached} | {len(rep.problems)} | {seconds:.0f} |", flush=True)  # fmt: skip
            counts = dict(lines=rep.lines, points=rep.points, spared=rep.spared, problems=len(rep.problems))
            counts["unreached"] = rep.unreached
            out[f"{forward} {exc.__name__}"] = counts
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="soak", required=True)
    f = sub.add_parser("faults", help="interrupts and drafter exceptions, per drafter")
    f.add_argument("--seeds", type=int, default=20, help="runs per drafter (default 20)")
    f.add_argument("--rate", type=float, default=0.01, help="chance of an interrupt per engine line (0.01)")
    f.add_argument("--drafter-p", type=float, default=0.05, help="chance a drafter call raises (0.05)")
    f.add_argument("--new-tokens", type=int, default=64, help="tokens per request (64)")
    f.add_argument("--fault-steps", type=int, default=150, help="steps with faults before they stop (150)")
    c = sub.add_parser("chaos", help="every fault at once (tests/chaos.py), greedy and seeded sampling")
    c.add_argument("--seeds", type=int, default=20, help="runs (default 20)")
    c.add_argument("--requests", type=int, default=48, help="requests per run (48)")
    c.add_argument("--new-tokens", type=int, default=32, help="tokens per request (32)")
    c.add_argument("--fault-steps", type=int, default=400, help="step calls with faults per run (400)")
    w = sub.add_parser("sweep", help="an exception at every line of one step (tests/interrupt_sweep.py)")
    w.add_argument("--stride", type=int, default=1, help="every n-th line (default 1: all)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None):
    """Runs the chosen soak; returns its totals (the tests check them)."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    logging.getLogger("sssd.engine").setLevel(logging.ERROR)  # the injected faults' warnings
    return {"faults": faults, "chaos": chaos, "sweep": sweep}[args.soak](args)


if __name__ == "__main__":
    main()
