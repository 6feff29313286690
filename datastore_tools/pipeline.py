"""The build: inputs -> documents (text or tokens) -> token documents -> datastore file or shards."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from datastore_tools import jsonl, text_files, token_arrays
from datastore_tools.errors import InputError
from datastore_tools.inputs import Input, InputKind, ReadOptions, detect_inputs, tokens_sibling
from datastore_tools.progress import Progress
from datastore_tools.stats import BuildSummary, ReadStats
from datastore_tools.tokenizing import BatchEncoder, chat_renderer, load_tokenizer, tokenize_stream
from datastore_tools.writer import check_destination, write_shards, write_single


@dataclass(frozen=True)
class BuildConfig:
    """Everything one build-datastore run needs (the command line, parsed)."""

    inputs: tuple[str, ...]  # files and directories, read in this order
    output: Path  # a .sssd file, or a directory of shards with shard_tokens
    tokenizer: str | None = None  # directory, .gguf file or "smollm2"; None: default when text is read
    vocab_size: int | None = None  # required for token inputs without a tokenizer
    read: ReadOptions = field(default_factory=ReadOptions)
    add_special_tokens: bool = False  # let the tokenizer add BOS/EOS-style tokens to each text
    batch_docs: int = 256  # texts per tokenizer call
    shard_tokens: int | None = None  # split into shards of at most this many tokens
    force: bool = False  # replace an existing output
    progress: bool = True  # progress display on stderr
    search_index: bool = True  # store the search index in each file (from 65,536 tokens per file)
    max_tokens: int | None = None  # memory bound: tokens one file may hold (None: from this machine's RAM)


# What building one file holds in memory per token, at most: the token stream (2-4 B), the suffix array
# (4-8 B) and the suffix sort's workspace (~1.5 B), with room to spare.
BUILD_BYTES_PER_TOKEN = 16


def default_max_tokens() -> int:
    """The largest file this machine can build in memory: physical RAM / BUILD_BYTES_PER_TOKEN."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        ram = 16 << 30
    return max(ram // BUILD_BYTES_PER_TOKEN, 1)


def _recorded_vocabulary(inputs: list[Input]) -> tuple[int, str] | None:
    """The vocabulary every input records about itself, if they all agree: .npz files (the shipped
    sample) and pairs files that `sssd generate --output` wrote can."""
    readers = {InputKind.NPZ: token_arrays.npz_vocabulary, InputKind.JSONL_PAIRS: jsonl.recorded_vocabulary}
    if any(i.kind not in readers for i in inputs):
        return None
    found = {readers[i.kind](i.path) for i in inputs}
    return found.pop() if len(found) == 1 else None


def _vocabulary(config: BuildConfig, inputs: list[Input]) -> tuple[Any, int, str]:
    """(tokenizer or None, vocab size, fingerprint) for this build."""
    from sssd.datastore.fingerprint import tokenizer_fingerprint

    needs_text = any(i.kind.needs_tokenizer for i in inputs)
    if not needs_text and config.tokenizer is None:
        recorded = _recorded_vocabulary(inputs)
        if config.vocab_size is None and recorded is not None:
            return None, *recorded
        if config.vocab_size is None:
            raise InputError(
                "pre-tokenized inputs need --vocab-size N, or --tokenizer to record the tokenizer "
                "that made them"
            )
        return None, config.vocab_size, ""
    say = (lambda m: print(f"build-datastore: {m}", file=sys.stderr, flush=True)) if config.progress else None
    tok = load_tokenizer(config.tokenizer, say)
    vocab = len(tok)
    if config.vocab_size is not None:
        if config.vocab_size < vocab:
            raise InputError(
                f"--vocab-size {config.vocab_size} is smaller than the tokenizer's {vocab} tokens"
            )
        vocab = config.vocab_size  # a model's embedding table may be padded past the tokenizer
    # a cached tokenizer carries the fingerprint of the full one (hashing 50k words again costs 0.2 s)
    return tok, vocab, getattr(tok, "fingerprint", None) or tokenizer_fingerprint(tok)


def _read(
    inp: Input,
    config: BuildConfig,
    tok: Any,
    vocab: tuple[int, str],
    stats: ReadStats,
    max_bytes: int,
) -> Iterable[str | np.ndarray]:
    """The documents of one input; a text document (file or JSONL line) of more than max_bytes bytes
    is refused before it is read whole."""
    opts, (vocab, fingerprint) = config.read, vocab
    if inp.kind is InputKind.JSONL_TEXT:
        return jsonl.read_text_records(inp.path, opts.text_field, stats, max_bytes)
    if inp.kind is InputKind.JSONL_CHAT:
        return jsonl.read_chat_records(inp.path, chat_renderer(tok), stats, max_bytes)
    if inp.kind is InputKind.JSONL_PAIRS:
        return jsonl.read_pair_records(inp.path, opts.pair_ids, vocab, stats, max_bytes, fingerprint)
    if inp.kind is InputKind.TEXT_FILE:
        return [text_files.read_text_file(inp.path, stats, max_bytes)]
    if inp.kind is InputKind.DIRECTORY:
        return text_files.read_directory(inp.path, opts.globs, opts.excludes, stats, max_bytes)
    if inp.kind is InputKind.NPY:
        return token_arrays.read_npy(inp.path, vocab, stats)
    if inp.kind is InputKind.NPZ:
        return token_arrays.read_npz(inp.path, vocab, stats)
    raise AssertionError(f"unhandled input kind {inp.kind}")


def _counted(
    docs: Iterator[np.ndarray], stats: ReadStats, progress: Progress, max_tokens: int, single: bool
) -> Iterator[np.ndarray]:
    """Drops empty documents and keeps the document/token counts for the summary and progress line.

    Bounds memory: a single file holds at most max_tokens tokens, and so does any one document (a
    shard never splits one)."""
    for doc in docs:
        if doc.size == 0:
            stats.skipped_empty += 1
            continue
        if doc.size > max_tokens:
            raise InputError(
                f"document {stats.documents} has {doc.size} tokens, more than --max-tokens {max_tokens} "
                f"(the tokens one file may hold in memory, ~{BUILD_BYTES_PER_TOKEN} B each); split it"
            )
        if single and stats.tokens + int(doc.size) > max_tokens:
            raise InputError(
                f"the corpus has more than --max-tokens {max_tokens} tokens, more than one file can be "
                f"built in memory here (~{BUILD_BYTES_PER_TOKEN} B per token): write a directory of shards "
                "with --shard-tokens N, or raise --max-tokens on a machine with more memory"
            )
        stats.documents += 1
        stats.tokens += int(doc.size)
        progress.reading(stats)
        yield doc
    progress.reading(stats, force=True)  # the final counts, before the build phases take the line


def _input_bytes(inputs: list[Input], opts: ReadOptions) -> int:
    """Total size of the inputs for the progress bar (directories: the files that will be read)."""
    total = 0
    for inp in inputs:
        if inp.kind is InputKind.DIRECTORY:
            files = text_files.iter_tree(inp.path, opts.globs, opts.excludes)
            total += sum(p.stat().st_size for p in files)
        else:
            total += inp.path.stat().st_size
            sibling = tokens_sibling(inp.path)
            if inp.kind is InputKind.NPY and sibling.is_file():
                total += sibling.stat().st_size
    return total


def build(config: BuildConfig) -> BuildSummary:
    """Reads every input, tokenizes text in batches and writes the datastore. Raises on bad input
    (InputError / ValueError, FileNotFoundError, ...) before anything appears at config.output."""
    t0 = time.perf_counter()
    out = config.output
    max_tokens = default_max_tokens() if config.max_tokens is None else config.max_tokens
    if max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {max_tokens}")
    if config.shard_tokens is not None and config.shard_tokens > max_tokens:
        raise ValueError(f"--shard-tokens {config.shard_tokens} exceeds --max-tokens {max_tokens}")
    check_destination(out, sharded=config.shard_tokens is not None, force=config.force)
    inputs = detect_inputs(list(config.inputs), config.read)
    t_setup = time.perf_counter()
    tok, vocab, fingerprint = _vocabulary(config, inputs)
    setup = time.perf_counter() - t_setup
    encode = BatchEncoder(tok, add_special_tokens=config.add_special_tokens) if tok is not None else None
    stats = ReadStats()
    progress = Progress(_input_bytes(inputs, config.read), enabled=config.progress)

    def items() -> Iterator[str | np.ndarray]:
        for inp in inputs:
            # ~1 token per byte at most
            yield from _read(inp, config, tok, (vocab, fingerprint), stats, max_tokens)

    docs = _counted(
        tokenize_stream(items(), encode, stats, batch_docs=config.batch_docs),
        stats,
        progress,
        max_tokens,
        single=config.shard_tokens is None,
    )
    try:
        if config.shard_tokens is None:
            paths = write_single(
                docs,
                out,
                vocab_size=vocab,
                fingerprint=fingerprint,
                phase=progress.phase,
                search_index=config.search_index,
            )
        else:
            paths = write_shards(
                docs,
                out,
                max_tokens=config.shard_tokens,
                vocab_size=vocab,
                fingerprint=fingerprint,
                phase=progress.phase,
                search_index=config.search_index,
            )
    finally:
        progress.close()
    return BuildSummary(
        output=out,
        shards=tuple(paths),
        documents=stats.documents,
        tokens=stats.tokens,
        input_files=stats.files,
        input_bytes=stats.input_bytes,
        text_bytes=stats.text_bytes,
        skipped_files=stats.skipped_files,
        skipped_empty=stats.skipped_empty,
        seconds=time.perf_counter() - t0,
        setup_seconds=setup,
        tokenize_seconds=stats.tokenize_seconds,
        output_bytes=sum(p.stat().st_size for p in paths),
        vocab_size=vocab,
        tokenizer_fingerprint=fingerprint,
    )
