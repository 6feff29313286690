"""The suffix-array datastore: build, open (mmap), search.

File format: see ``csrc/core/datastore_format.h``. A datastore is one ``.sssd`` file or a directory of
shards (``*.sssd``, opened in name order) that behave as one datastore.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from sssd import _core
from sssd._core import DatastoreError
from sssd.checks import check_fields, check_int
from sssd.datastore.fingerprint import MAX_FINGERPRINT_BYTES, same_vocabulary, tokenizer_fingerprint

PathLike = Union[str, "os.PathLike[str]"]
Progress = Callable[[str, int, int], None]
SHARD_SUFFIX = ".sssd"
FILE_MAGIC = b"SSSDSTOR"  # the first 8 bytes of every datastore file (csrc/core/datastore_format.h)


class TokenizerMismatchError(DatastoreError):
    """The datastore was built with a different tokenizer (vocabulary) than the one given."""


@dataclass(frozen=True)
class SearchConfig:
    """Parameters of continuation search (see ``csrc/core/search.h``)."""

    max_query_len: int = 16  # longest context suffix looked up
    min_query_len: int = 1  # shortest context suffix used
    min_occurrences: int = 4  # use shorter suffixes while the current one occurs fewer times than this
    max_samples: int = 100  # occurrences read per suffix, spread evenly over its range
    max_depth: int = 8  # tokens of continuation per occurrence

    def __post_init__(self) -> None:
        check_fields(self)  # ints, not bools or floats (ranges are checked natively)

    def native(self) -> Any:
        try:
            return _core.SearchParams(
                self.max_query_len, self.min_query_len, self.min_occurrences, self.max_samples, self.max_depth
            )
        except ValueError as e:
            raise ValueError(f"invalid SearchConfig {self}: {e}") from None


@dataclass(frozen=True)
class Trie:
    """Candidate continuations of one context. Node 0 is the root (the context's last token, or -1)."""

    tokens: np.ndarray  # [n] int32 token ids
    parents: np.ndarray  # [n] int32 parent index within this trie, -1 for the root
    counts: np.ndarray  # [n] int32 continuations through the node (root: all inserted)
    depth: np.ndarray  # [n] int32 distance from the root
    match_len: np.ndarray  # [n] int32 length of the context suffix whose match produced the node

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def paths(self) -> dict[tuple[int, ...], int]:
        """{token path from the root (root excluded): count} for every non-root node."""
        out: dict[tuple[int, ...], int] = {}
        keys: list[tuple[int, ...]] = [()]
        for i in range(1, len(self)):
            key = (*keys[int(self.parents[i])], int(self.tokens[i]))
            keys.append(key)
            out[key] = int(self.counts[i])
        return out


@dataclass(frozen=True)
class SearchResult:
    """Tries of a batch of contexts, flat: trie i is nodes [offsets[i], offsets[i+1])."""

    tokens: np.ndarray  # [N] int32
    parents: np.ndarray  # [N] int32, index within the node's own trie
    counts: np.ndarray  # [N] int32
    depth: np.ndarray  # [N] int32
    match_len: np.ndarray  # [N] int32
    offsets: np.ndarray  # [B + 1] int64

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def trie(self, i: int) -> Trie:
        if not 0 <= i < len(self):
            raise IndexError(f"trie index {i} out of range for a batch of {len(self)}")
        s = slice(int(self.offsets[i]), int(self.offsets[i + 1]))
        return Trie(self.tokens[s], self.parents[s], self.counts[s], self.depth[s], self.match_len[s])


@dataclass(frozen=True)
class DatastoreInfo:
    paths: tuple[str, ...]  # one per shard
    num_tokens: int
    num_documents: int
    vocab_size: int
    tokenizer_fingerprint: str
    token_width: int  # bytes per stored token
    sa_width: int  # bytes per suffix-array entry (largest over shards)
    file_bytes: int
    format_version: int
    index_strides: tuple[int, ...] = ()  # per shard: stride of the stored search index, 0 = none
    index_bytes: int = 0  # bytes of the stored search indexes (included in file_bytes)

    @property
    def has_search_index(self) -> bool:
        """Every shard stores its search index (else it is built in memory on the first search)."""
        return bool(self.index_strides) and all(s > 0 for s in self.index_strides)

    @property
    def bytes_per_token(self) -> float:
        return self.file_bytes / max(self.num_tokens, 1)


def _as_context(x: Any, i: int) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x  # dtype and layout are checked natively: a wrong dtype is a TypeError, not a copy
    arr = np.asarray(x)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"contexts[{i}] must be a 1-D sequence of int token ids")
    if arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max:
        raise ValueError(f"contexts[{i}] has token ids outside the int32 range")
    return arr.astype(np.int32)


