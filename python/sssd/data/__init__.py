"""Data shipped with the package, for ``sssd demo`` and quick experiments.

``smollm2_sample.npz``: the development corpus (1,500 documents, 182,384 tokens as uint16, 128 kB):
SmolLM2-135M-Instruct's own greedy outputs on other prompts, in the SmolLM2 vocabulary (49,152 tokens).
``demo_prompts.json``: twelve prompts of five kinds (``kind``): three chat and three code-completion
prompts (MT-Bench and HumanEval items of the development set, none of them among the corpus's prompts),
then hand-written ones that give the model text to work from: two each of answering from a passage, JSON
from given text, and editing given code. Regenerate both with ``tools/make_sample_corpus.py`` (it keeps
the hand-written prompts).

Imports: numpy. Nothing of sssd.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

SAMPLE_FILE = "smollm2_sample.npz"


def sample_corpus_path() -> Path:
    """Path of the sample corpus (an ``.npz`` with arrays ``tokens``, ``offsets``, ``vocab_size`` and
    ``tokenizer_fingerprint``); ``build-datastore`` reads it directly."""
    path = Path(str(resources.files(__name__).joinpath(SAMPLE_FILE)))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall sssd (the wheel ships it)")
    return path


def sample_corpus() -> tuple[np.ndarray, np.ndarray]:
    """(tokens [num_tokens] int32, offsets [num_documents + 1] int64): document k is
    tokens[offsets[k]:offsets[k+1]]. Pass the pair to ``sssd.build_datastore`` with
    ``vocab_size=sample_vocab_size()``."""
    with np.load(sample_corpus_path(), allow_pickle=False) as z:
        return z["tokens"].astype(np.int32), z["offsets"].astype(np.int64)


def sample_vocab_size() -> int:
    """Vocabulary size of the sample's tokenizer (SmolLM2: 49,152)."""
    with np.load(sample_corpus_path(), allow_pickle=False) as z:
        return int(z["vocab_size"])


def sample_tokenizer_fingerprint() -> str:
    """Fingerprint (``sssd.tokenizer_fingerprint``) of the tokenizer that produced the sample."""
    with np.load(sample_corpus_path(), allow_pickle=False) as z:
        return str(z["tokenizer_fingerprint"])
