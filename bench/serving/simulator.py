"""Simulated serving: an event-clock replay of a Poisson workload.

Time advances by the *predicted* step time of a fitted cost model (the "truth" profile, e.g. measured
on this CPU with ``sssd profile``); acceptance is the drafter's real acceptance on recorded (prompt,
output) pairs (teacher forcing: a draft node is accepted when its path equals the recorded output).
The policy under test runs unchanged: it calls the real drafter, chooses budgets with its own copy of
the cost model, and observes the simulated step times.

Admission and prefill (as the engine does them): arrived requests wait in a queue; before each step the
policy's ``admit`` picks who joins (FIFO without TPOT targets); each admitted request's prompt minus its
last token is prefilled in its own forward (``CostModel.prefill_time``), and the running requests wait for
it; the first output token comes from the request's first step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sssd.batch import on_path_mask
from sssd.evaluation.simulator import accepted_lengths
from sssd.policy.adaptive import AdmitView, BudgetPolicy, StepRecord, StepView, fifo
from sssd.policy.cost_model import CostModel
from workload import Arrival, Finished, StepLog


@dataclass
class _Live:
    arrival: Arrival
    prompt: np.ndarray
    output: np.ndarray
    pos: int  # output tokens committed
    first_token_s: float


def prefill_s(cost: CostModel, prompt_tokens: int) -> float:
    """Predicted time of prefilling one prompt of ``prompt_tokens`` tokens (its own forward)."""
    return cost.prefill_time(prompt_tokens)


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
    """Replays ``workload`` (sorted by arrival) and returns the finished requests and the step log.

    Admission is the policy's (``policy.admit``, FIFO when it has none or no request has a target), as
    in the engine: requests that arrived wait in a queue, the policy picks who joins before each step.
    The policy is told what an engine knows about a request's length: its token limit (``max_new_tokens``,
    default the longest recorded output), not where the recorded output ends."""
    drafter = make_drafter()
    cap = max_new_tokens or max(len(p.output_ids) for p in pairs)
    pending = sorted(workload, key=lambda a: a.arrival_s)
    nxt = 0
    waiting: list[Arrival] = []
    live: dict[int, _Live] = {}
    done: list[Finished] = []
    log = StepLog()
    clock = 0.0
    while nxt < len(pending) or waiting or live:
        while nxt < len(pending) and pending[nxt].arrival_s <= clock:
            a = pending[nxt]
            waiting.append(a)
            nxt += 1
            if use_slo:
                policy.set_slo(a.rid, a.tpot_target_s, priority=1.0 if a.slo_class == "tight" else 0.0)
        new = _admit(waiting, live, pairs, policy, max_batch, cap)
        if not live and not new:
            clock = pending[nxt].arrival_s
            continue
        stall = 0.0
        for a in new:
            p = pairs[a.pair]
            out = p.output_ids if max_new_tokens is None else p.output_ids[:max_new_tokens]
            stall += prefill_s(truth, len(p.prompt_ids) - 1)
            drafter.add_request(a.rid, np.asarray(p.prompt_ids, dtype=np.int32))
            live[a.rid] = _Live(a, p.prompt_ids, out, 0, -1.0)
        clock = _step(live, drafter, policy, truth, log, clock + stall, stall, cap)
        _finish_done(live, done, drafter, policy, clock)
    return done, log


def _admit(waiting: list, live: dict, pairs, policy, max_batch: int, cap: int) -> list:
    """Removes and returns the waiting arrivals the policy admits now (the engine's ``_admit``)."""
    free = max_batch - len(live)
    if not waiting or free <= 0:
        return []
    rids = list(live)
    view = AdmitView(
        [a.rid for a in waiting],
        [len(pairs[a.pair].prompt_ids) for a in waiting],
        [cap] * len(waiting),
        StepView(rids, [len(live[r].prompt) + live[r].pos for r in rids],
                 [cap - live[r].pos for r in rids], [None] * len(rids)),
        free,
    )  # fmt: skip
    chosen = policy.admit(view) if hasattr(policy, "admit") else fifo(view)
    if not chosen and not live:
        chosen = [waiting[0].rid]  # an empty batch always takes its first request
    by_id = {a.rid: a for a in waiting}
    new = [by_id[r] for r in chosen]
    waiting[:] = [a for a in waiting if a.rid not in set(chosen)]
    return new


def _step(
    live, drafter, policy: BudgetPolicy, truth: CostModel, log: StepLog, clock: float, stall: float, cap: int
) -> float:
    rids = list(live)
    b = len(rids)
    ctx = [len(live[r].prompt) + live[r].pos for r in rids]
    n_ctx = int(sum(ctx))
    remaining = [cap - live[r].pos for r in rids]  # what the engine knows: the token limit
    decision = policy.step(drafter, StepView(rids, ctx, remaining, [None] * b))
    acc = np.zeros(b, dtype=np.int64)
    if decision.batch is not None and decision.budget > 0:
        batch = decision.batch
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
            accepted = [
                live[r].output[live[r].pos : live[r].pos + a] for r, a in zip(rids, acc.tolist(), strict=True)
            ]
            drafter.observe(rids, batch, on_path_mask(batch, tokens=accepted))
    draft_budget = policy.config.budget if decision.drafted else 0
    c = truth.predict(b, n_ctx, decision.budget, drafted=decision.drafted, draft_budget=draft_budget)
    fwd, drf, ver = float(c.forward), float(c.draft), float(c.verify)
    step_s = fwd + drf + ver
    clock += step_s
    for i, r in enumerate(rids):
        lv = live[r]
        n = int(min(acc[i] + 1, len(lv.output) - lv.pos))
        drafter.extend(r, lv.output[lv.pos : lv.pos + n].astype(np.int32))
        lv.pos += n
        if lv.first_token_s < 0:
            lv.first_token_s = clock
    step = StepRecord(b, n_ctx, b + decision.budget, draft_budget, acc, draft_s=drf, forward_s=fwd,
                      verify_s=ver, prefill_s=stall, request_ids=rids)  # fmt: skip
    policy.observe(decision, step)
    log.add(b, decision.budget, step_s, int(acc.sum()), decision.expected_accepted)
    return clock


def _finish_done(live, done, drafter, policy: BudgetPolicy, clock: float) -> None:
    for r in [r for r, lv in live.items() if lv.pos >= len(lv.output)]:
        lv = live.pop(r)
        a = lv.arrival
        done.append(Finished(r, a.arrival_s, lv.first_token_s, clock, lv.pos, a.slo_class, a.tpot_target_s))
        drafter.remove_request(r)
        policy.remove_request(r)
