"""sssd simulate / calibrate through the CLI entry point (in process), on a tiny pairs file."""

import json

import numpy as np
import pytest
from sssd.cli import main
from sssd.evaluation.pairs import Pair, save_pairs


@pytest.fixture
def pairs_file(tmp_path):
    rng = np.random.default_rng(1)
    pairs = []
    for i in range(6):
        prompt = rng.integers(0, 30, 40)
        out = np.concatenate([prompt[5:25], rng.integers(0, 30, 10)])  # copies part of the prompt
        pairs.append(Pair.make(prompt, out, id=f"p{i}", subset="ab"[i % 2]))
    path = tmp_path / "pairs.jsonl"
    save_pairs(pairs, path)
    return path


def test_simulate_baseline_prints_a_table_and_json(pairs_file, tmp_path, capsys):
    out_json = tmp_path / "r.json"
    rc = main(
        [
            "simulate",
            "--pairs",
            str(pairs_file),
            "--baseline",
            "prompt-lookup",
            "--budget",
            "0,4",
            "--batch-size",
            "3",
            "--details",
            "--json",
            str(out_json),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert "| drafter | budget | MAL | MAL a | MAL b |" in text
    assert "| prompt-lookup | 0 | 1.000 |" in text
    data = json.loads(out_json.read_text())
    assert [r["budget"] for r in data["results"]] == [0, 4]
    assert data["results"][1]["mal"] > 1.0
    assert data["results"][0]["generated_tokens"] == 6 * 30


def test_simulate_subset_and_limit(pairs_file, capsys):
    assert (
        main(
            [
                "simulate",
                "--pairs",
                str(pairs_file),
                "--baseline",
                "prompt-lookup",
                "--budget",
                "2",
                "--subsets",
                "a",
                "--limit",
                "2",
            ]
        )
        == 0
    )
    assert "pairs: 2 " in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--pairs", "/nonexistent/pairs.jsonl", "--baseline", "prompt-lookup"],
        ["--baseline", "prompt-lookup", "--batch-size", "0"],
        ["--baseline", "prompt-lookup", "--subsets", "zzz"],
    ],
)
def test_simulate_bad_input_is_one_error_line(pairs_file, argv, capsys):
    if "--pairs" not in argv:
        argv = ["--pairs", str(pairs_file), *argv]
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sssd simulate: error:") and err.count("\n") == 1


def test_simulate_bad_budget_list_is_a_usage_error(pairs_file, capsys):
    assert main(["simulate", "--pairs", str(pairs_file), "--budget", "a,b"]) == 2
    assert capsys.readouterr().err == (
        "sssd simulate: error: argument --budget: expected a comma list of integers >= 0, got 'a,b' "
        "(see sssd simulate --help)\n"
    )


@pytest.fixture
def datastore_file(tmp_path):
    from sssd import build_datastore

    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 30, 60) for _ in range(20)]
    path = tmp_path / "tiny.sssd"
    build_datastore(docs, path, vocab_size=30)
    return path


def test_simulate_fused_drafter_with_datastore(pairs_file, datastore_file, tmp_path, capsys):
    out_json = tmp_path / "r.json"
    argv = [
        "simulate",
        "--pairs",
        str(pairs_file),
        "--datastore",
        str(datastore_file),
        "--budget",
        "8",
        "--batch-size",
        "2",
        "--calibration",
        "none",
        "--online",
        "--details",
        "--json",
        str(out_json),
        "--compare",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "input+datastore+recent (uncalibrated)" in text and "by source:" in text
    r, base = json.loads(out_json.read_text())["results"]
    assert r["mal"] >= 1.0 and set(r["by_source"]) <= {"input", "datastore", "pool"}
    assert base["drafter"] == "prompt-lookup" and "| prompt-lookup | 8 |" in text


def test_calibrate_then_simulate_with_the_table(pairs_file, datastore_file, tmp_path, capsys):
    from sssd.drafter.calibration import CalibrationTable

    table = tmp_path / "cal.json"
    argv = [
        "calibrate",
        "--pairs",
        str(pairs_file),
        "--datastore",
        str(datastore_file),
        "--output",
        str(table),
        "--budget",
        "8",
        "--batch-size",
        "2",
        "--holdout",
        "0.4",
        "--rounds",
        "1",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "| fitted |" in text and "| identity (raw scores) |" in text
    CalibrationTable.load(table)
    assert (
        main(
            [
                "simulate",
                "--pairs",
                str(pairs_file),
                "--datastore",
                str(datastore_file),
                "--budget",
                "4",
                "--calibration",
                str(table),
                "--sources",
                "input,datastore",
            ]
        )
        == 0
    )
    assert "input+datastore (calibrated)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--sources", "datastore"],  # no --datastore
        ["calibrate", "--output", "/tmp/x.json", "--sources", "input,datastore"],
        ["calibrate", "--output", "/tmp/x.json", "--holdout", "1.5"],
        ["calibrate", "--output", "/tmp/x.json", "--rounds", "0"],
        ["simulate", "--calibration", "/nonexistent/table.json"],
    ],
)
def test_drafter_configuration_errors(pairs_file, argv, capsys):
    assert main([argv[0], "--pairs", str(pairs_file), *argv[1:]]) == 2
    assert capsys.readouterr().err.startswith(f"sssd {argv[0]}: error:")


def test_simulate_with_a_draft_model_adds_model_and_merged_rows(pairs_file, tmp_path, capsys):
    from tiny_models import tiny_model

    model_dir = tmp_path / "draft"
    tiny_model("llama").save_pretrained(model_dir)  # vocabulary 96 covers the pairs' ids (< 30)
    rc = main(["simulate", "--pairs", str(pairs_file), "--budget", "4", "--batch-size", "3",
               "--draft-model", str(model_dir), "--json", str(tmp_path / "r.json")])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0
    labels = [r["drafter"] for r in json.loads((tmp_path / "r.json").read_text())["results"]]
    assert labels[1:] == ["model(draft)", "merged(sssd+model(draft))"]
    assert "| model(draft) | 4 |" in text
    mal = {r["drafter"]: r["mal"] for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert mal["merged(sssd+model(draft))"] >= 1.0 and mal[labels[0]] > 1.0
