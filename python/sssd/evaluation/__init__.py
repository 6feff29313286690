"""Evaluating drafters offline: (prompt, output) pairs, the teacher-forced simulator, baselines, fitting.

Owns the pairs file format (``pairs``: JSONL of token ids, written by ``sssd generate --output``), the
simulator that replays pairs through any drafter with requests joining and leaving (``simulator``),
baseline drafters such as prompt lookup (``baselines``) and calibration fitting and cross-fitting
(``fitting``) used by ``sssd simulate``, ``sssd calibrate`` and the benchmarks.

Imports: ``sssd.drafter`` (its DraftBatch and the drafters evaluated), ``sssd.batch`` (the request
index of each node), ``sssd.fileio`` (reading JSON lines) and numpy. No model, no torch.
"""

from sssd.evaluation.simulator import SimulationResult, simulate

__all__ = ["SimulationResult", "simulate"]
