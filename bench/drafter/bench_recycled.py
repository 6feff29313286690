"""The recycled candidates (the verifier's own top-k, DrafterConfig.use_recycled) against the same drafter
without them, side by side in one run.

    OMP_NUM_THREADS=1 PYTHONPATH=python:. python3 bench/drafter/bench_recycled.py [--parts a,b,c,d,e]

(a) MAL, teacher-forced: the dev pairs replayed at batch 1 in file order with online calibration (as
    tools/drafter_sanity.py), datastore = smollm2_other_outputs or none, budgets 16 and 64; all 244 pairs
    and the odd-indexed half (the shipped table's recycled rows are fitted on the even half). The model's
    top-8 along the pairs: SmolLM2 float32, teacher-forced, cached (sssd.models.teacher). µs/req: propose
    + recycle per request per step, as measured in the replay.
(b) Drafting time: propose µs per request (and nodes drafted per request) on the same contexts (prompt +
    200 output tokens of the dev pairs, the pool holding 100 outputs), the recycled table warmed with every
    dev pair's top-k, rounds alternating the order; median wall and CPU; recycle() µs per step;
    torch.topk against the argmax that verification computes anyway, on [rows, 49152] logits, and both
    read from chunk maxima (sssd.engine.rowops, what the engine runs on a CPU).
(c) End to end: SmolLM2-135M-Instruct, the bundled prompts (every kind) and --dev development prompts,
    float32 and bfloat16, batch 1 and 4, greedy, the adaptive policy (cap --budget): plain decoding, the
    drafter, the drafter + recycled candidates (the rows verification reads; every verified node's),
    taking turns prompt by prompt (batch 4: four prompts at a time); tokens/s and MAL per prompt kind,
    identical-to-plain counts; with --engine-rounds N, N rounds of fresh engines and each arm's tokens/s
    against the drafter's per kind, per round and summed.
(d) MAL end to end on held-out development prompts (the odd pairs), float32, batch 1, fixed budgets 16
    and 64, with and without the datastore: the drafter without the source, with the rows verification
    reads, with every verified node's (DrafterConfig.recycle_rows="all", which a replay cannot feed).
(e) The same on the bundled prompts (every kind; the bundled datastore) at fixed budgets 4, 8, 16, 32.
Speed on a shared machine moves with its load (printed): compare the columns of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import sssd
from sssd.evaluation.pairs import load_pairs
from sssd.evaluation.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
import corpora

PAIRS = corpora.DEV_DATA / "smollm2_dev_pairs.jsonl"


def load() -> str:
    return "load average " + " ".join(os.getloadavg().__repr__().strip("()").split(", ")[:3])


def teacher(pairs, k: int = 8):
    from sssd.evaluation.recycling import TeacherTopK
    from sssd.models.loading import load_model, resolve_model
    from sssd.models.local import cache_dir
    from sssd.models.teacher import cache_key, teacher_top_k

    seqs = [(p.prompt_ids, p.output_ids) for p in pairs]
    path = cache_dir() / "teacher_topk" / f"{cache_key(resolve_model(None), 'float32', k, seqs)}.npz"
    model = None if path.is_file() else load_model(None, "float32")[0]
    return TeacherTopK(*teacher_top_k(model, seqs, k, cache_file=path))


def part_a(ds, extra: dict) -> None:
    pairs = load_pairs(PAIRS)
    top = teacher(pairs)
    print(f"\n(a) MAL, teacher-forced, batch 1, online calibration ({load()})\n")
    print("| pairs | datastore | budget | MAL | MAL +recycled | ratio | µs/req | µs/req +recycled | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, idx in (("all 244", range(len(pairs))), ("odd 122 (held out)", range(1, len(pairs), 2))):
        sub, sub_top = [pairs[i] for i in idx], top.take(list(idx))
        for store in (ds, None):
            for budget in (16, 64):
                r = [replay(sub, sub_top, store, budget, rec, extra) for rec in (False, True)]
                us = [x.us_per_request_step for x in r]
                cells = [name, "yes" if store else "no", budget, f"{r[0].mal:.3f}", f"{r[1].mal:.3f}"]
                cells += [
                    f"{r[1].mal / r[0].mal:.3f}",
                    f"{us[0]:.1f}",
                    f"{us[1]:.1f}",
                    f"{us[1] / us[0]:.2f}",
                ]
                row(cells)


def replay(pairs, top, store, budget: int, recycled: bool, extra: dict):
    drafter = sssd.Drafter(store, sssd.DrafterConfig(use_recycled=recycled, **(extra if recycled else {})))
    top = top if recycled else None
    return simulate(drafter, pairs, budget=budget, batch_size=1, observe=True, top_k=top)


def row(cells) -> None:
    print("| " + " | ".join(map(str, cells)) + " |", flush=True)


def _drafters(ds, pairs, top, batch: int, extra: dict):
    out = []
    for rec in (False, True):
        cfg = sssd.DrafterConfig(use_recycled=rec, vocab_size=corpora.VOCAB, **(extra if rec else {}))
        d = sssd.Drafter(ds, cfg)
        for p in pairs[-100:]:
            d.add_to_pool(p.output_ids)
        if rec:
            read = [np.concatenate([p.prompt_ids[-1:], p.output_ids[:-1]]) for p in pairs]
            prev = [np.concatenate([p.prompt_ids[-2:-1], r[:-1]]) for p, r in zip(pairs, read, strict=True)]
            d.recycle(
                np.concatenate(read).astype(np.int32),
                top.ids,
                top.probs,
                np.concatenate(prev).astype(np.int32),
            )
        for r in range(batch):
            p = pairs[r % len(pairs)]
            d.add_request(r, np.concatenate([p.prompt_ids, p.output_ids[:200]]))
        out.append(d)
    return out


def part_b(ds, rounds: int, requests: int, extra: dict) -> None:
    import torch

    pairs = load_pairs(PAIRS)
    top = teacher(pairs)
    print(
        f"\n(b) propose µs per request, median of {rounds} rounds of ~{requests} requests, order alternating"
        f" ({load()})\n"
    )
    print(
        "| batch | budget | nodes/req | nodes/req +recycled | µs wall | µs wall +recycled | ratio "
        "| µs CPU | µs CPU +recycled | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for batch in (1, 4, 16):
        drafters = _drafters(ds, pairs, top, batch, extra)
        for budget in (16, 64):
            wall, cpu = ([], []), ([], [])
            reps = max(20, requests // batch)
            for rnd in range(rounds):
                for arm in (0, 1) if rnd % 2 == 0 else (1, 0):
                    d = drafters[arm]
                    d.propose(list(range(batch)), [budget] * batch)
                    w0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(reps):
                        d.propose(list(range(batch)), [budget] * batch)
                    wall[arm].append((time.perf_counter() - w0) / reps / batch * 1e6)
                    cpu[arm].append((time.process_time() - c0) / reps / batch * 1e6)
            # nodes drafted per request: without the source a tree may hold fewer than the budget
            nodes = [
                (d.propose(list(range(batch)), [budget] * batch).tokens.size - batch) / batch
                for d in drafters
            ]
            w = [statistics.median(x) for x in wall]
            c = [statistics.median(x) for x in cpu]
            ratios = [f"{w[1] / w[0]:.2f}", f"{c[1] / c[0]:.2f}"]
            row(
                [
                    batch,
                    budget,
                    f"{nodes[0]:.1f}",
                    f"{nodes[1]:.1f}",
                    f"{w[0]:.1f}",
                    f"{w[1]:.1f}",
                    ratios[0],
                    f"{c[0]:.1f}",
                    f"{c[1]:.1f}",
                    ratios[1],
                ]
            )
    d = _drafters(ds, pairs, top, 1, extra)[1]
    for rows in (4, 16):
        args = (top.ids[:rows, 0].copy(), top.ids[:rows].copy(), top.probs[:rows].copy())
        t0 = time.perf_counter()
        for _ in range(200):
            d.recycle(*args)
        print(f"\nrecycle() of {rows} rows: {(time.perf_counter() - t0) / 200 * 1e6:.1f} µs per call")
    torch.set_num_threads(1)
    print(
        "\n| logits dtype | rows | argmax µs | argmax_rows µs | topk(8) µs | topk_rows(8) µs "
        "| topk + softmax(8) µs |\n|---|---|---|---|---|---|---|"
    )
    for dt in (torch.float32, torch.bfloat16):
        for rows in (1, 4, 16):
            x = torch.randn(rows, corpora.VOCAB).to(dt)
            us = []
            for fn in (argmax, argmax_rows, top8, topk_rows8, top8_softmax):
                fn(x)
                t0 = time.perf_counter()
                for _ in range(300):
                    fn(x)
                us.append((time.perf_counter() - t0) / 300 * 1e6)
            print(f"| {str(dt)[6:]} | {rows} | " + " | ".join(f"{u:.1f}" for u in us) + " |")


def argmax(x):
    return x.argmax(-1)


def argmax_rows(x):
    from sssd.engine.rowops import argmax_rows

    return argmax_rows(x)


def topk_rows8(x):
    from sssd.engine.rowops import topk_rows

    return topk_rows(x, 8)


def top8(x):
    import torch

    return torch.topk(x, 8, -1)


def top8_softmax(x):
    import torch

    return torch.softmax(torch.topk(x, 8, -1).values.float(), -1)


def part_c(args) -> None:
    from bench_recycled_engine import run_engine

    run_engine(args)


def part_d(args) -> None:
    from bench_recycled_engine import run_mal

    pairs = load_pairs(PAIRS)[1::2][: args.mal_prompts]
    prompts = [(f"dev-{p.subset}", p.id, p.prompt_ids.tolist()) for p in pairs]
    named = {"yes": sssd.Datastore.open(corpora.outputs_datastore()), "no": None}
    stores = {k: named[k] for k in args.mal_stores.split(",")}
    budgets = [int(b) for b in args.mal_budgets.split(",")]
    title = "(d) MAL end to end, held-out development prompts (the odd pairs)"
    run_mal(args, lambda tok: prompts, stores, budgets, title)


def part_e(args) -> None:
    from bench_recycled_engine import _prompts, run_mal
    from sssd.integrations.vllm_demo import demo_datastore

    stores = {"bundled": sssd.Datastore.open(demo_datastore())}
    title = "(e) MAL end to end, the bundled prompts (every kind)"
    run_mal(args, lambda tok: _prompts(tok, 0), stores, [4, 8, 16, 32], title)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="a,b,c")
    ap.add_argument("--rounds", type=int, default=5, help="(b) timing rounds")
    ap.add_argument(
        "--round-requests",
        type=int,
        default=400,
        help="(b) requests drafted per arm and round (in at least 20 calls)",
    )
    ap.add_argument("--new", type=int, default=64, help="(c, d) new tokens per prompt")
    ap.add_argument("--dev", type=int, default=4, help="(c) development prompts besides the bundled ones")
    ap.add_argument(
        "--prompts", type=int, help="(c) the first N bundled prompts, kinds in turn (default: all 12)"
    )
    ap.add_argument("--budget", type=int, default=32, help="(c) the adaptive policy's largest budget")
    ap.add_argument(
        "--engine-rounds", type=int, default=1, help="(c) rounds, each with fresh engines and drafters"
    )
    ap.add_argument("--no-plain", action="store_true", help="(c) no plain-decoding arm (no identity check)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--threads", type=int, default=1, help="(c, d) torch threads")
    ap.add_argument(
        "--arms",
        default="sssd,sssd+recycled,sssd+recycled-all",
        help="(c) arms besides plain decoding: sssd, sssd+recycled, sssd+recycled-all, sssd+recycled-all*; "
        "an arm may carry DrafterConfig overrides, e.g. sssd+recycled-all:recycle_trust_match=9",
    )
    ap.add_argument("--mal-prompts", type=int, default=24, help="(d) held-out development prompts")
    ap.add_argument("--mal-stores", default="yes,no", help="(d) with the datastore (yes), without (no)")
    ap.add_argument("--mal-budgets", default="16,64", help="(d) fixed budgets")
    ap.add_argument(
        "--mal-arms",
        default="walked,all",
        help="(d, e) arms besides off: walked, all (with DrafterConfig overrides as --arms: all:key=value)",
    )
    ap.add_argument(
        "--calibration", default="default", help="(c, d, e) the drafters' calibration table (a JSON file)"
    )
    ap.add_argument(
        "--recycled-config",
        default="",
        help="(a, b) DrafterConfig overrides of the drafter with the source, e.g. :recycle_trust_match=0",
    )
    ap.add_argument("--calibration2", help="(c) the table of the arm sssd+recycled-all* (a JSON file)")
    args = ap.parse_args()
    from bench_recycled_engine import split_arm

    extra = split_arm(args.recycled_config)[1]
    ds = sssd.Datastore.open(corpora.outputs_datastore())
    parts = args.parts.split(",")
    if "a" in parts:
        part_a(ds, extra)
    if "b" in parts:
        part_b(ds, args.rounds, args.round_requests, extra)
    if "c" in parts:
        part_c(args)
    if "d" in parts:
        part_d(args)
    if "e" in parts:
        part_e(args)


if __name__ == "__main__":
    main()
