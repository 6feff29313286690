"""Cost model of one engine step, fitted robustly and refreshed online from measured steps.

A step has three timed parts, each modelled as a function that is linear in its coefficients:

- forward (verification): ``T_fwd = a·N_context + g(N_batched) + p·P_tree + v·L + t·[any draft node] + c``
  where ``N_context`` is the total number of committed tokens of the batch (the attention reads them),
  ``P_tree`` the query-key pairs that draft nodes add to the attention, which runs padded: ``B·(n_max -
  1)·rows`` for ``B`` requests, ``n_max`` nodes (root included) in the largest tree and ``rows`` the most
  cache rows any request reads (at batch 4 on a CPU a tree of 16 nodes on one request costs as much
  attention as 16 on each of them), ``L`` the output-head calls beyond the first (verification asks the
  head for one level of the walk per call unless one call for all rows pays, so a step costs up to one
  call per level of its longest accepted path; left
  out, the long accepted paths that come with large trees make large trees look dear) and ``v`` the cost
  of one such call. The head has one model, ``sssd.policy.head_cost.HeadCost`` (``CostModel.head``),
  which verification's choice of head calls reads too: where a step reports its head's time
  (``StepRecord.head_s``, the engine's), the head's calls are measured there and priced by it, all of
  them, and the forward is fitted without them (``L`` is then 0; with ``share_head``, the engine's, each
  call is recorded by its own rows as it is made, and a candidate budget is priced at the cheaper of one
  call per level and one call of all its rows); where it does not (a record without
  it: the vLLM proposer, simulations), ``v`` is fitted with the rest of the forward,
  ``N_batched`` the number of tokens scored in the forward (one root per request + the draft nodes), ``t``
  the fixed extra cost of a tree step over a plain decoding step (masks, tree attention path) and ``g``
  a non-decreasing piecewise-linear function of the scored tokens with knots at 1, 2, 4, 8, ... (one
  non-negative slope per segment, ``g(1) = 0``). A single slope (the design's ``b·N_batched``) cannot
  describe a real forward: on a CPU with bfloat16 matrix units the cost is nearly flat up to ~16-32
  tokens and then rises; in float32 it jumps between 2 and 8 tokens and then grows slowly. A line fitted
  to the small trees the policy happens to pick extrapolates wrongly to the large ones, and because the
  policy only measures what it picks, the error never corrects itself;
- drafting: ``T_draft = d·B + e·budget + g0`` for a propose call over ``B`` requests at a global budget;
- verify (walking the trees, the KV commit, the bookkeeping): ``T_verify = h·B + i·N_batched + j``.

The parts are the phases of ``sssd.policy.interface.StepRecord`` (``draft_s``, ``forward_s``, ``verify_s``),
the one record of a step, which is what the model learns from.

Each part is fitted by iteratively reweighted least squares with Huber weights (a few slow steps, e.g. a
garbage collection or another process on the core, must not drag the fit), non-negative coefficients,
exponential forgetting of old samples over a bounded window, and a weak prior pulling towards the seed
coefficients (a saved profile or a calibration run) so that a handful of online samples cannot produce a
wild model. The built-in default prior is *relative*: only its shape counts (a token costs 4% of a
one-token forward, the context and the bookkeeping a little), scaled at every refit by the median ratio
of the measured to the prior-predicted steps, so that it does not pull the fit towards another machine's
numbers. Token counts beyond the largest scored in the window cost what the last measured segment's slope
says (the prior's slope would keep a policy from ever trying sizes that a CPU with bfloat16 matrix units or
a GPU verifies at almost no extra cost); other directions the window does not excite keep the (scaled)
prior. The budget policy explores sizes around its choice so that the ones that matter are measured. All times
are seconds.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sssd.policy.head_cost import HeadCost
from sssd.policy.interface import StepRecord
from sssd.policy.robust_fit import OnlineLinearFit, huber_irls  # noqa: F401  (huber_irls: re-exported)

# 4: the bookkeeping part named "verify" (was "other"), the output head's call costs ("head"); 3: tree
# attention pairs; 2: one slope per token segment; 1: one slope (all load)
PROFILE_VERSION = 4

# Knots of the piecewise-linear token cost: segment i covers [KNOTS[i], KNOTS[i+1]] scored tokens, the last
# one everything above KNOTS[-1] (prefills of long prompts).
KNOTS = tuple(2**i for i in range(13))  # 1 .. 4096
SEGMENTS = (*(f"tokens_{lo}_{hi}" for lo, hi in itertools.pairwise(KNOTS)), f"tokens_{KNOTS[-1]}_up")
_LO = np.array(KNOTS, dtype=np.float64)
_WIDTH = np.array([*np.diff(KNOTS), np.inf], dtype=np.float64)

# Feature names of each part, in coefficient order (the last feature is the constant 1).
FORWARD_FEATURES = ("n_context", *SEGMENTS, "tree_attention", "head_levels", "tree", "const")
_SEG = slice(1, 1 + len(SEGMENTS))  # the token segments' columns
_ATT = 1 + len(SEGMENTS)  # the tree attention pairs' column
_LEV = 2 + len(SEGMENTS)  # the extra output-head levels' column
DRAFT_FEATURES = ("batch_size", "budget", "const")
VERIFY_FEATURES = ("batch_size", "n_batched", "const")


def token_segments(n_batched) -> np.ndarray:
    """Tokens of ``n_batched`` (scalar or [M]) in each segment between ``KNOTS``: [..., S] float64. Below one
    token the first segment goes negative (a step of no request: admission's "batch without it"), so the
    line of the first segment continues there as the single-slope model's did."""
    n = np.asarray(n_batched, dtype=np.float64)[..., None]
    seg = np.clip(n - _LO, 0.0, _WIDTH)
    seg[..., 0] = np.minimum(n[..., 0] - 1.0, _WIDTH[0])
    return seg


def tree_pairs_estimate(batch_size, n_context, k) -> np.ndarray:
    """``P_tree`` of ``k`` draft nodes (scalar or [K]) spread evenly over ``batch_size`` requests holding
    ``n_context`` committed tokens in all: what a caller that does not know the trees' shapes assumes."""
    per = np.asarray(k, dtype=np.float64) / max(batch_size, 1)
    return batch_size * per * (n_context / max(batch_size, 1) + 1.0 + per)


def tree_pairs_of(sizes, committed) -> float:
    """``P_tree`` of one forward: ``sizes`` [B] nodes per request (root included), ``committed`` [B] cache
    rows per request before the step."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if len(sizes) == 0:
        return 0.0
    rows = int((np.asarray(committed, dtype=np.int64) + sizes).max())
    return float(len(sizes) * (int(sizes.max()) - 1) * rows)


def forward_features(
    n_context: float,
    n_batched: float,
    batch_size: float,
    tree_pairs: float | None = None,
    head_levels: float = 0.0,
) -> list[float]:
    """Feature vector of the forward part (order of ``FORWARD_FEATURES``); ``tree_pairs`` None: the
    even-spread estimate; ``head_levels``: output-head calls beyond the first (the longest accepted path)."""
    tree = 1.0 if n_batched > batch_size else 0.0
    if tree_pairs is None:
        tree_pairs = float(tree_pairs_estimate(batch_size, n_context, n_batched - batch_size))
    segs = token_segments(n_batched).tolist()
    return [float(n_context), *segs, float(tree_pairs), float(head_levels), tree, 1.0]


@dataclass(frozen=True)
class StepCost:
    """Predicted times (seconds) of a step; arrays broadcast over candidate budgets."""

    forward: np.ndarray
    draft: np.ndarray
    verify: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.forward + self.draft + self.verify


def _forward_prior(forward) -> np.ndarray:
    """Forward coefficients (order of ``FORWARD_FEATURES``) from ``(a, b, c)``, ``(a, b, t, c)``, ``(a, b,
    t, c, p)`` or ``(a, b, t, c, p, h)`` where ``b`` is one slope for every token segment or a sequence of
    one slope per segment, ``p`` the cost of a tree attention pair and ``h`` of an output-head level (0
    when left out). A single slope is the design's ``b·N_batched``: the first token's share goes into the
    constant, so predictions agree."""
    forward = tuple(forward)
    if len(forward) == 3:  # (a, b, c): no tree-step term
        forward = (forward[0], forward[1], 0.0, forward[2])
    if len(forward) in (4, 5):
        forward = (*forward, *(0.0,) * (6 - len(forward)))
    if len(forward) != 6:
        raise ValueError("forward coefficients must be (a, b, c), (a, b, t, c), (a, b, t, c, p) or (.., h)")
    a, b, t, c, p, h = forward
    if np.ndim(b) == 0:
        slopes, c = np.full(len(SEGMENTS), float(b)), float(c) + float(b)
    else:
        slopes = np.asarray(b, dtype=np.float64)
        if slopes.shape != (len(SEGMENTS),):
            raise ValueError(
                f"forward: expected {len(SEGMENTS)} token slopes (knots {KNOTS}), got {slopes.shape}"
            )
    return np.array([float(a), *slopes, float(p), float(h), float(t), float(c)])


# The built-in priors, relative (scaled to the measured steps): a token costs 4% of a one-token forward
# (a compute-bound CPU in float32 is about there; bfloat16 matrix units and GPUs are far cheaper, which
# the policy's exploration finds out within a few dozen steps), a tree attention pair 1e-5 of it (a CPU's
# SDPA in float32 and bfloat16), an output-head level (the verification's walk asks the head for the logits
# of one more depth) 10% of it.
DEFAULT_FORWARD = (2e-8, 2e-4, 0.0, 5e-3, 5e-8, 5e-4)
DEFAULT_DRAFT = (5e-5, 1e-6, 5e-5)
DEFAULT_VERIFY = (5e-5, 1e-6, 2e-4)


class CostModel:
    """Predicts step time from batch shape; fitted online from the engine's :class:`StepRecord` of each step.

    ``forward``/``draft``/``verify``: seed coefficients (see :func:`_forward_prior` for the forward's
    forms); left out, the built-in relative prior of that part is used. ``extend_slope``: token segments
    beyond the largest forward in the window take the slope of the last one measured (False: the prior's),
    a segment counting as measured while samples worth ``extend_evidence`` (after forgetting) cover half
    of it. ``head``: the output head's call costs (a profile's; else measured from the steps)."""

    def __init__(
        self,
        forward: tuple | None = None,
        draft: tuple[float, float, float] | None = None,
        verify: tuple[float, float, float] | None = None,
        *,
        window: int = 512,
        forget: float = 0.99,
        prior_weight: float = 4.0,
        extend_slope: bool = True,
        extend_evidence: float = 2.0,
        head: HeadCost | None = None,
        meta: dict | None = None,
    ) -> None:
        kw = dict(window=window, forget=forget, prior_weight=prior_weight)
        typical = np.array([1.0, *np.minimum(_WIDTH, KNOTS[-1]), 1e4, 2.0, 1.0, 1.0])
        self.forward = OnlineLinearFit(
            FORWARD_FEATURES, _forward_prior(forward or DEFAULT_FORWARD), relative_prior=forward is None,
            typical=typical, chain=tuple(range(_SEG.start, _SEG.stop)) if extend_slope else (),
            chain_evidence=extend_evidence, **kw,
        )  # fmt: skip
        # the drafter's and the engine's own time are small and steady parts of a step: refitting them
        # every 32 samples instead of every 8 saves most of what observing a step costs the policy
        slow = dict(kw, refit_every=32)
        self.draft = OnlineLinearFit(
            DRAFT_FEATURES, np.array(draft or DEFAULT_DRAFT), relative_prior=draft is None, **slow
        )
        self.verify = OnlineLinearFit(
            VERIFY_FEATURES, np.array(verify or DEFAULT_VERIFY), relative_prior=verify is None, **slow
        )
        self.head = head if head is not None else HeadCost()
        # the head's calls recorded where they are made, by their own row counts (``share_head``); else
        # each step's head time is recorded here as calls of one row per request
        self.head_per_call = False
        self.head_one_call = False  # verification asks the head for every row of a step in one call
        self.meta = dict(meta or {})

    def share_head(self, head: HeadCost | None = None, *, one_call: bool = False) -> HeadCost:
        """The engine's output head records its own calls (rows, seconds) in this model's ``head`` (or in
        ``head``, which becomes it): a step's head is then priced by the rows it will ask for, and
        ``observe`` leaves the head's calls alone. ``one_call``: verification asks for every row of a
        step in one call (the recycled candidates' every-node rows). Returns the shared model."""
        if head is not None:
            self.head = head
        self.head_per_call = True
        self.head_one_call = bool(one_call)
        return self.head

    # -- prediction ---------------------------------------------------------------------------------
    def predict(
        self,
        batch_size: int,
        n_context: int,
        budgets,
        *,
        drafted: bool | None = None,
        draft_budget: int | None = None,
        tree_pairs=None,
        head_levels=None,
    ) -> StepCost:
        """Predicted cost of a step with ``batch_size`` requests, ``n_context`` committed tokens and each
        global budget in ``budgets`` (int or array [K]) draft nodes. Drafting time is counted for budgets
        > 0 unless ``drafted`` says whether a propose call is (True) or is not (False) part of the step;
        ``draft_budget``: the budget the drafter was asked for (one propose at the largest candidate, then
        truncated), default each candidate's own budget. ``tree_pairs`` (like ``budgets``): each
        candidate's tree attention pairs (:func:`tree_pairs_of`), default the even-spread estimate;
        ``head_levels`` (like ``budgets``): the expected output-head calls beyond the first (default 0),
        priced by ``head`` once it has measured a call (then the first call too), else by ``v``."""
        # Written out (no full feature matrices): the policy calls this every step for every candidate.
        k = np.asarray(budgets, dtype=np.float64)
        n_batched = batch_size + k
        f = self.forward.coef
        oa, ob, oc = self.verify.coef
        da, db, dc = self.draft.coef
        pairs = tree_pairs_estimate(batch_size, n_context, k) if tree_pairs is None else tree_pairs
        fwd = f[0] * n_context + token_segments(n_batched) @ f[_SEG] + f[_ATT] * np.asarray(pairs)
        levels = np.asarray(0.0 if head_levels is None else head_levels, dtype=np.float64)
        if self.head.measured:
            nodes = k if self.head_per_call else None
            fwd = fwd + self.head.step_s(batch_size, levels, nodes, self.head_one_call)
        else:
            fwd = fwd + f[_LEV] * levels
        fwd = fwd + f[-2] * (k > 0) + f[-1]
        ver = oa * batch_size + ob * n_batched + oc
        kd = k if draft_budget is None else float(draft_budget)
        drf = da * batch_size + db * kd + dc + 0.0 * k
        if drafted is None:
            drf = np.where(k > 0, drf, 0.0)
        elif not drafted:
            drf = np.zeros_like(k)
        return StepCost(np.maximum(fwd, 0.0), np.maximum(drf, 0.0), np.maximum(ver, 0.0))

    def measured_tokens(self) -> int:
        """The most tokens any forward in the model's window scored (0 before the first step)."""
        if not self.forward.num_samples:
            return 0
        seg = np.stack(self.forward._xs)[:, _SEG]
        return round(1 + float(seg.sum(axis=1).max()))

    def prefill_time(self, prompt_tokens: int) -> float:
        """Predicted time of prefilling one prompt of ``prompt_tokens`` tokens in its own forward (as the
        engine does between steps): a forward with no committed context and every token batched. Beyond
        the largest forward measured, the mean slope over the measured sizes is kept (the token segments
        there hold only the prior, which prices sizes the budget policy should try, not prefills)."""
        n = float(prompt_tokens)
        fwd = float(self.forward.predict(np.array(forward_features(0, n, n, 0.0))))
        m = self.measured_tokens()
        if n > m >= 2:
            at = lambda x: float(self.forward.predict(np.array(forward_features(0, x, x, 0.0))))  # noqa: E731
            fwd = max(fwd, at(m) + (n - m) * (at(m) - at(1)) / (m - 1))
        ver = self.verify.predict(np.array([1.0, 1.0, 1.0]))
        return float(max(fwd, 0.0) + max(ver, 0.0))

    def draft_time(self, batch_size: int, budget: int) -> float:
        return max(0.0, float(self.draft.predict(np.array([batch_size, budget, 1.0]))))

    # -- online update ------------------------------------------------------------------------------
    def observe(
        self, step: StepRecord, *, drafted: bool | None = None, tree_pairs: float | None = None
    ) -> None:
        """Adds one measured step (the engine's record); each part refits every few samples. ``drafted``:
        whether the drafter was called (default: the step has drafting time and a budget), its budget the
        plan's total; ``tree_pairs``: the trees' attention pairs (:func:`tree_pairs_of`; default the
        even-spread estimate). The output head's calls beyond the first are the longest accepted path; a
        step that reports its head's time (``head_s``) has its calls measured in ``head`` (``head_calls``
        of them, else one per level) and the rest of its forward fitted."""
        b = step.batch_size
        if b < 1:
            raise ValueError(f"a step of no request cannot be observed: {step}")
        if drafted is None:
            drafted = step.draft_s > 0 and step.draft_budget > 0
        levels = int(max(step.accepted, default=0))
        if step.head_s > 0 and not self.head_per_call:  # timed calls: HeadCost's, not the forward fit's
            self.head.record(b, step.head_s / (step.head_calls or 1 + levels))
        timed = self.head.measured
        x = forward_features(step.context_tokens, step.num_nodes, b, tree_pairs, 0.0 if timed else levels)
        self.forward.add(x, step.forward_s - step.head_s)
        if drafted and step.draft_budget > 0 and step.draft_s > 0:
            self.draft.add([b, step.draft_budget, 1.0], step.draft_s)
        self.verify.add([b, step.num_nodes, 1.0], step.verify_s)

    def fit(self, steps, **kw) -> CostModel:
        """Adds every step (``observe``, with ``kw``) then refits all parts (a calibration run or a saved
        profile's samples)."""
        for t in steps:
            self.observe(t, **kw)
        for part in (self.forward, self.draft, self.verify):
            if part.num_samples:
                part.refit()
        return self

    # -- persistence --------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        f = self.forward.coef
        return {
            "version": PROFILE_VERSION,
            "meta": self.meta,
            "forward": {
                "n_context": float(f[0]),
                "knots": list(KNOTS),
                "n_batched": [float(v) for v in f[_SEG]],  # slope per segment after each knot, s/token
                "tree_attention": float(f[_ATT]),  # s per query-key pair the trees add
                "head_levels": float(f[_LEV]),  # s per output-head call beyond the first
                "tree": float(f[-2]),
                "const": float(f[-1]),
            },
            "draft": dict(zip(DRAFT_FEATURES, map(float, self.draft.coef), strict=True)),
            "verify": dict(zip(VERIFY_FEATURES, map(float, self.verify.coef), strict=True)),
            "head": self.head.to_dict(),  # seconds per output-head call by rows
        }

    @classmethod
    def from_dict(cls, d: dict, **kw) -> CostModel:
        """A model seeded by a profile (``to_dict``; version 1 profiles, with one token slope, load too)."""
        if not isinstance(d, dict) or d.get("version") not in range(1, PROFILE_VERSION + 1):
            raise ValueError(f"not a cost profile of version 1 to {PROFILE_VERSION}")
        try:
            fw = d["forward"]
            slopes = fw["n_batched"]
            if d["version"] >= 2 and list(fw.get("knots", [])) != list(KNOTS):
                raise ValueError(f"cost profile has token knots {fw.get('knots')}, this sssd uses {KNOTS}")
            slopes = float(slopes) if d["version"] == 1 else [float(v) for v in slopes]
            forward = (
                float(fw["n_context"]), slopes, float(fw.get("tree", 0.0)), float(fw["const"]),
                float(fw.get("tree_attention", 0.0)), float(fw.get("head_levels", 0.0)),
            )  # fmt: skip
            verify_part = "verify" if "verify" in d else "other"  # "other" up to version 3
            head = HeadCost.from_dict(d.get("head", {}))
            draft, verify = (
                tuple(float(d[part][f]) for f in feats)
                for part, feats in (("draft", DRAFT_FEATURES), (verify_part, VERIFY_FEATURES))
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"cost profile is missing a coefficient: {e}") from None
        values = [forward[0], *np.ravel(forward[1]), *forward[2:], *draft, *verify]
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ValueError("cost profile coefficients must be finite and non-negative")
        return cls(forward, draft, verify, head=head, meta=d.get("meta", {}), **kw)

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
        f, d, o = self.forward.coef, self.draft.coef, self.verify.coef
        at = {n: float(self.predict(1, 0, n - 1, drafted=False).forward) for n in (1, 8, 32, 128)}
        return (
            f"CostModel(forward={f[0]:.3g}·ctx + {f[-2]:.3g}·tree + g(tokens) with g(1) = {at[1]:.3g}, "
            f"g(8) = {at[8]:.3g}, g(32) = {at[32]:.3g}, g(128) = {at[128]:.3g} (context 0), "
            f"draft={d[0]:.3g}·B + {d[1]:.3g}·k + {d[2]:.3g}, "
            f"verify={o[0]:.3g}·B + {o[1]:.3g}·tok + {o[2]:.3g})"
        )
