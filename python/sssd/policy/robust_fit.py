"""Robust online linear fits for the cost model: Huber-weighted, non-negative least squares over a bounded,
exponentially forgotten window of samples, anchored by a prior (absolute, or relative: a shape scaled to
the measurements). Used by :mod:`sssd.policy.cost_model`; numpy only."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np


def huber_irls(
    x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None, *, delta: float = 1.345, iters: int = 20
) -> np.ndarray:
    """Huber-robust, non-negative least squares fit of ``y ≈ x @ coef``.

    ``x`` [n, p], ``y`` [n], ``w`` [n] optional sample weights. Residuals are scaled by a robust
    estimate of their spread (1.4826 · MAD) and samples beyond ``delta`` scales are down-weighted as
    ``delta / |r|``. Coefficients that come out negative are fixed at 0 and the rest refitted (a small
    active-set loop; times cannot decrease with more work). Returns ``coef`` [p] (float64).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"huber_irls: x must be [n, p] and y [n], got {x.shape} and {y.shape}")
    n, p = x.shape
    if n == 0:
        raise ValueError("huber_irls: no samples")
    base = np.ones(n) if w is None else np.asarray(w, dtype=np.float64)
    if base.shape != (n,) or np.any(base < 0) or not np.all(np.isfinite(base)):
        raise ValueError("huber_irls: weights must be [n], finite and non-negative")
    robust = np.ones(n)
    coef = np.zeros(p)
    for _ in range(iters):
        coef = _nnls_weighted(x, y, base * robust)
        r = y - x @ coef
        scale = 1.4826 * _median(np.abs(r - _median(r)))
        if scale <= 1e-12 * max(1.0, float(np.max(np.abs(y)))):
            break  # (almost) exact fit
        u = np.abs(r) / (delta * scale)
        new = np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-12))
        if np.all(np.abs(new - robust) <= 1e-9 + 1e-6 * np.abs(robust)):  # np.allclose, without its checks
            break
        robust = new
    return coef


def _median(a: np.ndarray) -> float:
    """np.median of a non-empty 1-D array without its generic machinery (it runs a few hundred times per
    refit)."""
    n = len(a)
    h = n // 2
    if n % 2:
        return float(np.partition(a, h)[h])
    part = np.partition(a, (h - 1, h))
    return 0.5 * (float(part[h - 1]) + float(part[h]))


