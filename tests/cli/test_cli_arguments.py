"""Command line arguments are checked while they are parsed (before any model, file or torch loads), in one
line naming the valid values; `sssd --version`; `sssd build-datastore` as an alias; output labels a user
can read without the source (simulate's calibration and acceptance, calibrate's little-data warning,
info --verify's verdict, --shard-tokens' note)."""

from __future__ import annotations

import numpy as np
import pytest
from sssd import build_datastore
from sssd.cli import COMMANDS, main
from sssd.evaluation.pairs import Pair, save_pairs

from datastore_tools.cli import main as build_main


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: the errors below must come before it."""

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("sssd.models.loading.load_model", load)
    monkeypatch.setattr("sssd.models.loading.resolve_model", load)


BAD = [
    (
        ["generate", "--prompt", "x", "--attention", "foo"],
        "argument --attention: invalid choice: 'foo' (choose from 'auto', 'sdpa', 'packed', 'emulated')",
    ),
    (["generate", "--prompt", "x", "--temperature", "-1"], "--temperature: expected a number >= 0, got '-1'"),
    (["generate", "--prompt", "x", "--temperature", "nan"], "--temperature: expected a number >= 0"),
    (["generate", "--prompt", "x", "--top-p", "0"], "--top-p: expected a number in (0, 1], got '0'"),
    (["generate", "--prompt", "x", "--top-k", "-2"], "--top-k: expected an integer >= 0, got '-2'"),
    (["generate", "--prompt", "x", "--threads", "two"], "--threads: expected an integer >= 0, got 'two'"),
    (
        ["simulate", "--pairs", "p.jsonl", "--sources", "foo"],
        "--sources: sources must be a comma list of input, datastore, recent, recycled; got 'foo'",
    ),
    (["simulate", "--pairs", "p.jsonl", "--limit", "0"], "--limit: expected an integer >= 1, got '0'"),
    (
        ["calibrate", "--pairs", "p.jsonl", "--output", "t.json", "--holdout", "1"],
        "--holdout: expected a number in (0, 1), got '1'",
    ),
    (["profile", "--contexts", "1,64"], "--contexts: expected a comma list of integers >= 2, got '1,64'"),
    (
        ["tune-drafter", "--out", "d", "--data", "x.jsonl", "--lr", "0"],
        "--lr: expected a number > 0, got '0'",
    ),
    (
        ["tune-drafter", "--out", "d", "--data", "x.jsonl", "--kl-weight", "2"],
        "--kl-weight: expected a number in [0, 1], got '2'",
    ),
    (
        ["build-datastore", "a.txt", "-o", "x.sssd", "--batch-size", "0"],
        "expected a positive integer, got '0'",
    ),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD])
def test_bad_values_fail_while_parsing_in_one_line(no_model, argv, message, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    prog = "sssd " + argv[0]
    assert out == ""  # no header, nothing run
    assert err.startswith(f"{prog}: error: argument ") and err.count("\n") == 1, err
    assert message in err and err.endswith(f"(see {prog} --help)\n")


def test_the_attention_choices_are_the_engines():
    from sssd.cli.generate import ATTENTION_CHOICES
    from sssd.engine.adapter import ATTENTION_BACKENDS

    assert ATTENTION_CHOICES == ATTENTION_BACKENDS


def test_version(capsys):
    import sssd

    for command in (main, build_main):
        with pytest.raises(SystemExit) as e:
            command(["--version"])
        assert e.value.code == 0
        assert capsys.readouterr().out.startswith(f"sssd {sssd.__version__} (python 3.")


def test_the_package_version_is_the_project_version():
    import re
    from pathlib import Path

    import sssd

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("an installed copy, not a checkout")
    # tomllib is Python 3.11+; the project supports 3.10: the one line is read directly
    assert re.search(r'^version = "([^"]+)"$', pyproject.read_text(), re.M)[1] == sssd.__version__


def test_sssd_build_datastore_is_build_datastore(tmp_path, capsys):
    assert "build-datastore" in [name for name, _, _ in COMMANDS]
    np.save(tmp_path / "c.tokens.npy", np.tile(np.arange(1, 40), 3).astype(np.int32))
    out = tmp_path / "c.sssd"
    # inputs between options, as build-datastore takes them; --debug before the command is passed on
    argv = ["-o", str(out), str(tmp_path / "c.tokens.npy"), "--vocab-size", "50", "-q"]
    assert main(["build-datastore", *argv]) == 0
    assert "sssd build-datastore: warning:" in capsys.readouterr().err  # no tokenizer recorded
    assert main(["build-datastore", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "m.sssd")]) == 2
    assert capsys.readouterr().err.startswith("sssd build-datastore: error: ")
    with pytest.raises(FileNotFoundError):
        main(["--debug", "build-datastore", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "m.sssd")])
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "build-datastore" in capsys.readouterr().out


def test_info_verify_prints_a_verdict(tmp_path, capsys):
    from sssd.datastore import reference as ref

    path = tmp_path / "d.sssd"
    build_datastore([np.arange(1, 60) % 23 + 1, np.arange(5, 40)], path, vocab_size=64)
    assert main(["info", str(path), "--verify"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(
        "verify:        OK: every token in the vocabulary, documents and suffix array"
    )
    raw = bytearray(path.read_bytes())
    h = ref.unpack_header(bytes(raw))
    sa = np.frombuffer(raw, np.int32, h["num_tokens"], h["sa_offset"]).copy()
    sa[[0, -1]] = sa[[-1, 0]]  # out of order
    raw[h["sa_offset"] : h["sa_offset"] + sa.nbytes] = sa.tobytes()
    path.write_bytes(bytes(raw))
    assert main(["info", str(path), "--verify"]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "verify:        FAILED (the error follows)"
    assert err.startswith("sssd info: error: ") and err.count("\n") == 1


def _pairs(path, n: int, length: int = 30):
    rng = np.random.default_rng(5)
    pairs = []
    for i in range(n):
        prompt = rng.integers(0, 30, length)
        pairs.append(Pair.make(prompt, np.concatenate([prompt[3:20], rng.integers(0, 30, 8)]), id=f"p{i}"))
    save_pairs(pairs, path)
    return path


def test_simulate_says_how_it_calibrates_and_what_it_could_not_measure(tmp_path, capsys):
    pairs = _pairs(tmp_path / "p.jsonl", 3)
    assert main(["simulate", "--pairs", str(pairs), "--budget", "0,4", "--online"]) == 0
    out = capsys.readouterr().out
    assert (
        "batch size 16, allocation per-request, the shipped calibration table, updated online from the "
        "replayed outcomes" in out
    )
    assert "| accepted/drafted |" in out and "nan" not in out
    row0 = next(line for line in out.splitlines() if line.startswith("| input+recent") and "| 0 |" in line)
    assert "- (none drafted)" in row0  # budget 0 drafts nothing: no acceptance to show
    assert main(["simulate", "--pairs", str(pairs), "--calibration", "none", "--budget", "4"]) == 0
    assert "raw scores (no calibration table), fixed" in capsys.readouterr().out


def test_calibrate_warns_when_the_data_is_too_little(tmp_path, capsys):
    few = _pairs(tmp_path / "few.jsonl", 4)
    assert main(["calibrate", "--pairs", str(few), "--output", str(tmp_path / "t.json")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("sssd calibrate: warning: too little data: ") and "pairs to fit" in err
    enough = _pairs(tmp_path / "enough.jsonl", 60, length=80)
    assert main(["calibrate", "--pairs", str(enough), "--output", str(tmp_path / "t2.json")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_shard_tokens_notes_a_document_longer_than_a_shard(tmp_path, capsys):
    np.save(tmp_path / "c.tokens.npy", np.arange(1, 72).astype(np.int32))
    np.save(tmp_path / "c.offsets.npy", np.array([0, 5, 57, 62, 71], np.int64))  # one 52-token document
    argv = [str(tmp_path / "c.tokens.npy"), "-o", str(tmp_path / "s"), "--vocab-size", "97", "-q"]
    assert build_main([*argv, "--shard-tokens", "10"]) == 0
    err = capsys.readouterr().err
    assert "note: 1 shard holds one document longer than --shard-tokens 10 (the largest 52 tokens)" in err
    assert build_main([*argv, "--shard-tokens", "60", "--force"]) == 0
    assert "note:" not in capsys.readouterr().err
