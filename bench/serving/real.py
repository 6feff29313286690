"""Real serving: the engine on SmolLM2-135M (float32, this CPU) under a wall-clock Poisson workload.

Requests join the engine when their arrival time has passed (continuous batching); the engine steps
while it has work and sleeps until the next arrival otherwise. Every request generates exactly
``--max-new-tokens`` tokens (no EOS stop) from pairs whose recorded output is at least that long, so the
simulated mode can replay the same workload and the two can be compared (the sim's error is reported):
once with the given profile, once with a profile refit on the real runs' steps (saved as
bench/results/profile_cpu_realrun.json).
"""

from __future__ import annotations

import time

import workload
from corpora import RESULTS
from report import print_row
from simulator import simulate_serving
from workload import Finished, StepLog

ERRORS = ("mean_latency_s", "throughput_tok_s", "mean_tpot_s")  # compared between a real run and its replay


def _pairs(args):
    from sssd.evaluation.pairs import load_pairs

    pairs = load_pairs(args.pairs)
    n = args.max_new_tokens
    if n:
        pairs = [p for p in pairs if len(p.output_ids) >= n]
    return pairs[: args.pairs_limit] if args.pairs_limit else pairs


def run_one(
    engine_factory, policy, wl, pairs, n_new: int, use_slo: bool
) -> tuple[list[Finished], StepLog, list]:
    """One workload through a fresh engine; the finished requests, the step log and the engine's steps."""
    eng = engine_factory(policy)
    pending = sorted(wl, key=lambda a: a.arrival_s)
    nxt = 0
    info: dict[int, list] = {}  # engine rid -> [arrival, first token time]
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
        log.add(t.batch_size, k, t.step_s, int(sum(t.accepted)), float("nan"))
    return done, log, list(eng.stats.history)


def run_real(args) -> list[dict]:
    import sssd
    import torch
    from sssd.engine.engine import Engine, EngineConfig
    from sssd.models.loading import load_model
    from sssd.policy.cost_model import CostModel

    torch.set_num_threads(args.threads)
    n_new = args.max_new_tokens or 32
    args.max_new_tokens = n_new
    pairs = _pairs(args)
    model, _, path = load_model(args.model, "float32", "cpu")
    ds = sssd.Datastore.open(workload.datastore_path())
    cost = CostModel.load(args.profile)
    targets = workload.slo_targets(cost, args.max_batch // 2 or 1, args)
    print(f"real: {path.name}, {len(pairs)} pairs, {n_new} new tokens, torch threads {args.threads}")
    print(f"TPOT targets: tight {targets[0] * 1e3:.1f} ms, relaxed {targets[1] * 1e3:.1f} ms")

    def make_drafter():
        return sssd.Drafter(datastore=ds, config=sssd.DrafterConfig())

    def engine_factory(policy):
        config = EngineConfig(policy=policy, max_batch_size=args.max_batch)
        return Engine(model, drafter=make_drafter(), config=config)

    rows, steps = [], []
    with torch.inference_mode():
        engine_factory(workload.make_policy("no-spec", cost)[0]).generate(
            [pairs[0].prompt_ids.tolist()], max_new_tokens=4
        )
        for rate in args.rates:
            wl = workload.workload_for(args, len(pairs), rate, args.seed, targets)
            for pol_name in args.policies:
                policy, slo = workload.make_policy(pol_name, cost)
                t0 = time.perf_counter()
                done, log, seen = run_one(engine_factory, policy, wl, pairs, n_new, slo)
                steps += seen
                row = {"mode": "real", "rate": rate, "policy": pol_name, **workload.summarize(done, log)}
                row["wall_s"] = time.perf_counter() - t0
                row["acceptance_ratio_policy"] = policy.acceptance.ratio
                row["budget_by_batch"] = workload.budget_by_batch(log)
                rows.append(row)
                print_row(row)
                # the same workload through the simulator, for its error against this run
                _replay(row, "sim", wl, pairs, make_drafter, cost, args)
    refit = _refit(cost, steps)
    refit.save(RESULTS / "profile_cpu_realrun.json")
    print(f"cost model refit on the {len(steps)} real steps: {refit}")
    for row in rows:  # the simulator again, with the costs the real runs actually saw
        wl = workload.workload_for(args, len(pairs), row["rate"], args.seed, targets)
        _replay(row, "sim-refit", wl, pairs, make_drafter, refit, args)
    return rows


def _replay(row: dict, mode: str, wl, pairs, make_drafter, cost, args) -> None:
    """Replays a real run's workload in the simulator with ``cost``; stores the simulated row in ``row``
    (key "sim" or "sim_refit") with its relative errors (keys "sim_err_*" or "simrefit_err_*")."""
    policy, slo = workload.make_policy(row["policy"], cost)
    done, log = simulate_serving(
        wl, pairs, make_drafter, policy, cost, max_batch=args.max_batch,
        max_new_tokens=args.max_new_tokens, use_slo=slo,
    )  # fmt: skip
    srow = {"mode": mode, "rate": row["rate"], "policy": row["policy"], **workload.summarize(done, log)}
    if mode == "sim":
        srow["budget_by_batch"] = workload.budget_by_batch(log)
    tag = mode.replace("-", "")
    for key in ERRORS:
        if row.get(key) and srow.get(key):
            row[f"{tag}_err_{key}"] = (srow[key] - row[key]) / row[key]
    row[mode.replace("-", "_")] = srow
    print_row(srow)


def _refit(profile, steps: list):
    """The profile's drafting part with forward/bookkeeping refitted on the real runs' steps."""
    from sssd.policy.cost_model import CostModel

    cm = CostModel.from_dict(profile.to_dict(), prior_weight=0.0, forget=1.0, window=max(16, len(steps)))
    for t in steps:
        cm.observe(t, drafted=False)  # the profile's drafting part is kept
    cm.forward.refit()
    cm.verify.refit()
    cm.meta = {**profile.meta, "refit_on": f"{len(steps)} steps of bench/serving/serve.py real"}
    return cm
