"""Drafters: what proposes the token trees that the model verifies.

Owns the retrieval drafter (``retrieval``: the request's own tokens, the datastore and the recent-outputs
pool fused into one tree per request, chosen best-first by accumulated probability under one budget for
the whole batch, optionally SLO-aware), the calibration of its node scores (``calibration``), the batch
budget allocation and selection as pure functions (``allocation``), the tree metadata the model needs
(``buffers``: positions, ancestor masks, accepted-path indexes) and the Python oracle of all of it
(``reference``).

May import: ``sssd.datastore``, ``sssd._core``, ``sssd.fileio`` and numpy. Never the engine, torch or the
policy: drafters know nothing of models.
"""

from sssd.drafter.buffers import TreeBuffers, tree_buffers
from sssd.drafter.retrieval import DraftBatch, Drafter, DrafterConfig, UnknownRequestError

__all__ = ["DraftBatch", "Drafter", "DrafterConfig", "TreeBuffers", "UnknownRequestError", "tree_buffers"]
