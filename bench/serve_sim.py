"""Simulated serving: an event-clock replay of a Poisson workload.

Time advances by the *predicted* step time of a fitted cost model (the "truth" profile, e.g. measured
on this CPU with ``sssd profile``); acceptance is the drafter's real acceptance on recorded (prompt,
output) pairs (teacher forcing: a draft node is accepted when its path equals the recorded output).
The policy under test runs unchanged: it calls the real drafter, chooses budgets with its own copy of
the cost model, and observes the simulated step times.

Prefill (as the engine does it): each admitted request's prompt minus its last token is prefilled in
its own forward (``forward(n_context=0, n_batched=len(prompt) - 1)``); the first output token comes from
the request's first step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from serve_workload import Arrival, Finished, StepLog
from sssd.costmodel import CostModel, forward_features
from sssd.policy import BudgetPolicy, StepTiming, StepView
from sssd.simulate import accepted_lengths


@dataclass
class _Live:
    arrival: Arrival
    prompt: np.ndarray
    output: np.ndarray
    pos: int  # output tokens committed
    first_token_s: float


def prefill_s(cost: CostModel, prompt_tokens: int, n_new: int) -> float:
    """Predicted time of prefilling ``n_new`` prompts of ``prompt_tokens`` tokens in total."""
    fwd = cost.forward.predict(np.array(forward_features(0, prompt_tokens, prompt_tokens)))
    oth = cost.other.predict(np.array([float(n_new), float(n_new), 1.0]))
    return float(max(fwd, 0.0) + max(oth, 0.0))


def simulate_serving(
    workload: Sequence[Arrival],
    pairs: Sequence,
    make_drafter: Callable[[], object],
    policy: BudgetPolicy,
    truth: CostModel,
    *,
    max_batch: int = 16,
    max_new_tokens: int | None = None,
    use_slo: bool = False,
) -> tuple[list[Finished], StepLog]:
    """Replays ``workload`` (sorted by arrival) and returns the finished requests and the step log."""
    drafter = make_drafter()
    pending = sorted(workload, key=lambda a: a.arrival_s)
    nxt = 0
    live: dict[int, _Live] = {}
    done: list[Finished] = []
    log = StepLog()
    clock = 0.0
    while nxt < len(pending) or live:
        # admission (FIFO, up to max_batch), each prompt prefilled in its own forward
        new = []
        while nxt < len(pending) and pending[nxt].arrival_s <= clock and len(live) + len(new) < max_batch:
            new.append(pending[nxt])
            nxt += 1
        if not live and not new:
            clock = pending[nxt].arrival_s
            continue
        for a in new:
            p = pairs[a.pair]
            out = p.output_ids if max_new_tokens is None else p.output_ids[:max_new_tokens]
            clock += prefill_s(truth, len(p.prompt_ids) - 1, 1)
            drafter.add_request(a.rid, np.asarray(p.prompt_ids, dtype=np.int32))
            live[a.rid] = _Live(a, p.prompt_ids, out, 0, -1.0)
            if use_slo:
                policy.set_slo(a.rid, a.tpot_target_s, priority=1.0 if a.slo_class == "tight" else 0.0)
        clock = _step(live, drafter, policy, truth, log, clock)
        _finish_done(live, done, drafter, policy, clock)
    return done, log


def _step(live, drafter, policy: BudgetPolicy, truth: CostModel, log: StepLog, clock: float) -> float:
    rids = list(live)
    b = len(rids)
    ctx = [len(live[r].prompt) + live[r].pos for r in rids]
    n_ctx = int(sum(ctx))
    remaining = [len(live[r].output) - live[r].pos for r in rids]
    plan = policy.step(drafter, StepView(rids, ctx, remaining, [None] * b))
    acc = np.zeros(b, dtype=np.int64)
    if plan.batch is not None and plan.budget > 0:
        batch = plan.batch
        offsets = np.asarray(batch.offsets)
        depth = np.asarray(batch.depth)
        targets = np.full(len(depth), -1, dtype=np.int64)
        for i, r in enumerate(rids):
            sl = slice(offsets[i], offsets[i + 1])
            at = live[r].pos + depth[sl].astype(np.int64) - 1
            ok = (depth[sl] > 0) & (at < len(live[r].output))
            t = np.full(ok.shape, -1, dtype=np.int64)
            t[ok] = live[r].output[at[ok]]
            targets[sl] = t
        acc, _ = accepted_lengths(
            np.asarray(batch.tokens), np.asarray(batch.parents), depth, offsets, targets
        )
        if hasattr(drafter, "observe"):
            drafter.observe(rids, batch, acc)
    draft_budget = policy.config.budget if plan.drafted else 0
    c = truth.predict(b, n_ctx, plan.budget, drafted=plan.drafted, draft_budget=draft_budget)
    fwd, drf, oth = float(c.forward), float(c.draft), float(c.other)
    step_s = fwd + drf + oth
    clock += step_s
    for i, r in enumerate(rids):
        lv = live[r]
        n = int(min(acc[i] + 1, len(lv.output) - lv.pos))
        drafter.extend(r, lv.output[lv.pos : lv.pos + n].astype(np.int32))
        lv.pos += n
        if lv.first_token_s < 0:
            lv.first_token_s = clock
    policy.observe(StepTiming(b, plan.budget, b + plan.budget, n_ctx, tuple(acc), drf, fwd, oth, step_s))
    log.add(b, plan.budget, step_s, int(acc.sum()), plan.expected_accepted)
    return clock


def _finish_done(live, done, drafter, policy: BudgetPolicy, clock: float) -> None:
    for r in [r for r, lv in live.items() if lv.pos >= len(lv.output)]:
        lv = live.pop(r)
        a = lv.arrival
        done.append(Finished(r, a.arrival_s, lv.first_token_s, clock, lv.pos, a.slo_class, a.tpot_target_s))
        drafter.remove_request(r)
        policy.remove_request(r)
