"""The progress line of a run (sssd demo): redrawn in place on a terminal, silent in a log or a pipe."""

from __future__ import annotations

import io

from sssd.cli import progress
from sssd.cli.progress import ProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_moves_in_place(monkeypatch):
    monkeypatch.setattr(progress, "REDRAW_S", 0.0)  # every update draws
    out = Terminal()
    line = ProgressLine(out, width=10)
    line.start("adaptive, float32", 64)
    line.update(32)
    line.update(64)
    drawn = out.getvalue().split("\r")
    assert drawn[1].startswith("adaptive, float32 [..........] 0/64 tokens")
    assert drawn[2].startswith("adaptive, float32 [#####.....] 32/64 tokens, ")
    assert drawn[3].startswith("adaptive, float32 [##########] 64/64 tokens, ") and "tokens/s" in drawn[3]
    line.clear()
    assert out.getvalue().endswith("\r" + " " * len(drawn[3]) + "\r")  # blanked before other output
    assert "\n" not in out.getvalue()


def test_redraws_are_throttled(monkeypatch):
    out = Terminal()
    line = ProgressLine(out)
    line.start("run", 100)
    for k in range(1, 50):
        line.update(k)  # within REDRAW_S of the start: not drawn
    assert out.getvalue().count("\r") == 1


def test_in_a_log_or_pipe_nothing_is_drawn():
    out = io.StringIO()
    line = ProgressLine(out)
    line.start("run", 10)
    line.update(5, force=True)
    line.clear()
    assert out.getvalue() == ""
