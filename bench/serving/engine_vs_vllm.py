"""sssd's own engine against vLLM hosting sssd's drafter, on the same prompts, drafter, datastore, dtype,
threads and batch size, interleaved; where each engine's step time goes.

    PYTHONPATH=python python3 bench/serving/engine_vs_vllm.py --vllm-python build/vllm-venv/bin/python \\
        --prompts 8 --max-tokens 128 --batches 1,4 --rounds 2

Runs (``--runs``, comma-separated): ``vllm-plain`` (vLLM without speculation), ``vllm-sssd`` (vLLM with
sssd's proposer and the datastore; ``num_speculative_tokens`` = ``--k``), ``engine-plain`` (the engine,
budget 0), ``engine-adaptive`` (the engine's adaptive policy, 0..``--budget`` draft nodes, the datastore)
and ``engine-fixed:N`` (a fixed budget of N nodes). Every run is a fresh process (vLLM starts one engine
per process), warmed up on a short generation, then timed on all prompts at once with at most
``batch`` requests decoding together (vLLM's ``max_num_seqs``, the engine's ``max_batch_size``). The runs
of a round take their turns in an order that rotates from round to round, so a load that comes and goes
slows all of them alike; the table gives the median over rounds and every ratio is taken within a round.

vLLM runs in its own virtual environment (``--vllm-python``; it pins its own transformers), eagerly, with
its engine core in the worker process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that its step can be split:
the model forward (``_model_forward``), the output head (``compute_logits``), verification (``_sample``:
the rejection sampler), drafting (``propose_draft_token_ids``: sssd's proposer), prefill (forwards of
steps that schedule prompt tokens) and the rest (scheduler, input preparation, bookkeeping). The engine
reports its own phases (``EngineStats``): drafting, forward, output head, verification, prefill, the
rest. Both use ``--threads`` threads (vLLM binds its OpenMP threads to that many cores).

MAL = tokens per request step. Identical: outputs equal token for token to the same engine's plain run
(and, in the last column, to plain vLLM's). Speed depends on the machine and its load: the header prints
the load average before and after; do not run it beside anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the shared helpers (corpora)
PHASES = ("draft", "forward", "head", "verify", "prefill", "other")


# -- the children ------------------------------------------------------------------------------------
# cProfile's built-in functions (C code: kernels, torch ops) by category; Python is everything else
CATEGORIES = (
    ("linear", re.compile(r"linear_rows|_nn\.linear|_linear_pointwise|onednn_mm|weight_packed_linear|addmm|"
                          r"method 'mm'|matmul")),
    ("attention", re.compile(r"tree_attention|scaled_dot_product|attention|attn")),
    ("other torch", re.compile(r"torch|_ops|_C\.")),
)  # fmt: skip


def timed(fn, profile: bool):
    """Runs ``fn()``, under cProfile when ``profile``; returns its result, the split by category (None
    without profiling) and the wall seconds."""
    t0 = time.perf_counter()
    out, split = profiled(fn) if profile else (fn(), None)
    return out, split, time.perf_counter() - t0


def profiled(fn):
    """Runs ``fn()`` under cProfile; returns its result and seconds by category (see CATEGORIES)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    out = prof.runcall(fn)
    split = dict.fromkeys([c for c, _ in CATEGORIES] + ["other C", "python"], 0.0)
    for (filename, _, name), row in pstats.Stats(prof).stats.items():
        tottime = row[2]
        if filename != "~":
            split["python"] += tottime
            continue
        split[next((c for c, pat in CATEGORIES if pat.search(name)), "other C")] += tottime
    return out, split


def run_engine(job: dict) -> dict:
    """One sssd engine run (this interpreter's environment)."""
    import torch

    torch.set_num_threads(int(job["threads"]))
    import sssd
    from sssd.models.loading import load_model

    model, tok, _ = load_model(None, job["dtype"])
    kind, budget = job["kind"], int(job.get("budget", 0))
    drafter = sssd.Drafter(datastore=sssd.Datastore.open(job["datastore"])) if budget else None
    mode = "adaptive" if kind == "engine-adaptive" else "fixed"
    cfg = sssd.EngineConfig(budget=budget, budget_mode=mode, max_batch_size=int(job["batch"]))
    engine = sssd.Engine(model, tok, drafter=drafter, config=cfg)
    engine.generate([job["prompts"][0]], max_new_tokens=8)  # warm-up, as for vLLM
    st0 = _engine_totals(engine.stats)
    run = lambda: engine.generate(job["prompts"], max_new_tokens=int(job["max_tokens"]))  # noqa: E731
    res, split, wall = timed(run, bool(job.get("profile")))
    st1 = _engine_totals(engine.stats)
    d = {k: st1[k] - st0[k] for k in st1}
    # the forward without its output head, like vLLM's _model_forward (its head is compute_logits)
    phases = {"draft": d["draft"], "forward": d["forward"] - d["head"], "head": d["head"],
              "verify": d["verify"], "prefill": d["prefill"]}  # fmt: skip
    phases["other"] = wall - sum(v for v in phases.values() if v)
    tokens = [list(r.tokens) for r in res]
    return {"wall_s": wall, "tokens": tokens, "request_steps": sum(r.stats.steps for r in res),
            "steps": d["steps"], "phases": phases, "draft_tokens": d["nodes"], "profile": split}  # fmt: skip


