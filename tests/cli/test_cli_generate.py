"""sssd generate: prompt files, argument errors, the header, the chat template default, model ids and
datastores without a recorded tokenizer, on a tiny model directory (the engine tests cover the runs)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_models import put_in_hub_cache, save_tiny_model
from sssd.cli import main
from sssd.models.loading import read_prompts


def test_read_prompts_jsonl_and_text(tmp_path):
    j = tmp_path / "p.jsonl"
    j.write_text(json.dumps({"id": "a", "prompt_ids": [1, 2]}) + "\n\n" + json.dumps({"text": "hi"}) + "\n")
    items = read_prompts(j)
    assert items[0] == {"id": "a", "text": None, "ids": [1, 2]}
    assert items[1]["text"] == "hi" and items[1]["ids"] is None
    t = tmp_path / "p.txt"
    t.write_text("first prompt\n\nsecond\n")
    assert [it["text"] for it in read_prompts(t)] == ["first prompt", "second"]


@pytest.mark.parametrize(
    "content,match",
    [
        ("not json\n", "not valid JSON"),
        ("[1, 2]\n", "JSON object"),
        ('{"x": 1}\n', "prompt_ids"),
        ("\n", "no prompts"),
    ],
)
def test_read_prompts_errors(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(ValueError, match=match):
        read_prompts(p)
    with pytest.raises(FileNotFoundError):
        read_prompts(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    "argv,match",
    [
        (["generate", "--prompt", "x", "--batch-size", "0"], "--batch-size: expected an integer >= 1"),
        (
            ["generate", "--prompt", "x", "--max-new-tokens", "0"],
            "--max-new-tokens: expected an integer >= 1",
        ),
        (["generate", "--prompt", "x", "--budget", "-1"], "--budget: expected an integer >= 0"),
        (["generate", "--prompt", "x", "--model", "/nonexistent/model"], "model not found"),
        # Prompts and datastore are read before the model loads: their errors come first.
        (
            ["generate", "--prompts", "/nonexistent.jsonl", "--model", "/nonexistent/m"],
            "prompts file not found",
        ),
        (
            ["generate", "--prompt", "x", "--datastore", "/nonexistent.sssd", "--model", "/nonexistent/m"],
            "not found: /nonexistent.sssd",
        ),
        (["demo", "--prompts", "0"], "--prompts: expected an integer >= 1"),
    ],
)
def test_cli_argument_errors(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize(
    "content,name,match",
    [
        (bytes(range(128, 256)), "random.bin", "random.bin is not UTF-8 text"),
        (b"", "empty.sssd", "empty.sssd: truncated: 0 bytes is smaller than a datastore header"),
        (b"x" * 4096, "other.sssd", "other.sssd: not an sssd datastore (bad magic bytes)"),
    ],
)
def test_file_errors_name_the_file_before_torch_is_imported(tmp_path, content, name, match):
    """A bad prompts file or datastore fails in one line naming it, before torch is imported (a fraction of
    a second, not the seconds torch and the model take)."""
    import os
    import subprocess
    import sys

    path = tmp_path / name
    path.write_bytes(content)
    option = (
        ["--prompts", str(path)] if name.endswith(".bin") else ["--prompt", "x", "--datastore", str(path)]
    )
    code = (
        "import sys; from sssd.cli import main; rc = main(sys.argv[1:]); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run(
        [sys.executable, "-c", code, "generate", *option],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 2 and run.stdout.strip() == "no torch"
    assert run.stderr.count("\n") == 1 and match in run.stderr


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny Llama + word-level tokenizer with a chat template (tests/cli_models.py)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="module")
def tiny_dir_no_chat(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-plain"), chat=False)


@pytest.fixture(autouse=True)
def _no_progress_bars():
    """transformers' "Loading weights" bars go to stderr; the tests read sssd's own lines there."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    yield
    logging.enable_progress_bar()


