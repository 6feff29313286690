"""Regenerates python/sssd/data/smollm2_sample.npz, the small corpus shipped for the README demo.

Usage: PYTHONPATH=python python3 tools/make_sample_corpus.py [../shared/data] [--docs 300]
Takes the first documents of smollm2_other_outputs.{tokens,offsets}.npy (SmolLM2-135M-Instruct's own
greedy outputs on other prompts) and records the SmolLM2 tokenizer's fingerprint with them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sssd import tokenizer_fingerprint
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
    p.add_argument("--docs", type=int, default=300)
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


if __name__ == "__main__":
    main()
