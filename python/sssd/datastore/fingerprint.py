"""Tokenizer fingerprints: what a datastore records about the tokenizer that produced its tokens."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

MAX_FINGERPRINT_BYTES = 119


def vocabulary_hash(vocab: dict[str, int]) -> str:
    """16 hex digits of SHA-256 over the (token, id) pairs sorted by id."""
    items = sorted(vocab.items(), key=lambda kv: (kv[1], kv[0]))
    payload = json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(payload).hexdigest()[:16]


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """``name:hash`` for a Hugging Face tokenizer (anything with ``get_vocab()``).

    The hash identifies the vocabulary; the name is only for people reading ``info()``.
    """
    if not hasattr(tokenizer, "get_vocab"):
        raise TypeError(f"expected a tokenizer with get_vocab(), got {type(tokenizer).__name__}")
    name = os.path.basename(str(getattr(tokenizer, "name_or_path", "") or "tokenizer").rstrip("/"))
    name = name.replace(":", "_")[:80] or "tokenizer"
    return f"{name}:{vocabulary_hash(tokenizer.get_vocab())}"


def same_vocabulary(a: str, b: str) -> bool:
    """True when two fingerprints name the same vocabulary (the hash part decides)."""
    return a.rpartition(":")[2] == b.rpartition(":")[2]
