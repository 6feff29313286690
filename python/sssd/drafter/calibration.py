"""Calibration of the drafter's node scores: raw estimate -> probability that the node is accepted.

A table holds, for every group (source, depth bin, match-length bin), a monotone piecewise-linear
map on fixed knots ``x_k = k / (K - 1)`` (fixed spacing: there is nothing to validate when it changes).
Observations are soft-binned to the two knots around their raw score; a group's values are the weighted
isotonic (pool-adjacent-violators) fit of the knots' success rates. The drafter applies the table in C++
and updates it online from ``Drafter.observe`` (only touched groups are refit).

JSON format (``format: "sssd-calibration"``, ``version: 1``): ``sources`` (names, in source-id order),
``depth_edges`` / ``match_edges`` (lower bounds of the bins), ``num_knots``, ``values`` and
``weights`` as nested lists of shape [sources][depth bins][match bins][knots].
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from importlib import resources
from typing import Any, Union

import numpy as np

from sssd import _core

# source ids 0 .. 4 (DraftBatch.source): the retrieval sources, the recycled candidates (the verifier's own
# top-k) and retrieval candidates rescored with them; for the last two the match length is 1 + the rank
# among the recycled candidates (64: not among them)
SOURCES = ("input", "datastore", "pool", "recycled", "rescored")
DEFAULT_DEPTH_EDGES = (1, 2, 3, 4, 6, 9, 13)
DEFAULT_MATCH_EDGES = (1, 2, 3, 5, 9, 17)
DEFAULT_NUM_KNOTS = 11
FORMAT = "sssd-calibration"
VERSION = 1
PathLike = Union[str, "os.PathLike[str]"]


def _check_edges(edges: tuple[int, ...], what: str) -> None:
    if not edges or edges[0] > 1 or any(b <= a for a, b in itertools.pairwise(edges)):
        raise ValueError(f"{what} must be strictly increasing and start at a value <= 1, got {edges}")


@dataclass(frozen=True, eq=False)
class CalibrationTable:
    """Monotone maps raw -> p per (source, depth bin, match-length bin)."""

    depth_edges: tuple[int, ...]
    match_edges: tuple[int, ...]
    num_knots: int
    values: np.ndarray  # [S, D, M, K] float32 in [0, 1], non-decreasing along K
    weights: np.ndarray  # [S, D, M, K] float64 >= 0: observations (soft counts) behind each knot

    def __post_init__(self) -> None:
        _check_edges(self.depth_edges, "depth_edges")
        _check_edges(self.match_edges, "match_edges")
        if not 2 <= self.num_knots <= 1001:
            raise ValueError(f"num_knots must be in [2, 1001], got {self.num_knots}")
        shape = self.shape
        for name in ("values", "weights"):
            a = getattr(self, name)
            if not isinstance(a, np.ndarray) or a.shape != shape:
                raise ValueError(f"calibration {name} must be an array of shape {shape}")
        if not np.all((self.values >= 0) & (self.values <= 1)):
            raise ValueError("calibration values must lie in [0, 1]")
        if not np.all(np.isfinite(self.weights) & (self.weights >= 0)):
            raise ValueError("calibration weights must be finite and >= 0")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(SOURCES), len(self.depth_edges), len(self.match_edges), self.num_knots)

    @property
    def knots(self) -> np.ndarray:
        return np.linspace(0.0, 1.0, self.num_knots)

    @classmethod
    def identity(
        cls,
        depth_edges: tuple[int, ...] = DEFAULT_DEPTH_EDGES,
        match_edges: tuple[int, ...] = DEFAULT_MATCH_EDGES,
        num_knots: int = DEFAULT_NUM_KNOTS,
    ) -> CalibrationTable:
        shape = (len(SOURCES), len(depth_edges), len(match_edges), num_knots)
        values = np.broadcast_to(np.linspace(0, 1, num_knots, dtype=np.float32), shape).copy()
        return cls(tuple(depth_edges), tuple(match_edges), num_knots, values, np.zeros(shape))

    def bins(self, depth: Any, match_len: Any) -> tuple[np.ndarray, np.ndarray]:
        d = np.maximum(np.searchsorted(self.depth_edges, np.asarray(depth), side="right") - 1, 0)
        m = np.maximum(np.searchsorted(self.match_edges, np.asarray(match_len), side="right") - 1, 0)
        return d, m

    def apply(self, source: Any, depth: Any, match_len: Any, raw: Any) -> np.ndarray:
        """Calibrated probabilities [n] float32 (the numpy twin of the native map)."""
        s = np.asarray(source, dtype=np.int64)
        if s.size and (s.min() < 0 or s.max() >= len(SOURCES)):
            raise ValueError(f"source ids must be in [0, {len(SOURCES)}): {', '.join(SOURCES)}")
        d, m = self.bins(depth, match_len)
        k_count = self.num_knots
        t = np.clip(np.asarray(raw, dtype=np.float32), 0, 1) * np.float32(k_count - 1)
        k = np.minimum(t.astype(np.int64), k_count - 2)
        a = t - k.astype(np.float32)
        v = self.values[s, d, m]
        lo = np.take_along_axis(v, k[..., None], -1)[..., 0]
        hi = np.take_along_axis(v, (k + 1)[..., None], -1)[..., 0]
        return (lo + a * (hi - lo)).astype(np.float32)

    def native(self, max_prior_weight: float | None = None) -> Any:
        w = self.weights if max_prior_weight is None else np.minimum(self.weights, max_prior_weight)
        return _core.Calibration(
            list(self.depth_edges),
            list(self.match_edges),
            self.num_knots,
            np.ascontiguousarray(self.values, dtype=np.float32).ravel(),
            np.ascontiguousarray(w, dtype=np.float64).ravel(),
        )

    @classmethod
    def from_native(cls, c: Any) -> CalibrationTable:
        shape = (len(SOURCES), len(c.depth_edges), len(c.match_edges), c.num_knots)
        return cls(
            tuple(c.depth_edges),
            tuple(c.match_edges),
            int(c.num_knots),
            np.asarray(c.values, dtype=np.float32).reshape(shape),
            np.asarray(c.weights, dtype=np.float64).reshape(shape),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "sources": list(SOURCES),
            "depth_edges": list(self.depth_edges),
            "match_edges": list(self.match_edges),
            "num_knots": self.num_knots,
            "values": np.round(self.values.astype(np.float64), 6).tolist(),
            "weights": np.round(self.weights, 3).tolist(),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CalibrationTable:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError(f"not a calibration table (expected format {FORMAT!r})")
        if obj.get("version") != VERSION:
            raise ValueError(
                f"unsupported calibration table version {obj.get('version')!r} (this is {VERSION})"
            )
        sources = tuple(obj.get("sources", ()))
        if not sources or sources != SOURCES[: len(sources)]:
            raise ValueError(f"calibration table sources {obj.get('sources')} differ from {list(SOURCES)}")
        try:
            depth_edges = tuple(int(x) for x in obj["depth_edges"])
            match_edges = tuple(int(x) for x in obj["match_edges"])
            num_knots = int(obj["num_knots"])
            values = np.asarray(obj["values"], dtype=np.float32)
            weights = np.asarray(obj["weights"], dtype=np.float64)
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed calibration table: {e}") from None
        if len(sources) < len(SOURCES) and values.ndim == 4 and values.shape == weights.shape:
            # a table from before the later sources: theirs start as the identity, with no weight
            ident = cls.identity(depth_edges, match_edges, num_knots)
            values = np.concatenate([values, ident.values[len(sources) :]])
            weights = np.concatenate([weights, ident.weights[len(sources) :]])
        return cls(depth_edges, match_edges, num_knots, values, weights)

    def save(self, path: PathLike) -> None:
        from sssd.fileio import write_text_atomic

        write_text_atomic(path, json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: PathLike) -> CalibrationTable:
        with open(path) as f:
            return cls.from_json(json.load(f))


def default_table() -> CalibrationTable:
    """The shipped table (fitted by tools/fit_default_calibration.py); identity if it is missing."""
    ref = resources.files("sssd.data").joinpath("calibration_default.json")
    if not ref.is_file():
        return CalibrationTable.identity()
    return CalibrationTable.from_json(json.loads(ref.read_text()))


def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted non-decreasing least-squares fit (pool-adjacent-violators), native."""
    return np.asarray(
        _core.isotonic_fit(
            np.ascontiguousarray(y, dtype=np.float64), np.ascontiguousarray(w, dtype=np.float64)
        )
    )


