"""JSONL readers: text records, chat records, pre-tokenized (prompt_ids, output_ids) pairs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from sssd.datastore.fingerprint import same_vocabulary

from datastore_tools.errors import InputError
from datastore_tools.stats import ReadStats

PAIR_CHOICES = ("output", "prompt", "both", "concat")


def _lines(f: Any, path: Path, max_bytes: int | None) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line); a line longer than max_bytes is an InputError before it is read whole."""
    limit = -1 if max_bytes is None else max_bytes + 1
    line_no = 0
    while line := f.readline(limit):
        line_no += 1
        if max_bytes is not None and len(line) > max_bytes:
            raise InputError(f"{path}:{line_no}: line longer than {max_bytes} bytes (--max-tokens)")
        yield line_no, line


def iter_records(
    path: Path, stats: ReadStats, max_bytes: int | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, record) for every non-blank line; a bad line is an InputError naming it."""
    stats.files += 1
    with open(path, "rb") as f:
        for line_no, line in _lines(f, path, max_bytes):
            stats.input_bytes += len(line)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
                raise InputError(f"{path}:{line_no}: not valid JSON ({e})") from None
            if not isinstance(record, dict):
                raise InputError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
            yield line_no, record


def _field(path: Path, line_no: int, record: dict[str, Any], name: str) -> Any:
    if name not in record:
        raise InputError(f"{path}:{line_no}: record has no {name!r} field")
    return record[name]


def read_text_records(
    path: Path, field: str, stats: ReadStats, max_bytes: int | None = None
) -> Iterator[str]:
    for line_no, record in iter_records(path, stats, max_bytes):
        text = _field(path, line_no, record, field)
        if not isinstance(text, str):
            raise InputError(f"{path}:{line_no}: field {field!r} must be a string, got {type(text).__name__}")
        yield text


def read_chat_records(
    path: Path,
    render: Callable[[list[dict[str, Any]]], str],
    stats: ReadStats,
    max_bytes: int | None = None,
) -> Iterator[str]:
    """Each record's ``messages`` (a list of {"role", "content"}) rendered as one text by ``render``."""
    for line_no, record in iter_records(path, stats, max_bytes):
        messages = _field(path, line_no, record, "messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise InputError(f"{path}:{line_no}: 'messages' must be a list of {{role, content}} objects")
        try:
            yield render(messages)
        except InputError:
            raise
        except Exception as e:  # template errors come as many types (jinja2 errors, TypeError, ...)
            raise InputError(f"{path}:{line_no}: cannot render the chat template: {e}") from None


def _ids(path: Path, line_no: int, record: dict[str, Any], name: str, vocab_size: int) -> np.ndarray:
    """[n] int64 token ids of one field, checked against the vocabulary."""
    value = _field(path, line_no, record, name)
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise InputError(f"{path}:{line_no}: {name!r} must be a list of integer token ids")
    try:
        ids = np.asarray(value, dtype=np.int64)
    except OverflowError:
        raise InputError(f"{path}:{line_no}: {name!r} has a token id beyond 64 bits") from None
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        raise InputError(
            f"{path}:{line_no}: token id {int(ids[bad[0]])} in {name!r} is out of range for vocabulary "
            f"size {vocab_size}; check --vocab-size / --tokenizer"
        )
    return ids


def recorded_vocabulary(path: Path) -> tuple[int, str] | None:
    """(vocab_size, tokenizer fingerprint) that the first record of a pairs file names (``sssd generate
    --output`` writes ``"vocab_size"`` and ``"tokenizer"`` in every pair), or None when it names none."""
    for line_no, record in iter_records(path, ReadStats()):
        vocab, fingerprint = record.get("vocab_size"), record.get("tokenizer")
        if vocab is None and fingerprint is None:
            return None
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
            raise InputError(f"{path}:{line_no}: 'vocab_size' must be a positive integer, got {vocab!r}")
        if not isinstance(fingerprint, str) or not fingerprint:
            raise InputError(f"{path}:{line_no}: 'tokenizer' must be a tokenizer fingerprint (name:hash)")
        return vocab, fingerprint
    return None


def _check_tokenizer(path: Path, line_no: int, record: dict[str, Any], fingerprint: str) -> None:
    """A pair that names the tokenizer of its ids must name the build's (a file of another model's pairs
    would put ids of another vocabulary in the datastore)."""
    theirs = record.get("tokenizer")
    if fingerprint and isinstance(theirs, str) and not same_vocabulary(theirs, fingerprint):
        raise InputError(
            f"{path}:{line_no}: the pair's ids come from tokenizer {theirs!r}, not {fingerprint!r} (the "
            "tokenizer of this build): build them into a datastore of their own"
        )


def read_pair_records(
    path: Path,
    which: str,
    vocab_size: int,
    stats: ReadStats,
    max_bytes: int | None = None,
    fingerprint: str = "",
) -> Iterator[np.ndarray]:
    """Token documents from (prompt_ids, output_ids) records.

    which: "output" (default: the model's outputs are what a drafter should predict), "prompt", "both"
    (two documents per record) or "concat" (prompt then output as one document). ``fingerprint``: the
    build's tokenizer; a record that names another is an InputError.
    """
    if which not in PAIR_CHOICES:
        raise ValueError(f"pair ids must be one of {', '.join(PAIR_CHOICES)}, got {which!r}")
    for line_no, record in iter_records(path, stats, max_bytes):
        _check_tokenizer(path, line_no, record, fingerprint)
        if which in ("prompt", "both", "concat"):
            prompt = _ids(path, line_no, record, "prompt_ids", vocab_size)
        if which in ("output", "both", "concat"):
            output = _ids(path, line_no, record, "output_ids", vocab_size)
        if which == "concat":
            yield np.concatenate([prompt, output])
            continue
        if which in ("prompt", "both"):
            yield prompt
        if which in ("output", "both"):
            yield output
