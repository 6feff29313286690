import json

import numpy as np
import pytest
from sssd.evaluation.pairs import Pair, filter_pairs, load_pairs, save_pairs, split_pairs, total_tokens


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_roundtrip_keeps_extra_fields(tmp_path):
    rows = [
        {"id": "a", "subset": "x", "text": "hi", "prompt_ids": [1, 2], "output_ids": [3], "finished": True},
        {"id": "b", "subset": "y", "prompt_ids": [4], "output_ids": []},
    ]
    pairs = load_pairs(_write(tmp_path / "p.jsonl", rows))
    assert [p.id for p in pairs] == ["a", "b"]
    assert pairs[0].prompt_ids.dtype == np.int32 and pairs[0].extra == {"text": "hi", "finished": True}
    assert pairs[1].output_ids.size == 0
    assert save_pairs(pairs, tmp_path / "q.jsonl") == 2
    again = load_pairs(tmp_path / "q.jsonl")
    assert [p.to_json() for p in again] == [p.to_json() for p in pairs]
    assert total_tokens(again) == (3, 1)


def test_subset_filters(tmp_path):
    rows = [{"id": str(i), "subset": "ab"[i % 2], "prompt_ids": [1], "output_ids": [2]} for i in range(6)]
    path = _write(tmp_path / "p.jsonl", rows)
    assert len(load_pairs(path, subsets="a")) == 3
    assert len(load_pairs(path, subsets="a,b")) == 6
    assert len(filter_pairs(load_pairs(path), ["b"])) == 3
    assert len(load_pairs(path, limit=2)) == 2
    with pytest.raises(ValueError, match="no pairs in subset"):
        load_pairs(path, subsets="zzz")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"prompt_ids": [1]}', "missing field"),
        ('{"prompt_ids": [], "output_ids": [1]}', "prompt_ids is empty"),
        ('{"prompt_ids": [1, -2], "output_ids": [1]}', "outside"),
        ('{"prompt_ids": [1, 2.5], "output_ids": [1]}', "int token ids"),
        ('{"prompt_ids": "abc", "output_ids": [1]}', "list of int"),
        ('{"prompt_ids": [1], "output_ids": [99]}', "vocab_size"),
    ],
)
def test_bad_lines_say_where(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "prompt_ids": [1], "output_ids": [2]}\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as e:
        load_pairs(path, vocab_size=50)
    assert "bad.jsonl:2" in str(e.value)


def test_duplicate_ids_and_missing_file(tmp_path):
    row = {"id": "a", "prompt_ids": [1], "output_ids": [2]}
    with pytest.raises(ValueError, match="duplicate id"):
        load_pairs(_write(tmp_path / "d.jsonl", [row, row]))
    with pytest.raises(FileNotFoundError):
        load_pairs(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError):
        save_pairs([], tmp_path / "no" / "dir.jsonl")


def test_pair_requires_int32_arrays():
    with pytest.raises(TypeError):
        Pair("a", "", np.array([1], dtype=np.int64), np.array([1], dtype=np.int32))


def test_split_is_deterministic_and_disjoint():
    pairs = [Pair.make([1], [2], id=f"p{i}", subset="s") for i in range(200)]
    a, b = split_pairs(pairs, 0.3)
    assert {p.id for p in a}.isdisjoint({p.id for p in b}) and len(a) + len(b) == 200
    assert 30 < len(a) < 90
    a2, _ = split_pairs(list(reversed(pairs)), 0.3)
    assert {p.id for p in a2} == {p.id for p in a}
    with pytest.raises(ValueError):
        split_pairs(pairs, 1.5)
