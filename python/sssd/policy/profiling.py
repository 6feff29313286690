"""Measure a model's step cost on this machine and fit the :class:`~sssd.policy.cost_model.CostModel` profile.

Forward: an engine runs steps over a grid of (batch size, context length, tree tokens) with a synthetic
drafter (random trees of exactly the requested size: acceptance ≈ 0, so contexts stay near the grid
point) and a recording budget policy; every step's own timing (forward, verification/bookkeeping) is a
sample. The caller builds the engines (``make_engine``: ``sssd.cli.profile.engine_factory``), so the
policy layer never imports the engine. Drafting: the real drafter's ``propose`` is timed over a grid of
(batch size, budget) on recorded pairs. Both are fitted robustly and saved as JSON with the raw samples
and machine metadata.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from sssd.policy.cost_model import CostModel, forward_features
from sssd.policy.interface import PlainDraftBatch, StepRecord


@dataclass(frozen=True)
class ProfileGrid:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    contexts: tuple[int, ...] = (64, 256, 768)  # prompt tokens per request
    budgets: tuple[int, ...] = (0, 8, 16, 32, 64)  # global tree tokens (non-root) per step
    steps: int = 3  # measured steps per point (after one warm-up step)
    draft_batch_sizes: tuple[int, ...] = (1, 4, 16, 32)
    draft_budgets: tuple[int, ...] = (8, 32, 64, 128)
    draft_repeats: int = 5

    @classmethod
    def quick(cls) -> ProfileGrid:
        return cls((1, 4), (64, 256), (0, 16, 64), 2, (1, 8), (16, 64), 3)


class SyntheticDrafter:
    """Drafter API stand-in proposing random trees of exactly the requested global budget (split evenly
    over the requests), for timing the forward pass; random tokens are (almost) never accepted."""

    def __init__(self, vocab_size: int, seed: int = 0, fanout: int = 3) -> None:
        self.vocab_size = int(vocab_size)
        self.rng = np.random.default_rng(seed)
        self.fanout = fanout
        self._last: dict[int, int] = {}

    def add_request(self, rid: int, prompt_ids) -> None:
        self._last[rid] = int(np.asarray(prompt_ids)[-1])

    def extend(self, rid: int, new_ids) -> None:
        if len(new_ids):
            self._last[rid] = int(np.asarray(new_ids)[-1])

    def remove_request(self, rid: int) -> None:
        self._last.pop(rid, None)

    def observe(self, rids, batch, on_path) -> None:
        pass

    def propose(self, rids: Sequence[int], budget=0, slo=None):
        rids = list(rids)
        b = len(rids)
        if isinstance(budget, (int, np.integer)):
            per = np.full(b, int(budget) // b) + (np.arange(b) < int(budget) % b)
        else:
            per = np.asarray(budget, dtype=np.int64)
        tokens, parents, depth, offsets = [], [], [], [0]
        for rid, k in zip(rids, per, strict=True):
            tokens.append(self._last[rid])
            parents.append(-1)
            depth.append(0)
            base = len(depth) - 1
            for j in range(1, int(k) + 1):
                p = int(self.rng.integers(max(0, j - self.fanout), j))
                tokens.append(int(self.rng.integers(0, self.vocab_size)))
                parents.append(p)
                depth.append(depth[base + p] + 1)
            offsets.append(len(tokens))
        n = len(tokens)
        return PlainDraftBatch(
            np.array(tokens, dtype=np.int32),
            np.array(parents, dtype=np.int32),
            np.where(np.array(parents) < 0, 1.0, 0.0).astype(np.float32),
            np.array(depth, dtype=np.int32),
            np.array(offsets, dtype=np.int64),
            np.where(np.array(parents) < 0, -1, np.arange(n)).astype(np.int32),
            np.zeros(n - b + 1),
        )


class _Recorder:
    """Budget policy for profiling: plans ``budget``; keeps the engine's step records."""

    def __init__(self) -> None:
        self.budget = 0
        self.steps: list[StepRecord] = []

    def plan(self, view) -> int:
        return self.budget

    def observe(self, step: StepRecord) -> None:
        self.steps.append(step)


# make_engine(drafter, policy, max_batch_size, cache_rows) -> an engine (``sssd.Engine``) running the
# model with that drafter and budget policy, at most max_batch_size requests, cache_rows KV rows each.
EngineFactory = Callable[[Any, Any, int, int], Any]


