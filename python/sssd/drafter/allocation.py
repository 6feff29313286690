"""Spending a speculation budget: best-first trees and batch-wide allocation (pure functions, native).

The drafter runs these inside ``Drafter.propose``; they are exposed for schedulers, benchmarks and tests.
Definitions (glossary): p(v) = probability that v is accepted given its parent was; f(v) = product of p
along the path root..v; the expected accepted tokens of a selection = sum of f over its non-root nodes.

* ``greedy_sequence``: within one tree, the order in which best-first search by f takes the nodes. As
  f never increases along a path, the first k nodes are a connected subtree containing the root with
  the largest sum of f among all such subtrees of k nodes (with a per-depth width limit it is a greedy
  heuristic).
* ``allocate``: across trees, merging the per-tree sequences by f (the joint greedy) gives every prefix
  the largest total f for its size: the throughput-optimal split of a global budget. With TPOT targets,
  requests whose expected tokens per step x target fall short of the step time L + slack are served first
  (largest shortfall in tokens first), then the rest goes by f.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sssd import _core
from sssd.checks import check_int, check_real, int_array


def greedy_sequence(
    parents: Sequence[int] | np.ndarray,
    f: Sequence[float] | np.ndarray,
    depth: Sequence[int] | np.ndarray,
    cap: int,
    max_depth: int = 64,
    max_width: int = 0,
) -> np.ndarray:
    """Non-root node indices in best-first order. parents [n] (parents[0] = -1, parents[i] < i), f [n],
    depth [n]; at most ``cap`` nodes, depth <= max_depth, at most max_width per depth (0: no limit)."""
    i32 = (np.iinfo(np.int32).min, np.iinfo(np.int32).max)
    return _core.select_sequence(
        int_array(parents, "parents", lo=-1, hi=i32[1]).astype(np.int32),
        _reals(f, "f"),
        int_array(depth, "depth", lo=0, hi=i32[1]).astype(np.int32),
        check_int(cap, "cap", lo=i32[0], hi=i32[1]),
        check_int(max_depth, "max_depth", lo=i32[0], hi=i32[1]),
        check_int(max_width, "max_width", lo=i32[0], hi=i32[1]),
    )


def _reals(x: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    """A 1-D float64 array of real numbers (NaN allowed: it orders after every number)."""
    arr = np.asarray(x)
    if arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number)):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} must hold real numbers, got complex values")
    return np.ascontiguousarray(arr, dtype=np.float64).reshape(-1)


def _tpot_array(tpot: Sequence[float | None] | None, b: int) -> np.ndarray | None:
    if tpot is None:
        return None
    arr = np.asarray([np.nan if t is None else float(t) for t in tpot], dtype=np.float64)
    if arr.shape[0] != b:
        raise ValueError(f"got {arr.shape[0]} TPOT targets for {b} trees")
    if np.any(arr <= 0) or np.any(np.isinf(arr)):
        raise ValueError("TPOT targets must be > 0 and finite (None or NaN for no target)")
    return arr


def allocate(
    seq_f: Sequence[Sequence[float] | np.ndarray],
    budget: int,
    tpot: Sequence[float | None] | None = None,
    step_time: float = 0.0,
    slack: float = 0.0,
) -> np.ndarray:
    """The tree taking each rank 0, 1, ... (at most ``budget``). seq_f[i]: tree i's f values in greedy
    order (non-increasing). tpot: seconds per token per tree (None: no target); step_time, slack: seconds."""
    budget = check_int(budget, "budget", lo=0)
    arrays = [_reals(x, f"seq_f[{i}]") for i, x in enumerate(seq_f)]
    for i, a in enumerate(arrays):
        if np.any(np.diff(a) > 0):
            raise ValueError(f"seq_f[{i}] must be non-increasing (a greedy sequence)")
    return _core.allocate_budget(
        arrays,
        budget,
        _tpot_array(tpot, len(arrays)),
        check_real(step_time, "step_time"),
        check_real(slack, "slack"),
    )


def allocation_counts(order: np.ndarray, num_trees: int) -> np.ndarray:
    """Nodes per tree [num_trees] of an allocation order."""
    return np.bincount(np.asarray(order, dtype=np.int64), minlength=num_trees)