def _engine_totals(st) -> dict:
    names = ("draft_s", "forward_s", "head_s", "verify_s", "prefill_s", "steps", "nodes")
    return {name.removesuffix("_s"): getattr(st, name) for name in names}


class _Clock:
    """Seconds spent inside wrapped vLLM methods (the outermost call of each phase counts)."""

    def __init__(self):
        self.s = dict.fromkeys(PHASES, 0.0)
        self.prefill_step = False
        self.steps = 0

    def wrap(self, cls, name: str, phase: str) -> None:
        fn = getattr(cls, name)
        clock = self

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                dt = time.perf_counter() - t
                key = "prefill" if phase == "forward" and clock.prefill_step else phase
                clock.s[key] += dt

        setattr(cls, name, timed)

    def watch_steps(self, cls) -> None:
        fn = cls.execute_model
        clock = self

        def execute_model(runner, scheduler_output, *a, **kw):
            # a step that schedules prompt tokens (a new request, or a chunk of one) is a prefill step
            new = getattr(scheduler_output, "scheduled_new_reqs", None) or []
            clock.prefill_step = bool(new)
            clock.steps += 1
            return fn(runner, scheduler_output, *a, **kw)

        cls.execute_model = execute_model


def run_vllm(job: dict) -> dict:
    """One vLLM run (the vLLM environment): sssd's proposer or none, the step split by phase."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: its step is timed
    threads = int(job["threads"])
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if threads == 1 else f"0-{threads - 1}")
    import vllm
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    clock = _Clock()
    clock.watch_steps(CPUModelRunner)
    clock.wrap(CPUModelRunner, "_model_forward", "forward")
    clock.wrap(CPUModelRunner, "_sample", "verify")
    clock.wrap(CPUModelRunner, "propose_draft_token_ids", "draft")
    spec = None
    if job["kind"] == "vllm-sssd":
        os.environ["SSSD_VLLM_CONFIG"] = json.dumps({"datastore": job["datastore"], **job["vllm_config"]})
        spec = {"method": "custom_class", "model": "sssd.integrations.vllm.SssdProposer",
                "num_speculative_tokens": int(job["k"])}  # fmt: skip
    llm = vllm.LLM(
        job["model"], dtype=job["dtype"], enforce_eager=True, max_model_len=2048,
        max_num_seqs=int(job["batch"]), kv_cache_memory_bytes=1 << 30, disable_log_stats=False,
        speculative_config=spec, seed=0,
    )  # fmt: skip
    model = type(_find_model(llm))
    clock.wrap(model, "compute_logits", "head")
    sp = vllm.SamplingParams(temperature=0.0, max_tokens=int(job["max_tokens"]))
    prompts = [vllm.TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
    llm.generate(prompts[:1], vllm.SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    before = _spec_counters(llm)
    s0, n0 = dict(clock.s), clock.steps
    run = lambda: llm.generate(prompts, sp, use_tqdm=False)  # noqa: E731
    outs, split, wall = timed(run, bool(job.get("profile")))
    after = _spec_counters(llm)
    phases = {k: clock.s[k] - s0[k] for k in PHASES}
    phases["other"] = wall - sum(phases.values())
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    accepted = after.get("num_accepted_tokens", 0.0) - before.get("num_accepted_tokens", 0.0)
    new = sum(map(len, tokens))
    drafted = after.get("num_draft_tokens", 0.0) - before.get("num_draft_tokens", 0.0)
    return {"wall_s": wall, "tokens": tokens, "request_steps": new - accepted, "steps": clock.steps - n0,
            "phases": phases, "draft_tokens": drafted, "profile": split}  # fmt: skip


def _find_model(llm):
    """vLLM's model module (the object whose ``compute_logits`` is the output head)."""
    core = llm.llm_engine.engine_core
    core = getattr(core, "engine_core", core)
    worker = core.model_executor.driver_worker
    worker = getattr(worker, "worker", worker)
    return worker.model_runner.get_model()