class Datastore:
    """A memory-mapped datastore (one file, or shards that behave as one)."""

    def __init__(self, shards: Sequence[Any]):
        if not shards:
            raise ValueError("a datastore needs at least one shard")
        first = shards[0]
        for s in shards[1:]:
            if s.vocab_size != first.vocab_size or not same_vocabulary(s.fingerprint, first.fingerprint):
                raise DatastoreError(
                    f"shard {s.path} does not match {first.path}: vocab {s.vocab_size} vs "
                    f"{first.vocab_size}, tokenizer {s.fingerprint!r} vs {first.fingerprint!r}"
                )
        self._shards = list(shards)
        self._doc_starts = np.cumsum([0] + [s.num_documents for s in self._shards])

    @classmethod
    def open(cls, path: PathLike | Sequence[PathLike], *, tokenizer: Any = None) -> Datastore:
        """Open a file, a directory of ``*.sssd`` shards, or a list of files. O(1) per shard.

        ``tokenizer`` (a Hugging Face tokenizer or a fingerprint string) is checked against the one the
        datastore was built with; a different vocabulary raises TokenizerMismatchError.
        """
        paths = _shard_paths(path)
        ds = cls([_open_shard(p) for p in paths])
        if tokenizer is not None:
            ds.check_tokenizer(tokenizer)
        return ds

    def check_tokenizer(self, tokenizer: Any) -> None:
        expected = tokenizer if isinstance(tokenizer, str) else tokenizer_fingerprint(tokenizer)
        have = self.tokenizer_fingerprint
        if not have:
            raise TokenizerMismatchError(
                f"{self._shards[0].path} records no tokenizer; rebuild it with build-datastore --tokenizer"
            )
        if not same_vocabulary(have, expected):
            raise TokenizerMismatchError(
                f"datastore {self._shards[0].path} was built with tokenizer {have!r}, not {expected!r}: "
                "rebuild the datastore with this tokenizer"
            )

    def __len__(self) -> int:
        return sum(int(s.num_tokens) for s in self._shards)

    def __repr__(self) -> str:
        return f"Datastore({len(self)} tokens, {self.num_documents} documents, {len(self._shards)} shard(s))"

    @property
    def vocab_size(self) -> int:
        return int(self._shards[0].vocab_size)

    @property
    def num_documents(self) -> int:
        return int(self._doc_starts[-1])

    @property
    def tokenizer_fingerprint(self) -> str:
        return str(self._shards[0].fingerprint)

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    @property
    def shards(self) -> tuple[Any, ...]:
        """The native shard handles (``sssd._core.Datastore``, one per file, in search order).

        Public so other native components (the drafter) can pass them to their own C++ calls, which
        search them as one datastore exactly like :meth:`search`. Treat them as read-only; they stay
        valid (mapped) while any reference to them is alive.
        """
        return tuple(self._shards)

    def info(self) -> DatastoreInfo:
        return DatastoreInfo(
            paths=tuple(str(s.path) for s in self._shards),
            num_tokens=len(self),
            num_documents=self.num_documents,
            vocab_size=self.vocab_size,
            tokenizer_fingerprint=self.tokenizer_fingerprint,
            token_width=int(self._shards[0].token_width),
            sa_width=max(int(s.sa_width) for s in self._shards),
            file_bytes=sum(int(s.file_size) for s in self._shards),
            format_version=int(self._shards[0].version),
            index_strides=tuple(int(s.search_index_stride) for s in self._shards),
            index_bytes=sum(int(s.search_index_bytes) for s in self._shards),
        )

    def document(self, k: int) -> np.ndarray:
        """Token ids of document k (over all shards, in shard order). [len] int32."""
        k = check_int(k, "k")
        if not 0 <= k < self.num_documents:
            raise IndexError(f"document {k} out of range [0, {self.num_documents})")
        shard = int(np.searchsorted(self._doc_starts, k, side="right")) - 1
        return self._shards[shard].document(int(k - self._doc_starts[shard]))

    def search(self, contexts: Sequence[Any], config: SearchConfig | None = None) -> SearchResult:
        """One trie of candidate continuations per context; all contexts in one native call.

        contexts: a sequence of int32 arrays (or lists of ints). Token ids must be < vocab_size.
        """
        if isinstance(contexts, np.ndarray) and contexts.ndim == 1:
            raise TypeError("contexts must be a sequence of contexts; wrap a single context in a list")
        params = (config or SearchConfig()).native()
        arrays = [_as_context(c, i) for i, c in enumerate(contexts)]
        return SearchResult(*_core.search(self._shards, arrays, params))

    def search_one(self, context: Any, config: SearchConfig | None = None) -> Trie:
        return self.search([context], config).trie(0)

    def verify(self, progress: Progress | None = None) -> None:
        """Full O(n) check of every shard (order of the suffix array included). Raises DatastoreError."""
        for s in self._shards:
            s.verify(progress)


