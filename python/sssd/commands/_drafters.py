"""Drafter construction shared by ``sssd simulate``, ``sssd calibrate`` and the benchmarks."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

BASELINES = ("prompt-lookup",)
SOURCES = ("input", "datastore", "recent")


@dataclass(frozen=True)
class DrafterSpec:
    """What to build: a baseline by name, or the sssd drafter with some sources and a calibration."""

    baseline: str | None = None  # None: sssd.Drafter
    sources: tuple[str, ...] = SOURCES
    calibration: str | None = None  # JSON table path, "none" (identity), or None (shipped defaults)
    datastore: str | None = None

    def label(self) -> str:
        if self.baseline:
            return self.baseline
        cal = {None: "default", "none": "uncalibrated"}.get(self.calibration, "calibrated")
        return f"{'+'.join(self.sources)} ({cal})"


def parse_sources(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in names if s not in SOURCES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"--sources takes a comma list of {', '.join(SOURCES)}; got {text!r}"
        )
    return names


def parse_int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of ints, got {text!r}") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative ints, got {text!r}")
    return out


def open_datastore(path: str | None) -> Any:
    if path is None:
        return None
    from sssd.datastore import Datastore

    return Datastore.open(path)


def make_drafter(spec: DrafterSpec, datastore: Any = None) -> Any:
    """A fresh drafter (no requests, empty recent pool) for one simulation run."""
    if spec.baseline == "prompt-lookup":
        from sssd.baselines import PromptLookupDrafter

        return PromptLookupDrafter()
    if spec.baseline is not None:
        raise ValueError(f"unknown baseline {spec.baseline!r}; choose from {', '.join(BASELINES)}")
    if "datastore" in spec.sources and datastore is None:
        raise ValueError("the datastore source needs --datastore PATH (or leave it out of --sources)")
    try:
        from sssd.drafter import Drafter, DrafterConfig
    except ImportError as e:  # the drafter module is not built yet
        raise ValueError(f"the sssd drafter is not available ({e}); use --baseline prompt-lookup") from None
    config = DrafterConfig(
        use_input="input" in spec.sources,
        use_datastore="datastore" in spec.sources,
        use_recent="recent" in spec.sources,
    )
    drafter = Drafter(datastore=datastore if "datastore" in spec.sources else None, config=config)
    if spec.calibration is not None:
        from sssd import calibration

        table = (
            calibration.CalibrationTable.identity()
            if spec.calibration == "none"
            else calibration.CalibrationTable.load(spec.calibration)
        )
        drafter.set_calibration(table)
    return drafter
