"""Strict argument checks for the public API: a bool or a float is not an int, NaN is not a number.

Python's ``int(1.7)`` is 1 and ``True`` is an int, so an API that converts with ``int()`` takes request
1.7 as request 1 and ``budget=True`` as 1. These helpers refuse such values with a ``TypeError`` (wrong
type) or a ``ValueError`` (a value outside the allowed range, NaN, infinity) naming the argument.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np


def is_int(value: Any) -> bool:
    """An int or a numpy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(value: Any, name: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an int; TypeError unless it is one (bools and floats are not), ValueError out of range."""
    if type(value) is int and lo is None and hi is None:  # the common case, on every step: no more work
        return value
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        bound = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {bound}, got {v}")
    return v


def check_real(value: Any, name: str, *, finite: bool = True) -> float:
    """``value`` as a float: an int or a float (not a bool), finite unless ``finite=False``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    v = float(value)
    if finite and not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def int_array(value: Any, name: str, *, lo: int | None = None, hi: int | None = None) -> np.ndarray:
    """A 1-D array of integers (an int array, or a sequence of ints) as int64; TypeError for floats or
    bools, ValueError for values out of range."""
    arr = np.asarray(value)  # a list of Python ints becomes int64; floats or bools keep their kind
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    kind = arr.dtype.kind
    if kind == "O":
        for v in arr.tolist():
            check_int(v, f"{name} entries")
        arr = np.asarray(arr.tolist())
        kind = arr.dtype.kind
    if kind not in "iu":  # dtype.kind, not np.issubdtype: this runs on every propose
        raise TypeError(f"{name} must hold ints, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} has values past the int64 range")
    out = arr if arr.dtype == np.int64 else arr.astype(np.int64)
    if (lo is not None and int(out.min()) < lo) or (hi is not None and int(out.max()) > hi):
        raise ValueError(f"{name} must lie in [{lo}, {hi}]")
    return out


_SCALAR_TYPES = {
    "int": ("int", False),
    "int | None": ("int", True),
    "float": ("float", False),
    "float | None": ("float", True),
    "bool": ("bool", False),
}


def check_fields(obj: Any) -> None:
    """Checks every field of a dataclass annotated ``int``, ``float``, ``bool`` (or ``X | None``) with
    the functions above: meant for a config's ``__post_init__``, before its range checks."""
    for f in dataclasses.fields(obj):
        kind = _SCALAR_TYPES.get(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))
        if kind is None:
            continue
        value = getattr(obj, f.name)
        if value is None and kind[1]:
            continue
        name = f"{type(obj).__name__}.{f.name}"
        if kind[0] == "int":
            check_int(value, name)
        elif kind[0] == "float":
            check_real(value, name)
        else:
            check_bool(value, name)
