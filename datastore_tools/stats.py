"""Counters kept while reading inputs, and the summary printed at the end of a build."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ReadStats:
    """Running counts, updated by the readers and the pipeline as documents stream through."""

    files: int = 0  # input files opened (a directory counts its files)
    input_bytes: int = 0  # bytes read from input files
    text_bytes: int = 0  # UTF-8 bytes of text documents handed to the tokenizer
    skipped_files: int = 0  # binary or non-UTF-8 files found in directories
    skipped_empty: int = 0  # documents without tokens (left out: they cannot be matched)
    documents: int = 0  # documents written
    tokens: int = 0  # tokens written
    tokenize_seconds: float = 0.0  # wall time inside the tokenizer


@dataclass(frozen=True)
class BuildSummary:
    """What a build produced and how fast."""

    output: Path  # the datastore file, or the directory of shards
    shards: tuple[Path, ...]  # the files written (one when not sharded)
    documents: int
    tokens: int
    input_files: int
    input_bytes: int
    text_bytes: int  # UTF-8 bytes tokenized (0 for pre-tokenized inputs)
    skipped_files: int
    skipped_empty: int
    seconds: float  # wall time of the whole run, setup included
    setup_seconds: float  # of which: loading the tokenizer (importing transformers, reading its files)
    tokenize_seconds: float  # of which: encoding text
    output_bytes: int
    vocab_size: int
    tokenizer_fingerprint: str

    @property
    def tokens_per_second(self) -> float:
        """Throughput of reading, tokenizing, sorting and writing (tokenizer loading excluded)."""
        work = self.seconds - self.setup_seconds
        return self.tokens / work if work > 0 else 0.0

    def lines(self) -> list[str]:
        skipped = f"{self.skipped_files:,} binary/non-UTF-8 files, {self.skipped_empty:,} empty documents"
        per_token = self.output_bytes / max(self.tokens, 1)
        where = f"{self.output} ({len(self.shards)} shards)" if len(self.shards) > 1 else str(self.output)
        return [
            f"datastore:   {where}",
            f"documents:   {self.documents:,}",
            f"tokens:      {self.tokens:,}",
            f"read:        {self.input_files:,} files, {self.input_bytes:,} bytes, "
            f"{self.text_bytes:,} bytes of text",
            f"skipped:     {skipped}",
            f"time:        {self.seconds:.2f} s, of which {self.setup_seconds:.2f} s loading the tokenizer "
            f"and {self.tokenize_seconds:.2f} s encoding text ({self.tokens_per_second:,.0f} tokens/s after "
            "loading)",
            f"output size: {self.output_bytes:,} bytes ({per_token:.2f} B/token)",
            f"vocabulary:  {self.vocab_size:,} ({self.tokenizer_fingerprint or 'no tokenizer recorded'})",
        ]
