"""Cost model of one engine step, fitted robustly and refreshed online from measured steps.

A step has three timed parts, each modelled as a small linear function of its features:

- forward (verification): ``T_fwd = a·N_context + b·N_batched + t·[any draft node] + c`` where
  ``N_context`` is the total number of committed tokens of the batch (the attention reads them),
  ``N_batched`` the number of tokens scored in the forward (one root per request + the draft nodes) and
  ``t`` the fixed extra cost of a tree step over a plain decoding step (masks, tree attention path);
- drafting: ``T_draft = d·B + e·budget + g`` for a propose call over ``B`` requests at a global budget;
- bookkeeping (verification, KV commit, drafter updates): ``T_other = h·B + i·N_batched + j``.

Each part is fitted by iteratively reweighted least squares with Huber weights (a few slow steps, e.g. a
garbage collection or another process on the core, must not drag the fit), non-negative coefficients,
exponential forgetting of old samples over a bounded window, and a weak prior pulling towards the seed
coefficients (a saved profile or a calibration run) so that a handful of online samples cannot produce a
wild model. All times are seconds.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PROFILE_VERSION = 1

# Feature names of each part, in coefficient order (the last feature is the constant 1).
FORWARD_FEATURES = ("n_context", "n_batched", "tree", "const")
DRAFT_FEATURES = ("batch_size", "budget", "const")
OTHER_FEATURES = ("batch_size", "n_batched", "const")


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
        scale = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        if scale <= 1e-12 * max(1.0, float(np.max(np.abs(y)))):
            break  # (almost) exact fit
        u = np.abs(r) / (delta * scale)
        new = np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-12))
        if np.allclose(new, robust, rtol=1e-6, atol=1e-9):
            break
        robust = new
    return coef


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
    weight decay per newer sample.
    """

    features: tuple[str, ...]
    prior: np.ndarray
    window: int = 512
    forget: float = 0.99
    prior_weight: float = 4.0
    refit_every: int = 8
    coef: np.ndarray = field(init=False)
    _xs: deque = field(init=False, repr=False)
    _ys: deque = field(init=False, repr=False)
    _since_fit: int = field(init=False, default=0, repr=False)

    def __post_init__(self) -> None:
        self.prior = np.asarray(self.prior, dtype=np.float64).copy()
        if self.prior.shape != (len(self.features),):
            raise ValueError(f"prior must have {len(self.features)} coefficients, got {self.prior.shape}")
        if not (0.0 < self.forget <= 1.0) or self.window < 1:
            raise ValueError("forget must be in (0, 1] and window >= 1")
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
        if self._since_fit >= self.refit_every:
            self.refit()

    def refit(self) -> np.ndarray:
        self._since_fit = 0
        n = len(self._ys)
        if n == 0:
            self.coef = self.prior.copy()
            return self.coef
        x = np.stack(self._xs)
        y = np.asarray(self._ys)
        w = self.forget ** np.arange(n - 1, -1, -1, dtype=np.float64)
        if self.prior_weight > 0 and np.any(self.prior > 0):
            # Pseudo-observations of the prior at the observed feature ranges anchor directions the
            # window does not excite (e.g. budget always 0 so far).
            px = _anchor_points(x)
            x = np.vstack([x, px])
            y = np.concatenate([y, px @ self.prior])
            w = np.concatenate([w, np.full(len(px), self.prior_weight / len(px))])
        self.coef = huber_irls(x, y, w)
        return self.coef


def _anchor_points(x: np.ndarray) -> np.ndarray:
    """One point per feature at a typical magnitude plus the all-minimum point (constant column last)."""
    hi = np.maximum(np.max(x, axis=0), 1.0)
    pts = [np.where(np.arange(x.shape[1]) == x.shape[1] - 1, 1.0, 0.0)]
    for j in range(x.shape[1] - 1):
        p = pts[0].copy()
        p[j] = hi[j]
        pts.append(p)
    return np.stack(pts)


def forward_features(n_context: float, n_batched: float, batch_size: float) -> list[float]:
    """Feature vector of the forward part (order of ``FORWARD_FEATURES``)."""
    return [float(n_context), float(n_batched), 1.0 if n_batched > batch_size else 0.0, 1.0]


@dataclass(frozen=True)
class StepSample:
    """Measured times (seconds) and sizes of one engine step, the cost model's unit of evidence."""

    batch_size: int  # requests in the step
    n_context: int  # committed tokens over all requests
    n_batched: int  # tokens scored by the forward (roots + draft nodes)
    budget: int  # global budget the drafter was asked for (0 = no propose call)
    forward_s: float
    draft_s: float = 0.0
    other_s: float = 0.0


@dataclass(frozen=True)
class StepCost:
    """Predicted times (seconds) of a step; arrays broadcast over candidate budgets."""

    forward: np.ndarray
    draft: np.ndarray
    other: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.forward + self.draft + self.other


