"""Part (c) of bench_recycled.py: the engine end to end with and without the recycled candidates."""

from __future__ import annotations

import os
import statistics
import time

import corpora
import sssd

# sssd+recycled: the drafter gets the rows verification reads (the root and the accepted nodes);
# sssd+recycled-all: every verified node's row (recycle_rows="all": the output head on every draft row)
# sssd+recycled-all*: the same with the table of --calibration2 (two calibration tables side by side)
ARMS = ("plain", "sssd", "sssd+recycled", "sssd+recycled-all", "sssd+recycled-all*")


def split_arm(arm: str) -> tuple[str, dict]:
    """An arm's name and its DrafterConfig overrides: "sssd+recycled-all:recycle_trust_match=9" is the arm
    sssd+recycled-all with DrafterConfig(recycle_trust_match=9) (several: name:a=1:b=2)."""
    import ast

    name, *pairs = arm.split(":")
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = ast.literal_eval(value)
    return name, out


def _prompts(tok, n_dev: int, n_bundled: int | None = None) -> list[tuple[str, str, list[int]]]:
    """(kind, id, prompt ids): the bundled prompts (all, or the first n_bundled with the kinds in turn),
    then n_dev development prompts that are not among them. A prompt run twice would draft its second run
    from its first output (the drafter's pool of recent outputs), so each prompt runs once: the bundled
    chat and code prompts are the development set's first MT-Bench and HumanEval items."""
    from sssd.cli.demo import bundled_items
    from sssd.models.loading import chat_ids

    out = [(it["kind"], it["id"], chat_ids(tok, it["text"])) for it in bundled_items(n_bundled)]
    seen = {p[1] for p in out}
    dev = [r for r in corpora.dev_rows(n_dev + len(seen)) if r["id"] not in seen][:n_dev]
    out += [(f"dev-{r['subset']}", r["id"], list(r["prompt_ids"])) for r in dev]
    return out


def _engines(model, tok, ds, batch: int, budget: int, arms, calibration="default", calibration2=None) -> dict:
    v = corpora.VOCAB
    out = {}
    for label in arms:
        arm, extra = split_arm(label)
        drafter = (
            None
            if arm == "plain"
            else sssd.Drafter(
                ds,
                sssd.DrafterConfig(
                    use_recycled="recycled" in arm,
                    recycle_rows="all" if "-all" in arm else "walked",
                    vocab_size=v,
                    calibration=calibration2 if arm.endswith("*") else calibration,
                    **extra,
                ),
            )
        )
        cfg = sssd.EngineConfig(budget=0 if drafter is None else budget, max_batch_size=batch,
                                budget_mode="fixed" if drafter is None else "adaptive")  # fmt: skip
        out[label] = sssd.Engine(model, tok, drafter=drafter, config=cfg)
    return out


def _run(engines, prompts, batch: int, new: int) -> dict:
    """Per arm: seconds, tokens, per prompt (tokens, steps); the arms take turns chunk by chunk."""
    arms = list(engines)
    got = {arm: {"s": 0.0, "out": {}} for arm in arms}
    chunks = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    for c, chunk in enumerate(chunks):
        for j in range(len(arms)):
            arm = arms[(c + j) % len(arms)]
            t0 = time.perf_counter()
            res = engines[arm].generate([p[2] for p in chunk], max_new_tokens=new)
            got[arm]["s"] += time.perf_counter() - t0
            secs = (time.perf_counter() - t0) / len(chunk)  # per prompt: exact at batch 1
            for p, r in zip(chunk, res, strict=True):
                got[arm]["out"][p[1]] = (r.tokens, r.stats.steps, secs)
    for arm in arms:
        st = engines[arm].stats
        got[arm]["nodes"] = st.nodes / max(st.steps, 1)
        got[arm]["ms"] = _step_ms(engines[arm])
    return got