def fit(
    source: Any,
    depth: Any,
    match_len: Any,
    raw: Any,
    accepted: Any,
    *,
    depth_edges: tuple[int, ...] = DEFAULT_DEPTH_EDGES,
    match_edges: tuple[int, ...] = DEFAULT_MATCH_EDGES,
    num_knots: int = DEFAULT_NUM_KNOTS,
    prior_weight: float = 1.0,
) -> CalibrationTable:
    """Fit a table from observations (each a node whose parent was accepted; accepted = 0/1).

    Knots without data keep the identity value; ``prior_weight`` pseudo-observations at the identity
    value per knot keep sparse groups sane.
    """
    table = CalibrationTable.identity(depth_edges, match_edges, num_knots)
    s = np.asarray(source, dtype=np.int64)
    y = np.asarray(accepted, dtype=np.float64)
    r = np.clip(np.asarray(raw, dtype=np.float64), 0, 1)
    if not (s.shape == y.shape == r.shape == np.shape(depth) == np.shape(match_len)) or s.ndim != 1:
        raise ValueError("source, depth, match_len, raw and accepted must be 1-D arrays of one length")
    if s.size and (s.min() < 0 or s.max() >= len(SOURCES)):
        raise ValueError(f"source ids must be in [0, {len(SOURCES)}): {', '.join(SOURCES)}")
    if np.any((y != 0) & (y != 1)):
        raise ValueError("accepted must hold 0/1 outcomes")
    d, m = table.bins(depth, match_len)
    t = r * (num_knots - 1)
    k = np.minimum(t.astype(np.int64), num_knots - 2)
    a = t - k
    wsum = np.zeros(table.shape)
    ssum = np.zeros(table.shape)
    for kk, ww in ((k, 1 - a), (k + 1, a)):
        np.add.at(wsum, (s, d, m, kk), ww)
        np.add.at(ssum, (s, d, m, kk), ww * y)
    prior = table.values.astype(np.float64)
    wtot = wsum + prior_weight
    rate = (ssum + prior * prior_weight) / wtot
    values = np.empty(table.shape, dtype=np.float32)
    for idx in np.ndindex(*table.shape[:3]):
        values[idx] = np.clip(isotonic(rate[idx], wtot[idx]), 0, 1)
    return CalibrationTable(tuple(depth_edges), tuple(match_edges), num_knots, values, wsum)


def calibration_error(p: Any, accepted: Any, bins: int = 10) -> float:
    """Expected calibration error: sum over equal-width p bins of |mean p - accept rate| * share."""
    p = np.asarray(p, dtype=np.float64)
    y = np.asarray(accepted, dtype=np.float64)
    if p.size == 0:
        return 0.0
    b = np.minimum((p * bins).astype(np.int64), bins - 1)
    err = 0.0
    for i in range(bins):
        sel = b == i
        if sel.any():
            err += abs(p[sel].mean() - y[sel].mean()) * sel.mean()
    return float(err)
