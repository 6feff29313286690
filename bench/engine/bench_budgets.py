"""Every speculation budget side by side: transformers' ``generate``, the engine's plain decoding (budget 0),
fixed budgets and the adaptive policy, in each dtype, on what the package ships: the demo's prompts (five
kinds, taken in turn: chat, code, code-edit, passage, json) with the chat template, and a datastore of the
bundled corpus (SmolLM2-135M-Instruct's own outputs on other prompts). Greedy, EOS respected.

    OMP_NUM_THREADS=1 PYTHONPATH=python python3 bench/engine/bench_budgets.py            # quick (minutes)
    OMP_NUM_THREADS=1 PYTHONPATH=python python3 bench/engine/bench_budgets.py --prompts 12 \
        --max-new-tokens 128 --rounds 1 --batches 1,4          # the README's table (~35 minutes)
    OMP_NUM_THREADS=1 PYTHONPATH=python python3 bench/engine/bench_budgets.py --full  # 256 tokens, 3 rounds

Interleaved: in every round each run takes its turn on a prompt (a batch of prompts at batch > 1) before
the next prompt, in an order that rotates, so a load that comes and goes slows every run alike. Each run
builds a fresh engine (drafter, policy) per round and keeps it over that round's prompts, as a server
would. tokens/s = output tokens / wall time of the generate calls (prefill included), per round; the
table gives the median and the minimum over rounds, and every ratio is taken within a round (side by
side) before its median/min. Identical: outputs equal token for token to the engine's plain decoding in
the same dtype (float32: must be all; bfloat16: rounding differs between a many-token forward and
one-token forwards, so outputs can drift; where they differ, the position of the first difference). The
adaptive rows also print the budgets the policy chose and its predicted against its measured step times.
Speed depends on the machine and its load: the header prints both, and a row whose turns (or those of a
run it is compared with) ran while other processes took CPU time says so in its notes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sssd
import torch
from bench_engine import hf_generate  # greedy generate, left-padded batches, cut after EOS
from replay import Replay
from sssd.cli.demo import bundled_items, first_difference
from sssd.cli.speedup import speedup_notes, tree_cost
from sssd.data import sample_corpus, sample_vocab_size
from sssd.models.loading import chat_ids, cpu_bf16_units, load_model
from sssd.policy.contention import ContentionMeter, worst


@dataclass
class Run:
    """One configuration and what it measured: per round (rates), per prompt (outputs, MAL)."""

    name: str
    budget: int | None  # None: transformers' generate
    mode: str = "fixed"
    secs: list = field(default_factory=list)  # [rounds]
    tokens: list = field(default_factory=list)  # [rounds]
    steps: int = 0
    outputs: dict = field(default_factory=dict)  # prompt index -> tokens (last round)
    prompt_steps: dict = field(default_factory=dict)  # prompt index -> forward passes (last round)
    nodes: list = field(default_factory=list)  # draft nodes verified per step (every round)
    trace: list = field(default_factory=list)  # the adaptive policy's PolicyStep records (every round)
    turns: dict = field(default_factory=dict)  # (round, chunk) -> (tokens, seconds, outputs)
    history: list = field(default_factory=list)  # the engine's StepRecords (every round)
    meter: ContentionMeter = field(default_factory=lambda: ContentionMeter(torch.get_num_threads()))

    def rate(self, r: int) -> float:
        return self.tokens[r] / self.secs[r]


def runs_for(budgets: list[int], cap: int, hf: bool) -> list[Run]:
    runs = [Run("generate", None)] if hf else []
    runs += [Run("budget 0" if b == 0 else f"fixed {b}", b) for b in budgets]
    return [*runs, Run(f"adaptive 0..{cap}", cap, "adaptive")]


def engine_for(run: Run, model, tok, ds, batch: int):
    drafter = sssd.Drafter(datastore=ds) if run.budget else None
    cfg = sssd.EngineConfig(budget=run.budget, budget_mode=run.mode, max_batch_size=batch)
    return sssd.Engine(model, tok, drafter=drafter, config=cfg)


def one_turn(run: Run, engine, hf_model, chunk: list[int], prompts, new: int, eos: int) -> tuple[int, float]:
    """Runs ``run`` on the prompts of ``chunk`` (indexes); records outputs and steps. (tokens, seconds)."""
    ps = [prompts[i] for i in chunk]
    with run.meter:  # how busy the machine was over this run's own turns
        t = time.perf_counter()
        if engine is None:
            outs = hf_generate(hf_model, ps, new, eos)
        else:
            before = engine.stats.steps
            res = engine.generate(ps, max_new_tokens=new)
        secs = time.perf_counter() - t
    if engine is not None:
        outs = [r.tokens for r in res]
        taken = engine.stats.steps - before
        run.steps += taken
        steps = list(engine.stats.history)[-taken:] if taken else []
        run.history += steps
        run.nodes += [h.num_nodes - h.batch_size for h in steps]
        if run.mode == "adaptive" and taken:  # the policy keeps its most recent steps only
            run.trace += list(engine.policy.trace)[-taken:]
        for i, r in zip(chunk, res, strict=True):
            run.prompt_steps[i] = r.stats.steps
    for i, o in zip(chunk, outs, strict=True):
        run.outputs[i] = o
    return sum(map(len, outs)), secs


def references(model, tok, prompts, batch: int, new: int) -> dict:
    """The engine's plain decoding of every prompt, in chunks of ``batch`` (what replay writes)."""
    engine = engine_for(Run("budget 0", 0), model, tok, None, batch)
    refs = {}
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        out = engine.generate(chunk, max_new_tokens=new)
        refs.update({tuple(p): list(o.tokens) for p, o in zip(chunk, out, strict=True)})
    return refs


