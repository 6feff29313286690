"""Evaluating drafters on (prompt, output) pairs: drafter variants, calibration fitting, cross-fitting.

Used by ``sssd simulate``, ``sssd calibrate`` and ``bench/drafter/bench_drafter.py``. A calibration table must
be judged on pairs it was not fitted on: ``fit_calibration`` fits on one set, ``crossfit_simulate``
measures every pair with a table fitted on the other folds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sssd.evaluation.pairs import Pair, split_pairs
from sssd.evaluation.simulator import NodeRecords, SimulationResult, merge_results, simulate

BASELINES = ("prompt-lookup",)
# "recent" = the drafter's recent-outputs pool; "recycled" = the verifier's own top-k (a replay needs the
# model's top-k along the pairs: sssd.evaluation.recycling.TeacherTopK)
SOURCES = ("input", "datastore", "recent", "recycled")
DEFAULT_SOURCES = SOURCES[:3]
_SOURCE_ALIASES = {"pool": "recent"}


@dataclass(frozen=True)
class DrafterSpec:
    """What to build: a baseline by name, or the sssd drafter with some sources and a calibration."""

    baseline: str | None = None  # None: sssd.Drafter
    sources: tuple[str, ...] = DEFAULT_SOURCES
    calibration: str | None = None  # JSON table path, "none" (identity), or None (shipped default)
    datastore: str | None = None  # path, for labels only (the opened Datastore is passed separately)
    online: bool = False  # online calibration updates (drafter.observe) in the simulation

    def label(self) -> str:
        if self.baseline:
            return self.baseline
        cal = {None: "default table", "none": "uncalibrated"}.get(self.calibration, "calibrated")
        return f"{'+'.join(self.sources)} ({cal})"


def parse_sources(text: str) -> tuple[str, ...]:
    """'input,datastore' -> ('input', 'datastore'); ValueError names the valid sources."""
    names = tuple(_SOURCE_ALIASES.get(s.strip(), s.strip()) for s in text.split(",") if s.strip())
    bad = [s for s in names if s not in SOURCES]
    if bad or not names:
        raise ValueError(f"sources must be a comma list of {', '.join(SOURCES)}; got {text!r}")
    return tuple(dict.fromkeys(names))


def load_table(spec_calibration: str | None) -> Any:
    """The CalibrationTable a spec names: None -> the shipped default, "none" -> identity, else a file."""
    from sssd.drafter import calibration

    if spec_calibration is None:
        return calibration.default_table()
    if spec_calibration == "none":
        return calibration.CalibrationTable.identity()
    return calibration.CalibrationTable.load(spec_calibration)


def make_drafter(spec: DrafterSpec, datastore: Any = None, table: Any = None, recycle_k: int = 8) -> Any:
    """A fresh drafter (no requests, empty recent pool). ``table`` overrides ``spec.calibration``;
    ``recycle_k``: recycled candidates per token (with the recycled source)."""
    if spec.baseline == "prompt-lookup":
        from sssd.evaluation.baselines import PromptLookupDrafter

        return PromptLookupDrafter()
    if spec.baseline is not None:
        raise ValueError(f"unknown baseline {spec.baseline!r}; choose from {', '.join(BASELINES)}")
    if "datastore" in spec.sources and datastore is None:
        raise ValueError("the datastore source needs a datastore (--datastore PATH)")
    from sssd.drafter.retrieval import Drafter, DrafterConfig

    config = DrafterConfig(
        use_input="input" in spec.sources,
        use_datastore="datastore" in spec.sources,
        use_pool="recent" in spec.sources,
        use_recycled="recycled" in spec.sources,
        recycle_k=recycle_k,
        calibration=table if table is not None else load_table(spec.calibration),
        online_calibration=spec.online,
    )
    return Drafter(datastore=datastore if "datastore" in spec.sources else None, config=config)


def records_arrays(records: NodeRecords) -> tuple[np.ndarray, ...]:
    """(source, depth, match_len, raw, accepted) of the tested nodes, for calibration.fit."""
    f = records.features
    missing = [k for k in ("source", "depth", "match_len", "raw_score") if k not in f]
    if missing:
        raise ValueError(f"the drafter's batches lack per-node fields {missing}: cannot fit a calibration")
    return f["source"], f["depth"], f["match_len"], f["raw_score"], records.accepted


def collect_records(
    spec: DrafterSpec,
    datastore: Any,
    pairs: Sequence[Pair],
    *,
    budget: int,
    batch_size: int,
    table: Any = None,
    top_k: Any = None,
) -> SimulationResult:
    """Simulate with records kept (online updates off, so the records reflect one fixed table). top_k:
    the model's top-k along the pairs, for the recycled source (``simulate``)."""
    k = top_k.k if top_k is not None else 8
    drafter = make_drafter(replace(spec, online=False), datastore, table, recycle_k=k)
    return simulate(drafter, pairs, budget=budget, batch_size=batch_size, collect_records=True, top_k=top_k)


