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


class DecodeError(RuntimeError):
    """The tokenizer's ``decode`` raised (the message names the original error): the request whose tokens
    it could not decode fails alone (``sssd.engine.engine.Engine._append``)."""


class IncrementalDetokenizer:
    """Text of ``tokens`` (a list the caller appends to), produced as deltas by :meth:`push`.

    ``tokenizer``: anything with ``decode(ids, skip_special_tokens=...)`` (a Hugging Face tokenizer).
    Special tokens (EOS, chat markers) are skipped, as in ``tokenizer.decode(tokens,
    skip_special_tokens=True)``.

    The emitted text is kept in pieces, each with the window after it (``prefix``, ``read``) and the text's
    length: appending a piece is the one statement that commits a step, so an interrupt leaves the state as
    it was before the step or after it, and a ``push`` or ``finish`` run again changes nothing.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.pending = ""  # text of tokens past ``read`` that is not emitted yet (ends incomplete)
        self._pieces: list[tuple[str, int, int, int]] = []  # (text, prefix, read, length) after each

    @property
    def prefix(self) -> int:
        """Window start: tokens before it are text already."""
        return self._pieces[-1][1] if self._pieces else 0

    @property
    def read(self) -> int:
        """Tokens up to here have been emitted as text."""
        return self._pieces[-1][2] if self._pieces else 0

    @property
    def length(self) -> int:
        """Characters emitted so far."""
        return self._pieces[-1][3] if self._pieces else 0

    def _decode(self, ids: list[int]) -> str:
        try:
            return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        except Exception as e:
            raise DecodeError(f"{type(e).__name__}: {e}") from e

    def push(self, tokens: list[int]) -> str:
        """The new text after ``tokens`` grew (by one or more tokens since the last call): the delta,
        possibly empty while a character is incomplete. ``self.pending`` then holds what is held back as
        the tokenizer decodes it now (U+FFFD for the incomplete tail), for callers that look for stop
        strings: text + pending is ``decode(tokens)``."""
        prefix, read = self.prefix, self.read
        prefix_text = self._decode(tokens[prefix:read])
        window_text = self._decode(tokens[prefix:])
        if len(window_text) > len(prefix_text) and not window_text.endswith(INCOMPLETE):
            delta = window_text[len(prefix_text) :]
            self.pending = ""
            self._pieces.append((delta, read, len(tokens), self.length + len(delta)))
            return delta
        self.pending = window_text[len(prefix_text) :]
        return ""

    def finish(self, tokens: list[int]) -> str:
        """The rest of the text once ``tokens`` is final (incomplete characters included, as the
        tokenizer decodes them)."""
        prefix, read = self.prefix, self.read
        prefix_text = self._decode(tokens[prefix:read])
        window_text = self._decode(tokens[prefix:])
        delta = window_text[len(prefix_text) :] if len(window_text) > len(prefix_text) else ""
        self.pending = ""
        self._pieces.append((delta, len(tokens), len(tokens), self.length + len(delta)))
        return delta

    def tail(self, n: int) -> str:
        """The last ``n`` characters of the text emitted so far (cost independent of its length)."""
        if n <= 0:
            return ""
        out: list[str] = []
        need = n
        for piece in reversed(self._pieces):
            out.append(piece[0][-need:])
            need -= len(out[-1])
            if need <= 0:
                break
        return "".join(reversed(out))

    @property
    def text(self) -> str:
        """All text emitted so far."""
        pieces = self._pieces
        if len(pieces) > 1:  # joined into one piece: one statement, like a step
            self._pieces = [("".join(p[0] for p in pieces), *pieces[-1][1:])]
        return self._pieces[0][0] if self._pieces else ""
