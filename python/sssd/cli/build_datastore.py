"""sssd build-datastore: the `build-datastore` command under `sssd` (the same options, inputs and exit
statuses; see `build-datastore --help` or docs/cli.md).

`sssd.cli.main` hands `sssd build-datastore ...` to `datastore_tools.cli.main`, whose parser lets inputs
come between options; this module gives `sssd --help` its line and `sssd build-datastore --help` its text.
"""

from __future__ import annotations

import argparse

NAME = "build-datastore"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from datastore_tools.cli import add_arguments as add_build_arguments

    add_build_arguments(p)


def run(args: argparse.Namespace) -> int:
    from datastore_tools.cli import build_from_args

    return build_from_args(args)
