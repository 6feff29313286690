"""The engine: continuous batching of requests over any Hugging Face causal LM, with tree verification.

Owns the step loop (``engine``: admit, draft, verify, commit, stream), the requests and their results
(``requests``), the model adapter that registers the tree attention and drives the model through its
public extension points (``adapter``, ``attention``), the KV cache (``kv_cache``), turning a drafter's
batch into the trees the model scores (``trees``), and verification (``verify`` for a step,
``acceptance`` for the per-node greedy / sampling / multi-step rules, ``sampling`` for the target's
distribution).

Imports: torch, transformers, ``sssd.kernels`` (the GPU attention) and ``sssd.policy`` (the budget policy
interface). Never a drafter: drafters are duck-typed, any object with the drafter API works.
Importing this package needs torch; ``sssd.Engine`` and ``sssd.EngineConfig`` import it on first use.
"""
