"""Serving engines that host sssd's drafter.

Owns the adapters that let a serving engine call the drafter in its own loop: ``vllm`` (vLLM's custom
speculative proposer, ``method="custom_class"``), ``rows`` (following an engine's batch rows to drafter
requests incrementally) and ``chains`` (one draft chain per request, chosen from the fused tree and
ranked batch-wide like the tree budget).

Imports: ``sssd.datastore``, ``sssd.drafter``, ``sssd.policy`` (cost model and goodput choice),
``sssd.batch`` (the accepted chains as the drafter's on-path mask), ``sssd.checks``, ``sssd.fileio`` (the
JSON configuration), and for the demo (``vllm_demo``)
``sssd.models`` and ``sssd.data``; numpy. Never torch at import time, never vLLM's internals: only the
proposer interface vLLM documents (the class is built with the ``VllmConfig`` and answers
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)``).
"""
