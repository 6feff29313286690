"""Requests of the engine: their state, stop conditions, statistics and the results handed back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sssd.engine.sampling import SamplingParams


@dataclass
class RequestStats:
    """Per-request counters. Times are seconds of the steps the request took part in (shared steps count
    fully for each of their requests)."""

    steps: int = 0
    tokens: int = 0  # output tokens kept
    accepted: int = 0  # draft tokens accepted (before any stop truncation)
    draft_nodes: int = 0  # non-root nodes verified
    draft_time: float = 0.0
    forward_time: float = 0.0
    step_time: float = 0.0
    prefill_time: float = 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def accepted_per_step(self) -> float:
        return self.accepted / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class GenerationResult:
    request_id: int
    prompt_tokens: list[int]
    tokens: list[int]  # generated tokens (the EOS / stop-completing token included)
    text: str
    finish_reason: str  # "eos" | "length" | "stop" | "context"
    stats: RequestStats


@dataclass(frozen=True)
class StreamEvent:
    """Tokens of one request accepted in one step."""

    request_id: int
    tokens: list[int]  # new tokens
    text: str  # new text (empty without a tokenizer)
    finished: bool
    finish_reason: str | None = None
    result: GenerationResult | None = None  # set on the request's last event


def as_prompt_ids(prompt: Any, tokenizer: Any, vocab_size: int) -> np.ndarray:
    """int64 ``[n]`` token ids of a prompt given as text (needs a tokenizer) or as token ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer; pass token ids or give the Engine a tokenizer")
        if not prompt:
            raise ValueError("empty prompt")
        ids = np.asarray(tokenizer(prompt)["input_ids"], dtype=np.int64)
    else:
        try:
            ids = np.asarray(prompt)
        except Exception as e:
            raise TypeError(
                f"a prompt must be a string or a sequence of token ids, got {type(prompt).__name__}"
            ) from e
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise TypeError(f"a prompt must be a string or a 1-D sequence of token ids, got {prompt!r:.80}")
        ids = ids.astype(np.int64)
    if ids.size == 0:
        raise ValueError("empty prompt")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}), got {ids.min()}..{ids.max()}")
    return ids


@dataclass
class Request:
    rid: int
    prompt: np.ndarray  # [n] int64
    params: SamplingParams
    eos: frozenset[int]
    budget: int | None  # own tree budget, None = the engine's policy decides
    max_context: int
    tokenizer: Any = None
    output: list[int] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    finish_reason: str | None = None
    rng: np.random.Generator | None = None
    _text_len: int = 0

    def __post_init__(self) -> None:
        if not self.params.greedy:
            self.rng = np.random.default_rng(self.params.seed)

    @property
    def last_token(self) -> int:
        return int(self.output[-1]) if self.output else int(self.prompt[-1])

    @property
    def context_len(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def remaining(self) -> int:
        """Tokens this request may still produce."""
        return min(self.params.max_new_tokens - len(self.output), self.max_context - self.context_len)

    def append(self, new: list[int]) -> list[int]:
        """Add a step's tokens; applies EOS, max_new_tokens, context and stop strings (tokens after a stop
        are dropped). Returns the tokens kept."""
        kept: list[int] = []
        for t in new:
            kept.append(int(t))
            self.output.append(int(t))
            if t in self.eos:
                self.finish_reason = "eos"
            elif len(self.output) >= self.params.max_new_tokens:
                self.finish_reason = "length"
            elif self.context_len >= self.max_context:
                self.finish_reason = "context"
            if self.finish_reason:
                break
        if self.params.stop and self.tokenizer is not None:
            cut = self._stop_cut(len(self.output) - len(kept))
            if cut is not None:
                drop = len(self.output) - cut
                del self.output[cut:]
                kept = kept[: len(kept) - drop]
                self.finish_reason = "stop"
        self.stats.tokens = len(self.output)
        return kept

    def _stop_cut(self, before: int) -> int | None:
        """Smallest output length > ``before`` whose text contains a stop string, if any."""
        longest = max(len(s) for s in self.params.stop)
        text = self.text()
        start = max(0, self._text_len - longest - 8)
        if not any(s in text[start:] for s in self.params.stop):
            self._text_len = len(text)
            return None
        for k in range(before + 1, len(self.output) + 1):
            if any(
                s in self.tokenizer.decode(self.output[:k], skip_special_tokens=True)
                for s in self.params.stop
            ):
                return k
        return None

    def text(self) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(self.output, skip_special_tokens=True)

    def result(self) -> GenerationResult:
        return GenerationResult(
            request_id=self.rid,
            prompt_tokens=self.prompt.tolist(),
            tokens=list(self.output),
            text=self.text(),
            finish_reason=self.finish_reason or "length",
            stats=self.stats,
        )
