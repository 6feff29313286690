"""Regenerates the demo's bundled data in python/sssd/data/: the corpus and the prompts.

Usage: PYTHONPATH=python python3 tools/make_sample_corpus.py [../shared/data] [--docs 1500] [--prompts 3]

``smollm2_sample.npz``: the first ``--docs`` documents (all 1,500 by default, 182k tokens) of
smollm2_other_outputs.{tokens,offsets}.npy — SmolLM2-135M-Instruct's own greedy outputs on other prompts —
with the SmolLM2 tokenizer's fingerprint. ``demo_prompts.json``: the user messages of the first
``--prompts`` MT-Bench and HumanEval pairs of smollm2_dev_pairs.jsonl (none of them is among the corpus's
prompts), so the demo needs no evaluation package, followed by the hand-written prompts already in the
file (passage, JSON and code-editing kinds), which are kept as they are.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from sssd import tokenizer_fingerprint
from sssd.fileio import write_text_atomic
from sssd.models.local import load_tokenizer

OUT = Path(__file__).resolve().parent.parent / "python" / "sssd" / "data" / "smollm2_sample.npz"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "data_dir",
        nargs="?",
        default=Path(__file__).resolve().parents[1].parent / "shared" / "data",
        type=Path,
    )
    p.add_argument("--docs", type=int, default=1500, help="corpus documents to ship (default 1500: all)")
    p.add_argument("--prompts", type=int, default=3, help="prompts per subset (default 3)")
    args = p.parse_args()
    tokens = np.load(args.data_dir / "smollm2_other_outputs.tokens.npy")
    offsets = np.load(args.data_dir / "smollm2_other_outputs.offsets.npy")[: args.docs + 1]
    tok = load_tokenizer()
    vocab = len(tok)
    # uint16 holds every id of a 49,152-token vocabulary and halves the file.
    assert vocab <= 1 << 16 and int(tokens[: offsets[-1]].max()) < vocab
    np.savez_compressed(
        OUT,
        tokens=tokens[: offsets[-1]].astype(np.uint16),
        offsets=offsets.astype(np.int64),
        vocab_size=np.int64(vocab),
        tokenizer_fingerprint=np.str_(tokenizer_fingerprint(tok)),
    )
    print(f"{OUT}: {len(offsets) - 1} documents, {int(offsets[-1])} tokens, {OUT.stat().st_size} bytes")
    write_prompts(args.data_dir / "smollm2_dev_pairs.jsonl", args.prompts)


def write_prompts(pairs: Path, per_subset: int) -> None:
    """The user message (``text``) of the first dev prompts, chat and code alternating."""
    rows = [json.loads(line) for line in pairs.open(encoding="utf-8")]
    by_subset = {s: [r for r in rows if r.get("subset") == s][:per_subset] for s in ("mtbench", "humaneval")}
    prompts = []
    for chat, code in zip(by_subset["mtbench"], by_subset["humaneval"], strict=True):
        for row, kind in ((chat, "chat"), (code, "code")):
            prompts.append({"id": row["id"], "kind": kind, "text": row["text"]})
    out = OUT.parent / "demo_prompts.json"
    # the hand-written prompts (passage, JSON, code-editing kinds) are not from the dev pairs: kept, after
    kept = [it for it in json.loads(out.read_text(encoding="utf-8")) if it["kind"] not in ("chat", "code")]
    prompts += kept
    write_text_atomic(out, json.dumps(prompts, indent=1, ensure_ascii=False) + "\n")
    print(f"{out}: {len(prompts)} prompts")


if __name__ == "__main__":
    main()
