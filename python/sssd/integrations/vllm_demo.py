"""Run SmolLM2-135M-Instruct in vLLM with and without sssd's proposer, compare speed and outputs.

    python -m sssd.integrations.vllm_demo                      # bundled prompts, batch 1, plain vs sssd
    python -m sssd.integrations.vllm_demo --methods plain,ngram,sssd,sssd-ds --batch 8 --prompts 8

Methods: ``plain`` (no speculation), ``ngram`` (vLLM's prompt lookup), ``suffix`` (vLLM's suffix decoding;
needs ``arctic-inference``), ``sssd`` (sssd's proposer on the request's own tokens and recent outputs),
``sssd-ds`` (the same plus a datastore of SmolLM2's own outputs on other prompts, bundled with sssd).
Each method runs in its own process (vLLM starts its engine core with spawn, one engine per process).
Greedy decoding: every method's token ids are compared with plain vLLM's.

``run_method`` is also the benchmark's worker (bench/serving/bench_vllm.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROPOSER = "sssd.integrations.vllm.SssdProposer"
METHODS = ("plain", "ngram", "suffix", "sssd", "sssd-ds")


def demo_datastore() -> Path:
    """The bundled corpus of SmolLM2's outputs as a datastore file, built once into sssd's cache."""
    import sssd
    from sssd.data import sample_corpus, sample_tokenizer_fingerprint, sample_vocab_size
    from sssd.models.local import cache_dir

    path = cache_dir() / "datastores" / "smollm2-outputs.sssd"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        sssd.build_datastore(
            sample_corpus(), path, vocab_size=sample_vocab_size(), tokenizer=sample_tokenizer_fingerprint()
        )  # written atomically
    return path


def bundled_prompts(n: int) -> list[str]:
    """The first ``n`` of the prompts bundled with sssd (MT-Bench and HumanEval items)."""
    from importlib import resources

    items = json.loads(resources.files("sssd.data").joinpath("demo_prompts.json").read_text(encoding="utf-8"))
    if not 1 <= n <= len(items):
        raise ValueError(f"--prompts must be in [1, {len(items)}], got {n}")
    return [it["text"] for it in items[:n]]


def speculative_config(method: str, k: int) -> dict | None:
    if method == "plain":
        return None
    if method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 1,
        }
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if method in ("sssd", "sssd-ds"):
        return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def _spec_counters(llm: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        name = getattr(m, "name", "")
        if name.startswith("vllm:spec_decode") and hasattr(m, "value"):
            out[name.removeprefix("vllm:spec_decode_")] = float(m.value)
    return out


def run_method(job: dict) -> dict:
    """Build one vLLM engine for ``job["method"]`` and generate; returns tokens, time and acceptance."""
    import vllm

    method, k = job["method"], int(job["k"])
    if method == "sssd-ds":
        os.environ["SSSD_VLLM_CONFIG"] = json.dumps({"datastore": job["datastore"], **job.get("sssd", {})})
    elif method == "sssd":
        os.environ["SSSD_VLLM_CONFIG"] = json.dumps(job.get("sssd", {}))
    llm = vllm.LLM(
        job["model"], dtype="float32", enforce_eager=True, max_model_len=job.get("max_model_len", 2048),
        max_num_seqs=int(job["batch"]), kv_cache_memory_bytes=1 << 30, disable_log_stats=False,
        speculative_config=speculative_config(method, k), seed=0,
    )  # fmt: skip
    mt = job["max_tokens"]  # one for all, or one per prompt (requests then leave at different steps)
    sp = [vllm.SamplingParams(temperature=0.0, max_tokens=int(m)) for m in (mt if isinstance(mt, list) else
          [mt] * len(job["prompts"]))]  # fmt: skip
    prompts = [vllm.TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
    llm.generate(prompts[:1], vllm.SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    before = _spec_counters(llm)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    after = _spec_counters(llm)
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    drafts = delta.get("num_drafts_total", delta.get("num_drafts", 0.0))
    accepted = delta.get("num_accepted_tokens_total", delta.get("num_accepted_tokens", 0.0))
    return {
        "method": method, "batch": job["batch"], "k": k, "wall_s": wall, "tokens": tokens,
        "new_tokens": sum(map(len, tokens)), "drafts": drafts, "accepted": accepted,
        "draft_tokens": delta.get("num_draft_tokens_total", delta.get("num_draft_tokens", 0.0)),
    }  # fmt: skip


def run_in_child(job: dict, timeout: float = 1800) -> dict:
    """``run_method`` in a fresh Python process (one vLLM engine per process); raises with its stderr."""
    with tempfile.TemporaryDirectory(prefix="sssd-vllm-") as tmp:
        spec, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps(job))
        proc = subprocess.run(
            [sys.executable, "-m", "sssd.integrations.vllm_demo", "--child", str(spec), str(result)],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if proc.returncode != 0 or not result.is_file():
            lines = ((proc.stdout or "") + "\n" + (proc.stderr or "")).splitlines()  # vLLM logs to stdout
            # vLLM reports a worker's exception in its log, above its own "initialization failed"
            causes = dict.fromkeys(
                ln.split("] ", 1)[-1] for ln in lines if "Error: " in ln or "Exception: " in ln
            )
            tail = "\n".join(lines[-30:])
            raise RuntimeError(
                f"vLLM run {job['method']} (batch {job['batch']}) failed: " + " | ".join(causes) + f"\n{tail}"
            )
        return json.loads(result.read_text())


def summarize(results: list[dict]) -> list[dict]:
    """Rows with tok/s, mean acceptance length and agreement with the plain run of the same batch."""
    plain = {r["batch"]: r for r in results if r["method"] == "plain"}
    rows = []
    for r in results:
        base = plain.get(r["batch"])
        same = None if base is None else sum(a == b for a, b in zip(r["tokens"], base["tokens"], strict=True))
        # tokens per request-step: every step of a request yields its accepted drafts + 1 token
        steps = r["new_tokens"] - r["accepted"]
        mal = r["new_tokens"] / steps if steps > 0 else 1.0
        per_draft = 1.0 + r["accepted"] / r["drafts"] if r["drafts"] else 1.0  # vLLM's own figure
        tok_s = r["new_tokens"] / r["wall_s"]
        rows.append({
            "method": r["method"], "batch": r["batch"], "tok_s": tok_s,
            "speedup": tok_s / (base["new_tokens"] / base["wall_s"]) if base else None,
            "mal": mal, "per_draft": per_draft, "draft_tokens": r["draft_tokens"], "accepted": r["accepted"],
            "identical": same, "outputs": len(r["tokens"]),
        })  # fmt: skip
    return rows


def print_table(rows: list[dict]) -> None:
    print("| method | batch | tok/s | vs plain | MAL (tokens per step) | accepted per draft + 1 "
          "| draft tokens | accepted | identical to plain |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        same = f"{r['identical']}/{r['outputs']}" if r["identical"] is not None else "-"
        print(f"| {r['method']} | {r['batch']} | {r['tok_s']:.1f} | {sp} | {r['mal']:.2f} | "
              f"{r['per_draft']:.2f} | {r['draft_tokens']:.0f} | {r['accepted']:.0f} | {same} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sssd.integrations.vllm_demo", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--methods", default="plain,sssd,sssd-ds", help="comma-separated, from " + ",".join(METHODS)
    )
    ap.add_argument("--prompts", type=int, default=2, help="bundled prompts (MT-Bench / HumanEval items)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1, help="vLLM's max_num_seqs")
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        job = json.loads(Path(args.child[0]).read_text())
        Path(args.child[1]).write_text(json.dumps(run_method(job)))
        return 0
    from sssd.models.loading import chat_ids
    from sssd.models.local import ensure_hf_model, load_tokenizer

    model = ensure_hf_model()
    tok = load_tokenizer(model)
    prompts = [chat_ids(tok, q) for q in bundled_prompts(args.prompts)]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        speculative_config(m, args.k)  # unknown names fail before anything runs
    if "plain" not in methods:
        methods.insert(0, "plain")
    base = {"model": str(model), "prompts": prompts, "max_tokens": args.max_tokens, "batch": args.batch,
            "k": args.k, "datastore": str(demo_datastore())}  # fmt: skip
    results = []
    for m in methods:
        print(f"running vLLM with {m} ...", file=sys.stderr, flush=True)
        results.append(run_in_child({**base, "method": m}))
    rows = summarize(results)
    print_table(rows)
    return 0 if all(r["identical"] == r["outputs"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
