"""The ``sssd`` command: one subcommand per module in ``sssd.cli``.

Each module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. Modules are
imported lazily so ``sssd --help`` stays fast and commands that need torch do not import it for others.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (name, module, one-line help). Keep in alphabetical order.
COMMANDS: list[tuple[str, str, str]] = [
    ("calibrate", "sssd.cli.calibrate", "fit a calibration table on pairs with the simulator"),
    ("demo", "sssd.cli.demo", "SmolLM2 demo: generate with and without speculation, compare"),
    ("generate", "sssd.cli.generate", "generate with speculative decoding; outputs + stats"),
    ("info", "sssd.cli.info", "show a datastore's header and check it"),
    ("profile", "sssd.cli.profile", "measure a model's step cost and save the cost profile (JSON)"),
    ("simulate", "sssd.cli.simulate", "replay (prompt, output) pairs through a drafter: MAL, timing"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sssd", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module, help_text in COMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except (ValueError, OSError, TypeError) as e:  # bad input: one clear line, no traceback
        print(f"sssd {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
