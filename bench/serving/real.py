"""Real serving: the engine on SmolLM2-135M (float32, this CPU) under a wall-clock Poisson workload.

Requests join the engine when their arrival time has passed (continuous batching); the engine steps
while it has work and sleeps until the next arrival otherwise. Every request generates exactly
``--max-new-tokens`` tokens (no EOS stop) from pairs whose recorded output is at least that long, so the
simulated mode can replay the same workload and the two can be compared (the sim's error is reported).
"""

from __future__ import annotations

import time

import numpy as np
from serve_workload import Finished, StepLog, poisson_workload, summarize


def _pairs(args):
    from sssd.evaluation.pairs import load_pairs

    pairs = load_pairs(args.pairs)
    n = args.max_new_tokens
    if n:
        pairs = [p for p in pairs if len(p.output_ids) >= n]
    return pairs[: args.pairs_limit] if args.pairs_limit else pairs


def run_one(engine_factory, policy, wl, pairs, n_new: int, use_slo: bool) -> tuple[list[Finished], StepLog]:
    eng = engine_factory(policy)
    pending = sorted(wl, key=lambda a: a.arrival_s)
    nxt = 0
    info: dict[int, tuple] = {}  # engine rid -> (arrival, first token time)
    done: list[Finished] = []
    t0 = time.perf_counter()
    while nxt < len(pending) or eng.has_unfinished():
        now = time.perf_counter() - t0
        while nxt < len(pending) and pending[nxt].arrival_s <= now:
            a = pending[nxt]
            rid = eng.add_request(pairs[a.pair].prompt_ids.tolist(), max_new_tokens=n_new, eos_token_ids=[])
            if use_slo:
                policy.set_slo(rid, a.tpot_target_s, priority=1.0 if a.slo_class == "tight" else 0.0)
            info[rid] = [a, -1.0]
            nxt += 1
        if not eng.has_unfinished():
            time.sleep(max(0.0, pending[nxt].arrival_s - (time.perf_counter() - t0)))
            continue
        events = eng.step()
        now = time.perf_counter() - t0
        for e in events:
            st = info[e.request_id]
            if e.tokens and st[1] < 0:
                st[1] = now
            if e.finished:
                a = st[0]
                n = len(e.result.tokens)
                done.append(Finished(a.rid, a.arrival_s, st[1], now, n, a.slo_class, a.tpot_target_s))
                eng.result(e.request_id)
    log = StepLog()
    for t, (_, k) in zip(eng.stats.history, getattr(policy, "history", []), strict=False):
        log.add(t.batch_size, k, t.step_time, int(sum(t.accepted)), float("nan"))
    STEPS.extend(eng.stats.history)
    return done, log


STEPS: list = []  # every engine step of every real run (to refit the cost profile on them)


