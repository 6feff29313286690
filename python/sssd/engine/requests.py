"""Requests of the engine: their state, stop conditions, statistics and the results handed back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sssd.engine.chat import chat_prompt_ids, is_messages
from sssd.engine.detokenize import INCOMPLETE, IncrementalDetokenizer
from sssd.engine.sampling import SamplingParams, draw_key, position_draws
from sssd.policy.interface import renamed_time


@dataclass
class RequestStats:
    """Per-request counters. Times are seconds of the steps the request took part in (shared steps count
    fully for each of their requests)."""

    steps: int = 0
    tokens: int = 0  # output tokens kept
    accepted: int = 0  # draft tokens accepted (before any stop truncation)
    draft_nodes: int = 0  # non-root nodes verified
    draft_s: float = 0.0  # the phases' names of sssd.policy.interface.StepRecord
    forward_s: float = 0.0
    step_s: float = 0.0
    prefill_s: float = 0.0

    __getattr__ = renamed_time  # the old names (draft_time, ...) still read, with a DeprecationWarning

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
    finish_reason: str  # "eos" | "length" | "stop" | "context" | "abort" | "error"
    stats: RequestStats
    error: str | None = None  # finish_reason "error": what failed (e.g. the tokenizer's decode)


@dataclass(frozen=True)
class StreamEvent:
    """Tokens of one request accepted in one step, and the text they added (incrementally detokenized:
    the texts of a request's events concatenate to its result's text)."""

    request_id: int
    tokens: list[int]  # new tokens
    text: str  # new text (empty without a tokenizer)
    finished: bool
    finish_reason: str | None = None
    result: GenerationResult | None = None  # set on the request's last event


def as_prompt_ids(prompt: Any, tokenizer: Any, vocab_size: int) -> np.ndarray:
    """int64 ``[n]`` token ids of a prompt given as text (used as is; needs a tokenizer), as chat messages
    (a list of ``{"role", "content"}`` dicts, rendered by the tokenizer's chat template with the generation
    prompt: ``sssd.engine.chat``) or as token ids."""
    if is_messages(prompt):
        ids = np.asarray(chat_prompt_ids(prompt, tokenizer), dtype=np.int64)
    elif isinstance(prompt, str):
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
    key: np.ndarray | None = None  # uint64 [2] key of the sampling draws (None: greedy), see draws()
    owner: int | None = None  # the generate() / stream() whose request it is (None: step()'s caller)
    _detok: IncrementalDetokenizer | None = field(default=None, repr=False)
    _text_done: bool = False
    _stop_len: int = 0
    _checked: int = 0  # output tokens whose stop conditions were checked (an interrupt may leave one out)
    _stop_seen: int = 0  # characters of complete text searched for stop strings
    emitted: int = 0  # output tokens handed out in StreamEvents
    emitted_text: int = 0  # and characters of their text
    drafter_tokens: int = -1  # tokens of this request the drafter holds (-1: none / unknown; engine.recovery)
    draft_failures: int = 0
    draft_retry: int = 0  # the drafter step from which its drafter state may be rebuilt again
    error: str | None = None

    def __post_init__(self) -> None:
        if not self.params.greedy:
            self.key = draw_key(self.params.seed)
        if self.tokenizer is not None:
            self._detok = IncrementalDetokenizer(self.tokenizer)
        self._stop_len = max((len(s) for s in self.params.stop), default=0)

    @property
    def last_token(self) -> int:
        return int(self.output[-1]) if self.output else int(self.prompt[-1])

    @property
    def context_len(self) -> int:
        return len(self.prompt) + len(self.output)

    def draws(self, position: int) -> np.random.Generator:
        """The random numbers for this request's token at ``position`` (index in prompt + output): a
        function of the seed and the position only, so a step that is run again draws the same."""
        return position_draws(self.key, position)

    @property
    def remaining(self) -> int:
        """Tokens this request may still produce."""
        return min(self.params.max_new_tokens - len(self.output), self.max_context - self.context_len)

    def append(self, new: list[int]) -> list[int]:
        """Add a step's tokens; applies stop strings, EOS, max_new_tokens and the context limit (tokens
        after the one that finishes the request are dropped). Returns the tokens kept. With a tokenizer the
        text grows incrementally (``peek_text`` gives what is new since ``handed_out``).

        The tokens are the truth and each is checked right after it arrives; an interrupt between the two
        leaves the newest token unchecked, which :meth:`catch_up` checks (the checks can run twice)."""
        kept: list[int] = []
        for t in new:
            if self.finish_reason:
                break
            self.output.append(int(t))
            kept.append(int(t))
            self._check_newest()
        if self.finish_reason:
            self.finish_text()
        self.stats.tokens = len(self.output)
        return kept

    def _check_newest(self) -> None:
        t = self.output[-1]
        if self._detok is not None and self._grow_text():
            self.finish_reason = "stop"  # a stop string wins over EOS / length at the same token
        elif t in self.eos:
            self.finish_reason = "eos"
        elif len(self.output) >= self.params.max_new_tokens:
            self.finish_reason = "length"
        elif self.context_len >= self.max_context:
            self.finish_reason = "context"
        self._checked = len(self.output)

    def catch_up(self) -> None:
        """After an interrupted ``append``: check the newest token if its checks did not run."""
        if self._checked < len(self.output) and not self.finish_reason:
            self._check_newest()

    def _grow_text(self) -> bool:
        """Detokenize the newest token; True when the text now contains a stop string. Only complete
        characters count: the text, and what is held back of the newest characters up to an incomplete
        one (U+FFFD as the tokenizer decodes a partial character is no character yet). Only the characters
        new since the last search and the ones before them that a stop string can span are searched, so
        the cost does not grow with the output; a search run again finds what the first one found."""
        detok = self._detok
        detok.push(self.output)
        if not self._stop_len:
            return False
        held = detok.pending.rstrip(INCOMPLETE)
        total = detok.length + len(held)
        need = max(total - self._stop_seen, 1) + self._stop_len - 1
        window = held[-need:] if need <= len(held) else detok.tail(need - len(held)) + held
        if any(s in window for s in self.params.stop):
            return True
        self._stop_seen = total
        return False

    def finish_text(self) -> None:
        """Flush the text of a finished request (an incomplete last character as the tokenizer decodes it)."""
        if self._detok is not None and not self._text_done:
            self._detok.finish(self.output)
            self._text_done = True

    def fail(self, message: str) -> None:
        """Finish with ``finish_reason="error"``; the text stays what was decoded before the failure."""
        self.finish_reason = "error"
        self.error = message
        self._text_done = True

    def peek_text(self) -> str:
        """The text added since the last ``handed_out``."""
        detok = self._detok
        return "" if detok is None else detok.tail(detok.length - self.emitted_text)

    def handed_out(self, tokens: int | None = None, chars: int | None = None) -> None:
        """The first ``tokens`` output tokens and ``chars`` characters of text (default: all so far)
        reached the caller (in StreamEvents)."""
        if tokens is None:
            tokens, chars = len(self.output), (0 if self._detok is None else self._detok.length)
        self.emitted, self.emitted_text = tokens, chars

    def text(self) -> str:
        """The output's text so far (complete once the request finished)."""
        return "" if self._detok is None else self._detok.text

    def result(self) -> GenerationResult:
        return GenerationResult(
            request_id=self.rid,
            prompt_tokens=self.prompt.tolist(),
            tokens=list(self.output),
            text=self.text(),
            finish_reason=self.finish_reason or "length",
            stats=self.stats,
            error=self.error,
        )
