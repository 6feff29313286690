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

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sssd.checks import check_int, check_real, is_int


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
        # every field checked and stored as a plain Python value: numpy scalars are accepted alike
        # (np.float32(0.7) as well as np.int32(4)); a wrong type is a TypeError naming the field
        put = functools.partial(object.__setattr__, self)
        put("max_new_tokens", check_int(self.max_new_tokens, "max_new_tokens", lo=1))
        t = check_real(self.temperature, "temperature")
        if t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t}")
        put("temperature", t)
        put("top_k", check_int(self.top_k, "top_k (0 = off)", lo=0))
        p = check_real(self.top_p, "top_p")
        if not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {p}")
        put("top_p", p)
        if self.seed is not None:
            put("seed", check_int(self.seed, "seed", lo=0))
        put("stop", _stop_strings(self.stop))
        if self.eos_token_ids is not None:
            put("eos_token_ids", _token_ids(self.eos_token_ids, "eos_token_ids"))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _stop_strings(stop: Any) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings: one string, or an iterable of them."""
    if isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, (bytes, bytearray)) or not isinstance(stop, Iterable):
        raise TypeError(f"stop must be a string or a sequence of strings, got {type(stop).__name__} {stop!r}")
    out = tuple(stop)
    for s in out:
        if not isinstance(s, str):
            raise TypeError(f"stop must hold strings, got {type(s).__name__} {s!r}")
        if not s:
            raise ValueError("stop strings must not be empty")
    return tuple(str(s) for s in out)


def _token_ids(ids: Any, name: str) -> tuple[int, ...]:
    """``ids`` (one token id or an iterable of them; ints or numpy integers) as a tuple of ints >= 0."""
    if is_int(ids):
        ids = (ids,)
    elif isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        what = f"{type(ids).__name__} {ids!r}"
        raise TypeError(f"{name} must be a token id or a sequence of token ids, got {what}")
    return tuple(check_int(i, f"{name} entries", lo=0) for i in ids)


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
    second 64-bit word (each position owns 2^64 blocks, so the streams of two positions never overlap)."""
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
    unknown = sorted(set(kw) - set(base.__dataclass_fields__))
    if unknown:
        raise TypeError(
            f"unknown sampling parameter(s) {', '.join(unknown)}; SamplingParams has "
            f"{', '.join(base.__dataclass_fields__)}"
        )
    if stop is not None:
        kw["stop"] = stop
    if not kw:
        return base
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    fields.update(kw)
    return SamplingParams(**fields)
