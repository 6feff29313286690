"""sssd: lossless speculative decoding with a retrieval drafter and tree verification.

The datastore and search need only numpy; the engine (later) needs torch and transformers.
"""

from sssd._core import DatastoreError, has_openmp, max_threads
from sssd.cuda_ops import cuda_available, has_cuda
from sssd.datastore import (
    Datastore,
    DatastoreInfo,
    SearchConfig,
    SearchResult,
    TokenizerMismatchError,
    build_datastore,
)
from sssd.fingerprint import tokenizer_fingerprint

__version__ = "0.1.0"

__all__ = [
    "Datastore",
    "DatastoreError",
    "DatastoreInfo",
    "SearchConfig",
    "SearchResult",
    "TokenizerMismatchError",
    "build_datastore",
    "cuda_available",
    "has_cuda",
    "has_openmp",
    "max_threads",
    "tokenizer_fingerprint",
]
