"""Argument types and the parser of the command line tools: every value is checked while the command line
is parsed, before anything loads, and a bad one is one line that says what is allowed.

``argparse`` calls a ``type=`` function on the text given; an ``ArgumentTypeError`` becomes
``PROG: error: argument --NAME: MESSAGE`` and exit status 2. The functions here are made by factories
(``integer(lo=1)``) so that each message names the allowed range or the valid values.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

T = TypeVar("T")


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (``PROG: error: ...; see PROG --help``) with exit
    status 2, like every other error of the tools, instead of the whole usage summary first."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _bound(lo: float | None, hi: float | None, lo_open: bool = False, hi_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    return f"<= {hi:g}" if hi is not None else ""


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An ``int`` type with an inclusive range (``integer(lo=1)``: 1, 2, ...)."""
    want = " ".join(filter(None, ("an integer", _bound(lo, hi))))

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return value

    return parse


def add_count(p: argparse.ArgumentParser, flag: str, default: int | None, help: str, lo: int = 1) -> None:
    """Adds ``flag``: an integer option of at least ``lo`` (a count: tokens, requests, nodes, rounds)."""
    p.add_argument(flag, type=integer(lo=lo), default=default, help=help)


def real(
    lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False
) -> Callable[[str], float]:
    """A finite ``float`` type in a range (``lo_open`` / ``hi_open``: that end excluded)."""
    want = " ".join(filter(None, ("a number", _bound(lo, hi, lo_open, hi_open))))

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        low_ok = lo is None or (value > lo if lo_open else value >= lo)
        high_ok = hi is None or (value < hi if hi_open else value <= hi)
        if not math.isfinite(value) or not low_ok or not high_ok:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return value

    return parse


def integer_list(lo: int = 0) -> Callable[[str], list[int]]:
    """A comma list of ints ``>= lo`` (``16,64``), at least one."""
    want = f"a comma list of integers >= {lo}"

    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if not values or min(values) < lo:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return values

    return parse


def from_value_error(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argument type: its ValueError (whose message names the valid values) becomes the
    usage error's text instead of argparse's ``invalid parse value``."""

    def wrapped(text: str) -> T:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return wrapped


def version_text() -> str:
    """``sssd VERSION (python X.Y)``: what ``--version`` prints."""
    import sssd  # the package itself (its version), not one of its subpackages

    return f"sssd {sssd.__version__} (python {sys.version_info.major}.{sys.version_info.minor})"
