"""``--help`` that states every default: the formatter of ``sssd`` and ``build-datastore``."""

from __future__ import annotations

import argparse
from typing import Any


def format_default(value: Any) -> str:
    """A default as a user would type it: lists and tuples as comma lists (``16,64``)."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to each option's help text.

    Skipped where the help already states its default ("(default ..." or "default: ..."; an option
    whose default is computed says what it means in words), and for defaults that mean "not given"
    (None, False, empty): the help text says what happens then. Descriptions and epilogs keep their
    line breaks (they are written as paragraphs and lists).
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "(default" in text.lower()
            or "default:" in text.lower()
            or default is None
            or default is False
            or default in ("", [], ())
            or default is argparse.SUPPRESS
            or not action.option_strings  # positionals
            or isinstance(action, (argparse._HelpAction, argparse._VersionAction))
        ):
            return text
        shown = format_default(default).replace("%", "%%")  # argparse %-formats help strings
        return f"{text} (default: {shown})" if text else f"default: {shown}"
