"""A small progress display on stderr (no dependency): redrawn on a terminal, phase lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from datastore_tools.stats import ReadStats

_BAR_WIDTH = 24


def _si(x: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(x) < 1000:
            return f"{x:.1f}{unit}" if unit else f"{x:.0f}"
        x /= 1000
    return f"{x:.1f}T"


class Progress:
    """Reading progress (documents, tokens, bytes against the known input size) and build phases.

    On a terminal the line is redrawn at most every ``interval`` seconds; on a pipe or file (logs, CI) only
    the start of each phase is printed, so logs stay short.
    """

    def __init__(
        self, total_bytes: int, *, enabled: bool = True, stream: TextIO | None = None, interval: float = 0.1
    ):
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._tty = enabled and self._stream.isatty()
        self._total = total_bytes
        self._interval = interval
        self._start = time.monotonic()
        self._last = 0.0
        self._phase = ""
        self._width = 0

    def reading(self, stats: ReadStats, *, force: bool = False) -> None:
        """Called per document; cheap when nothing is drawn."""
        if not self._tty:
            self._announce("reading inputs")
            return
        now = time.monotonic()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        secs = max(now - self._start, 1e-9)
        frac = min(stats.input_bytes / self._total, 1.0) if self._total else 0.0
        filled = int(frac * _BAR_WIDTH)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        self._draw(
            f"reading [{bar}] {frac:4.0%} {_si(stats.documents)} docs {_si(stats.tokens)} tokens "
            f"{_si(stats.input_bytes)}B {_si(stats.tokens / secs)} tok/s"
        )

    def phase(self, name: str, done: int, total: int) -> None:
        """A build phase reported by sssd.build_datastore (``total`` 0: unknown)."""
        if name.endswith("reading documents"):
            return  # build_datastore's own reading report: the reading line already shows it
        if not self._tty:
            self._announce(name)
            return
        now = time.monotonic()
        if name == self._phase and now - self._last < self._interval and done != total:
            return
        self._last = now
        self._phase = name
        self._draw(f"{name} {done / total:4.0%}" if total else f"{name} {_si(done)}")

    def _announce(self, name: str) -> None:
        if self._enabled and name != self._phase:
            self._phase = name
            print(f"build-datastore: {name} ...", file=self._stream, flush=True)

    def _draw(self, line: str) -> None:
        pad = " " * max(self._width - len(line), 0)
        self._stream.write("\r" + line + pad)
        self._stream.flush()
        self._width = len(line)

    def close(self) -> None:
        """Ends the redrawn line so later output starts on a fresh one."""
        if self._tty and self._width:
            self._stream.write("\n")
            self._stream.flush()
            self._width = 0