def measure(
    runs: list[Run], models, tok, ds, prompts, batch: int, rounds: int, new: int, fresh: bool, replay=None
) -> None:
    """``rounds`` rounds; in each, every run takes its turn on every chunk of ``batch`` prompts, with one
    engine per round (``fresh``: per turn, so that the adaptive policy starts cold on every chunk). With
    ``replay`` (a :class:`Replay`) the engine runs write its references."""
    model, hf_model = models
    eos = int(tok.eos_token_id)
    chunks = [list(range(i, min(i + batch, len(prompts)))) for i in range(0, len(prompts), batch)]
    for r in range(rounds):
        make = lambda run: None if run.budget is None else engine_for(run, model, tok, ds, batch)  # noqa: E731
        engines = [make(run) for run in runs]
        tokens, secs = np.zeros(len(runs), dtype=np.int64), np.zeros(len(runs))
        for c, chunk in enumerate(chunks):
            for j in range(len(runs)):
                k = (r + c + j) % len(runs)
                if fresh and c > 0:
                    engines[k] = make(runs[k])
                if replay is not None and engines[k] is not None:
                    with replay.on(engines[k]):
                        n, s = one_turn(runs[k], engines[k], hf_model, chunk, prompts, new, eos)
                else:
                    n, s = one_turn(runs[k], engines[k], hf_model, chunk, prompts, new, eos)
                tokens[k] += n
                secs[k] += s
                run = runs[k]
                run.turns[r, c] = (n, s, tuple(tuple(run.outputs[i]) for i in chunk))
        for run, n, s in zip(runs, tokens, secs, strict=True):
            run.tokens.append(int(n))
            run.secs.append(float(s))
        line = ", ".join(f"{run.name} {run.rate(r):.1f}" for run in runs)
        print(f"  round {r + 1}/{rounds}: tok/s {line}", flush=True)


def agreement(run: Run, plain: Run) -> str:
    """'k/n' identical to ``plain``, with the first-difference positions of the others."""
    diffs = [first_difference(run.outputs[i], plain.outputs[i]) for i in sorted(plain.outputs)]
    where = [d for d in diffs if d is not None]
    tail = f" (first difference at {', '.join(map(str, where))})" if where else ""
    return f"{len(diffs) - len(where)}/{len(diffs)}{tail}"


def ratio(a: Run, b: Run) -> tuple[float, float]:
    """Median and min over rounds of a's rate over b's, each taken in the same round."""
    r = [a.rate(i) / b.rate(i) for i in range(len(a.secs))]
    return float(np.median(r)), float(np.min(r))


def same_text_ratio(a: Run, b: Run) -> str:
    """a's rate over b's on the turns (a batch of prompts in a round) where both wrote the same outputs,
    with how many turns that is. In bfloat16 outputs drift apart, and a drifted text can be far easier or
    harder to draft for (one prompt went from 86 forwards for 126 tokens to 23 for 128 when its text fell
    into a repeated line), so the rates over all prompts compare texts as much as budgets."""
    same = [t for t in a.turns if t in b.turns and a.turns[t][2] == b.turns[t][2]]
    if not same:
        return f"- (0/{len(a.turns)})"
    rate = lambda run: sum(run.turns[t][0] for t in same) / sum(run.turns[t][1] for t in same)  # noqa: E731
    return f"{rate(a) / rate(b):.2f}x ({len(same)}/{len(a.turns)})"