def _nnls_weighted(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares with coefficients clamped at >= 0 by dropping negative ones (active set)."""
    p = x.shape[1]
    active = np.ones(p, dtype=bool)
    sw = np.sqrt(w)
    coef = np.zeros(p)
    for _ in range(p):
        coef[:] = 0.0
        if not active.any():
            break
        sol, *_ = np.linalg.lstsq(x[:, active] * sw[:, None], y * sw, rcond=None)
        coef[active] = sol
        neg = coef < 0
        if not neg.any():
            break
        active &= ~neg
    return np.maximum(coef, 0.0)


@dataclass
class OnlineLinearFit:
    """A robust linear fit over a bounded, exponentially forgotten window of samples.

    ``prior`` [p] are the seed coefficients; ``prior_weight`` is how many samples' worth of evidence the
    prior counts as (pseudo-observations at a few representative points). ``forget`` in (0, 1] is the
    weight decay per newer sample. ``relative_prior``: the prior gives a shape only; it is scaled by the
    median ratio of measured to prior-predicted time before use (the built-in default: its absolute
    numbers fit no particular machine). ``typical`` [p]: the magnitude of each feature at which the prior
    is anchored when the window does not reach it (default 1). Columns that no sample in the window
    excites take the (scaled) prior coefficient directly, except along ``chain`` (column indices of
    consecutive slopes of one piecewise-linear feature, e.g. the cost of tokens in 1-2, 2-4, 4-8, ...):
    there a slope beyond the last one measured (samples worth ``chain_evidence`` after forgetting cover
    at least half of its ``typical``) continues it, so the recent measurements, not the prior or old
    samples, say what the next sizes cost until they are measured again. Refits every ``refit_every``
    samples, and more often while there are few (after samples 1, 2, 3, 5, 7, ...), so that the first
    steps of a run do not wait on the prior.
    """

    features: tuple[str, ...]
    prior: np.ndarray
    window: int = 512
    forget: float = 0.99
    prior_weight: float = 4.0
    refit_every: int = 8
    relative_prior: bool = False
    typical: np.ndarray | None = None
    chain: tuple[int, ...] = ()
    chain_evidence: float = 2.0
    coef: np.ndarray = field(init=False)
    _xs: deque = field(init=False, repr=False)
    _ys: deque = field(init=False, repr=False)
    _since_fit: int = field(init=False, default=0, repr=False)

    def __post_init__(self) -> None:
        self.prior = np.asarray(self.prior, dtype=np.float64).copy()
        p = len(self.features)
        if self.prior.shape != (p,):
            raise ValueError(f"prior must have {p} coefficients, got {self.prior.shape}")
        if not (0.0 < self.forget <= 1.0) or self.window < 1:
            raise ValueError("forget must be in (0, 1] and window >= 1")
        self.typical = np.ones(p) if self.typical is None else np.asarray(self.typical, dtype=np.float64)
        self.coef = self.prior.copy()
        self._xs = deque(maxlen=self.window)
        self._ys = deque(maxlen=self.window)

    @property
    def num_samples(self) -> int:
        return len(self._ys)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """``x`` [..., p] → predicted seconds [...]."""
        return np.asarray(x, dtype=np.float64) @ self.coef

    def add(self, x, y: float) -> None:
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (len(self.features),) or not np.all(np.isfinite(x)) or not math.isfinite(y):
            raise ValueError(f"sample must be {len(self.features)} finite features and a finite time")
        self._xs.append(x)
        self._ys.append(float(y))
        self._since_fit += 1
        if self._since_fit >= min(self.refit_every, max(1, len(self._ys) // 2)):
            self.refit()

    def prior_scale(self, x: np.ndarray, y: np.ndarray) -> float:
        """Measured / prior-predicted time, the median over samples ``x`` [n, p], ``y`` [n]; 1 for an
        absolute prior."""
        pred = x @ self.prior
        ok = pred > 0
        if not self.relative_prior or not ok.any():
            return 1.0
        return float(np.median(y[ok] / pred[ok]))

    def refit(self) -> np.ndarray:
        self._since_fit = 0
        n = len(self._ys)
        if n == 0:
            self.coef = self.prior.copy()
            return self.coef
        x = np.stack(self._xs)
        y = np.asarray(self._ys)
        w = self.forget ** np.arange(n - 1, -1, -1, dtype=np.float64)
        w_samples = w
        prior = self.prior * self.prior_scale(x, y)
        if self.prior_weight >= 1e6 * w.sum():  # the samples could move no coefficient by 1e-6: pinned
            self.coef = prior
            return self.coef
        cols = np.any(x != 0, axis=0)
        cols[-1] = True  # the constant
        xs = x[:, cols]
        if self.prior_weight > 0 and np.any(prior > 0):
            # Pseudo-observations of the prior at the observed feature ranges anchor directions the
            # window hardly excites (e.g. budget always 0 so far).
            px = _anchor_points(xs, self.typical[cols])
            xs = np.vstack([xs, px])
            y = np.concatenate([y, px @ prior[cols]])
            w = np.concatenate([w, np.full(len(px), self.prior_weight / len(px))])
        coef = prior.copy()  # columns that no sample excites keep the prior
        coef[cols] = huber_irls(xs, y, w)
        # along the chain, a slope is measured while recent samples (``chain_evidence`` of them, counted
        # with their forgetting weights) cover half its segment (``typical``): one measured only at its
        # start is the prior's (the anchor's leverage), and one measured long ago (the first, slowest
        # forwards of a process, or another load) would otherwise hold for as long as the policy keeps
        # away from those sizes; both continue the last measured slope, so the policy tries them again
        half = np.abs(x) >= 0.5 * self.typical
        covered = w_samples @ half >= self.chain_evidence
        last = None
        for j in self.chain:
            if covered[j]:
                last = j
            elif last is not None:
                coef[j] = coef[last]
        self.coef = coef
        return self.coef


def _anchor_points(x: np.ndarray, typical: np.ndarray) -> np.ndarray:
    """One point per feature at a typical magnitude (the largest observed, at least ``typical`` [p]) plus
    the all-minimum point (constant column last)."""
    hi = np.maximum(np.max(x, axis=0), typical)
    pts = [np.where(np.arange(x.shape[1]) == x.shape[1] - 1, 1.0, 0.0)]
    for j in range(x.shape[1] - 1):
        p = pts[0].copy()
        p[j] = hi[j]
        pts.append(p)
    return np.stack(pts)
