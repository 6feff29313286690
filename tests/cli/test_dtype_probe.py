"""--dtype auto on a CPU: float32 or bfloat16 from a measurement on this machine (sssd.cli.dtypes), the
choice for speculative and plain decoding, and the cache: keyed by CPU, torch and model, written only
when the machine was quiet. On a tiny model; which dtype wins here is never asserted."""

from __future__ import annotations

import pytest
from sssd.cli import dtypes
from sssd.cli.dtypes import DtypeProbe

REAL_PROBE = dtypes.probe  # tests/conftest.py replaces it for every other test


@pytest.fixture
def tiny():
    from tiny_models import tiny_model

    return tiny_model("llama").to("cpu").float().eval()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SSSD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dtypes, "probe", REAL_PROBE)
    return tmp_path / "probes" / "dtypes.json"


def test_the_choice_weighs_the_forwards_the_run_makes():
    # bfloat16 slower on one token, much faster on 17 (a CPU with AMX tiles)
    amx = DtypeProbe((30.0, 60.0), (35.0, 37.0))
    assert amx.ratio() == pytest.approx(((35 / 30) * (37 / 60)) ** 0.5)
    assert amx.faster(speculative=True) and not amx.faster(speculative=False)
    assert not DtypeProbe((30.0, 60.0), (60.0, 120.0)).faster()  # emulated bfloat16
    text = amx.text()
    assert "1-token forward 30.0 ms in float32, 35.0 ms in bfloat16" in text and "measured now" in text
    busy = DtypeProbe((30.0, 60.0), (15.0, 30.0), busy="other processes used 1.0 of 2 cores")
    assert "unreliable, the machine was busy: other processes used" in busy.text()
    assert not busy.faster()  # a busy machine's times are no evidence: float32, the exact one


def test_the_probe_times_both_dtypes_and_caches_a_quiet_machines_result(tiny, cache, monkeypatch):
    import torch

    quiet = DtypeProbe((2.0, 4.0), (1.0, 2.0))
    monkeypatch.setattr(dtypes, "measure", lambda model, bf16, threads: quiet)
    found, copy = dtypes.probe(tiny, 1)
    assert found == quiet and copy.dtype == torch.bfloat16 and tiny.dtype == torch.float32
    assert cache.is_file()
    again, copy = dtypes.probe(tiny, 1)
    assert again.cached and copy is None and again.float32_ms == quiet.float32_ms
    assert "cached from an earlier run" in again.text()
    assert not dtypes.probe(tiny, 2)[0].cached  # another thread count is another key


def test_a_busy_machines_probe_is_not_kept(tiny, cache, monkeypatch):
    busy = DtypeProbe((2.0, 4.0), (1.0, 2.0), busy="load average 3.0 on 2 cores")
    monkeypatch.setattr(dtypes, "measure", lambda model, bf16, threads: busy)
    assert dtypes.probe(tiny, 1)[0] is busy
    assert not cache.exists()


def test_a_damaged_cache_is_measured_again(tiny, cache):
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    found, _ = dtypes.probe(tiny, 1)  # the real measurement, on the tiny model
    assert not found.cached and len(found.float32_ms) == len(found.bfloat16_ms) == 2
    assert all(ms > 0 for ms in (*found.float32_ms, *found.bfloat16_ms))


def test_the_cache_key_names_cpu_torch_threads_and_model(tiny):
    import torch

    key = dtypes.cache_key(tiny, 3)
    assert f"torch {torch.__version__} x3" in key and "llama" in key and "[" in key


@pytest.mark.parametrize("faster", [True, False])
def test_choose_converts_only_where_bfloat16_is_faster(tiny, monkeypatch, faster):
    import torch

    measured = DtypeProbe((2.0, 4.0), (1.0, 2.0) if faster else (3.0, 6.0))
    monkeypatch.setattr(dtypes, "probe", lambda model, threads: (measured, None))
    model, choice = dtypes.choose(tiny, 1)
    assert choice.dtype == ("bfloat16" if faster else "float32") and choice.probe is measured
    assert model.dtype == getattr(torch, choice.dtype)
    assert choice.why.startswith("auto: bfloat16 took")
    assert ("--dtype float32 is exact" in choice.why) is faster


def test_load_model_auto_keeps_a_given_dtype(tmp_path):
    from cli_models import save_tiny_model

    path = save_tiny_model(tmp_path / "m")
    model, _, _, choice = dtypes.load_model_auto(str(path), "float32", "cpu")
    assert str(model.dtype) == "torch.float32"
    assert choice.dtype == "float32" and choice.why == "" and choice.probe is None
    _, _, _, choice = dtypes.load_model_auto(str(path), "auto", "cpu")  # conftest: float32 faster
    assert choice.dtype == "float32" and choice.why.startswith("auto: bfloat16 took 2.00")


def test_a_busy_probe_keeps_float32(tiny, monkeypatch):
    busy = DtypeProbe((2.0, 4.0), (1.0, 2.0), busy="other processes used 1.2 of 2 cores")
    monkeypatch.setattr(dtypes, "probe", lambda model, threads: (busy, None))
    model, choice = dtypes.choose(tiny, 1)
    assert choice.dtype == "float32" and str(model.dtype) == "torch.float32"
    assert choice.why.endswith("but the machine was busy while timing (other processes used 1.2 of 2 cores)")