def _spec_counters(llm) -> dict[str, float]:
    out = {}
    for m in llm.get_metrics():
        name = getattr(m, "name", "")
        if name.startswith("vllm:spec_decode") and hasattr(m, "value"):
            key = name.removeprefix("vllm:spec_decode_").removesuffix("_total")
            out[key] = float(m.value)
    return out


# -- the driver --------------------------------------------------------------------------------------
def child(job: dict, python: str, timeout: float, sssd_path: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="sssd-vs-") as tmp:
        spec, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps(job))
        env = dict(os.environ, PYTHONPATH=str(sssd_path), OMP_NUM_THREADS=str(job["threads"]))
        proc = subprocess.run(
            [python, str(Path(__file__).resolve()), "--child", str(spec), str(result)],
            capture_output=True, text=True, timeout=timeout, env=env,
        )  # fmt: skip
        if proc.returncode != 0 or not result.is_file():
            tail = "\n".join(((proc.stdout or "") + (proc.stderr or "")).splitlines()[-25:])
            raise RuntimeError(f"{job['kind']} (batch {job['batch']}) failed:\n{tail}")
        return json.loads(result.read_text())


def parse_runs(spec: str) -> list[tuple[str, int]]:
    runs = []
    for name in filter(None, (s.strip() for s in spec.split(","))):
        if name.startswith("engine-fixed:"):
            runs.append((name, int(name.split(":", 1)[1])))
        elif name in ("vllm-plain", "vllm-sssd", "engine-plain", "engine-adaptive"):
            runs.append((name, -1))
        else:
            raise SystemExit(f"unknown run {name!r}")
    return runs


def prompt_ids(kind: str, n: int) -> list[list[int]]:
    if kind == "dev":
        from corpora import dev_rows

        return [r["prompt_ids"] for r in dev_rows(n)]
    from sssd.integrations.vllm_demo import bundled_prompts
    from sssd.models.loading import chat_ids
    from sssd.models.local import ensure_hf_model, load_tokenizer

    tok = load_tokenizer(ensure_hf_model())
    return [chat_ids(tok, q) for q in bundled_prompts(n)]


def summarize(results: dict, runs, batches, rounds: int) -> list[dict]:
    """Per batch and run: median tok/s over rounds, ratios within rounds, MAL, phases, agreement."""
    import statistics as stats

    rows = []
    for b in batches:
        for name, _ in runs:
            got = [results.get((b, r, name)) for r in range(rounds)]
            got = [g for g in got if g is not None]
            if not got:
                continue
            rate = [sum(map(len, g["tokens"])) / g["wall_s"] for g in got]
            row = {"batch": b, "run": name, "tok_s": stats.median(rate), "rounds": len(got)}
            for base in ("engine-plain", "vllm-plain", "vllm-sssd"):
                ratios = []
                for r in range(rounds):
                    a, o = results.get((b, r, name)), results.get((b, r, base))
                    if a and o:
                        ratios.append((sum(map(len, a["tokens"])) / a["wall_s"])
                                      / (sum(map(len, o["tokens"])) / o["wall_s"]))  # fmt: skip
                row[f"vs {base}"] = stats.median(ratios) if ratios else None
            last = got[-1]
            row["mal"] = sum(map(len, last["tokens"])) / max(last["request_steps"], 1)
            row["steps"] = last["steps"]
            # tokens scored per request step: the request's own token and its draft
            row["scored"] = 1 + last["draft_tokens"] / max(last["request_steps"], 1)
            row["phases"] = {k: v for k, v in last["phases"].items() if v is not None}
            row["wall_s"] = last["wall_s"]
            if last.get("profile"):
                row["profile_ms"] = {k: 1e3 * v / max(last["steps"], 1) for k, v in last["profile"].items()}
            own = "vllm-plain" if name.startswith("vllm") else "engine-plain"
            for key, base in (("identical", own), ("identical to vllm-plain", "vllm-plain")):
                ref = results.get((b, len(got) - 1, base)) or next(
                    (results[k] for k in results if k[0] == b and k[2] == base), None
                )
                row[key] = (
                    None
                    if ref is None
                    else sum(x == y for x, y in zip(last["tokens"], ref["tokens"], strict=True))
                )
            row["outputs"] = len(last["tokens"])
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        "| batch | run | tok/s | vs engine plain | vs vLLM plain | vs vLLM+sssd | MAL | scored | steps | "
        "ms/step: draft / forward / head / verify / prefill / other | identical (own plain, vLLM plain) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratios = " | ".join(
            "-" if r[k] is None else f"{r[k]:.2f}x"
            for k in ("vs engine-plain", "vs vllm-plain", "vs vllm-sssd")
        )
        ph = r["phases"]
        steps = max(r["steps"], 1)
        split = " / ".join("-" if k not in ph else f"{1e3 * ph[k] / steps:.1f}" for k in PHASES)
        same = f"{r['identical']}/{r['outputs']}, {r['identical to vllm-plain']}/{r['outputs']}"
        print(
            f"| {r['batch']} | {r['run']} | {r['tok_s']:.1f} | {ratios} | {r['mal']:.2f} | {r['scored']:.2f} "
            f"| {r['steps']} | {split} | {same} |"
        )


