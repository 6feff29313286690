"""Drafters: what proposes the token trees that the model verifies.

Owns the retrieval drafter (``retrieval``: the request's own tokens, the datastore and the recent-outputs
pool fused into one tree per request, chosen best-first by accumulated probability under one budget for
the whole batch, optionally SLO-aware), the calibration of its node scores (``calibration``), the batch
budget allocation and selection as pure functions (``allocation``) and the Python oracle of all of it
(``reference``). The trees leave as a ``DraftBatch`` (flat arrays); the engine checks them and builds
the masks the model needs (``sssd.engine.trees``). Beside the retrieval drafter, with the same API:
``model.py`` (``ModelDrafter``: a small causal LM as the drafter, expansion or dynamic trees, greedy or
sampled with draft distributions), ``model_calibration.py`` (its online score table), ``merge.py``
(``MergedDrafter``: several drafters' trees merged into one per request) and ``assemble.py`` (best-first
selection over candidate nodes and packing into a ``DraftBatch``, numpy only).

Imports: ``sssd.datastore``, ``sssd._core``, ``sssd.checks``, ``sssd.batch``, ``sssd.fileio`` and numpy; and
``sssd.engine`` with torch, for the model drafter: it runs its draft model through the engine's
``ModelAdapter`` and KV cache (no forked modeling code), so the engine never imports a drafter (it
duck-types them). ``model.py`` is imported lazily (``sssd.ModelDrafter``): ``import sssd.drafter`` needs
only numpy. Never the policy.
"""

from sssd.drafter.retrieval import DraftBatch, Drafter, DrafterConfig, UnknownRequestError

__all__ = ["DraftBatch", "Drafter", "DrafterConfig", "UnknownRequestError"]