def _open_shard(path: str) -> Any:
    """The native datastore of one file. A file too short for a header is told apart by its first bytes:
    one that does not start as a datastore does is "not an sssd datastore" whatever its size (a text
    file given by mistake); one that does, or an empty one, was cut short ("truncated")."""
    try:
        return _core.Datastore(path)
    except DatastoreError as e:
        if "smaller than a datastore header" not in str(e):
            raise
        with open(path, "rb") as f:
            head = f.read(len(FILE_MAGIC))
        if head and not FILE_MAGIC.startswith(head):
            raise DatastoreError(f"{path}: not an sssd datastore (bad magic bytes)") from None
        raise


def _shard_paths(path: PathLike | Sequence[PathLike]) -> list[str]:
    if isinstance(path, (str, os.PathLike)):
        p = Path(path)
        if p.is_dir():
            shards = sorted(str(x) for x in p.iterdir() if x.name.endswith(SHARD_SUFFIX) and x.is_file())
            if not shards:
                raise FileNotFoundError(f"no *{SHARD_SUFFIX} shards in directory {p}")
            return shards
        if not p.exists():
            raise FileNotFoundError(f"datastore not found: {p}")
        return [str(p)]
    paths = [str(x) for x in path]
    for x in paths:
        if not Path(x).is_file():
            raise FileNotFoundError(f"datastore shard not found: {x}")
    if not paths:
        raise ValueError("no datastore paths given")
    return paths


