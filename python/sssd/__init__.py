"""sssd: lossless speculative decoding with a retrieval drafter and tree verification.

The package follows the architecture (see each subpackage's docstring for what it owns and may import):

- ``sssd.datastore``  suffix-array datastore: file format, build, open, search (numpy only)
- ``sssd.drafter``    retrieval drafter, calibration, budget allocation (numpy only)
- ``sssd.engine``     continuous-batching engine, model adapter, KV cache, verification (torch)
- ``sssd.kernels``    CUDA tree attention and KV commit wrappers and their references (torch)
- ``sssd.policy``     cost model, adaptive and SLO-aware budget policy, admission, profiling
- ``sssd.evaluation`` (prompt, output) pairs, teacher-forced simulator, baselines, calibration fitting
- ``sssd.models``     local models (SmolLM2 from its wheel) and prompt sets, model loading
- ``sssd.integrations`` serving engines that host the drafter
- ``sssd.cli``        the ``sssd`` commands

The public API is re-exported here as ``sssd.X``; the datastore and the drafter need only numpy, the
engine's names (``sssd.Engine`` ...) import torch and transformers on first use.
"""

from sssd._core import DatastoreError, has_openmp, max_threads
from sssd.datastore import (
    Datastore,
    DatastoreInfo,
    SearchConfig,
    SearchResult,
    TokenizerMismatchError,
    build_datastore,
    tokenizer_fingerprint,
)
from sssd.drafter import DraftBatch, Drafter, DrafterConfig, UnknownRequestError
from sssd.evaluation import SimulationResult, simulate
from sssd.kernels.tree_attention import cuda_available, has_cuda

__version__ = "0.1.0"

# The engine needs torch and transformers: import it only when one of its names is used. The scheduling
# names need only numpy but are imported on first use too.
_LAZY = {
    "Engine": "sssd.engine.engine",
    "EngineConfig": "sssd.engine.engine",
    "SamplingParams": "sssd.engine.sampling",
    "GenerationResult": "sssd.engine.requests",
    "StreamEvent": "sssd.engine.requests",
    "BudgetConfig": "sssd.policy.adaptive",
    "BudgetPolicy": "sssd.policy.adaptive",
    "CostModel": "sssd.policy.cost_model",
    "ModelDrafter": "sssd.drafter.model",
    "ModelDrafterConfig": "sssd.drafter.model",
    "MergedDrafter": "sssd.drafter.merge",
    "MergedDrafterConfig": "sssd.drafter.merge",
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
    "MergedDrafter",
    "MergedDrafterConfig",
    "ModelDrafter",
    "ModelDrafterConfig",
    "SamplingParams",
    "SearchConfig",
    "SearchResult",
    "SimulationResult",
    "StreamEvent",
    "TokenizerMismatchError",
    "UnknownRequestError",
    "build_datastore",
    "cuda_available",
    "has_cuda",
    "has_openmp",
    "max_threads",
    "simulate",
    "tokenizer_fingerprint",
]
