"""Budget-policy variants side by side: fixed budgets and adaptive policies with changed settings,
interleaved prompt by prompt (batch by batch), on the bundled demo prompts and datastore, greedy.

    OMP_NUM_THREADS=1 PYTHONPATH=python python3 bench/engine/ab_policy.py --dtype bfloat16 --batch 4 \\
        fixed:16 fixed:4 adaptive adaptive:prior_slope=5e-5

A variant is ``fixed:K``, or ``adaptive`` with ``BudgetConfig`` fields after a colon (``adaptive:
explore_every=4,min_gain=0``), ``prior_slope=S``: the built-in relative cost prior's per-token slope
(default 2e-4, i.e. 4% of a one-token forward), ``extend_slope=0|1``, ``extend_evidence=E``, ``forget=F``,
``prior_weight=W``:
the ``CostModel`` options. Either kind takes ``head=lazy`` (``fixed:16,head=lazy``): verification asks the
output head for one level of the accepted paths per call, never for all remaining rows at once (the
adapter's ``head_cost`` off); ``head=steps``: the policy's cost model records each step's head time as
calls of one row per request and prices a step's head as one such call per expected level, apart from
the head's own record of its calls (how it was before ``CostModel.share_head``).
``--recycled all|walked``: every variant's drafter with the recycled candidates (``DrafterConfig``'s
``use_recycled``, ``recycle_rows``).
Every adaptive variant may choose up to ``--cap`` nodes (``adaptive:budget=16``: up to 16). Prints, per
round, each variant's tokens/s, its ratio to the first variant and its tokens per forward. ``--replay``:
every variant writes the engine's plain decoding's text (``bench/engine/replay.py``), so that bfloat16
variants, whose outputs would drift apart, are compared on equal texts.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import numpy as np
import sssd
import sssd.policy.cost_model as cost_model
import torch
from replay import Replay
from sssd.cli.demo import bundled_items
from sssd.data import sample_corpus, sample_vocab_size
from sssd.models.loading import chat_ids, load_model
from sssd.policy.adaptive import BudgetConfig, BudgetPolicy
from sssd.policy.contention import ContentionMeter, worst
from sssd.policy.head_cost import HeadCost


def parse_variant(text: str) -> tuple[str, int | None, dict, dict]:
    """'fixed:16' -> ('fixed', 16, {}, {}); 'adaptive:min_gain=0,prior_slope=5e-5' -> ('adaptive', None,
    {'min_gain': 0.0}, {'prior_slope': 5e-5}): BudgetConfig fields, then the cost model's options."""
    kind, _, rest = text.partition(":")
    fields, cost = {}, {}
    if kind == "fixed":
        k, *opts = rest.split(",")
        for item in opts:
            key, _, value = item.partition("=")
            if key != "head":
                raise argparse.ArgumentTypeError(f"a fixed variant takes only head=lazy, got {item!r}")
            cost["head"] = value
        return kind, int(k), fields, cost
    if kind != "adaptive":
        raise argparse.ArgumentTypeError(f"variant must be fixed:K or adaptive[:key=value,...], got {text!r}")
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key == "head":
            cost[key] = value
        elif key == "prior_slope":
            cost[key] = float(value)
        elif key == "extend_slope":
            cost[key] = bool(float(value))
        elif key in ("forget", "prior_weight", "extend_evidence"):
            cost[key] = float(value)
        else:
            default = getattr(BudgetConfig(), key)
            fields[key] = int(value) if default is None else type(default)(float(value))
    return kind, None, fields, cost


def make_engine(variant, model, tok, ds, batch: int, cap: int, recycled: str | None = None):
    engine = _engine(variant, model, tok, ds, batch, cap, recycled)
    head = variant[3].get("head", "plan")
    if head not in ("plan", "lazy", "steps"):
        raise SystemExit(f"head must be plan, lazy or steps, got {head!r}")
    if head == "lazy":
        engine.adapter.head_cost = None
    cost = getattr(engine.policy, "cost", None)
    if head == "steps" and cost is not None:
        cost.head_per_call = cost.head_one_call = False
        engine.adapter.head_cost = HeadCost()
    return engine


def _engine(variant, model, tok, ds, batch: int, cap: int, recycled: str | None = None):
    kind, k, fields, cost = variant
    cost = {key: v for key, v in cost.items() if key != "head"}
    rec = {} if recycled is None else {"use_recycled": True, "recycle_rows": recycled}
    drafter = sssd.Drafter(datastore=ds, config=sssd.DrafterConfig(**rec))
    if kind == "fixed":
        return sssd.Engine(
            model,
            tok,
            drafter=drafter,
            config=sssd.EngineConfig(budget=k, budget_mode="fixed", max_batch_size=batch),
        )
    default = cost_model.DEFAULT_FORWARD
    if "prior_slope" in cost:  # the relative prior is read when the cost model is made
        cost_model.DEFAULT_FORWARD = (default[0], cost["prior_slope"], default[2], default[3])
    try:
        model_kw = {k: v for k, v in cost.items() if k != "prior_slope"}
        fields = dict(fields)
        cap = int(fields.pop("budget", cap))  # a variant's own largest budget (``adaptive:budget=16``)
        policy = BudgetPolicy(BudgetConfig(budget=cap, **fields), cost_model.CostModel(**model_kw))
    finally:
        cost_model.DEFAULT_FORWARD = default
    config = sssd.EngineConfig(budget=cap, max_batch_size=batch, policy=policy)
    return sssd.Engine(model, tok, drafter=drafter, config=config)


