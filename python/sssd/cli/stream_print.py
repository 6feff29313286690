"""How ``sssd generate`` shows its outputs: each prompt's text as it is generated, in prompt order.

A prompt's block is a header line (``=== ID: N prompt tokens``), its text as the engine hands it out
(flushed at every step, so a reader sees it grow), and a closing line that says how it ended
(``=== ID: 16 new tokens, finished by eos, 1.45 tokens per step``). Requests of a batch run together;
the text of a prompt after the one on screen waits in a buffer until its turn, so blocks never mix.
After Ctrl-C, :meth:`StreamPrinter.interrupted` shows what every started prompt had generated.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def closing_line(name: str, result: Any) -> str:
    """The line after a prompt's text: output length, why it stopped, tokens per step (MAL)."""
    n = len(result.tokens)
    return (
        f"=== {name}: {n} new token{'s' * (n != 1)}, finished by {result.finish_reason}, "
        f"{result.stats.tokens_per_step:.2f} tokens per step"
    )


class StreamPrinter:
    """Prints the blocks of ``names`` (one per prompt, in order) from events given in any order."""

    def __init__(self, names: list[str], prompt_lengths: list[int], out: TextIO | None = None):
        self.names = names
        self.lengths = prompt_lengths
        self.out = out if out is not None else sys.stdout
        self.chunks: list[list[str]] = [[] for _ in names]  # text handed out so far, per prompt
        self.results: list[Any] = [None] * len(names)  # GenerationResult once finished
        self.tokens = [0] * len(names)  # new tokens so far, per prompt
        self.printed = 0  # chunks of the prompt on screen already written
        self.current = 0  # the prompt on screen (all before it are complete)
        self.opened = False  # its header is written
        self.ends_line = True  # the last character written was a newline

    def event(self, index: int, text: str, tokens: int, result: Any = None) -> None:
        """``tokens`` new tokens and their ``text`` (a delta) for prompt ``index``; on its last event, its
        result."""
        self.tokens[index] += tokens
        if text:
            self.chunks[index].append(text)
        if result is not None:
            self.results[index] = result
        self._advance()

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.ends_line = text.endswith("\n")

    def _open(self, i: int) -> None:
        self._write(f"=== {self.names[i]}: {self.lengths[i]} prompt tokens\n")
        self.opened, self.printed = True, 0

    def _catch_up(self, i: int) -> None:
        self._write("".join(self.chunks[i][self.printed :]))
        self.printed = len(self.chunks[i])

    def _close(self, line: str) -> None:
        self._write(("" if self.ends_line else "\n") + line + "\n")
        self.current, self.opened = self.current + 1, False

    def _advance(self) -> None:
        while self.current < len(self.names):
            i = self.current
            if not self.opened:
                self._open(i)
            self._catch_up(i)
            if self.results[i] is None:
                break
            self._close(closing_line(self.names[i], self.results[i]))
        self.out.flush()

    def interrupted(self) -> None:
        """Ctrl-C: closes the prompt on screen and shows the buffered text of every other started one."""
        first, first_open = self.current, self.opened
        for i in range(first, len(self.names)):
            if not (i == first and first_open) and not self.tokens[i] and self.results[i] is None:
                continue  # not started (or nothing decoded yet): nothing to show
            if not self.opened:
                self._open(i)
            self._catch_up(i)
            if self.results[i] is not None:
                self._close(closing_line(self.names[i], self.results[i]))
            else:
                n = self.tokens[i]
                self._close(f"=== {self.names[i]}: interrupted after {n} new token{'s' * (n != 1)}")
        self.out.flush()