def table(runs: list[Run], dtype: str, batch: int) -> list[str]:
    plain = next(r for r in runs if r.budget == 0)
    hf = next((r for r in runs if r.budget is None), None)
    fixed = [r for r in runs if r.budget is not None and r.mode == "fixed"]
    best = max(fixed, key=lambda r: np.median([r.rate(i) for i in range(len(r.secs))]))
    lines = []
    for run in runs:
        rates = [run.rate(i) for i in range(len(run.secs))]
        mal = (
            f"{run.tokens[-1] / max(sum(run.prompt_steps.values()), 1):.2f}"
            if run.budget is not None
            else "-"
        )
        vs_hf = "{:.2f}x ({:.2f})".format(*ratio(run, hf)) if hf else "-"
        vs_best = "{:.2f}x ({:.2f})".format(*ratio(run, best))
        same = "-" if run.budget is None or run is best else same_text_ratio(run, best)
        ident = "reference" if run is plain else agreement(run, plain)
        mark = " (best fixed)" if run is best else ""
        lines.append(
            f"| {dtype} | {batch} | {run.name}{mark} | {np.median(rates):.1f} ({min(rates):.1f}) | {mal} | "
            f"{vs_hf} | {vs_best} | {same} | {ident} | {notes(run, plain, best, hf)} |"
        )
    return lines


def notes(run: Run, plain: Run, best: Run, hf: Run | None) -> str:
    """The line's warnings: the machine was busy during this run's turns or during those of a run it is
    compared with (its figures are then unreliable), or it lost to plain decoding despite accepted
    drafts (what a tree forward cost against a plain one)."""
    others = [r for r in (plain, best, hf) if r is not None]
    contention = worst(run.meter.reading(), *(r.meter.reading() for r in others))
    mal = run.tokens[-1] / max(sum(run.prompt_steps.values()), 1) if run.budget is not None else 1.0
    speedup = ratio(run, plain)[0]
    return speedup_notes(speedup, mal, contention, tree_cost(run.history, plain.history)) or "-"


def policy_lines(run: Run, dtype: str, batch: int) -> list[str]:
    """What the adaptive policy chose, and how well its cost model predicted the steps it took."""
    tr = run.trace
    if not tr:
        return []
    k = np.array([t.budget for t in tr])
    drafted = np.array([t.drafted for t in tr])
    ratio_ = np.array([t.predicted_s / t.step_s for t in tr if t.step_s > 0])
    edges = [0, 1, 4, 8, 16, 32, 64, 1 << 30]
    hist = np.histogram(k, bins=edges)[0]
    names = ["0", "1-3", "4-7", "8-15", "16-31", "32-63", "64+"]
    spread = ", ".join(f"{name}: {n / len(k):.0%}" for name, n in zip(names, hist, strict=True) if n)
    return [
        f"- {dtype}, batch {batch}, {run.name}: {len(k)} steps; draft nodes verified per step mean "
        f"{k.mean():.1f}, none on {np.mean(k == 0):.0%} of steps ({np.mean(~drafted):.0%} without calling "
        "the drafter); "
        f"by size {spread}; predicted / measured step time median {np.median(ratio_):.2f} "
        f"(10-90%: {np.percentile(ratio_, 10):.2f}-{np.percentile(ratio_, 90):.2f})"
    ]


def drift_lines(runs: list[Run], items, dtype: str, batch: int) -> list[str]:
    """Where the adaptive run and the best fixed budget wrote different texts (last round): each such
    prompt's forwards per output token in both, the easier text first-named. A drifted text that falls into
    a repeated line can take a quarter of the forwards, which moves a rate over a dozen prompts more than
    the budgets do."""
    fixed = [r for r in runs if r.budget is not None and r.mode == "fixed"]
    best = max(fixed, key=lambda r: np.median([r.rate(i) for i in range(len(r.secs))]))
    ad = runs[-1]
    cells = []
    for i in sorted(best.outputs):
        if i not in ad.outputs or list(ad.outputs[i]) == list(best.outputs[i]):
            continue
        fb, fa = (run.prompt_steps.get(i, 0) / max(len(run.outputs[i]), 1) for run in (best, ad))
        cells.append(f"{i} ({items[i]['kind']}) {fb:.2f}/{fa:.2f}")
    if not cells:
        return []
    return [
        f"- {dtype}, batch {batch}: texts of {best.name} and {ad.name} differ on {len(cells)} of "
        f"{len(best.outputs)} prompts; forwards per output token there ({best.name}/{ad.name}): "
        + ", ".join(cells)
    ]