def fit_calibration(
    spec: DrafterSpec,
    datastore: Any,
    pairs: Sequence[Pair],
    *,
    budget: int = 64,
    batch_size: int = 16,
    rounds: int = 2,
    top_k: Any = None,
) -> Any:
    """A table fitted on ``pairs``. Round 1 replays them with the identity table (raw scores, so every
    group's raw -> acceptance relation is seen unbent) and fits the monotone maps to the tested nodes;
    each further round replays with the latest table, so the fit also sees the nodes a calibrated
    drafter proposes, and refits on all observations so far."""
    from sssd.drafter import calibration

    if spec.baseline is not None:
        raise ValueError("baselines have no calibration to fit")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    table = calibration.CalibrationTable.identity()
    observed: list[tuple[np.ndarray, ...]] = []
    for _ in range(rounds):
        r = collect_records(
            spec, datastore, pairs, budget=budget, batch_size=batch_size, table=table, top_k=top_k
        )
        observed.append(records_arrays(r.records))
        table = calibration.fit(*(np.concatenate(cols) for cols in zip(*observed, strict=True)))
    return table


def calibration_error(records: NodeRecords) -> float:
    """ECE of the probabilities the drafter reported for tested nodes against their outcomes."""
    from sssd.drafter import calibration

    return calibration.calibration_error(records.features["probs"], records.accepted)


_FIT_CACHE: dict[tuple, Any] = {}


def crossfit_simulate(
    spec: DrafterSpec,
    datastore: Any,
    pairs: Sequence[Pair],
    *,
    budget: int,
    batch_size: int = 16,
    allocation: str = "per-request",
    calibrate: bool = True,
    fit_budget: int = 64,
    collect: bool = False,
) -> SimulationResult:
    """2-fold cross-fit: fit a table on each half (split_pairs), replay the other half with it, add up.

    ``calibrate=False`` replays the same two halves with the spec's own table (or a baseline), so rows
    with and without fitting see the same batches and the same recent-outputs pool (one half's
    outputs). Tables are cached per (sources, fold, fit budget) within the process, so a sweep over
    budgets fits each fold once."""
    halves = split_pairs(pairs, 0.5)
    parts = []
    for fit_on, measure in (halves, halves[::-1]):
        if not fit_on or not measure:
            raise ValueError("cross-fitting needs pairs in both halves (use more pairs)")
        table = None
        if calibrate:
            key = (spec.sources, tuple(p.id for p in fit_on), fit_budget, batch_size, id(datastore))
            if key not in _FIT_CACHE:
                _FIT_CACHE[key] = fit_calibration(
                    spec, datastore, fit_on, budget=fit_budget, batch_size=batch_size
                )
            table = _FIT_CACHE[key]
        drafter = make_drafter(spec, datastore, table)
        parts.append(
            simulate(
                drafter,
                measure,
                budget=budget,
                batch_size=batch_size,
                allocation=allocation,
                observe=spec.online,
                collect_records=collect,
            )
        )
    return merge_results(parts)
