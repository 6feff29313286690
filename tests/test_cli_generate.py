"""sssd generate / demo command line: prompt files and argument errors (the model runs are covered by
the engine tests and the demo itself)."""

from __future__ import annotations

import json

import pytest
from sssd.cli import main
from sssd.model_loading import read_prompts


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