def _table(prompts, got, dtype: str, batch: int) -> None:
    kinds = list(dict.fromkeys(p[0] for p in prompts))
    plain = got["plain"]["out"] if "plain" in got else None
    print(f"\n{dtype}, batch {batch} ({_load()}): tokens/s over all prompts, MAL per kind")
    print(
        "| arm | tokens/s | vs plain | MAL | "
        + " | ".join(f"MAL {k}" for k in kinds)
        + " | identical to plain | draft nodes/step | ms/step: forward (head) verify |"
    )
    print("|---|---|---|---|" + "---|" * len(kinds) + "---|---|---|")
    base = None
    for arm in got:
        out = got[arm]["out"]
        tokens = sum(len(v[0]) for v in out.values())
        rate = tokens / got[arm]["s"]
        base = base or rate
        steps = sum(v[1] for v in out.values())
        per_kind = []
        for k in kinds:
            ids = [p[1] for p in prompts if p[0] == k]
            per_kind.append(sum(len(out[i][0]) for i in ids) / max(1, sum(out[i][1] for i in ids)))
        same = "-" if plain is None else f"{sum(out[i][0] == plain[i][0] for i in out)}/{len(out)}"
        tail = f" | {same} | {got[arm]['nodes']:.1f} | {got[arm]['ms']} |"
        print(f"| {arm} | {rate:.2f} | {rate / base:.2f} | {tokens / max(steps, 1):.3f} | "
              + " | ".join(f"{m:.3f}" for m in per_kind) + tail)  # fmt: skip
    if batch == 1:
        _rates(prompts, kinds, got)
    chat = [p[1] for p in prompts if p[0] == "chat"][:1]
    if chat:
        mals = [
            f"{arm} {len(got[arm]['out'][chat[0]][0]) / max(1, got[arm]['out'][chat[0]][1]):.3f}"
            for arm in got
        ]
        print(f"\nthe first chat prompt ({chat[0]}), MAL: " + ", ".join(mals))


def _rates(prompts, kinds, got) -> None:
    """Tokens/s per prompt kind (batch 1: each prompt timed on its own)."""
    print("\n| arm | " + " | ".join(f"tokens/s {k}" for k in kinds) + " |\n|---|" + "---|" * len(kinds))
    for arm in got:
        out = got[arm]["out"]
        cells = []
        for k in kinds:
            ids = [p[1] for p in prompts if p[0] == k]
            cells.append(f"{sum(len(out[i][0]) for i in ids) / sum(out[i][2] for i in ids):.2f}")
        print(f"| {arm} | " + " | ".join(cells) + " |")


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_engine(args) -> None:
    import torch
    from sssd.integrations.vllm_demo import demo_datastore
    from sssd.models.loading import load_model

    torch.set_num_threads(args.threads)
    ds = sssd.Datastore.open(demo_datastore())
    print(f"\n(c) end to end: SmolLM2-135M-Instruct, {args.threads} torch thread(s), greedy, adaptive policy "
          f"(0..{args.budget}), {args.new} new tokens per prompt, arms taking turns")  # fmt: skip
    for dtype in args.dtypes.split(","):
        model, tok, _ = load_model(None, dtype)
        prompts = _prompts(tok, args.dev, args.prompts)
        for batch in map(int, args.batches.split(",")):
            plain = [] if args.no_plain else ["plain"]
            arms = plain + [a for a in args.arms.split(",") if split_arm(a)[0] in ARMS and a != "plain"]
            rounds = []
            cals = (args.calibration, args.calibration2)
            for _ in range(args.engine_rounds):  # fresh engines and drafters: a cold pool and table each
                engines = _engines(model, tok, ds, batch, args.budget, arms, *cals)
                rounds.append(_run(engines, prompts, batch, args.new))
                _table(prompts, rounds[-1], dtype, batch)
            if len(rounds) > 1:
                _rounds_table(prompts, rounds, arms, batch)


def _rounds_table(prompts, rounds: list[dict], arms: list[str], batch: int) -> None:
    """Each arm's tokens/s against the first drafting arm's, over all prompts and (batch 1, where each
    prompt is timed on its own) per prompt kind: every round's ratio, the ratio of the rounds' summed
    tokens and seconds, and the mean of the rounds' ratios with two standard errors."""
    kinds = ["all", *dict.fromkeys(p[0] for p in prompts)] if batch == 1 else ["all"]
    base = next((a for a in arms if a != "plain"), arms[0])

    def rate(got, arm, kind):
        ids = [p[1] for p in prompts if kind in ("all", p[0])]
        out = got[arm]["out"]
        return sum(len(out[i][0]) for i in ids), sum(out[i][2] for i in ids)

    print(f"\n{len(rounds)} rounds: tokens/s against {base} (per round; summed over the rounds; mean of the "
          f"rounds ± 2 standard errors)")  # fmt: skip
    print("| arm | " + " | ".join(kinds) + " |\n|---|" + "---|" * len(kinds))
    for arm in arms:
        if arm == base:
            continue
        cells = []
        for kind in kinds:
            per, tot = [], [0.0, 0.0, 0.0, 0.0]
            for got in rounds:
                (ta, sa), (tb, sb) = rate(got, arm, kind), rate(got, base, kind)
                per.append((ta / sa) / (tb / sb))
                tot = [tot[0] + ta, tot[1] + sa, tot[2] + tb, tot[3] + sb]
            summed = (tot[0] / tot[1]) / (tot[2] / tot[3])
            mean, se = statistics.mean(per), statistics.stdev(per) / len(per) ** 0.5
            cells.append(" ".join(f"{r:.3f}" for r in per) + f"; {summed:.3f}; {mean:.3f} ± {2 * se:.3f}")
        print(f"| {arm} | " + " | ".join(cells) + " |")


