"""The engine: continuous batching of requests over any Hugging Face causal LM, with tree verification.

Owns the step loop (``engine``: draft, forward, verify, commit, hand out; its accounting in ``stats``),
requests in and out of the batch (``lifecycle``: queueing from any thread, admission, aborts, results;
``runs``: ``generate`` and ``stream``; ``threads``: the threading contract), the requests themselves
(``requests``, ``chat``, ``detokenize``), the model adapter that drives the model through its public
extension points (``adapter``; ``shadow``: the engine's own view of the user's model, which it never
switches; the forward's output with the output head applied lazily), the registered tree attention as
one plan/run backend per way of running it and the masks its plans hold (``backends``, ``attention``),
the static-shape forward compiled or captured per bucket (``static_step``), the KV cache (``kv_cache``),
the step's trees as one flat batch, its accepted paths and the check of a drafter's batch into it
(``trees``), verification (``verify`` for a step, ``acceptance`` for the per-node greedy / sampling /
multi-step rules, ``sampling`` for the target's distribution), and what keeps faults from stranding the
batch (``recovery``: the drafter's and the policy's guards, the repair of the cache).

Imports: torch, transformers, ``sssd.kernels`` (the GPU attention), ``sssd.policy`` (the budget policy
interface), ``sssd.checks`` (argument checks), ``sssd.batch`` (the algebra of a flat batch of draft
trees) and ``sssd.datastore`` (which datastore a model may draft from). Never a drafter: drafters are
duck-typed, any object with the drafter API works.
Importing this package needs torch; ``sssd.Engine`` and ``sssd.EngineConfig`` import it on first use.
"""
