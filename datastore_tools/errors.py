"""The error type of bad input data (a malformed line, an id out of range, an unreadable file)."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input data; the message names the file (and line or document) and what to do."""
