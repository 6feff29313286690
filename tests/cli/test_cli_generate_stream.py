"""sssd generate shows text as it is produced (a header line per prompt, the text flushed every step, a
closing line saying how it ended), keeps what was generated on Ctrl-C (exit 130), and its --output pairs
record the tokenizer so that build-datastore takes them without flags. Tiny model directory, CPU."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_models import save_tiny_model, subprocess_env, tiny_tokenizer
from sssd.cli import main
from sssd.cli.stream_print import StreamPrinter

from datastore_tools.cli import main as build_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-stream"))


@pytest.fixture(autouse=True)
def _no_progress_bars():
    from transformers.utils import logging

    logging.disable_progress_bar()
    yield
    logging.enable_progress_bar()


def _result(n: int, reason: str = "eos", mal: float = 1.5):
    return SimpleNamespace(tokens=[0] * n, finish_reason=reason, stats=SimpleNamespace(tokens_per_step=mal))


class _Screen:
    """A stdout that records what was visible at each flush."""

    def __init__(self):
        self.text, self.flushed = "", []

    def write(self, s):
        self.text += s

    def flush(self):
        self.flushed.append(self.text)


def test_blocks_come_in_prompt_order_and_are_flushed_per_event():
    screen = _Screen()
    p = StreamPrinter(["a", "b"], [4, 7], out=screen)
    p.event(1, "B1 ", 1)  # the second prompt's text waits
    assert screen.flushed[-1] == "=== a: 4 prompt tokens\n"
    p.event(0, "A1 ", 1)
    assert screen.flushed[-1].endswith("A1 ")  # visible at once
    p.event(1, "B2", 2, _result(3))  # b is done, still behind a
    p.event(0, "A2", 1, _result(2, "length", 1.0))
    assert screen.text == (
        "=== a: 4 prompt tokens\nA1 A2\n=== a: 2 new tokens, finished by length, 1.00 tokens per step\n"
        "=== b: 7 prompt tokens\nB1 B2\n=== b: 3 new tokens, finished by eos, 1.50 tokens per step\n"
    )


def test_interrupted_shows_every_started_prompt():
    screen = _Screen()
    p = StreamPrinter(["a", "b", "c"], [1, 2, 3], out=screen)
    p.event(0, "A1", 1)
    p.event(1, "B1\n", 2)
    p.interrupted()
    assert screen.text == (
        "=== a: 1 prompt tokens\nA1\n=== a: interrupted after 1 new token\n"
        "=== b: 2 prompt tokens\nB1\n=== b: interrupted after 2 new tokens\n"
    )  # c had not started: nothing to show


def _generate(model, capsys, *extra):
    argv = ["generate", "--model", str(model), "--device", "cpu", "--max-new-tokens", "12"]
    rc = main([*argv, *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def test_generate_streams_each_step_as_it_comes(tiny_dir, tmp_path, monkeypatch, capsys):
    from sssd.engine.engine import Engine

    seen = []  # stdout after each step of the speculative run
    step = Engine.step

    def recording_step(self):
        events = step(self)
        seen.append(capsys.readouterr().out)
        return events

    monkeypatch.setattr(Engine, "step", recording_step)
    prompts = tmp_path / "p.txt"
    prompts.write_text("w1 w2 w3\nw4 w5\n")
    rc, out, _ = _generate(tiny_dir, capsys, "--prompts", str(prompts), "--batch-size", "2", "--budget", "0")
    assert rc == 0
    shown = "".join(seen) + out
    blocks = [line for line in shown.splitlines() if line.startswith("=== ")]
    assert blocks[0] == "=== p/1: 5 prompt tokens"  # <|user|> w1 w2 w3 <|assistant|>
    assert blocks[1].startswith("=== p/1: ") and "new tokens, finished by" in blocks[1]
    assert blocks[2].startswith("=== p/2: ") and blocks[3].startswith("=== p/2: ")
    texts = [s for s in seen if s.strip()]
    assert len(texts) > 2  # text arrived over several steps, not all at the end


def test_ctrl_c_prints_what_was_generated_and_exits_130(tiny_dir, monkeypatch, capsys):
    from sssd.engine.engine import Engine

    calls = {"n": 0}
    step = Engine.step

    def interrupting_step(self):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(Engine, "step", interrupting_step)
    rc, out, err = _generate(tiny_dir, capsys, "--prompt", "w1 w2", "--budget", "0", "--no-chat")
    assert rc == 130
    assert err.splitlines()[-1] == "sssd generate: interrupted"
    lines = out.splitlines()
    assert lines[-3] == "=== prompt: 2 prompt tokens"  # w1 w2
    assert lines[-2] == _greedy_text(tiny_dir, [5, 6], 3)  # the 3 steps' tokens, as text
    assert lines[-1] == "=== prompt: interrupted after 3 new tokens"


def _greedy_text(model_dir, prompt, n):
    """The text of ``n`` greedy tokens by transformers' own generate (independent of the engine)."""
    from tiny_models import hf_greedy
    from transformers import AutoModelForCausalLM

    ids = hf_greedy(AutoModelForCausalLM.from_pretrained(model_dir), prompt, n)
    assert 1 not in ids, "the tiny model ended early: pick another prompt"
    return tiny_tokenizer().decode(ids)


