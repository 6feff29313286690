"""Strategies and checks shared by the native fuzz targets (tests/drafter/test_native_fuzz*.py).

Every target calls one entry of ``sssd._core`` with malformed input (wrong dtypes, shapes and layouts,
NaN/inf, negative or huge values, empty arrays, non-arrays) and accepts exactly two outcomes: a Python
exception of the documented kinds, or a result that passes the target's checks. A crash (SIGSEGV,
SIGBUS, abort) ends the test process; under the ASan+UBSan build of ``.ci/run`` so does any
out-of-bounds access or undefined behaviour.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import strategies as st
from sssd import DatastoreError

# What a native call may raise on bad input (UnknownRequestError is a KeyError and a ValueError).
ALLOWED = (TypeError, ValueError, IndexError, KeyError, OverflowError, MemoryError, DatastoreError)

INT_DTYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
FLOAT_DTYPES = (np.float16, np.float32, np.float64)
ALL_DTYPES = (*INT_DTYPES, *FLOAT_DTYPES, np.bool_)

# Scalars that are not what a native int/float/bool parameter wants, or are at its edges.
JUNK = st.sampled_from(
    [None, True, False, 1.5, math.nan, "3", b"3", [1, 2], (3,), {}, object(), np.float64(2.0)]
)
EDGE_INTS = st.sampled_from(
    [0, 1, -1, 2, 3, 7, 64, 127, 128, 2**15, 2**30, 2**31 - 1, -(2**31), 2**31, 2**62, -(2**63)]
)
EDGE_FLOATS = st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e-300, 1e300, math.nan, math.inf, -math.inf])


def mostly(common: st.SearchStrategy[Any], edges: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """common 80% of the time, edge values 10%, junk 10% (so that calls with several arguments often
    get past the type checks and reach the code behind them)."""
    return st.integers(0, 9).flatmap(lambda k: JUNK if k == 0 else edges if k == 1 else common)


def ints(lo: int = -3, hi: int = 12) -> st.SearchStrategy[Any]:
    """Mostly small ints, some edge values, some junk."""
    return mostly(st.integers(lo, hi), EDGE_INTS)


def reals() -> st.SearchStrategy[Any]:
    return mostly(st.one_of(st.floats(-2, 2), st.integers(-2, 5)), EDGE_FLOATS)


def _values(dt: np.dtype) -> st.SearchStrategy[Any]:
    if dt == np.bool_:
        return st.booleans()
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        edges = [
            v for v in (info.min, info.max, -1, 0, 1, 127, 128, 2**31 - 1, 2**31) if info.min <= v <= info.max
        ]
        return st.one_of(st.integers(max(info.min, -3), min(info.max, 12)), st.sampled_from(edges))
    return st.one_of(st.floats(-3, 12, width=32), EDGE_FLOATS)


@st.composite
def arrays(
    draw: st.DrawFn,
    dtypes: tuple[Any, ...] = ALL_DTYPES,
    length: st.SearchStrategy[int] | None = None,
    junk: bool = True,
    values: st.SearchStrategy[Any] | None = None,
    valid: float = 0.0,
) -> Any:
    """A numpy array. With probability ``valid``: 1-D, C-contiguous, of dtype ``dtypes[0]``; otherwise of
    one of ``dtypes`` and mostly 1-D, sometimes 0-D, 2-D or non-contiguous, or (when ``junk``) sometimes
    not an array at all."""
    good = draw(st.integers(0, 99)) < round(100 * valid)
    if not good and junk and draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(JUNK, st.lists(st.integers(-2, 5), max_size=4)))
    dt = np.dtype(dtypes[0] if good else draw(st.sampled_from(dtypes)))
    n = draw(length if length is not None else st.integers(0, 10))
    vals = draw(st.lists(values if values is not None else _values(dt), min_size=n, max_size=n))
    with np.errstate(all="ignore"):
        try:
            a = np.array(vals, dtype=dt) if vals else np.zeros(0, dt)
        except (OverflowError, ValueError):
            a = np.array(vals).astype(dt)  # wraps around, like a C cast
    shape = "1d" if good else draw(st.sampled_from(["1d"] * 8 + ["0d", "2d", "strided"]))
    if shape == "0d":
        return np.array(a[0] if n else dt.type(0))
    if shape == "2d":
        return np.stack([a, a])
    if shape == "strided" and n:
        return np.repeat(a, 2)[::2]  # same values, not C-contiguous
    return a


def succeeds(fn: Any, *args: Any) -> bool:
    """Whether fn(*args) returned (False when it raised one of the allowed exceptions)."""
    try:
        fn(*args)
    except ALLOWED:
        return False
    return True


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """fn(*args) returning its result, or None when it raised one of the allowed exceptions."""
    try:
        return fn(*args, **kwargs)
    except ALLOWED:
        return None


@st.composite
def tree_arrays(draw: st.DrawFn, max_nodes: int = 12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parents int32, f float64, depth int32) of one tree: well formed, or broken in one place."""
    n = draw(st.integers(1, max_nodes))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    f = draw(st.lists(st.one_of(st.floats(0, 1), EDGE_FLOATS), min_size=n, max_size=n))
    par, dep = np.array(parents, np.int32), np.array(depth, np.int32)
    breakage = draw(st.sampled_from(["none", "none", "depth", "parent", "root"]))
    k = draw(st.integers(0, n - 1))
    if breakage == "depth":
        dep[k] = draw(st.sampled_from([-1, -(2**31), 2**31 - 1, 2**30, 1000, 5]))
    elif breakage == "parent":
        par[k] = draw(st.sampled_from([-1, -5, k, k + 1, 2**31 - 1]))
    elif breakage == "root":
        par[0] = draw(st.sampled_from([0, 1, -2]))
    return par, np.array(f, np.float64), dep