def repeated_share(outputs, n: int = 8) -> tuple[int, int]:
    """(repeated, total): of the outputs' n-grams, how many repeat an earlier n-gram of the same output.
    A text stuck in a loop repeats nearly all of them, and retrieval then drafts it almost for free."""
    hit = total = 0
    for seq in outputs:
        seen = set()
        for i in range(n, len(seq) + 1):
            gram = tuple(seq[i - n : i])
            hit += gram in seen
            seen.add(gram)
            total += 1
    return hit, total


def repeat_lines(runs: list[Run], dtype: str, batch: int) -> list[str]:
    """How much of each engine run's text (last round) repeats itself. Where bfloat16 texts drift apart, a
    run whose texts fell into loops more often drafts more per forward, a speed bought with a worse text."""
    cells = []
    for run in (r for r in runs if r.budget is not None):
        hit, total = repeated_share(run.outputs[i] for i in sorted(run.outputs))
        cells.append(f"{run.name} {hit / max(total, 1):.1%}")
    return [
        f"- {dtype}, batch {batch}: output 8-grams repeating an earlier one of the same output: "
        + ", ".join(cells)
    ]


def kind_lines(runs: list[Run], items, dtype: str, batch: int) -> list[str]:
    """MAL per prompt kind of the adaptive run and of the largest fixed budget."""
    out = []
    for run in (r for r in runs if r.budget and (r.mode == "adaptive" or r is runs[-2])):
        by = {}
        for i, it in enumerate(items):
            if i in run.prompt_steps:
                n, s = by.get(it["kind"], (0, 0))
                by[it["kind"]] = (n + len(run.outputs[i]), s + run.prompt_steps[i])
        out.append(
            f"- {dtype}, batch {batch}, {run.name}: MAL "
            + ", ".join(f"{k} {n / s:.2f}" for k, (n, s) in by.items())
        )
    return out


