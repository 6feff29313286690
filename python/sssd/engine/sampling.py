"""Sampling parameters and the target distribution they define (temperature, top-k, top-p).

The random numbers of a sampling request are a function of its seed and the position of the token being
drawn: the token at position ``i`` (its index in prompt + output) uses the uniforms of a counter-based
generator (Philox) keyed by the seed, with ``i`` in the counter (:func:`position_draws`). Plain decoding
and tree verification draw the token at ``i`` with the first uniform of that stream (inverse CDF);
SpecInfer's acceptance tests and residual draw at ``i`` take the next ones. So

- with the same seed, speculative sampling of deterministic drafts yields the very tokens plain sampling
  yields, not just the same distribution;
- a step that is interrupted (an exception, ``KeyboardInterrupt``) and run again draws the same numbers
  for the same positions: nothing about the generator has to be saved or restored, and a faulted run
  samples exactly the fault-free run's tokens. (With SpecInfer the token also depends on the draft tree,
  so a drafter fault that changes a tree can change the sample; it stays a valid sample.)
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
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be an int >= 0 or None, got {self.seed}")
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
    """float64 ``[n, V]`` probabilities of the LLM at each of ``n`` nodes under ``params`` (sampling only).

    The row maximum is subtracted before dividing by the temperature: any temperature > 0, down to the
    smallest subnormal, then gives finite logits <= 0 with a 0 at the maximum (a tiny temperature is the
    greedy limit, ties shared), so no inf or NaN reaches the softmax."""
    x = logits.double()
    x = (x - x.max(dim=-1, keepdim=True).values) / params.temperature
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


def draw_key(seed: int | None) -> np.ndarray:
    """The uint64 ``[2]`` Philox key of a request's draws: from its seed, or fresh entropy when None."""
    return np.random.SeedSequence(seed).generate_state(2, np.uint64)


def position_draws(key: np.ndarray, position: int) -> np.random.Generator:
    """The generator of the token at ``position``: Philox keyed by ``key``, the position in the counter's
    second 64-bit word (each position owns 2^64 blocks, so the streams of two positions never overlap).
    About 7 µs to create."""
    return np.random.Generator(np.random.Philox(key=key, counter=int(position) << 64))


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