def _iter_chunks(documents: Any, chunk_tokens: int) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """Yields (tokens, offsets) chunks of about chunk_tokens tokens from the accepted document forms."""
    if (
        isinstance(documents, tuple)
        and len(documents) == 2
        and all(isinstance(x, np.ndarray) for x in documents)
    ):
        tokens, offsets = documents
        offsets = np.asarray(offsets)
        if offsets.ndim != 1 or offsets.size < 1 or not np.issubdtype(offsets.dtype, np.integer):
            raise ValueError("offsets must be a 1-D integer array with num_documents + 1 entries")
        if offsets[0] != 0 or offsets[-1] != len(tokens) or np.any(np.diff(offsets) < 0):
            raise ValueError("offsets must start at 0, not decrease, and end at len(tokens)")
        offsets = offsets.astype(np.int64)
        # Cut at document boundaries into chunks of roughly chunk_tokens tokens.
        start = 0
        while start < len(offsets) - 1:
            stop = int(np.searchsorted(offsets, offsets[start] + chunk_tokens, side="right")) - 1
            stop = min(max(stop, start + 1), len(offsets) - 1)
            lo, hi = int(offsets[start]), int(offsets[stop])
            yield np.ascontiguousarray(tokens[lo:hi]), offsets[start : stop + 1] - lo
            start = stop
        return
    buf: list[np.ndarray] = []
    lengths: list[int] = [0]
    for i, doc in enumerate(documents):
        arr = np.asarray(doc)
        if arr.size and (arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer)):
            raise TypeError(f"document {i} must be a 1-D sequence of int token ids, got {arr.dtype}")
        arr = arr.reshape(-1).astype(np.int64, copy=False) if arr.size else np.zeros(0, np.int64)
        buf.append(arr)
        lengths.append(lengths[-1] + arr.size)
        if lengths[-1] >= chunk_tokens:
            yield np.concatenate(buf), np.asarray(lengths, dtype=np.int64)
            buf, lengths = [], [0]
    if buf:
        yield np.concatenate(buf), np.asarray(lengths, dtype=np.int64)


def build_datastore(
    documents: Any,
    path: PathLike,
    *,
    vocab_size: int,
    tokenizer: Any = None,
    progress: Progress | None = None,
    chunk_tokens: int = 1 << 20,
    force_sa64: bool = False,
    search_index: bool | None = None,
    index_stride: int = 64,
) -> DatastoreInfo:
    """Build a datastore file from token documents and write it atomically to ``path``.

    documents: an iterable of int sequences (one per document), or a tuple ``(tokens, offsets)`` of numpy
    arrays with document k = tokens[offsets[k]:offsets[k+1]]. Streamed in chunks; token ids must be in
    [0, vocab_size). tokenizer: a Hugging Face tokenizer or a fingerprint string, recorded in the header.
    progress(phase, done, total) is called during the build. An interrupted or failed build leaves no
    file at ``path``. Returns the new datastore's info.

    search_index: store the search index (``csrc/core/search_index.h``, about 1 byte per token at stride
    64) in the file, so that the first search does not build it: None (default) stores it from 65,536
    tokens on (smaller datastores search fast enough without one), True always, False never.
    index_stride: its sampling stride, a power of two >= 2.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    fingerprint = (
        ""
        if tokenizer is None
        else (tokenizer if isinstance(tokenizer, str) else tokenizer_fingerprint(tokenizer))
    )
    if len(fingerprint.encode()) > MAX_FINGERPRINT_BYTES:
        raise ValueError("tokenizer fingerprint is longer than 119 bytes")
    out = Path(path)
    if out.is_dir():
        raise IsADirectoryError(f"{out} is a directory; give a file path for the datastore")
    if not out.parent.exists():
        raise FileNotFoundError(f"directory {out.parent} does not exist")
    if check_int(chunk_tokens, "chunk_tokens") < 1:
        raise ValueError("chunk_tokens must be >= 1")
    if not isinstance(force_sa64, bool):
        raise TypeError(f"force_sa64 must be a bool, got {force_sa64!r}")
    if search_index not in (None, True, False):
        raise ValueError(f"search_index must be None, True or False, got {search_index!r}")
    if isinstance(index_stride, bool) or not isinstance(index_stride, (int, np.integer)):
        raise ValueError(f"index_stride must be an int, got {index_stride!r}")
    if index_stride < 2 or index_stride & (index_stride - 1):
        raise ValueError(f"index_stride must be a power of two >= 2, got {index_stride}")
    builder = _core.Builder(int(vocab_size), fingerprint, force_sa64)
    min_tokens = {None: 65536, True: 0, False: 0}[search_index]
    builder.set_search_index(0 if search_index is False else int(index_stride), min_tokens)
    for tokens, offsets in _iter_chunks(documents, chunk_tokens):
        builder.add(tokens, offsets)
        if progress is not None:
            progress("reading documents", int(builder.num_tokens), 0)
    builder.finish(str(out), progress)
    return Datastore.open(out).info()