@st.composite
def on_path_masks(draw: st.DrawFn, offsets: Any, parents: Any) -> Any:
    """An ``on_path`` argument of ``Drafter.observe`` for a batch (``offsets``, ``parents``): one random
    path from each root (a bool array), or that broken in one place: a root unmarked, a second child or
    an orphan marked, a wrong length, dtype or layout, or not an array at all."""
    offsets, parents = np.asarray(offsets), np.asarray(parents)
    n = len(parents)
    mask = np.zeros(n, bool)
    tree_ok = offsets.ndim == 1 and len(offsets) >= 1 and offsets.dtype.kind in "iu"
    for i in range(len(offsets) - 1 if tree_ok else 0):
        a, e = int(offsets[i]), int(offsets[i + 1])
        if not 0 <= a < e <= n:
            continue
        node, mask[a] = 0, True
        while draw(st.integers(0, 2)) > 0:
            kids = [v for v in range(1, e - a) if int(parents[a + v]) == node]
            if not kids:
                break
            node = draw(st.sampled_from(kids))
            mask[a + node] = True
    breakage = draw(st.sampled_from(["none"] * 4 + ["root", "flip", "length", "dtype", "layout", "junk"]))
    if breakage == "root" and tree_ok and len(offsets) > 1 and 0 <= int(offsets[0]) < n:
        mask[int(offsets[0])] = False
    elif breakage == "flip" and n:
        k = draw(st.integers(0, n - 1))
        mask[k] = not mask[k]
    elif breakage == "length":
        mask = np.concatenate([mask, [True]]) if draw(st.booleans()) else mask[:-1]
    elif breakage == "dtype":
        mask = mask.astype(draw(st.sampled_from([np.uint8, np.int32, np.int64, np.float32])))
    elif breakage == "layout":
        mask = np.repeat(mask, 2)[::2] if n else np.stack([mask, mask])
    elif breakage == "junk":
        mask = draw(st.one_of(JUNK, st.just(mask.tolist())))
    return mask
