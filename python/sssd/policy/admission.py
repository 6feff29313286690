"""SLO-aware admission: which waiting requests join the batch now, and which wait.

A request's TPOT is set by the steps it shares with the rest of the batch, and by the prefills of the
requests admitted while it runs (each prompt is prefilled in its own forward, between two steps, and
every running request waits for it). Waiting before the first token does not count towards TPOT. So when
a request with a TPOT target is on course to meet it, admitting one more request can push it over, while
holding that request back a little costs only that request's queueing time.

:func:`admission_order` puts higher-priority requests first (FIFO among equals). :func:`admit_with_slo`
then admits each candidate unless its predicted cost (its prefill now, plus its per-step cost for the
part of the protected request's remaining life that it overlaps) would push a *protected* request over
its target. Protected = a running request with a target and a priority at least the candidate's whose
projected TPOT without further admissions meets the target (a request that misses anyway gets no
protection: holding others back for it would cost throughput and still miss).

Projection of request i (seconds per token over its whole run so far + remaining):
``(time_i + prefills + steps_i · step_i) / (tokens_i + remaining_i)``, with ``steps_i = remaining_i /
rate_i`` (rate = expected tokens per step) and ``step_i`` the predicted step time averaged over those
steps: each running request j contributes its marginal step cost for the fraction ``min(1, steps_j /
steps_i)`` of them (it leaves when it is done).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sssd.policy.cost_model import CostModel


@dataclass(frozen=True)
class RunningState:
    """The running batch as the admission rule sees it; arrays [B] in batch order."""

    targets: np.ndarray  # TPOT target, seconds (inf = none)
    priority: np.ndarray
    time_s: np.ndarray  # seconds since the request's first step (steps + prefill stalls)
    tokens: np.ndarray  # output tokens so far
    remaining: np.ndarray  # tokens it is expected to produce still
    rate: np.ndarray  # expected tokens per step (accepted + the next token)
    context: np.ndarray  # committed tokens


@dataclass(frozen=True)
class Candidate:
    """A waiting request."""

    rid: int
    prompt_len: int  # prompt tokens (all but the last are prefilled on admission)
    remaining: float  # tokens it is expected to produce
    priority: float = 0.0


def admission_order(priority: list[float]) -> list[int]:
    """Queue positions in admission order: higher priority first, arrival (queue) order among equals."""
    return sorted(range(len(priority)), key=lambda i: (-priority[i], i))


def expected_remaining(tokens, limit, finished_lengths, min_samples: int = 8) -> np.ndarray:
    """[n] expected tokens still to come of requests with ``tokens`` [n] so far and at most ``limit`` [n]
    more: the mean residual length of the finished requests (``finished_lengths``, output tokens) that got
    past ``tokens``, or the limit itself while fewer than ``min_samples`` of them did."""
    tokens = np.asarray(tokens, dtype=np.float64)
    out = np.asarray(limit, dtype=np.float64).copy()
    done = np.asarray(finished_lengths, dtype=np.float64)
    for i, (n, m) in enumerate(zip(tokens, out.copy(), strict=True)):
        longer = done[done > n]
        if len(longer) >= min_samples:
            out[i] = min(float(np.minimum(longer, n + m).mean() - n), m)
    return out


def marginal_step_s(cost: CostModel, batch: int, n_context: int, nodes: float, ctx: int, k: float) -> float:
    """Predicted extra step time of one more request with ``ctx`` committed tokens and ``k`` draft nodes,
    added to a step of ``batch`` requests, ``n_context`` tokens and ``nodes`` draft nodes."""
    before = cost.predict(batch, n_context, nodes, drafted=nodes > 0).total
    after = cost.predict(batch + 1, n_context + ctx, nodes + k, drafted=nodes + k > 0).total
    return max(float(after - before), 0.0)


def projected_tpot(
    run: RunningState,
    cost: CostModel,
    nodes_per_request: float,
    *,
    drain: bool = False,
    refill: tuple[float, float] = (0.0, np.inf),
) -> np.ndarray:
    """[B] projected whole-run TPOT of each running request: with the batch as it is for the rest of its
    run (each leaving request replaced by a new one, whose prefill stalls the batch), or with ``drain``,
    if no one joins any more. ``refill``: (prefill seconds, steps a new request runs) of a replacement."""
    b = len(run.targets)
    if b == 0:
        return np.zeros(0)
    k1 = float(nodes_per_request)
    k = k1 * b
    n_ctx = int(run.context.sum())
    step_now = float(cost.predict(b, n_ctx, k, drafted=k > 0).total)
    own = np.array([marginal_step_s(cost, b - 1, n_ctx - int(c), k - k1, int(c), k1) for c in run.context])
    life = run.remaining / np.maximum(run.rate, 1e-9)  # [B] steps left
    overlap = np.minimum(1.0, life[None, :] / np.maximum(life[:, None], 1e-9))  # [i, j]: j's share
    if drain:
        step_avg = step_now - ((1.0 - overlap) * own[None, :]).sum(axis=1)
        stalls = np.zeros(b)
    else:  # slot j empties after life[j] steps, then every `new_life` steps; each refill is a prefill
        step_avg = np.full(b, step_now)
        prefill_s, new_life = refill
        after = np.maximum(life[:, None] - life[None, :], 0.0)  # [i, j] steps of i after j leaves
        leaves = (life[:, None] > life[None, :]) * (1.0 + after / max(new_life, 1.0))
        np.fill_diagonal(leaves, 0.0)
        stalls = prefill_s * leaves.sum(axis=1)
    return (run.time_s + life * step_avg + stalls) / np.maximum(run.tokens + run.remaining, 1)


def _with(run: RunningState, c: Candidate, target: float, rate: float, stall_s: float) -> RunningState:
    """``run`` after admitting ``c``: its prefill stalls the running requests; it starts with no time."""
    return RunningState(
        np.append(run.targets, target),
        np.append(run.priority, c.priority),
        np.append(run.time_s + stall_s, 0.0),
        np.append(run.tokens, 0),
        np.append(run.remaining, c.remaining),
        np.append(run.rate, rate),
        np.append(run.context, c.prompt_len),
    )


def admit_with_slo(
    run: RunningState,
    waiting: list[Candidate],
    targets: dict[int, float],
    free_slots: int,
    cost: CostModel,
    *,
    nodes_per_request: float,
    default_rate: float,
    margin: float = 1.0,
    hold_unreachable: bool = True,
    tolerance: float = 1.0,
    force: set[int] | None = None,
) -> list[int]:
    """Ids of the waiting requests to admit now, in admission order (at most ``free_slots``).

    ``targets``: TPOT target of the waiting requests that have one; ``nodes_per_request``: draft nodes
    a request typically gets per step (its step cost); ``default_rate``: expected tokens per step of a new
    request; ``margin`` scales the targets (< 1 keeps a safety margin); ``hold_unreachable``: a candidate
    with a target also waits while its own projection misses it (the batch shrinks as others finish, and
    its TPOT only starts at its first token); ``force``: ids admitted whenever there is a slot (e.g.
    waited too long). An empty batch always admits its first candidate. A candidate that waits holds up
    everyone after it (FIFO within a priority class, no starvation by smaller requests)."""
    force = force or set()
    if waiting:  # a replacement looks like the average waiting request
        refill = (
            float(np.mean([cost.prefill_time(max(c.prompt_len - 1, 0)) for c in waiting])),
            float(np.mean([c.remaining for c in waiting])) / max(default_rate, 1e-9),
        )
    chosen: list[int] = []
    floor = _batch_floor(run, waiting, free_slots, cost, nodes_per_request, tolerance)
    for i in admission_order([c.priority for c in waiting]):
        c = waiting[i]
        if len(chosen) >= free_slots:
            break
        if len(run.targets) < floor:
            force = force | {c.rid}
        target = targets.get(c.rid, np.inf)
        trial = _with(run, c, target, default_rate, cost.prefill_time(max(c.prompt_len - 1, 0)))
        if len(run.targets) > 0 and c.rid not in force:
            best = projected_tpot(run, cost, nodes_per_request, drain=True)
            after = projected_tpot(trial, cost, nodes_per_request, refill=refill)
            limit = margin * trial.targets
            guarded = (best <= limit[:-1]) & (run.priority >= c.priority)
            if (guarded & (after[:-1] > limit[:-1])).any():
                break
            if hold_unreachable and after[-1] > limit[-1]:
                break
        chosen.append(c.rid)
        run = trial
    return chosen


def _batch_floor(
    run: RunningState, waiting: list[Candidate], free_slots: int, cost: CostModel, k1: float, tol: float
) -> int:
    """Smallest batch whose predicted throughput (requests per second of step time) is within ``tol`` of
    the batch with every waiting request that fits: admission never holds the batch below it."""
    if tol >= 1.0 or not waiting:
        return 0
    b = len(run.targets)
    full = b + min(free_slots, len(waiting))
    ctx = float(np.mean([*run.context, *[c.prompt_len for c in waiting]]))
    sizes = np.arange(1, full + 1)
    rps = np.array([n / float(cost.predict(n, int(n * ctx), n * k1, drafted=k1 > 0).total) for n in sizes])
    return int(sizes[np.argmax(rps >= (1.0 - tol) * rps[-1])])


def admit(
    view, ledger, cost: CostModel, config, nodes_per_request: float, tokens_per_step: float
) -> list[int]:
    """The budget policy's admission (``BudgetPolicy.admit``): ids of waiting requests to admit before the
    next step, in order (at most ``view.free_slots``). FIFO without TPOT targets (or with
    ``config.slo_admission`` off); with them :func:`admit_with_slo`, from what ``ledger``
    (``sssd.policy.requests.RequestLedger``) knows of the running requests. Counts in ``ledger.deferred``
    how often each request was held back (``config.slo_max_defer`` of them and it is admitted anyway)."""
    rids = list(view.running.request_ids)
    has_targets = any(r in ledger.slo for r in (*rids, *view.waiting_ids))
    if not (config.slo_admission and view.free_slots > 0 and has_targets):
        return list(view.waiting_ids[: max(view.free_slots, 0)])  # first come, first served
    targets, prio = ledger.targets(rids, catch_up=False)
    stats = [ledger.stats(r) for r in rids]
    rate = np.array([(s.tokens + 4 * tokens_per_step) / (s.steps + 4) for s in stats])
    tokens = np.array([s.tokens for s in stats])
    run = RunningState(
        targets, prio, np.array([s.time_s for s in stats]), tokens,
        ledger.expected_remaining(tokens, view.running.remaining), rate,
        np.asarray(view.running.context_lens, dtype=np.int64),
    )  # fmt: skip
    w_left = ledger.expected_remaining(np.zeros(len(view.waiting_ids)), view.waiting_remaining)
    slo = ledger.slo
    waiting = [
        Candidate(r, int(n), float(m), slo[r].priority if r in slo else 0.0)
        for r, n, m in zip(view.waiting_ids, view.prompt_lens, w_left, strict=True)
    ]
    force = {r for r in view.waiting_ids if ledger.deferred.get(r, 0) >= config.slo_max_defer}
    chosen = admit_with_slo(
        run, waiting, {r: slo[r].tpot_s for r in view.waiting_ids if r in slo}, view.free_slots, cost,
        nodes_per_request=nodes_per_request, default_rate=tokens_per_step,
        margin=config.slo_admit_margin, hold_unreachable=config.slo_admit_hold,
        tolerance=config.slo_admit_tolerance, force=force,
    )  # fmt: skip
    # counts of the requests waiting now only (one that left the queue unadmitted is forgotten)
    ledger.deferred = {r: ledger.deferred.get(r, 0) + 1 for r in view.waiting_ids if r not in chosen}
    return chosen
