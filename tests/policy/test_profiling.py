"""Profiling: the engine-driven forward grid and the drafting grid produce samples the cost model fits."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from sssd.cli import main
from sssd.cli.profile import engine_factory
from sssd.evaluation.baselines import PromptLookupDrafter
from sssd.policy import profiling as prof

from tests.tiny_models import VOCAB, tiny_model


def test_synthetic_drafter_gives_exact_budgets():
    d = prof.SyntheticDrafter(VOCAB, seed=0)
    for rid in range(3):
        d.add_request(rid, [5, 6, rid + 7])
    b = d.propose([0, 1, 2], budget=10)
    assert len(b.tokens) == 13 and list(np.diff(b.offsets)) == [5, 4, 4]
    assert list(b.tokens[b.offsets[:-1]]) == [7, 8, 9]  # roots = last context tokens
    tree = np.repeat(np.arange(3), np.diff(b.offsets))
    nonroot = b.parents >= 0
    assert np.all(b.parents[nonroot] < (np.arange(13) - b.offsets[tree])[nonroot])


def test_profile_forward_and_drafting_fit(tmp_path):
    grid = prof.ProfileGrid((1, 2), (8,), (0, 6), 1, (1, 2), (4, 8), 2)
    fwd = prof.profile_forward(engine_factory(tiny_model("llama")), VOCAB, grid)
    assert len(fwd) == 2 * 2 * 1
    assert {s.num_nodes - s.batch_size for s in fwd} == {0, 6}
    ctxs = [np.arange(2, 40, dtype=np.int32) % VOCAB]
    drafting = prof.profile_drafting(PromptLookupDrafter, ctxs, grid)
    assert len(drafting) == 2 * 2 * 2 and all(t > 0 for _, _, t in drafting)
    cm = prof.fit_profile(fwd, drafting, {"model": "tiny"})
    assert cm.forward.num_samples == len(fwd)
    path = tmp_path / "p.json"
    cm.save(path, extra=prof.samples_json(fwd, drafting))
    d = json.loads(path.read_text())
    assert d["meta"]["model"] == "tiny" and len(d["forward_samples"]) == len(fwd)


def test_profile_cli_rejects_bad_grids(capsys):
    assert main(["profile", "--batch-sizes", "1,x", "--output", "unused.json"]) == 2
    assert "comma list" in capsys.readouterr().err
    assert main(["profile", "--batch-sizes", "0", "--output", "unused.json"]) == 2