def file_items(args) -> list[dict]:
    """``--prompts`` prompts of ``--prompt-file`` as {id, kind, text}: those whose recorded output reached
    ``--min-output`` tokens (a rule fixed before measuring: long outputs), kinds in turn, in file order."""
    items = []
    with open(args.prompt_file, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            rec = json.loads(line)
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                raise SystemExit(f"{args.prompt_file}:{n + 1}: each line must be an object with a 'text'")
            if args.min_output and len(rec.get("output_ids") or ()) < args.min_output:
                continue
            kind = str(rec.get("kind") or rec.get("subset") or "prompt")
            items.append({"id": str(rec.get("id", f"line{n + 1}")), "kind": kind, "text": rec["text"]})
    kinds = list(dict.fromkeys(it["kind"] for it in items))
    queues = [[it for it in items if it["kind"] == k] for k in kinds]
    order = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
    if len(order) < args.prompts:
        raise SystemExit(f"{args.prompt_file}: {len(order)} prompts qualify, --prompts asks {args.prompts}")
    return order[: args.prompts]


def prompt_source(args) -> str:
    if args.prompt_file is None:
        return f"{args.prompts} bundled (kinds in turn)"
    longest = f" whose recorded output reached {args.min_output} tokens" if args.min_output else ""
    return f"the first {args.prompts} of {Path(args.prompt_file).name}{longest} (kinds in turn)"


def header(args) -> list[str]:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    units = cpu_bf16_units() or "none"
    return [
        f"`{' '.join(['python3', 'bench/engine/bench_budgets.py', *sys.argv[1:]])}`",
        "",
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, bfloat16 "
        f"matrix units: {units}, {torch.get_num_threads()} torch thread(s), {os.cpu_count()} CPUs, load "
        f"average at start {load}; {args.rounds} interleaved rounds, {args.max_new_tokens} new tokens at "
        f"most per prompt; prompts: {prompt_source(args)}"
        + (
            "; replay: every engine run writes the engine's plain decoding's text (a draft token is accepted "
            "when it equals the reference's; see bench/engine/replay.py)"
            if args.replay
            else ""
        ),
        "",
        "| dtype | batch | run | tok/s median (min) | MAL | vs generate median (min) "
        "| vs best fixed median (min) | vs best fixed, same text (turns) | identical to budget 0 | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=5, help="bundled prompts (kinds in turn; 12 = all)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", default="1")
    ap.add_argument("--budgets", default="0,4,8,16,32", help="fixed budgets (0: the engine's plain decoding)")
    ap.add_argument(
        "--cap", type=int, help="the adaptive policy's largest budget (default: the largest fixed)"
    )
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' generate")
    ap.add_argument(
        "--fresh", action="store_true", help="a new engine for every turn (the policy starts cold)"
    )
    ap.add_argument(
        "--full", action="store_true", help="= --prompts 12 --max-new-tokens 256 --rounds 3 --batches 1,4"
    )
    ap.add_argument(
        "--replay", action="store_true",
        help="every engine run writes the engine's plain decoding's text (equal texts in bfloat16 too)",
    )  # fmt: skip
    ap.add_argument(
        "--prompt-file",
        help="JSON lines with a 'text' (optionally 'id', 'kind' or 'subset'): these prompts instead of "
        "the bundled ones, kinds in turn, --prompts of them",
    )
    ap.add_argument(
        "--min-output", type=int, default=0,
        help="with --prompt-file: only prompts whose recorded 'output_ids' have at least this many tokens",
    )  # fmt: skip
    ap.add_argument("--out", help="append the markdown to this file")
    ap.add_argument("--json", help="write every measurement (per round, per prompt) to this JSON file")
    args = ap.parse_args()
    if args.full:
        args.prompts, args.max_new_tokens, args.rounds, args.batches = 12, 256, 3, "1,4"
    args.budgets = [int(b) for b in args.budgets.split(",")]
    if 0 not in args.budgets:
        raise SystemExit("--budgets must include 0 (the plain decoding every output is compared with)")
    args.cap = args.cap or max(args.budgets)
    return args


def bench_dtype(args, dtype: str, items) -> tuple[list[str], list[str], list[dict]]:
    """Every batch size in ``dtype``: (table rows, notes, raw measurements)."""
    model, tok, _ = load_model(None, dtype)
    hf_model = None if args.no_hf else load_model(None, dtype)[0]  # the engine switches its model's attention
    prompts = [chat_ids(tok, it["text"]) for it in items]
    rows, notes, dump = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.sssd"
        sssd.build_datastore(sample_corpus(), path, vocab_size=sample_vocab_size(), tokenizer=tok)
        ds = sssd.Datastore.open(path, tokenizer=tok)
        for batch in map(int, args.batches.split(",")):
            runs = runs_for(args.budgets, args.cap, not args.no_hf)
            replay = None
            if args.replay:
                replay = Replay(references(model, tok, prompts, batch, args.max_new_tokens))
            new, fresh = args.max_new_tokens, args.fresh
            measure(runs, (model, hf_model), tok, ds, prompts, batch, args.rounds, new, fresh, replay)
            rows += table(runs, dtype, batch)
            print("\n".join(rows[-len(runs) :]), flush=True)
            notes += policy_lines(runs[-1], dtype, batch) + kind_lines(runs, items, dtype, batch)
            notes += drift_lines(runs, items, dtype, batch) + repeat_lines(runs, dtype, batch)
            if replay is not None:
                share = replay.moved / max(replay.steps, 1)
                notes.append(
                    f"- {dtype}, batch {batch}, replay: the model's own verification differed from the "
                    f"reference on {replay.moved} of {replay.steps} request steps ({share:.1%})"
                )
            dump += [
                {"dtype": dtype, "batch": batch, "run": r.name, "tokens": r.tokens, "secs": r.secs,
                 "outputs": {items[i]["id"]: o for i, o in r.outputs.items()},
                 "forwards": {items[i]["id"]: n for i, n in r.prompt_steps.items()},
                 "turns": [[rd, c, int(n), float(sec)] for (rd, c), (n, sec, _) in sorted(r.turns.items())]}
                for r in runs
            ]  # fmt: skip
    return rows, notes, dump


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    items = bundled_items(args.prompts) if args.prompt_file is None else file_items(args)
    lines, notes, dump = header(args), [], []
    print("\n".join(lines), flush=True)
    for dtype in args.dtypes.split(","):
        r, n, d = bench_dtype(args, dtype, items)
        lines, notes, dump = lines + r, notes + n, dump + d
    notes.append(f"- load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("\n" + "\n".join(notes))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n".join([*lines, "", *notes]) + "\n\n")
    if args.json:
        Path(args.json).write_text(json.dumps(dump) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
