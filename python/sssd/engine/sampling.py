"""Sampling parameters and the target distribution they define (temperature, top-k, top-p).

Every output token of a sampling request is drawn with exactly one uniform number from the request's own
``numpy.random.Generator`` (inverse CDF), whether it comes from plain decoding or from a verified tree.
So with the same seed, speculative sampling of deterministic drafts yields the very tokens plain
sampling yields, not just the same distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request decodes. ``temperature == 0`` is greedy (top-k/top-p ignored).

    ``eos_token_ids``: None = the model's/tokenizer's EOS tokens; ``()`` = never stop on a token.
    ``stop``: strings; generation ends with the token that completes one (tokens after it are dropped).
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, (int, np.integer)):
            raise TypeError(f"max_new_tokens must be an int, got {type(self.max_new_tokens).__name__}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not (0.0 < p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
        ):
            raise TypeError(f"seed must be an int or None, got {type(self.seed).__name__}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        if self.eos_token_ids is not None:
            ids = (self.eos_token_ids,) if isinstance(self.eos_token_ids, int) else tuple(self.eos_token_ids)
            if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0 for i in ids):
                raise ValueError(f"eos_token_ids must be non-negative ints, got {self.eos_token_ids!r}")
            object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_probs(logits: torch.Tensor, params: SamplingParams) -> np.ndarray:
    """float64 ``[n, V]`` probabilities of the LLM at each of ``n`` nodes under ``params`` (sampling only)."""
    x = logits.double() / params.temperature
    v = x.shape[-1]
    if 0 < params.top_k < v:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        p = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(p, dim=-1) - p  # mass strictly before each token
        drop_sorted = before >= params.top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1).cpu().numpy()


def sample_from(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from ``probs`` ``[V]`` with one uniform draw (inverse CDF)."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1))


def eos_defaults(model: object, tokenizer: object) -> tuple[int, ...]:
    """EOS ids of the model's generation config and the tokenizer."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if src is None:
            continue
        ids.extend([src] if isinstance(src, int) else list(src))
    return tuple(sorted(set(int(i) for i in ids)))


def as_params(params: SamplingParams | None, overrides: dict, *, stop: Sequence[str] | str | None = None):
    """``params`` with keyword overrides applied (None values ignored)."""
    base = params or SamplingParams()
    kw = {k: v for k, v in overrides.items() if v is not None}
    if stop is not None:
        kw["stop"] = stop
    if not kw:
        return base
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    fields.update(kw)
    return SamplingParams(**fields)