def prediction_error(name: str, engine) -> str | None:
    """How well an adaptive variant's cost model predicted its steps: the median of predicted / measured
    step time and the mean of its distance to 1, over the steps in the policy's trace (None: no trace)."""
    trace = [t for t in getattr(engine.policy, "trace", ()) if t.step_s > 0]
    if not trace:
        return None
    r = np.array([t.predicted_s / t.step_s for t in trace])
    return f"{name} median {np.median(r):.3f}, mean |r - 1| {np.mean(np.abs(r - 1)):.3f} ({len(r)} steps)"


def same_text(name: str, turns: list, ref: list) -> str:
    """``name``'s rate over the reference's on the batches where both wrote the same outputs (bfloat16
    outputs drift, and a drifted text can be far easier or harder to draft for)."""
    same = [c for c, (a, b) in enumerate(zip(turns, ref, strict=True)) if a[2] == b[2]]
    if not same:
        return f"{name} - (0/{len(ref)})"
    rate = lambda t: sum(t[c][0] for c in same) / sum(t[c][1] for c in same)  # noqa: E731
    return f"{name} {rate(turns) / rate(ref):.2f}x ({len(same)}/{len(ref)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "variants", nargs="+", help="fixed:K or adaptive[:key=value,...]; the first is the reference"
    )
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=12, help="bundled prompts (kinds in turn; 12 = all)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cap", type=int, default=32, help="the adaptive variants' largest budget")
    ap.add_argument(
        "--recycled", choices=["all", "walked"], help="every drafter with the recycled candidates"
    )
    ap.add_argument(
        "--replay", action="store_true",
        help="every variant writes the engine's plain decoding's text (bench/engine/replay.py): equal texts",
    )  # fmt: skip
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variants]
    torch.set_num_threads(1)
    model, tok, _ = load_model(None, args.dtype)
    prompts = [chat_ids(tok, it["text"]) for it in bundled_items(args.prompts)]
    chunks = [prompts[i : i + args.batch] for i in range(0, len(prompts), args.batch)]
    print(f"{args.dtype}, batch {args.batch}, {len(prompts)} prompts x {args.max_new_tokens} tokens; "
          f"ratios to {args.variants[0]}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.sssd"
        sssd.build_datastore(sample_corpus(), path, vocab_size=sample_vocab_size(), tokenizer=tok)
        ds = sssd.Datastore.open(path, tokenizer=tok)
        replay = None
        if args.replay:
            plain = make_engine(("fixed", 0, {}, {}), model, tok, ds, args.batch, args.cap)
            refs = {}
            for chunk in chunks:
                out = plain.generate(chunk, max_new_tokens=args.max_new_tokens)
                refs.update({tuple(p): list(o.tokens) for p, o in zip(chunk, out, strict=True)})
            replay = Replay(refs)
        for r in range(args.rounds):
            engines = [make_engine(v, model, tok, ds, args.batch, args.cap, args.recycled) for v in variants]
            tokens, secs, steps = [0] * len(variants), [0.0] * len(variants), [0] * len(variants)
            turns = [[] for _ in variants]  # per chunk: (tokens, seconds, outputs)
            meters = [ContentionMeter(torch.get_num_threads()) for _ in variants]  # each over its own turns
            for c, chunk in enumerate(chunks):
                for j in range(len(variants)):
                    i = (r + c + j) % len(variants)  # a rotating order: a passing load slows all alike
                    before = engines[i].stats.steps
                    with meters[i], replay.on(engines[i]) if replay else contextlib.nullcontext():
                        t = time.perf_counter()
                        out = engines[i].generate(chunk, max_new_tokens=args.max_new_tokens)
                        dt = time.perf_counter() - t
                    n = sum(len(o.tokens) for o in out)
                    secs[i] += dt
                    tokens[i] += n
                    steps[i] += engines[i].stats.steps - before
                    turns[i].append((n, dt, [list(o.tokens) for o in out]))
            ref = tokens[0] / secs[0]
            cells = [f"{name} {n / s:.1f} tok/s ({n / s / ref:.2f}x, {n / st:.2f} tokens/forward)"
                     for name, n, s, st in zip(args.variants, tokens, secs, steps, strict=True)]  # fmt: skip
            # every ratio of the round is to the first variant: one slowed variant moves them all
            busy = worst(*(m.reading() for m in meters)).mark()
            print(f"round {r + 1}: " + ", ".join(cells) + (f"; {busy}" if busy else ""), flush=True)
            fits = [prediction_error(name, e) for name, e in zip(args.variants, engines, strict=True)]
            if any(fits):
                print("  predicted / measured step time: " + ", ".join(filter(None, fits)), flush=True)
            pairs = zip(args.variants[1:], turns[1:], strict=True)
            same = ", ".join(same_text(name, t, turns[0]) for name, t in pairs)
            print(
                f"  on the batches where a variant wrote the same text as {args.variants[0]}: {same}",
                flush=True,
            )
        if args.replay:
            print(f"replay: the model's own walk differed on {replay.moved} of {replay.steps} request steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