MAL_ARMS = ("off", "walked", "all")


def run_mal(args, prompts_of, stores: dict, budgets: list[int], title: str) -> None:
    """Parts (d) and (e): mean accepted length end to end (the engine, SmolLM2 float32, greedy, batch 1,
    fixed budgets), without the recycled source, with the rows verification reads ("walked") and with
    every verified node's ("all"). prompts_of(tokenizer): the prompts, (kind, id, prompt ids); stores:
    name -> datastore (or None).
    The teacher-forced replay of part (a) knows the model's top-k only along the reference text, so it
    cannot feed "all": here the engine runs the model."""
    import torch
    from sssd.models.loading import load_model

    torch.set_num_threads(args.threads)
    model, tok, _ = load_model(None, "float32")
    prompts = prompts_of(tok)
    kinds = list(dict.fromkeys(p[0] for p in prompts))
    print(f"\n{title}: {len(prompts)} prompts, {args.new} new tokens each, SmolLM2 float32, greedy, batch 1, "
          f"fixed budget ({_load()})\n")  # fmt: skip
    print("| datastore | budget | arm | MAL | ratio | " + " | ".join(f"MAL {k}" for k in kinds)
          + " | tokens | outputs as without | ms/step: forward (head) verify |")  # fmt: skip
    print("|---|---|---|---|---|" + "---|" * len(kinds) + "---|---|---|")
    for store, ds in stores.items():
        for budget in budgets:
            outs, times = {}, {}
            asked = args.mal_arms.split(",")
            arms = ["off"] + [a for a in asked if split_arm(a)[0] in MAL_ARMS and a != "off"]
            for label in arms:
                arm, extra = split_arm(label)
                cfg = sssd.DrafterConfig(
                    use_recycled=arm != "off",
                    recycle_rows="all" if arm == "all" else "walked",
                    vocab_size=corpora.VOCAB,
                    calibration=args.calibration,
                    **extra,
                )
                fixed = sssd.EngineConfig(budget=budget, budget_mode="fixed", max_batch_size=1)
                engine = sssd.Engine(model, tok, drafter=sssd.Drafter(ds, cfg), config=fixed)
                # one at a time: each request's own steps
                outs[label] = [engine.generate([list(p[2])], max_new_tokens=args.new)[0] for p in prompts]
                times[label] = _step_ms(engine)
            base = None
            for arm in arms:
                res = outs[arm]
                tokens, steps = sum(len(r.tokens) for r in res), sum(r.stats.steps for r in res)
                mal = tokens / max(steps, 1)
                base = base or mal
                per_kind = []
                for k in kinds:
                    mine = [r for p, r in zip(prompts, res, strict=True) if p[0] == k]
                    per_kind.append(
                        sum(len(r.tokens) for r in mine) / max(1, sum(r.stats.steps for r in mine))
                    )
                same = all(a.tokens == b.tokens for a, b in zip(res, outs["off"], strict=True))
                cells = [store, budget, arm, f"{mal:.3f}", f"{mal / base:.3f}"]
                cells += [f"{m:.3f}" for m in per_kind] + [tokens, same, times[arm]]
                print("| " + " | ".join(map(str, cells)) + " |", flush=True)


def _step_ms(engine) -> str:
    """Milliseconds per step over the engine's steps: the forward with the output head in it, the head
    alone, and verification (timings: read them with the load average printed above)."""
    st = engine.stats
    if not st.steps:
        return "-"
    return " ".join(
        [
            f"{1e3 * st.forward_s / st.steps:.1f}",
            f"({1e3 * st.head_s / st.steps:.1f})",
            f"{1e3 * st.verify_s / st.steps:.1f}",
        ]
    )
