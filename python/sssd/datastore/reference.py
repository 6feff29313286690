"""Slow, obviously-correct Python versions of the native datastore ops: the test oracle.

Nothing here is fast or meant for production; every function follows the definition in the most direct
way so that the native code (``csrc/core``) can be checked against it on random inputs.

* :func:`encode_stream` / :func:`suffix_array`: the token stream and suffix array of a datastore file
  (``csrc/core/datastore_format.h``): token t is stored as t + 1, 0 ends each document, and the suffix
  array lists the stream positions of real tokens ordered by the whole stream suffix (so separators,
  the smallest symbol, make a suffix that ends its document sort before its extensions).
* :func:`read_datastore_file` / :func:`fnv1a64`: a plain reader of the file format and its checksum.
* :class:`ReferenceDatastore`: continuation search over one or more shards, as in ``csrc/core/search.h``.

Node order: :meth:`ReferenceDatastore.search` creates trie nodes in the order the native search does
(query lengths from longest to shortest, samples in suffix-array order over the shards in order, each
continuation inserted depth first; a new node is appended). The random-corpus test asserts the flat
arrays are identical, node order included; the hand-written tests state their expectations with
:func:`canonical_trie` (every path with its count and match length), which ignores node order.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sssd.datastore.store import SearchConfig, SearchResult, Trie

FNV64_OFFSET_BASIS = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3
HEADER_BYTES = 256
MAGIC = b"SSSDSTOR"
# (name, struct code) of the 256-byte header, in file order; see csrc/core/datastore_format.h.
HEADER_FIELDS = (
    ("magic", "8s"),
    ("version", "I"),
    ("token_width", "I"),
    ("sa_width", "I"),
    ("flags", "I"),
    ("vocab_size", "Q"),
    ("num_tokens", "Q"),
    ("num_documents", "Q"),
    ("stream_length", "Q"),
    ("stream_offset", "Q"),
    ("doc_offsets_offset", "Q"),
    ("sa_offset", "Q"),
    ("file_size", "Q"),
    ("fingerprint", "120s"),
    ("index_offset", "Q"),  # the optional stored search index (flags bit 0); 0 without one
    ("index_bytes", "Q"),
    ("index_checksum", "Q"),
    ("content_checksum", "Q"),  # flags bit 1: checksum of the sections (csrc/core/datastore_format.h)
    ("reserved", "8s"),
    ("header_checksum", "Q"),
)
HEADER_STRUCT = struct.Struct("<" + "".join(code for _, code in HEADER_FIELDS))
assert HEADER_STRUCT.size == HEADER_BYTES


def fnv1a64(data: bytes) -> int:
    """FNV-1a, 64 bit."""
    h = FNV64_OFFSET_BASIS
    for byte in data:
        h = ((h ^ byte) * FNV64_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def unpack_header(raw: bytes) -> dict[str, Any]:
    """The header fields of the first 256 bytes of a datastore file."""
    values = HEADER_STRUCT.unpack(raw[:HEADER_BYTES])
    return {name: v for (name, _), v in zip(HEADER_FIELDS, values, strict=True)}


def pack_header(fields: dict[str, Any], *, reseal: bool = True) -> bytes:
    """256 header bytes from fields; ``reseal`` recomputes the checksum over the first 248 bytes."""
    raw = HEADER_STRUCT.pack(*(fields[name] for name, _ in HEADER_FIELDS))
    if reseal:
        raw = raw[:-8] + struct.pack("<Q", fnv1a64(raw[:-8]))
    return raw


FLAG_SEARCH_INDEX = 1
FLAG_CONTENT_CHECKSUM = 2


def without_content_checksum(raw: bytes) -> bytes:
    """The file ``raw`` as a build without a content checksum (an older build) would have written it:
    the flag and the field cleared, the header resealed. Lets tests reach the structure checks that a
    checksum mismatch would otherwise preempt."""
    h = unpack_header(raw)
    h["flags"] &= ~FLAG_CONTENT_CHECKSUM
    h["content_checksum"] = 0
    return pack_header(h) + bytes(raw[HEADER_BYTES:])


def token_width(vocab_size: int) -> int:
    """Bytes per stream symbol: ids are stored as id + 1, so uint16 holds vocabularies up to 65535."""
    return 2 if vocab_size <= 65535 else 4


@dataclass(frozen=True)
class DatastoreFile:
    """The sections of a datastore file, read without any validation."""

    header: dict[str, Any]
    stream: np.ndarray  # [stream_length] uint16/uint32 symbols (token + 1, 0 = separator)
    doc_offsets: np.ndarray  # [num_documents + 1] uint64
    sa: np.ndarray  # [num_tokens] int32/int64 stream positions

    def documents(self) -> list[list[int]]:
        return [
            [int(s) - 1 for s in self.stream[int(b) : int(e) - 1]]
            for b, e in zip(self.doc_offsets[:-1], self.doc_offsets[1:], strict=True)
        ]


def read_datastore_file(path: str | Path) -> DatastoreFile:
    """Reads a well-formed datastore file with plain numpy (for comparing files with the reference)."""
    raw = Path(path).read_bytes()
    h = unpack_header(raw)
    sym = np.uint16 if h["token_width"] == 2 else np.uint32
    idx = np.int32 if h["sa_width"] == 4 else np.int64

    def section(offset: int, dtype: Any, count: int) -> np.ndarray:
        return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).copy()

    return DatastoreFile(
        header=h,
        stream=section(h["stream_offset"], sym, h["stream_length"]),
        doc_offsets=section(h["doc_offsets_offset"], np.uint64, h["num_documents"] + 1),
        sa=section(h["sa_offset"], idx, h["num_tokens"]),
    )


def encode_stream(documents: Sequence[Sequence[int]]) -> list[int]:
    """The stored token stream: every token + 1, and a 0 after every document."""
    stream: list[int] = []
    for doc in documents:
        stream.extend(int(t) + 1 for t in doc)
        stream.append(0)
    return stream


def suffix_array(stream: Sequence[int]) -> list[int]:
    """Positions of the real (non-zero) symbols, sorted by the stream suffix starting there.

    Python compares lists lexicographically with a proper prefix first, which is the order of the
    native SA-IS with its virtual sentinel. O(n^2 log n): for small test corpora only.
    """
    s = list(stream)
    return sorted((p for p in range(len(s)) if s[p] != 0), key=lambda p: s[p:])


def canonical_trie(trie: Trie) -> tuple[int, int, dict[tuple[int, ...], tuple[int, int]]]:
    """(root token, root count, {path: (count, match_len)}): a trie independent of its node order."""
    paths: list[tuple[int, ...]] = [()]
    out: dict[tuple[int, ...], tuple[int, int]] = {}
    for i in range(1, len(trie)):
        path = (*paths[int(trie.parents[i])], int(trie.tokens[i]))
        paths.append(path)
        out[path] = (int(trie.counts[i]), int(trie.match_len[i]))
    return int(trie.tokens[0]), int(trie.counts[0]), out


def check_trie_invariants(trie: Trie) -> None:
    """Structural rules every search trie obeys; raises AssertionError naming the broken one."""
    n = len(trie)
    assert n >= 1 and trie.parents[0] == -1 and trie.depth[0] == 0, "node 0 is the root"
    child_tokens: dict[int, set[int]] = {}
    child_counts = [0] * n
    for i in range(1, n):
        p = int(trie.parents[i])
        assert 0 <= p < i, f"parents[{i}]={p} is not an earlier node"
        assert trie.depth[i] == trie.depth[p] + 1, f"depth of node {i}"
        assert trie.counts[i] >= 1, f"count of node {i}"
        seen = child_tokens.setdefault(p, set())
        assert int(trie.tokens[i]) not in seen, f"node {p} has two children {int(trie.tokens[i])}"
        seen.add(int(trie.tokens[i]))
        child_counts[p] += int(trie.counts[i])
        # A node is created by the longest query length that reaches it, after its parent was.
        assert p == 0 or trie.match_len[i] <= trie.match_len[p], f"match_len of node {i} exceeds parent"
    for i in range(n):
        assert child_counts[i] <= trie.counts[i], f"children of node {i} count more than it"


class _TrieBuilder:
    def __init__(self, root: int):
        self.tokens, self.parents, self.counts = [root], [-1], [0]
        self.depth, self.match_len = [0], [0]
        self.children: list[dict[int, int]] = [{}]

    def insert(self, path: Sequence[int], match_len: int) -> None:
        self.counts[0] += 1
        node = 0
        for t in path:
            child = self.children[node].get(t)
            if child is None:
                child = len(self.tokens)
                self.children[node][t] = child
                self.tokens.append(t)
                self.parents.append(node)
                self.counts.append(0)
                self.depth.append(self.depth[node] + 1)
                self.match_len.append(match_len)
                self.children.append({})
            self.counts[child] += 1
            node = child


class ReferenceDatastore:
    """Documents in one or more shards, searched as one datastore (like ``sssd.Datastore``)."""

    def __init__(self, shards: Sequence[Sequence[Sequence[int]]], vocab_size: int):
        self.vocab_size = int(vocab_size)
        self.streams = [encode_stream(docs) for docs in shards]
        self.suffix_arrays = [suffix_array(s) for s in self.streams]

    @classmethod
    def from_documents(cls, documents: Sequence[Sequence[int]], vocab_size: int) -> ReferenceDatastore:
        return cls([documents], vocab_size)

    def occurrences(self, query: Sequence[int]) -> list[tuple[int, int]]:
        """(shard, stream position) of every occurrence of the token ids ``query``, shard by shard in
        suffix-array order (the concatenated ranges the samples are spread over)."""
        q = [int(t) + 1 for t in query]
        return [
            (k, p)
            for k, (stream, sa) in enumerate(zip(self.streams, self.suffix_arrays, strict=True))
            for p in sa
            if stream[p : p + len(q)] == q
        ]

    def continuation(self, shard: int, start: int, max_depth: int) -> list[int]:
        """Up to max_depth token ids from stream position ``start``, stopping at the document end."""
        out: list[int] = []
        for s in self.streams[shard][start : start + max_depth]:
            if s == 0:
                break
            out.append(s - 1)
        return out

    def search_one(self, context: Sequence[int], config: SearchConfig | None = None) -> Trie:
        cfg = config or SearchConfig()
        _validate(cfg)
        ctx = [int(t) for t in context]
        trie = _TrieBuilder(ctx[-1] if ctx else -1)
        max_len = min(cfg.max_query_len, len(ctx))
        for t in ctx[len(ctx) - max_len :]:  # only the tokens a query can use are checked
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"context token id {t} is outside the vocabulary [0, {self.vocab_size})")
        if max_len >= cfg.min_query_len and cfg.max_samples > 0:
            lengths = range(max_len, cfg.min_query_len - 1, -1)
            longest = next((n for n in lengths if self.occurrences(ctx[len(ctx) - n :])), None)
            for n in range(longest or 0, cfg.min_query_len - 1, -1):
                occ = self.occurrences(ctx[len(ctx) - n :])
                k = min(len(occ), cfg.max_samples)
                for i in range(k):
                    shard, pos = occ[i * len(occ) // k]  # the i-th of k indices spread evenly
                    trie.insert(self.continuation(shard, pos + n, cfg.max_depth), n)
                if len(occ) >= cfg.min_occurrences:
                    break
        a = [np.asarray(x, dtype=np.int32) for x in (trie.tokens, trie.parents, trie.counts)]
        b = [np.asarray(x, dtype=np.int32) for x in (trie.depth, trie.match_len)]
        return Trie(*a, *b)

    def search(self, contexts: Sequence[Sequence[int]], config: SearchConfig | None = None) -> SearchResult:
        tries = [self.search_one(c, config) for c in contexts]
        offsets = np.cumsum([0] + [len(t) for t in tries]).astype(np.int64)

        def cat(field: str) -> np.ndarray:
            parts = [getattr(t, field) for t in tries]
            return np.concatenate(parts) if parts else np.zeros(0, np.int32)

        return SearchResult(*(cat(f) for f in ("tokens", "parents", "counts", "depth", "match_len")), offsets)


def _validate(cfg: SearchConfig) -> None:
    if cfg.min_query_len < 1:
        raise ValueError("min_query_len must be >= 1")
    if cfg.max_query_len < cfg.min_query_len:
        raise ValueError("max_query_len must be >= min_query_len")
    if cfg.min_occurrences < 0 or cfg.max_samples < 0 or cfg.max_depth < 0:
        raise ValueError("min_occurrences, max_samples and max_depth must be >= 0")
