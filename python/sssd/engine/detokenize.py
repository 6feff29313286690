"""Incremental detokenization: the text of a growing token sequence, one short decode per new token.

Decoding the whole output again at every step costs O(length) per step and can emit half a character when
a multi-byte character spans tokens. Here the text is decoded from a short window instead: ``prefix``
marks where the window starts (tokens before it are already text), ``read`` marks how far the text has
been emitted. For each new token the window ``tokens[prefix:]`` is decoded and compared with the decode of
``tokens[prefix:read]``; the difference is new text, emitted only when it does not end in an incomplete
character (U+FFFD, what a tokenizer's byte-level decode gives for bytes that do not form a character yet).
Then the window slides forward. Decoding a window rather than single tokens keeps tokenizers that merge
or strip spaces at token boundaries (SentencePiece's leading space) correct: the window always starts at
a token whose text is already known.

The window holds the few tokens since the last emitted text (more only while a character is incomplete),
so each token costs two decodes of a handful of tokens whatever the output's length. The concatenated
deltas plus the final :meth:`IncrementalDetokenizer.finish` are the text of the whole sequence.
"""

from __future__ import annotations

from typing import Any

INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """Text of ``tokens`` (a list the caller appends to), produced as deltas by :meth:`push`.

    ``tokenizer``: anything with ``decode(ids, skip_special_tokens=...)`` (a Hugging Face tokenizer).
    Special tokens (EOS, chat markers) are skipped, as in ``tokenizer.decode(tokens,
    skip_special_tokens=True)``.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.prefix = 0  # window start: tokens before it are text already
        self.read = 0  # tokens up to here have been emitted as text
        self.pending = ""  # text of tokens past ``read`` that is not emitted yet (ends incomplete)
        self._chunks: list[str] = []
        self._length = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, tokens: list[int]) -> str:
        """The new text after ``tokens`` grew (by one or more tokens since the last call): the delta,
        possibly empty while a character is incomplete. ``self.pending`` then holds what is held back as
        the tokenizer decodes it now (U+FFFD for the incomplete tail), for callers that look for stop
        strings: text + pending is ``decode(tokens)``."""
        prefix_text = self._decode(tokens[self.prefix : self.read])
        window_text = self._decode(tokens[self.prefix :])
        if len(window_text) > len(prefix_text) and not window_text.endswith(INCOMPLETE):
            delta = window_text[len(prefix_text) :]
            self.prefix, self.read = self.read, len(tokens)
            self.pending = ""
            self._add(delta)
            return delta
        self.pending = window_text[len(prefix_text) :]
        return ""

    def finish(self, tokens: list[int]) -> str:
        """The rest of the text once ``tokens`` is final (incomplete characters included, as the
        tokenizer decodes them)."""
        prefix_text = self._decode(tokens[self.prefix : self.read])
        window_text = self._decode(tokens[self.prefix :])
        delta = window_text[len(prefix_text) :] if len(window_text) > len(prefix_text) else ""
        self.prefix = self.read = len(tokens)
        self.pending = ""
        self._add(delta)
        return delta

    def _add(self, delta: str) -> None:
        if delta:
            self._chunks.append(delta)
            self._length += len(delta)

    def tail(self, n: int) -> str:
        """The last ``n`` characters of the text emitted so far (cost independent of its length)."""
        if n <= 0:
            return ""
        out: list[str] = []
        need = n
        for chunk in reversed(self._chunks):
            out.append(chunk[-need:])
            need -= len(out[-1])
            if need <= 0:
                break
        return "".join(reversed(out))

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""
