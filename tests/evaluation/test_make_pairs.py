"""tools/make_pairs.py without the model: the prompt set is the one behind the shared dev pairs."""

import json
from pathlib import Path

import pytest

make_pairs = pytest.importorskip("tools.make_pairs")
DEV = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "smollm2_dev_pairs.jsonl"


def test_prompts_match_the_dev_pairs():
    try:
        rows = make_pairs.prompts(["mtbench", "humaneval"])
    except FileNotFoundError as e:  # prompt packages not installed
        pytest.skip(str(e))
    assert len(rows) == 80 + 164
    assert len({r["id"] for r in rows}) == len(rows)
    if DEV.is_file():
        dev = {}
        with open(DEV) as f:
            for line in f:
                obj = json.loads(line)
                dev[obj["id"]] = obj
        for r in rows:
            assert dev[r["id"]]["text"] == r["text"] and dev[r["id"]]["subset"] == r["subset"]


def test_unknown_subset_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit):
        make_pairs.main(["--output", str(tmp_path / "p.jsonl"), "--subsets", "gsm8k"])
