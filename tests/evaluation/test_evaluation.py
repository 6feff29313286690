"""sssd.evaluation.fitting: drafter variants, calibration fitting on pairs and cross-fitting."""

import numpy as np
import pytest
from sssd import build_datastore
from sssd.datastore.store import Datastore
from sssd.drafter.calibration import CalibrationTable
from sssd.evaluation.fitting import (
    DrafterSpec,
    calibration_error,
    collect_records,
    crossfit_simulate,
    fit_calibration,
    make_drafter,
    parse_sources,
)
from sssd.evaluation.pairs import Pair


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    rng = np.random.default_rng(3)
    phrases = [rng.integers(0, 40, 12) for _ in range(6)]
    docs = [
        np.concatenate([phrases[i % 6], rng.integers(0, 40, 20), phrases[(i + 1) % 6]]) for i in range(30)
    ]
    path = tmp_path_factory.mktemp("ds") / "d.sssd"
    build_datastore(docs, path, vocab_size=40)
    pairs = []
    for i in range(16):
        prompt = np.concatenate([phrases[i % 6], rng.integers(0, 40, 10)])
        out = np.concatenate([phrases[(i + 2) % 6], rng.integers(0, 40, 8), prompt[:10]])
        pairs.append(Pair.make(prompt, out, id=f"q{i}", subset="s"))
    return Datastore.open(path), pairs


def test_parse_sources():
    assert parse_sources("input, pool") == ("input", "recent")
    assert parse_sources("datastore,datastore") == ("datastore",)
    for bad in ("", "input,web"):
        with pytest.raises(ValueError, match="input, datastore, recent"):
            parse_sources(bad)


def test_make_drafter_variants():
    assert make_drafter(DrafterSpec(baseline="prompt-lookup")).name == "prompt-lookup"
    d = make_drafter(DrafterSpec(sources=("input",)))
    assert d.datastore is None and not d.config.use_datastore and not d.config.use_pool
    with pytest.raises(ValueError, match="needs a datastore"):
        make_drafter(DrafterSpec())
    with pytest.raises(ValueError, match="unknown baseline"):
        make_drafter(DrafterSpec(baseline="oracle"))
    assert DrafterSpec(calibration="none").label() == "input+datastore+recent (uncalibrated)"


def test_fit_and_crossfit(setup):
    ds, pairs = setup
    spec = DrafterSpec()
    table = fit_calibration(spec, ds, pairs, budget=16, batch_size=4)
    assert isinstance(table, CalibrationTable) and table.weights.sum() > 0
    r = collect_records(spec, ds, pairs, budget=16, batch_size=4, table=table)
    assert len(r.records) > 0 and 0.0 <= calibration_error(r.records) <= 1.0
    cf = crossfit_simulate(spec, ds, pairs, budget=8, batch_size=4)
    assert cf.num_pairs == len(pairs) and cf.generated_tokens == sum(p.output_ids.size for p in pairs)
    assert cf.mal >= 1.0
    plain = crossfit_simulate(DrafterSpec(baseline="prompt-lookup"), ds, pairs, budget=8, calibrate=False)
    assert plain.num_pairs == len(pairs) and plain.steps > 0
    one_round = fit_calibration(spec, ds, pairs, budget=16, batch_size=4, rounds=1)
    assert one_round.weights.sum() < table.weights.sum()  # round 2 adds the calibrated drafter's nodes
    with pytest.raises(ValueError, match="rounds"):
        fit_calibration(spec, ds, pairs, rounds=0)
    with pytest.raises(ValueError, match="baselines"):
        fit_calibration(DrafterSpec(baseline="prompt-lookup"), None, pairs)
