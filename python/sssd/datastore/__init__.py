"""The datastore: a memory-mapped suffix array over a tokenized corpus, and its search.

Owns the file format (versioned header, tokens, document offsets, suffix array, optional stored search
index), building (``build_datastore``, atomic writes), opening (O(1), mmap), checking (``verify``) and
searching (context suffix → count-weighted continuation trie), plus the tokenizer fingerprint that ties a
file to its vocabulary. ``reference`` holds the slow, obviously-correct Python oracle of all of it.

Imports: ``sssd._core`` (the native format, build and search) and ``sssd.checks``, and numpy. Nothing
else of sssd (it is the bottom layer).
"""

from sssd.datastore.fingerprint import tokenizer_fingerprint
from sssd.datastore.store import (
    Datastore,
    DatastoreError,
    DatastoreInfo,
    SearchConfig,
    SearchResult,
    TokenizerMismatchError,
    build_datastore,
)

__all__ = [
    "Datastore",
    "DatastoreError",
    "DatastoreInfo",
    "SearchConfig",
    "SearchResult",
    "TokenizerMismatchError",
    "build_datastore",
    "tokenizer_fingerprint",
]