def _generate(model, capsys, *extra):
    """(exit status, stdout, stderr of sssd) of a short greedy `sssd generate` on the CPU."""
    argv = ["generate", "--model", str(model), "--device", "cpu", "--max-new-tokens", "6", "--quiet"]
    rc = main([*argv, *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def _header(out: str) -> dict[str, str]:
    """The header lines of `sssd generate` ("key: value") as a dict."""
    lines = [line.split(":", 1) for line in out.splitlines()[:5]]
    return {k: v.strip() for k, v in lines}


@pytest.mark.parametrize("attention", ["sdpa", "emulated"])
def test_generate_runs_a_model_directory_with_device_and_attention(tiny_dir, tmp_path, attention, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [5, 6, 7, 8, 5, 6, 7]}\n{"text": "w1 w2 w3 w1 w2"}\n')
    out = tmp_path / "pairs.jsonl"
    extra = ["--prompts", str(prompts), "--attention", attention, "--budget", "8", "--max-new-tokens", "12"]
    rc, text, _ = _generate(tiny_dir, capsys, *extra, "--output", str(out), "--baseline")
    assert rc == 0
    runs_on = _header(text)["runs on"]  # --dtype auto: measured (tests/conftest.py: float32 faster)
    assert runs_on.startswith("cpu, float32 (auto: bfloat16 took 2.00 of float32's time here")
    assert f"), attention {attention}" in runs_on
    assert "identical outputs 2/2" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["prompt_ids"] == [5, 6, 7, 8, 5, 6, 7]
    assert all(1 <= len(r["output_ids"]) <= 12 for r in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl", "pairs.jsonl"]  # no temporary left


def test_generate_rejects_bad_device_and_attention(tiny_dir, capsys):
    import torch

    if not torch.cuda.is_available():
        rc, _, err = _generate(tiny_dir, capsys, "--prompt", "w1", "--device", "cuda")
        assert rc == 2 and "no CUDA device" in err
    rc, _, err = _generate(tiny_dir, capsys, "--prompt", "w1", "--device", "tpu9")
    assert rc == 2 and "unknown device" in err
    rc, _, err = _generate(tiny_dir, capsys, "--prompt", "w1", "--attention", "flash")
    assert rc == 2 and "argument --attention: invalid choice: 'flash' (choose from 'auto', 'sdpa'" in err


@pytest.mark.parametrize(
    "flags,prompt_ids,form",
    [
        ((), [2, 9, 10, 3], "text in the model's chat template"),  # <|user|> w5 w6 <|assistant|>
        (("--chat",), [2, 9, 10, 3], "text in the model's chat template"),
        (("--no-chat",), [9, 10], "text as given (--no-chat)"),
    ],
)
def test_chat_template_is_on_by_default(tiny_dir, tmp_path, capsys, flags, prompt_ids, form):
    out = tmp_path / "pairs.jsonl"
    rc, text, _ = _generate(
        tiny_dir, capsys, "--prompt", "w5 w6", "--budget", "0", "--output", str(out), *flags
    )
    assert rc == 0
    assert json.loads(out.read_text())["prompt_ids"] == prompt_ids
    assert _header(text)["prompts"].startswith(f"1 ({form})")


def test_a_model_without_chat_template_gets_the_raw_text(tiny_dir_no_chat, tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    rc, text, _ = _generate(
        tiny_dir_no_chat, capsys, "--prompt", "w5 w6", "--budget", "0", "--output", str(out)
    )
    assert rc == 0 and json.loads(out.read_text())["prompt_ids"] == [9, 10]
    assert "text as given (the model has no chat template)" in _header(text)["prompts"]
    rc, _, err = _generate(tiny_dir_no_chat, capsys, "--prompt", "w5 w6", "--chat")
    assert rc == 2 and err.strip() == (
        "sssd generate: error: --chat: this model's tokenizer has no chat template (drop --chat)"
    )


@pytest.mark.parametrize(
    "flags,policy,drafter",
    [
        (("--budget", "0"), "plain decoding (--budget 0: no drafting)", "none"),
        (
            ("--budget", "4", "--budget-mode", "fixed"),
            "fixed budget: 4 draft nodes per step for the batch",
            "each request's own tokens + recent outputs (no datastore)",
        ),
        ((), "adaptive budget: the best expected goodput in 0..16 draft nodes", "each request's own"),
        (
            ("--budget", "4", "--budget-mode", "fixed", "--recycled", "all"),
            "fixed budget: 4 draft nodes per step for the batch",
            "each request's own tokens + recent outputs + recycled candidates (the verifier's top-k, "
            "every verified node's) (no datastore)",
        ),
    ],
)
def test_header_states_the_policy_that_runs(tiny_dir, capsys, flags, policy, drafter):
    rc, text, err = _generate(tiny_dir, capsys, "--prompt", "w1 w2", *flags)
    head = _header(text)
    assert rc == 0 and err.count("note:") == 0
    assert head["policy"].startswith(policy) and head["drafter"].startswith(drafter)
    assert head["model"] == str(tiny_dir)


def test_recycled_candidates_change_no_output(tiny_dir, tmp_path, capsys):
    """--recycled walked / all: the drafter gets the verifier's top-k; greedy output as without."""
    outs = []
    for mode in ("off", "walked", "all"):
        out = tmp_path / f"{mode}.jsonl"
        argv = ["--prompt", "w1 w2 w3", "--budget", "8", "--budget-mode", "fixed", "--recycled", mode]
        rc, _, err = _generate(tiny_dir, capsys, *argv, "--output", str(out))
        assert rc == 0 and "note:" not in err
        outs.append(json.loads(out.read_text())["output_ids"])
    assert outs[0] == outs[1] == outs[2]
    rc, _, err = _generate(tiny_dir, capsys, "--prompt", "w1", "--budget", "0", "--recycled", "all")
    assert rc == 0 and "--recycled is not used" in err


def test_header_states_batch_and_sampling_and_notes_unused_options(tiny_dir, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("w1 w2\nw3 w4\nw5\n")
    argv = ["--prompts", str(prompts), "--batch-size", "2", "--temperature", "0.5", "--seed", "3"]
    rc, text, _ = _generate(tiny_dir, capsys, *argv)
    assert rc == 0
    assert _header(text)["prompts"] == (
        "3 (text in the model's chat template); batch size 2; sampling (temperature 0.5, top-k 0, "
        "top-p 1, seed 3); up to 6 new tokens each"
    )
    argv = ["--prompt", "w1", "--budget", "0", "--datastore", "/nonexistent.sssd", "--top-k", "5"]
    rc, text, err = _generate(tiny_dir, capsys, *argv, "--cost-profile", "p.json")
    assert rc == 0 and "greedy" in _header(text)["prompts"]  # the unused datastore is not even opened
    assert err.splitlines() == [
        "sssd generate: note: --datastore is not used: --budget 0 is plain decoding (no drafting)",
        "sssd generate: note: --cost-profile is not used: it seeds only --budget-mode adaptive with "
        "--budget > 0",
        "sssd generate: note: --top-k not used: --temperature 0 is greedy decoding",
    ]


def test_a_hub_id_loads_from_the_local_hugging_face_cache(tiny_dir, tmp_path, monkeypatch, capsys):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = put_in_hub_cache(tiny_dir, hub, "tiny-org/tiny-llama")
    rc, text, _ = _generate("tiny-org/tiny-llama", capsys, "--prompt", "w1 w2", "--budget", "0")
    assert rc == 0 and _header(text)["model"] == f"tiny-org/tiny-llama ({snapshot})"
    rc, _, err = _generate("tiny-org/absent", capsys, "--prompt", "w1")
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("sssd generate: error: model 'tiny-org/absent' is not a local path")
    assert str(hub) in err and "`hf download tiny-org/absent`" in err and "HF_HOME" in err


def test_model_specs(tmp_path, monkeypatch):
    from sssd.models.loading import hf_hub_cache, is_hub_id, resolve_model

    assert is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct") and is_hub_id("gpt2")
    for spec in ("/abs/model", "./rel", "a/b/c", "x.gguf", "../up", "~/m", "a b"):
        assert not is_hub_id(spec), spec
    with pytest.raises(FileNotFoundError, match="model not found"):
        resolve_model("/nonexistent/model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without config"):
        resolve_model(tmp_path / "empty")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="neither a"):
        resolve_model(tmp_path / "weights.bin")
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hf_hub_cache() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    assert hf_hub_cache() == tmp_path / "legacy"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hf_hub_cache() == tmp_path / "hub"


def _tokens_npy(path, vocab: int):
    rng = np.random.default_rng(3)
    np.save(path, np.tile(rng.integers(4, vocab, 40), 5).astype(np.int32))
    return path


def test_a_datastore_without_tokenizer_is_announced_then_used_with_a_warning(tiny_dir, tmp_path, capsys):
    from datastore_tools.cli import main as build_main

    ds = tmp_path / "ids.sssd"
    assert (
        build_main([str(_tokens_npy(tmp_path / "c.npy", 96)), "-o", str(ds), "--vocab-size", "96", "-q"]) == 0
    )
    warning = capsys.readouterr().err
    assert (
        warning.startswith(f"build-datastore: warning: {ds} records no tokenizer")
        and warning.count("\n") == 1
    )
    rc, text, err = _generate(tiny_dir, capsys, "--prompt", "w1 w2 w3", "--datastore", str(ds), "--baseline")
    assert rc == 0 and "identical outputs 1/1" in text
    assert err.splitlines() == [
        f"sssd generate: warning: datastore {ds} records no tokenizer; using it because its vocabulary "
        "(96 ids) fits the model's (96) - its ids must come from this model's tokenizer (build-datastore "
        "--tokenizer records it)"
    ]
    assert _header(text)["drafter"].endswith(f"datastore {ds} (200 tokens, no tokenizer recorded)")
    big = tmp_path / "big.sssd"
    assert (
        build_main([str(_tokens_npy(tmp_path / "b.npy", 200)), "-o", str(big), "--vocab-size", "200", "-q"])
        == 0
    )
    capsys.readouterr()
    rc, _, err = _generate(tiny_dir, capsys, "--prompt", "w1", "--datastore", str(big))
    assert rc == 2 and err.count("\n") == 1 and "(200 ids) is larger than the model's (96)" in err


def test_a_datastore_of_another_tokenizer_is_refused_in_one_line(tiny_dir, tmp_path, capsys):
    from cli_models import tiny_tokenizer
    from sssd import build_datastore

    docs = [np.arange(4, 60), np.arange(10, 90)]
    build_datastore(docs, tmp_path / "other.sssd", vocab_size=96, tokenizer="other:0123456789abcdef")
    build_datastore(docs, tmp_path / "same.sssd", vocab_size=96, tokenizer=tiny_tokenizer())
    rc, _, err = _generate(tiny_dir, capsys, "--prompt", "w1", "--datastore", str(tmp_path / "other.sssd"))
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(
        f"sssd generate: error: datastore {tmp_path / 'other.sssd'} was built with tokenizer"
    )
    rc, text, err = _generate(tiny_dir, capsys, "--prompt", "w1", "--datastore", str(tmp_path / "same.sssd"))
    assert rc == 0 and err == "" and _header(text)["drafter"].endswith("(136 tokens, tokenizer checked)")


@pytest.mark.parametrize("verbose", [False, True])
def test_no_third_party_progress_bars_unless_verbose(tiny_dir, verbose):
    """transformers draws a "Loading weights" bar on every model load: the commands print their own lines
    and show it only with --verbose."""
    import os
    import subprocess
    import sys

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")
    }
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    argv = ["generate", "--model", str(tiny_dir), "--prompt", "w1 w2", "--max-new-tokens", "2", "--quiet"]
    argv += ["--device", "cpu", "--dtype", "float32"] + (["--verbose"] if verbose else [])
    run = subprocess.run(
        [sys.executable, "-m", "sssd.cli", *argv], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert ("Loading weights" in run.stderr) is verbose


def test_the_speedup_line_says_when_the_machine_was_busy(tiny_dir, monkeypatch, capsys):
    from sssd.policy import contention

    busy = iter(range(0, 10**9, 10**6))  # /proc/stat: other processes took every core all the time
    monkeypatch.setattr(contention, "_system_times", lambda: (float(next(busy)), 0.0))
    rc, text, _ = _generate(tiny_dir, capsys, "--prompt", "w1 w2 w3 w1 w2", "--baseline")
    line = next(s for s in text.splitlines() if s.startswith("speedup over plain decoding"))
    assert rc == 0 and "(measured; identical outputs 1/1); unreliable (machine busy: other processes" in line