def print_profile(rows: list[dict]) -> None:
    keys = [c for c, _ in CATEGORIES] + ["other C", "python"]
    print(
        "\nms per step by where the time went (cProfile: C functions by category, Python the rest; "
        "profiling slows Python, so compare the columns more than the totals)\n"
    )
    print("| batch | run | scored | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 3) + "|")
    for r in rows:
        if "profile_ms" in r:
            cells = " | ".join(f"{r['profile_ms'][k]:.1f}" for k in keys)
            print(f"| {r['batch']} | {r['run']} | {r['scored']:.2f} | {cells} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-python", default=os.environ.get("SSSD_VLLM_PYTHON", "build/vllm-venv/bin/python"))
    ap.add_argument("--prompt-set", choices=("dev", "bundled"), default="dev")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--runs", default="vllm-plain,vllm-sssd,engine-plain,engine-adaptive")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=8, help="vLLM's num_speculative_tokens")
    ap.add_argument("--budget", type=int, default=32, help="the engine's adaptive policy: 0..budget nodes")
    ap.add_argument("--vllm-config", default="{}", help="extra SSSD_VLLM_CONFIG keys for vllm-sssd (JSON)")
    ap.add_argument("--profile", action="store_true", help="also split each step by cProfile (slower)")
    ap.add_argument("--sssd-path", type=Path, default=ROOT / "python",
                    help="the engine runs' sssd package (another checkout's python/: an A/B)")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "engine_vs_vllm.json")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        job = json.loads(Path(args.child[0]).read_text())
        out = run_vllm(job) if job["kind"].startswith("vllm") else run_engine(job)
        Path(args.child[1]).write_text(json.dumps(out))
        return 0
    runs = parse_runs(args.runs)
    if any(n.startswith("vllm") for n, _ in runs) and not Path(args.vllm_python).is_file():
        raise SystemExit(f"--vllm-python {args.vllm_python}: no such interpreter (a venv with vllm-cpu)")
    from sssd.integrations.vllm_demo import demo_datastore
    from sssd.models.local import ensure_hf_model

    batches = [int(x) for x in args.batches.split(",")]
    base = {"model": str(ensure_hf_model()), "prompts": prompt_ids(args.prompt_set, args.prompts),
            "max_tokens": args.max_tokens, "datastore": str(demo_datastore()), "dtype": args.dtype,
            "threads": args.threads, "k": args.k, "vllm_config": json.loads(args.vllm_config),
            "profile": args.profile}  # fmt: skip
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    results: dict = {}
    for b in batches:
        for r in range(args.rounds):
            order = runs[r % len(runs) :] + runs[: r % len(runs)]
            for name, fixed in order:
                budget = fixed if fixed >= 0 else (args.budget if name == "engine-adaptive" else 0)
                job = {**base, "kind": name if fixed < 0 else "engine-fixed", "batch": b, "budget": budget}
                python = args.vllm_python if name.startswith("vllm") else sys.executable
                t = time.perf_counter()
                print(f"batch {b} round {r}: {name} ...", file=sys.stderr, flush=True)
                path = args.sssd_path if name.startswith("engine") else ROOT / "python"
                results[(b, r, name)] = child(job, python, args.timeout, path)
                print(f"  {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = summarize(results, runs, batches, args.rounds)
    print(
        f"\nSmolLM2-135M-Instruct {args.dtype}, greedy, {args.prompts} {args.prompt_set} prompts x "
        f"{args.max_tokens} new tokens, {args.threads} thread(s), vLLM k={args.k}, "
        f"engine 0..{args.budget}\n"
    )
    print_table(rows)
    if args.profile:
        print_profile(rows)
    from corpora import save_rows

    save_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
