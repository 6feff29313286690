"""A progress line for a run that generates tokens: what runs, a bar that moves with the tokens, how many
so far and how fast, redrawn in place on stderr at most ten times a second. Only where stderr is a
terminal: in a log or a pipe the in-place redraws would pile up as one long line, so there the line stays
silent and the caller's own per-item lines say how far it got. Drawing costs microseconds a step; the
steps it follows take tens of milliseconds."""

from __future__ import annotations

import sys
import time
from typing import TextIO

REDRAW_S = 0.1


class ProgressLine:
    def __init__(self, stream: TextIO | None = None, width: int = 20) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.width = width
        self._label, self._total, self._t0, self._drawn, self._shown = "", 1, 0.0, 0.0, 0

    def start(self, label: str, total: int) -> None:
        """A new run: ``label`` (what runs), up to ``total`` tokens."""
        self._label, self._total = label, max(int(total), 1)
        self._t0 = self._drawn = time.perf_counter()
        self.update(0, force=True)

    def update(self, tokens: int, force: bool = False) -> None:
        if not self.live:
            return
        now = time.perf_counter()
        if not force and now - self._drawn < REDRAW_S:
            return
        self._drawn = now
        done = min(tokens, self._total)
        fill = round(self.width * done / self._total)
        rate = tokens / (now - self._t0) if now > self._t0 and tokens else 0.0
        bar = "#" * fill + "." * (self.width - fill)
        self._write(f"{self._label} [{bar}] {tokens}/{self._total} tokens, {rate:.1f} tokens/s")

    def clear(self) -> None:
        """Removes the line (before other output is printed)."""
        if self.live and self._shown:
            self._write("")
            self._shown = 0

    def _write(self, text: str) -> None:
        pad = " " * max(self._shown - len(text), 0)  # blank what a longer earlier line left
        self.stream.write("\r" + text + pad + ("\r" if not text else ""))
        self.stream.flush()
        self._shown = len(text)
