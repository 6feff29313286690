"""sssd: lossless speculative decoding with a retrieval drafter and tree verification.

The datastore and search need only numpy; the engine (later) needs torch and transformers.
"""

from sssd._core import DatastoreError, has_openmp, max_threads
from sssd.datastore import (
    Datastore,
    DatastoreInfo,
    SearchConfig,
    SearchResult,
    TokenizerMismatchError,
    build_datastore,
)
from sssd.drafter import DraftBatch, Drafter, DrafterConfig, UnknownRequestError
from sssd.fingerprint import tokenizer_fingerprint
from sssd.simulate import SimulationResult, simulate
from sssd.tree_buffers import TreeBuffers, tree_buffers

__version__ = "0.1.0"

# Scheduling names, imported on first use (numpy only; nothing here may pull in torch at `import sssd`).
_LAZY = {
    "BudgetConfig": "sssd.policy",
    "BudgetPolicy": "sssd.policy",
    "CostModel": "sssd.costmodel",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sssd' has no attribute {name!r}")


__all__ = [
    "BudgetConfig",
    "BudgetPolicy",
    "CostModel",
    "Datastore",
    "DatastoreError",
    "DatastoreInfo",
    "DraftBatch",
    "Drafter",
    "DrafterConfig",
    "SearchConfig",
    "SearchResult",
    "SimulationResult",
    "TokenizerMismatchError",
    "TreeBuffers",
    "UnknownRequestError",
    "build_datastore",
    "has_openmp",
    "max_threads",
    "simulate",
    "tokenizer_fingerprint",
    "tree_buffers",
]
