"""How good and how cheap a tuned draft model is: the table of docs/tuning.md.

For the draft directory written by `sssd tune-drafter` (one model, or draft-1..K with --drafts K) and the
target (default: the bundled SmolLM2-135M-Instruct), on held-out (prompt, output) pairs (default: the
244 development pairs, never trained on):

- teacher-forced top-1 agreement: the share of output positions where the model's argmax is the
  target's recorded next token, for the target itself in float32 (the ceiling: the pairs were recorded
  in bfloat16), the untuned draft (derived again with the same spec) and each tuned draft (and the
  share where any of them is right);
- training time (from the draft's tune_report.json);
- the cost of one forward of one token (decoding with a KV cache of --context tokens), draft against
  target, timed alternately in this one run (median of --repeats), so both see the same machine load.

    SSSD_DEV_DATA=../shared/data python bench/drafter/tune_drafter_report.py --draft DIR [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
from corpora import DEV_DATA


def _drafts(root: Path) -> list[Path]:
    if (root / "config.json").is_file():
        return [root]
    found = sorted(root.glob("draft-*"), key=lambda p: int(p.name.split("-")[1]))
    if not found:
        raise SystemExit(f"{root}: no draft model (config.json or draft-K/)")
    return found


def one_token_ms(models: list, context: int, repeats: int) -> list[float]:
    """Median ms of a one-token forward with a KV cache of ``context`` tokens, per model, interleaved."""
    from transformers import DynamicCache

    caches = []
    vocab = models[0].config.vocab_size
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for m in models:
            cache = DynamicCache(config=m.config)
            m(input_ids=ids, cache=cache, use_cache=True)
            caches.append(cache)
        one = torch.tensor([[int(ids[0, -1])]])
        pos = torch.tensor([[context]])
        times: list[list[float]] = [[] for _ in models]
        for r in range(repeats + 3):
            for k, (m, cache) in enumerate(zip(models, caches, strict=True)):
                t0 = time.perf_counter()
                m(input_ids=one, position_ids=pos, cache=cache, use_cache=True)
                dt = time.perf_counter() - t0
                cache.crop(-1)  # back to the context: every call sees the same cache
                if r >= 3:  # warm-up
                    times[k].append(dt)
    return [1e3 * statistics.median(t) for t in times]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", required=True, help="directory written by sssd tune-drafter")
    ap.add_argument("--target", default=None, help="target model (default: the bundled SmolLM2)")
    ap.add_argument("--pairs", default=str(DEV_DATA / "smollm2_dev_pairs.jsonl"), help="held-out pairs")
    ap.add_argument("--every", type=int, default=1, help="use every n-th pair only (1: all pairs)")
    ap.add_argument("--context", type=int, default=256, help="KV cache length of the timed forward")
    ap.add_argument("--repeats", type=int, default=30, help="timed one-token forwards per model")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--skip-target-agreement", action="store_true", help="do not score the target itself")
    ap.add_argument("--skip-untuned", action="store_true", help="do not score the untuned draft")
    ap.add_argument(
        "--timing-threads",
        type=int,
        default=1,
        help="torch threads while timing (1: on a shared machine, more threads stall in OpenMP barriers "
        "whenever another process holds a core: medians of 0.1-2.4 s for a 55 ms forward were seen)",
    )
    ap.add_argument("--timing-only", action="store_true", help="only time the one-token forwards")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers
    from sssd.evaluation.pairs import load_pairs
    from sssd.models.draft import derive_draft
    from sssd.models.loading import load_model
    from sssd.models.tuning import doc_agreement, docs_from_pairs
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    root = Path(args.draft)
    report = json.loads((root / "tune_report.json").read_text())
    target, _, target_path = load_model(args.target, "float32", "cpu")
    drafts = [AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval() for p in _drafts(root)]
    untuned = None
    if not args.skip_untuned and not Path(report["draft"]).is_dir():
        untuned = derive_draft(target, report["draft"])
    pairs = load_pairs(args.pairs)
    pairs = pairs[:: max(1, args.every)]
    docs = docs_from_pairs([(p.prompt_ids, p.output_ids) for p in pairs])
    n_out = sum(len(p.output_ids) for p in pairs)
    print(f"target: {target_path}; draft: {root} ({report['draft']}, {len(drafts)} draft(s))")
    print(f"held-out pairs: {args.pairs}, {len(pairs)} pairs, {n_out:,} output positions; torch threads "
          f"{torch.get_num_threads()}\n")  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(args.timing_threads)
    ms = one_token_ms([target, *drafts], args.context, args.repeats)
    torch.set_num_threads(threads)
    cells = [f"draft {k + 1} {m:.2f} ms ({m / ms[0]:.2f}x)" for k, m in enumerate(ms[1:])]
    print(f"one-token forward, {args.timing_threads} thread(s): target {ms[0]:.2f} ms, " + ", ".join(cells))
    if args.timing_only:
        return 0
    cost = [f"{m:.2f} ms ({m / ms[0]:.2f}x)" for m in ms]
    rows = []
    if not args.skip_target_agreement:
        rows.append(("target itself, float32 (ceiling)", doc_agreement([target], docs)[0][0], "", cost[0]))
    if untuned is not None:
        acc = doc_agreement([untuned], docs)[0][0]
        rows.append((f"draft {report['draft']}, untuned", acc, "", cost[1]))
    scores, _ = doc_agreement(drafts, docs)
    for k, entry in enumerate(report["drafts"]):
        name = f"draft {k + 1}" if len(drafts) > 1 else "draft"
        train = f"{entry['seconds']:.0f} s, {entry['steps']} steps, {entry['train_tokens']:,} tokens"
        rows.append((f"{name} {report['draft']}, tuned", scores[k], train, cost[k + 1]))
    if len(drafts) > 1:
        rows.append((f"any of the {len(drafts)} tuned drafts", scores[-1], "", ""))
    print("| model | top-1 agreement (held out) | training | one-token forward (x target) |")
    print("|---|---|---|---|")
    for name, acc, train, c in rows:
        print(f"| {name} | {acc:.3f} | {train} | {c} |")
    print(
        f"\none-token forward: KV cache of {args.context} tokens, median of {args.repeats}, models timed "
        f"alternately in this run, {args.timing_threads} torch thread(s)"
    )
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
