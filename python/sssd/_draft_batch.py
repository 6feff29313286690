"""Stand-in for ``sssd.drafter.DraftBatch`` (the contract's fields) until the drafter branch lands."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DraftBatch:
    tokens: np.ndarray  # [N] int32
    parents: np.ndarray  # [N] int32, -1 for roots, else index within the own tree
    probs: np.ndarray  # [N] float32
    depth: np.ndarray  # [N] int32
    offsets: np.ndarray  # [B + 1] int64
    rank: np.ndarray  # [N] int32, -1 for roots
    gain: np.ndarray  # [M + 1] float64