class CostModel:
    """Predicts step time from batch shape; fitted online from :class:`StepSample` samples."""

    def __init__(
        self,
        forward: tuple[float, ...] = (2e-8, 2e-4, 0.0, 5e-3),
        draft: tuple[float, float, float] = (5e-5, 1e-6, 5e-5),
        other: tuple[float, float, float] = (5e-5, 1e-6, 2e-4),
        *,
        window: int = 512,
        forget: float = 0.99,
        prior_weight: float = 4.0,
        meta: dict | None = None,
    ) -> None:
        kw = dict(window=window, forget=forget, prior_weight=prior_weight)
        if len(forward) == 3:  # (a, b, c): no tree-step term
            forward = (forward[0], forward[1], 0.0, forward[2])
        self.forward = OnlineLinearFit(FORWARD_FEATURES, np.array(forward), **kw)
        self.draft = OnlineLinearFit(DRAFT_FEATURES, np.array(draft), **kw)
        self.other = OnlineLinearFit(OTHER_FEATURES, np.array(other), **kw)
        self.meta = dict(meta or {})

    # -- prediction ---------------------------------------------------------------------------------
    def predict(
        self,
        batch_size: int,
        n_context: int,
        budgets,
        *,
        drafted: bool | None = None,
        draft_budget: int | None = None,
    ) -> StepCost:
        """Predicted cost of a step with ``batch_size`` requests, ``n_context`` committed tokens and each
        global budget in ``budgets`` (int or array [K]) draft nodes. Drafting time is counted for budgets
        > 0 unless ``drafted`` says whether a propose call is (True) or is not (False) part of the step;
        ``draft_budget``: the budget the drafter was asked for (one propose at the largest candidate, then
        truncated), default each candidate's own budget."""
        # Written out (no feature matrices): the policy calls this every step for every candidate.
        k = np.asarray(budgets, dtype=np.float64)
        n_batched = batch_size + k
        fa, fb, ft, fc = self.forward.coef
        oa, ob, oc = self.other.coef
        da, db, dc = self.draft.coef
        fwd = fa * n_context + fb * n_batched + ft * (k > 0) + fc
        oth = oa * batch_size + ob * n_batched + oc
        kd = k if draft_budget is None else float(draft_budget)
        drf = da * batch_size + db * kd + dc + 0.0 * k
        if drafted is None:
            drf = np.where(k > 0, drf, 0.0)
        elif not drafted:
            drf = np.zeros_like(k)
        return StepCost(np.maximum(fwd, 0.0), np.maximum(drf, 0.0), np.maximum(oth, 0.0))

    def prefill_time(self, prompt_tokens: int) -> float:
        """Predicted time of prefilling one prompt of ``prompt_tokens`` tokens in its own forward (as the
        engine does between steps): a forward with no committed context and every token batched."""
        n = float(prompt_tokens)
        fwd = self.forward.predict(np.array(forward_features(0, n, n)))
        oth = self.other.predict(np.array([1.0, 1.0, 1.0]))
        return float(max(fwd, 0.0) + max(oth, 0.0))

    def draft_time(self, batch_size: int, budget: int) -> float:
        return max(0.0, float(self.draft.predict(np.array([batch_size, budget, 1.0]))))

    # -- online update ------------------------------------------------------------------------------
    def observe(self, t: StepSample) -> None:
        """Adds one measured step; each part refits every few samples."""
        if t.batch_size < 1 or t.n_batched < t.batch_size or t.n_context < 0 or t.budget < 0:
            raise ValueError(f"inconsistent step timing: {t}")
        self.forward.add(forward_features(t.n_context, t.n_batched, t.batch_size), t.forward_s)
        if t.budget > 0 and t.draft_s > 0:
            self.draft.add([t.batch_size, t.budget, 1.0], t.draft_s)
        self.other.add([t.batch_size, t.n_batched, 1.0], t.other_s)

    def fit(self, timings) -> CostModel:
        """Adds every timing then refits all parts (calibration run or a saved profile's samples)."""
        for t in timings:
            self.observe(t)
        for part in (self.forward, self.draft, self.other):
            if part.num_samples:
                part.refit()
        return self

    # -- persistence --------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": PROFILE_VERSION,
            "meta": self.meta,
            "forward": dict(zip(FORWARD_FEATURES, map(float, self.forward.coef), strict=True)),
            "draft": dict(zip(DRAFT_FEATURES, map(float, self.draft.coef), strict=True)),
            "other": dict(zip(OTHER_FEATURES, map(float, self.other.coef), strict=True)),
        }

    @classmethod
    def from_dict(cls, d: dict, **kw) -> CostModel:
        if not isinstance(d, dict) or d.get("version") != PROFILE_VERSION:
            raise ValueError(f"not a cost profile of version {PROFILE_VERSION}")
        try:
            parts = [
                tuple(float(d[part].get(f, 0.0) if f == "tree" else d[part][f]) for f in feats)
                for part, feats in (
                    ("forward", FORWARD_FEATURES),
                    ("draft", DRAFT_FEATURES),
                    ("other", OTHER_FEATURES),
                )
            ]
        except (KeyError, TypeError) as e:
            raise ValueError(f"cost profile is missing a coefficient: {e}") from None
        if any(not math.isfinite(v) or v < 0 for p in parts for v in p):
            raise ValueError("cost profile coefficients must be finite and non-negative")
        return cls(*parts, meta=d.get("meta", {}), **kw)

    def save(self, path: str | os.PathLike, extra: dict | None = None) -> None:
        """Writes the profile as JSON (atomically: temporary file + rename)."""
        d = self.to_dict()
        if extra:
            d.update(extra)
        from sssd.fileio import write_text_atomic

        write_text_atomic(path, json.dumps(d, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike, **kw) -> CostModel:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"cost profile {path} not found (make one with `sssd profile`)")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"cost profile {path} is not valid JSON: {e}") from None
        return cls.from_dict(d, **kw)

    def __repr__(self) -> str:
        f, d, o = self.forward.coef, self.draft.coef, self.other.coef
        return (
            f"CostModel(forward={f[0]:.3g}·ctx + {f[1]:.3g}·tok + {f[2]:.3g}·tree + {f[3]:.3g}, "
            f"draft={d[0]:.3g}·B + {d[1]:.3g}·k + {d[2]:.3g}, "
            f"other={o[0]:.3g}·B + {o[1]:.3g}·tok + {o[2]:.3g})"
        )