def run_real(args) -> list[dict]:
    import sssd
    import torch
    from serve import bench_cache, datastore_path, make_policy, slo_targets
    from serve_sim import simulate_serving
    from sssd.engine.engine import Engine, EngineConfig
    from sssd.models.loading import load_model
    from sssd.policy.cost_model import CostModel

    torch.set_num_threads(args.threads)
    n_new = args.max_new_tokens or 32
    args.max_new_tokens = n_new
    pairs = _pairs(args)
    model, _, path = load_model(args.model, "float32", "cpu")
    name = path.name
    ds = sssd.Datastore.open(datastore_path(bench_cache()))
    cost = CostModel.load(args.profile)
    tight, relaxed = slo_targets(cost, args.max_batch // 2 or 1, args)
    print(f"real: {name}, {len(pairs)} pairs, {n_new} new tokens, torch threads {args.threads}")
    print(f"TPOT targets: tight {tight * 1e3:.1f} ms, relaxed {relaxed * 1e3:.1f} ms")

    def engine_factory(policy):
        drafter = sssd.Drafter(datastore=ds, config=sssd.DrafterConfig())
        return Engine(
            model, drafter=drafter, config=EngineConfig(policy=policy, max_batch_size=args.max_batch)
        )

    rows = []
    with torch.inference_mode():
        engine_factory(make_policy("no-spec", cost)[0]).generate(
            [pairs[0].prompt_ids.tolist()], max_new_tokens=4
        )
        for rate in args.rates:
            wl = poisson_workload(
                len(pairs), rate, args.requests, seed=args.seed, tight_tpot_s=tight, relaxed_tpot_s=relaxed
            )
            for pol_name in args.policies:
                policy, slo = make_policy(pol_name, cost)
                t0 = time.perf_counter()
                done, log = run_one(engine_factory, policy, wl, pairs, n_new, slo)
                row = {"mode": "real", "rate": rate, "policy": pol_name, **summarize(done, log)}
                row["wall_s"] = time.perf_counter() - t0
                row["acceptance_ratio_policy"] = policy.acceptance.ratio
                row["budget_by_batch"] = _budget_by_batch(log)
                rows.append(row)
                _print(row)
                # the same workload through the simulator, for its error against this run
                sp, _ = make_policy(pol_name, cost)
                sd, slog = simulate_serving(
                    wl, pairs, lambda: sssd.Drafter(datastore=ds, config=sssd.DrafterConfig()), sp, cost,
                    max_batch=args.max_batch, max_new_tokens=n_new, use_slo=slo,
                )  # fmt: skip
                srow = {"mode": "sim", "rate": rate, "policy": pol_name, **summarize(sd, slog)}
                srow["budget_by_batch"] = _budget_by_batch(slog)
                for key in ("mean_latency_s", "throughput_tok_s", "mean_tpot_s"):
                    if row.get(key) and srow.get(key):
                        row[f"sim_err_{key}"] = (srow[key] - row[key]) / row[key]
                row["sim"] = srow
                _print(srow)
    refit = _refit(cost)
    refit.save(RESULTS_DIR() / "profile_cpu_realrun.json")
    print(f"cost model refit on the {len(STEPS)} real steps: {refit}")
    for row in rows:  # the simulator again, with the costs the real runs actually saw
        rate, pol_name = row["rate"], row["policy"]
        wl = poisson_workload(
            len(pairs), rate, args.requests, seed=args.seed, tight_tpot_s=tight, relaxed_tpot_s=relaxed
        )
        sp, slo = make_policy(pol_name, refit)
        sd, slog = simulate_serving(
            wl, pairs, lambda: sssd.Drafter(datastore=ds, config=sssd.DrafterConfig()), sp, refit,
            max_batch=args.max_batch, max_new_tokens=n_new, use_slo=slo,
        )  # fmt: skip
        srow = {"mode": "sim-refit", "rate": rate, "policy": pol_name, **summarize(sd, slog)}
        for key in ("mean_latency_s", "throughput_tok_s", "mean_tpot_s"):
            if row.get(key) and srow.get(key):
                row[f"simrefit_err_{key}"] = (srow[key] - row[key]) / row[key]
        row["sim_refit"] = srow
        _print(srow)
    return rows


def RESULTS_DIR():
    from serve import RESULTS

    return RESULTS


def _refit(profile):
    """The profile's drafting part with forward/bookkeeping refitted on the real runs' steps."""
    from sssd.policy.cost_model import CostModel, forward_features

    cm = CostModel.from_dict(profile.to_dict(), prior_weight=0.0, forget=1.0, window=max(16, len(STEPS)))
    for t in STEPS:
        cm.forward.add(forward_features(t.context_tokens, t.num_nodes, t.batch_size), t.forward_time)
        cm.other.add([t.batch_size, t.num_nodes, 1.0], max(0.0, t.step_time - t.forward_time - t.draft_time))
    cm.forward.refit()
    cm.other.refit()
    cm.meta = {**profile.meta, "refit_on": f"{len(STEPS)} steps of bench/serve.py real"}
    return cm


def _budget_by_batch(log) -> dict[int, float]:
    b = np.array(log.batch_size)
    k = np.array(log.budget)
    return {int(x): float(k[b == x].mean()) for x in np.unique(b)} if len(b) else {}


def _print(row: dict) -> None:
    from serve import _print_row

    _print_row(row)