def profile_forward(
    make_engine: EngineFactory,
    vocab_size: int,
    grid: ProfileGrid,
    *,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[StepRecord]:
    """Engine steps over the grid; the record of each measured step (its drafting time left out: the
    synthetic drafter's is not the real one's, ``profile_drafting`` times that).

    make_engine: builds one engine per (batch size, context) point, see ``EngineFactory``; vocab_size:
    the model's vocabulary (random prompt and draft tokens are drawn below it).
    """
    vocab = int(vocab_size)
    rng = np.random.default_rng(seed)
    out: list[StepRecord] = []
    for b in grid.batch_sizes:
        for ctx in grid.contexts:
            rec = _Recorder()
            eng = make_engine(SyntheticDrafter(vocab, seed), rec, b, ctx + 256)
            for _ in range(b):
                prompt = rng.integers(3, vocab, ctx).tolist()
                eng.add_request(prompt, max_new_tokens=10_000, eos_token_ids=[])
            for k in grid.budgets:
                rec.budget = k
                eng.step()  # warm-up (and admission/prefill on the first point)
                start = len(rec.steps)
                for _ in range(grid.steps):
                    eng.step()
                out.extend(replace(t, draft_s=0.0) for t in rec.steps[start:])
                if progress:
                    ms = 1e3 * np.median([t.forward_s for t in rec.steps[start:]])
                    progress(f"forward  batch {b:3d}  context {ctx:5d}  tree {k:4d}: {ms:8.2f} ms")
    return out


def profile_drafting(
    make_drafter: Callable[[], Any],
    contexts: Sequence[np.ndarray],
    grid: ProfileGrid,
    *,
    progress: Callable[[str], None] | None = None,
) -> list[tuple[int, int, float]]:
    """(batch size, budget, seconds) of ``propose`` calls; requests' contexts cycle through ``contexts``."""
    out = []
    for b in grid.draft_batch_sizes:
        drafter = make_drafter()
        rids = list(range(b))
        for i in rids:
            drafter.add_request(i, np.asarray(contexts[i % len(contexts)], dtype=np.int32))
        for k in grid.draft_budgets:
            drafter.propose(rids, budget=k)  # warm-up
            times = []
            for _ in range(grid.draft_repeats):
                t0 = time.perf_counter()
                drafter.propose(rids, budget=k)
                times.append(time.perf_counter() - t0)
            out.extend((b, k, t) for t in times)
            if progress:
                progress(f"drafting batch {b:3d}  budget {k:4d}: {1e3 * np.median(times):8.3f} ms")
    return out


def fit_profile(forward: Sequence[StepRecord], drafting: Sequence[tuple[int, int, float]], meta=None):
    """A CostModel fitted on the samples alone (no prior)."""
    cm = CostModel(prior_weight=0.0, window=max(16, len(forward) + len(drafting)), forget=1.0, meta=meta)
    for s in forward:
        cm.observe(s)
    for b, k, t in drafting:
        cm.draft.add([b, k, 1.0], t)
    for part in (cm.forward, cm.draft, cm.verify):
        if part.num_samples:
            part.refit()
    return cm


def machine_meta(model_name: str) -> dict:
    import torch

    dev = "cuda:" + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {
        "model": model_name,
        "device": dev,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def samples_json(forward: Sequence[StepRecord], drafting) -> dict:
    return {
        "forward_samples": [asdict(s) for s in forward],
        "draft_samples": [{"batch_size": b, "budget": k, "seconds": t} for b, k, t in drafting],
    }


# the forward samples' field names in profiles written before a step had one record (StepRecord)
_OLD_SAMPLE_NAMES = {"n_context": "context_tokens", "n_batched": "num_nodes", "other_s": "verify_s"}


def step_from_json(d: dict) -> StepRecord:
    """A forward sample of a profile file (``samples_json``; older files' names are read too)."""
    d = {_OLD_SAMPLE_NAMES.get(k, k): v for k, v in d.items() if k not in ("tree_pairs", "head_levels")}
    try:
        return StepRecord(**d)
    except TypeError as e:
        raise ValueError(f"not a step record of a cost profile: {e}") from None


def fit_error(cm: CostModel, forward: Sequence[StepRecord]) -> float:
    """Median relative error of the fitted forward model on its samples."""
    if not forward:
        return float("nan")
    x = np.array([forward_features(s.context_tokens, s.num_nodes, s.batch_size) for s in forward])
    y = np.array([s.forward_s for s in forward])
    return float(np.median(np.abs(cm.forward.predict(x) - y) / np.maximum(y, 1e-9)))
