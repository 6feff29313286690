"""sssd: lossless speculative decoding with a retrieval drafter and tree verification.

The datastore and search need only numpy; the engine (later) needs torch and transformers.
"""

import os

# Idle OpenMP threads spin ("active" wait) for a while after each parallel region. The drafter runs one
# short parallel region per decoding step next to a busy Python/torch thread; on a loaded 2-core machine
# the spinning threads steal the CPU and each region stalled ~20 ms. Passive waiting sleeps instead. This
# must be set before the OpenMP runtime starts, i.e. before importing _core; a user's setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

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
from sssd.drafter import DraftBatch, Drafter, DrafterConfig, UnknownRequestError
from sssd.fingerprint import tokenizer_fingerprint
from sssd.simulate import SimulationResult, simulate
from sssd.tree_buffers import TreeBuffers, tree_buffers

__version__ = "0.1.0"

# The engine needs torch and transformers: import it only when one of its names is used. The scheduling
# names need only numpy but are imported on first use too.
_LAZY = {
    "Engine": "sssd.engine",
    "EngineConfig": "sssd.engine",
    "SamplingParams": "sssd.sampling",
    "GenerationResult": "sssd.requests",
    "StreamEvent": "sssd.requests",
    "BudgetConfig": "sssd.policy",
    "BudgetPolicy": "sssd.policy",
    "CostModel": "sssd.costmodel",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sssd' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


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
    "Engine",
    "EngineConfig",
    "GenerationResult",
    "SamplingParams",
    "SearchConfig",
    "SearchResult",
    "SimulationResult",
    "StreamEvent",
    "TokenizerMismatchError",
    "TreeBuffers",
    "UnknownRequestError",
    "build_datastore",
    "cuda_available",
    "has_cuda",
    "has_openmp",
    "max_threads",
    "simulate",
    "tokenizer_fingerprint",
    "tree_buffers",
]
