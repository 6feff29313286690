"""Pre-tokenized inputs: a token array with document offsets (``.npy`` pair or one ``.npz``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from datastore_tools.errors import InputError
from datastore_tools.inputs import tokens_sibling
from datastore_tools.stats import ReadStats

_CHECK_CHUNK = 1 << 24  # tokens range-checked per step (bounded memory on huge memory-mapped arrays)


def _check_arrays(name: str, tokens: np.ndarray, offsets: np.ndarray, vocab_size: int) -> None:
    """Shapes, dtypes, the document table and every token id; InputError naming the first problem."""
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise InputError(f"{name}: tokens must be a 1-D integer array, got {tokens.dtype} {tokens.shape}")
    if offsets.ndim != 1 or offsets.size < 1 or not np.issubdtype(offsets.dtype, np.integer):
        raise InputError(f"{name}: offsets must be a 1-D integer array of num_documents + 1 entries")
    if offsets[0] != 0 or offsets[-1] != tokens.size or np.any(np.diff(offsets) < 0):
        raise InputError(
            f"{name}: offsets must start at 0, never decrease and end at the token count {tokens.size}"
        )
    for lo in range(0, tokens.size, _CHECK_CHUNK):
        part = tokens[lo : lo + _CHECK_CHUNK]
        bad = np.flatnonzero((part < 0) | (part >= vocab_size))
        if bad.size:
            pos = lo + int(bad[0])
            doc = int(np.searchsorted(offsets, pos, side="right")) - 1
            raise InputError(
                f"{name}: token id {int(tokens[pos])} at position {pos} (document {doc}) is out of range "
                f"for vocabulary size {vocab_size}; check --vocab-size / --tokenizer"
            )


def _documents(tokens: np.ndarray, offsets: np.ndarray) -> Iterator[np.ndarray]:
    """Views tokens[offsets[k]:offsets[k+1]], no copies."""
    bounds = offsets.astype(np.int64).tolist()
    for lo, hi in itertools.pairwise(bounds):
        yield tokens[lo:hi]


def _load(path: Path, **kwargs) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False, **kwargs)
    except (ValueError, EOFError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise InputError(f"{path}: not a readable numpy file ({e})") from None


def read_npy(path: Path, vocab_size: int, stats: ReadStats) -> Iterator[np.ndarray]:
    """Documents of ``A.tokens.npy`` split by ``A.offsets.npy``; without that file, one document.

    The token array is memory-mapped, so corpora larger than RAM stream through.
    """
    tokens = _load(path, mmap_mode="r")
    sibling = tokens_sibling(path)
    offsets = _load(sibling) if sibling.is_file() else np.array([0, tokens.size], dtype=np.int64)
    _check_arrays(str(path), tokens, offsets, vocab_size)
    stats.files += 1 + sibling.is_file()
    stats.input_bytes += path.stat().st_size + (sibling.stat().st_size if sibling.is_file() else 0)
    yield from _documents(tokens, offsets)


def read_npz(path: Path, vocab_size: int, stats: ReadStats) -> Iterator[np.ndarray]:
    """Documents of an ``.npz`` with arrays ``tokens`` and ``offsets`` (as ``sssd.data`` ships)."""
    z = _load(path)
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise InputError(f"{path}: expected an .npz archive with arrays tokens and offsets")
    with z:
        missing = {"tokens", "offsets"} - set(z.files)
        if missing:
            raise InputError(
                f"{path}: missing array(s) {', '.join(sorted(missing))}; expected tokens, offsets"
            )
        tokens, offsets = z["tokens"], z["offsets"]
    _check_arrays(str(path), tokens, offsets, vocab_size)
    stats.files += 1
    stats.input_bytes += path.stat().st_size
    yield from _documents(tokens, offsets)


def npz_vocabulary(path: Path) -> tuple[int, str] | None:
    """(vocab_size, tokenizer fingerprint) recorded in an ``.npz`` (as the shipped sample has), or None."""
    z = _load(path)
    if not isinstance(z, np.lib.npyio.NpzFile):
        return None
    with z:
        if "vocab_size" not in z.files:
            return None
        fingerprint = str(z["tokenizer_fingerprint"]) if "tokenizer_fingerprint" in z.files else ""
        return int(z["vocab_size"]), fingerprint
