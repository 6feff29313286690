"""sssd calibrate: fit a calibration table from simulated verification outcomes (placeholder)."""

from __future__ import annotations

import argparse

NAME = "calibrate"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", required=True)


def run(args: argparse.Namespace) -> int:
    raise ValueError("sssd calibrate needs the drafter's calibration module (not merged yet)")