def test_a_real_sigint_keeps_the_text(tiny_dir, tmp_path):
    """SIGINT to a running `sssd generate`: the text so far is printed, the exit status is 130."""
    env = subprocess_env()
    argv = ["generate", "--model", str(tiny_dir), "--device", "cpu", "--prompt", "w1 w2", "--budget", "0",
            "--max-new-tokens", "100000"]  # fmt: skip
    # the tiny model has 256 positions and ends at its context limit: each step is slowed so that the
    # signal finds it running. A shell that starts the tests in the background (`cmd &` without job
    # control) leaves SIGINT ignored, and Python then installs no handler: restore Ctrl-C's default
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import time, sys; from sssd.engine.engine import Engine; step = Engine.step\n"
        "def slow(self):\n    time.sleep(0.05); return step(self)\n"
        "Engine.step = slow\nfrom sssd.cli import main; sys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    header = ""
    while "=== prompt: " not in header:  # the block has started: tokens are being generated
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        header += line
    header += proc.stdout.read(4)  # some text arrived
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = (header + out).rstrip().splitlines()
    start = lines.index("=== prompt: 4 prompt tokens")  # <|user|> w1 w2 <|assistant|>
    text, last = "\n".join(lines[start + 1 : -1]), lines[-1]
    assert last.startswith("=== prompt: interrupted after ") and int(last.split()[-3]) > 0
    assert text.strip()  # the text generated before the signal is on the screen
    assert err.strip().splitlines()[-1] == "sssd generate: interrupted"


def test_generate_output_feeds_build_datastore_without_flags(tiny_dir, tmp_path, capsys):
    from sssd import Datastore, tokenizer_fingerprint

    pairs = tmp_path / "pairs.jsonl"
    prompts = tmp_path / "p.txt"
    prompts.write_text("w1 w2 w3\nw7 w8\n")
    rc, _, _ = _generate(tiny_dir, capsys, "--prompts", str(prompts), "--budget", "0", "--output", str(pairs))
    assert rc == 0
    record = json.loads(pairs.read_text().splitlines()[0])
    fingerprint = tokenizer_fingerprint(tiny_tokenizer())
    assert record["vocab_size"] == 96 and record["tokenizer"].endswith(fingerprint.rpartition(":")[2])
    ds = tmp_path / "outputs.sssd"
    assert build_main([str(pairs), "-o", str(ds), "-q"]) == 0
    assert capsys.readouterr().err == ""  # no warning: the tokenizer is recorded
    assert Datastore.open(ds).tokenizer_fingerprint == record["tokenizer"]
    rc, out, err = _generate(tiny_dir, capsys, "--prompt", "w1 w2", "--datastore", str(ds), "--budget", "4")
    assert rc == 0 and "tokenizer checked" in out and err == ""


def test_pairs_of_another_tokenizer_are_refused(tmp_path, capsys):
    good = {"prompt_ids": [1, 2], "output_ids": [3, 4], "tokenizer": "a:0123456789abcdef", "vocab_size": 50}
    other = {**good, "tokenizer": "b:fedcba9876543210"}
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(other) + "\n")
    assert build_main([str(path), "-o", str(tmp_path / "x.sssd")]) == 2
    err = capsys.readouterr().err
    assert "mixed.jsonl:2: the pair's ids come from tokenizer 'b:fedcba9876543210'" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**good, "vocab_size": "many"}) + "\n")
    assert build_main([str(bad), "-o", str(tmp_path / "y.sssd")]) == 2
    assert "'vocab_size' must be a positive integer" in capsys.readouterr().err
