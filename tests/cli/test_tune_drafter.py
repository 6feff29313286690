"""Draft models derived from a target and tuned on its outputs (`sssd tune-drafter`), on tiny seeded
models: derivation keeps the vocabulary and loads back, packing keeps documents apart, training lowers
the loss, boosting weights what earlier drafts miss, the command writes a loadable directory, and bad
inputs or an interrupted run leave one error line and nothing half-written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from cli_models import save_tiny_model
from sssd.cli import main
from sssd.models import tuning
from sssd.models.draft import DraftSpec, derive_draft, save_draft
from sssd.models.tuning import (
    IGNORE,
    Doc,
    TuneConfig,
    boost_weights,
    doc_agreement,
    docs_from_pairs,
    pack,
    split_docs,
    train_draft,
)
from tiny_models import FAMILIES, VOCAB, hf_greedy, tiny_model
from transformers import AutoModelForCausalLM


def _target_pairs(model, n: int = 12, prompt_len: int = 6, out_len: int = 16, seed: int = 0):
    """(prompt, output) pairs of the target's own greedy outputs on seeded random prompts."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = rng.integers(4, VOCAB, prompt_len).tolist()
        out.append((np.array(prompt, np.int32), np.array(hf_greedy(model, prompt, out_len), np.int32)))
    return out


def test_draft_spec_parsing():
    assert DraftSpec.parse("layers:3") == DraftSpec(layers=3)
    assert DraftSpec.parse("width:64, layers:2") == DraftSpec(layers=2, width=64)
    assert str(DraftSpec.parse("width:64")) == "width:64,layers:2"
    for bad in ("", "layers", "layers:0", "layers:x", "depth:2", "layers:1,layers:2"):
        with pytest.raises(ValueError, match="draft spec"):
            DraftSpec.parse(bad)


@pytest.mark.parametrize("family", FAMILIES)
def test_layers_draft_copies_the_target_and_loads_back(family, tmp_path):
    target = tiny_model(family)
    draft = derive_draft(target, "layers:1")
    assert draft.config.num_hidden_layers == 1 and draft.config.vocab_size == VOCAB
    t_state, d_state = target.state_dict(), draft.state_dict()
    assert all(torch.equal(d_state[k], t_state[k]) for k in d_state)
    assert any(".layers.0." in k for k in d_state) and not any(".layers.1." in k for k in d_state)
    assert torch.equal(draft.get_output_embeddings().weight, target.get_output_embeddings().weight)
    assert target.config.num_hidden_layers == 2  # the target is untouched
    save_draft(draft, tmp_path / "d")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "d").eval()
    ids = torch.tensor([[5, 9, 17, 3, 40]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, draft(ids).logits, atol=1e-5)
    with pytest.raises(ValueError, match="only 2 decoder layers"):
        derive_draft(target, "layers:3")


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_width_draft_is_narrow_keeps_the_vocabulary_and_loads_back(family, tmp_path):
    target = tiny_model(family)
    draft = derive_draft(target, "width:16,layers:1", seed=3)
    assert draft.config.hidden_size == 16 and draft.config.num_hidden_layers == 1
    assert draft.get_output_embeddings().weight.shape == (VOCAB, 16)
    again = derive_draft(target, "width:16,layers:1", seed=3)
    pairs = zip(draft.state_dict().values(), again.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    save_draft(draft, tmp_path / "w")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "w")
    assert loaded.config.hidden_size == 16 and loaded.config.vocab_size == VOCAB
    with pytest.raises(ValueError, match="multiple of the target's head size"):
        derive_draft(target, "width:12")


def test_packing_keeps_documents_apart_and_labels_only_outputs():
    model = tiny_model("llama")
    docs = [Doc(np.array([5, 6, 7, 8], np.int32), 2), Doc(np.array([9, 10, 11], np.int32), 1)]
    data = pack(docs)
    assert data.positions.tolist() == [0, 1, 2, 3, 0, 1, 2]
    # labels[i] = the output token after position i: doc 1's outputs are 7, 8; doc 2's 10, 11
    assert data.labels.tolist() == [IGNORE, 7, 8, IGNORE, 10, 11, IGNORE]
    ids, pos, _ = data.batch([0], 7)
    with torch.no_grad():
        packed = tuning._logits(model, ids, pos)[0]
        alone = [model(input_ids=torch.tensor([d.tokens.tolist()])).logits[0] for d in docs]
    assert torch.allclose(packed, torch.cat(alone), atol=1e-5)
    with pytest.raises(ValueError, match="empty data"):
        pack([])
    train, held = split_docs(docs * 10, 0.1, seed=0)
    assert len(train) == 18 and len(held) == 2


def test_a_few_training_steps_lower_the_loss_and_raise_agreement():
    target = tiny_model("llama")
    docs = docs_from_pairs(_target_pairs(target, n=16))
    draft = derive_draft(target, "layers:1")
    before = doc_agreement([draft], docs)[0][0]
    cfg = TuneConfig(steps=40, batch_size=4, seq_len=32, lr=3e-3, warmup=5, eval_every=0, seed=1)
    stats = train_draft(draft, pack(docs), cfg)
    first = np.mean([v for _, v in stats.losses[:5]])
    last = np.mean([v for _, v in stats.losses[-5:]])
    assert last < 0.8 * first, (first, last)
    assert doc_agreement([draft], docs)[0][0] > before
    assert stats.steps == 40 and stats.tokens == 40 * 4 * 32


def test_training_is_seeded():
    target = tiny_model("llama")
    data = pack(docs_from_pairs(_target_pairs(target, n=6)))
    cfg = TuneConfig(steps=5, batch_size=2, seq_len=16, eval_every=0)
    runs = []
    for _ in range(2):
        draft = derive_draft(target, "layers:1")
        runs.append(train_draft(draft, data, cfg).losses)
    assert runs[0] == runs[1]


def test_boosting_weights_what_earlier_drafts_miss():
    target = tiny_model("llama")
    docs = docs_from_pairs(_target_pairs(target, n=4))
    ids, pos, labels = pack(docs).batch([0], 64)
    w, missed = boost_weights([], ids, pos, labels, 0.25)
    assert w.tolist() == [1.0] * int((labels != IGNORE).sum()) and missed == 1.0
    # the target itself as the "earlier draft": it predicts its own greedy outputs everywhere
    w, missed = boost_weights([target], ids, pos, labels, 0.25)
    assert set(w.tolist()) == {0.25} and missed == 0.0
    w, missed = boost_weights([target], ids, pos, labels, 1.0)  # boosting off: the share still shows
    assert set(w.tolist()) == {1.0} and missed == 0.0


def _write_pairs(path, pairs, bump: int = 0):
    with open(path, "w") as f:
        for i, (p, o) in enumerate(pairs):
            f.write(json.dumps({"id": str(i), "prompt_ids": p.tolist(), "output_ids": (o + bump).tolist()}))
            f.write("\n")
    return path


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    target = save_tiny_model(root / "target")
    model = tiny_model("llama")
    pairs = _write_pairs(root / "train.jsonl", _target_pairs(model, n=12))
    held = _write_pairs(root / "held.jsonl", _target_pairs(model, n=4, seed=7))
    return target, pairs, held


def _args(target, data, out, *extra):
    run = ["--steps", "6", "--batch-size", "2", "--seq-len", "16", "--draft", "layers:1"]
    return ["tune-drafter", "--target", str(target), "--data", str(data), "--out", str(out), *run, *extra]


def test_cli_writes_a_loadable_draft_and_a_report(tiny_target, tmp_path, capsys):
    target, pairs, held = tiny_target
    out = tmp_path / "draft"
    assert main(_args(target, pairs, out, "--eval-pairs", str(held), "--eval-every", "3")) == 0
    err = capsys.readouterr().err
    assert "step 6/6: loss" in err and "held-out top-1 agreement" in err and "tokens/s" in err
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 1 and model.config.vocab_size == VOCAB
    assert (out / "tokenizer.json").is_file()
    report = json.loads((out / "tune_report.json").read_text())
    assert 0 <= report["drafts"][0]["eval_agreement_after"] <= 1
    assert [p.name for p in tmp_path.iterdir()] == ["draft"]  # no temporary directory left
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask


def test_cli_boosting_writes_one_directory_per_draft(tiny_target, tmp_path, capsys):
    target, pairs, held = tiny_target
    out = tmp_path / "drafts"
    assert main(_args(target, pairs, out, "--drafts", "2", "--eval-pairs", str(held))) == 0
    err = capsys.readouterr().err
    assert "draft 2/2: step 6/6" in err and "missed by earlier drafts" in err
    assert "any of the 2 drafts right" in err
    for k in (1, 2):
        AutoModelForCausalLM.from_pretrained(out / f"draft-{k}")
    assert "eval_agreement_any_draft" in json.loads((out / "tune_report.json").read_text())


def _one_error(capsys, needle: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("sssd tune-drafter: error: ") and err.count("\n") == 1, err
    assert needle in err, err


def test_cli_bad_inputs_give_one_line_and_status_2(tiny_target, tmp_path, capsys):
    target, pairs, _ = tiny_target
    out = tmp_path / "out"
    assert main(_args(target, tmp_path / "missing.jsonl", out)) == 2
    _one_error(capsys, "data file not found")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(_args(target, empty, out)) == 2
    _one_error(capsys, "empty data")
    foreign = _write_pairs(tmp_path / "foreign.jsonl", [(np.array([5]), np.array([3, 4]))], bump=VOCAB)
    assert main(_args(target, foreign, out)) == 2
    _one_error(capsys, "vocabulary mismatch")
    tokens = tmp_path / "c.tokens.npy"
    np.save(tokens, np.array([5, 6, 500], np.int32))
    np.save(tmp_path / "c.offsets.npy", np.array([0, 3], np.int64))
    assert main(_args(target, tokens, out)) == 2
    _one_error(capsys, "vocabulary mismatch")
    assert main(_args(target, pairs, out, "--draft", "depth:2")) == 2
    _one_error(capsys, "draft spec")
    assert main(_args(target, pairs, tmp_path)) == 2
    _one_error(capsys, "exists")
    other = tmp_path / "other"
    AutoModelForCausalLM.from_config(
        AutoModelForCausalLM.from_pretrained(target).config.__class__(
            vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
    ).save_pretrained(other)
    assert main(_args(target, pairs, out, "--draft", str(other))) == 2
    _one_error(capsys, "vocabulary mismatch")
    assert not out.exists()


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_nothing_half_written_when_training_stops(tiny_target, tmp_path, monkeypatch, capsys, error):
    target, pairs, _ = tiny_target
    out = tmp_path / "out"
    real = tuning.train_draft
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second draft: the first one is trained and waiting to be saved
            raise error("stop")
        return real(*args, **kwargs)

    monkeypatch.setattr(tuning, "train_draft", failing)
    if error is KeyboardInterrupt:
        assert main(_args(target, pairs, out, "--drafts", "2")) == 130
    else:
        with pytest.raises(RuntimeError):
            main(_args(target, pairs, out, "--drafts", "2"))
    assert list(tmp_path.iterdir()) == []


def test_save_is_atomic_when_writing_fails(tmp_path, monkeypatch):
    draft = derive_draft(tiny_model("llama"), "layers:1")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(draft, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        save_draft(draft, tmp_path / "d")
    assert list(tmp_path.iterdir()) == []


def test_kl_to_the_target_logits_trains_too():
    target = tiny_model("llama")
    data = pack(docs_from_pairs(_target_pairs(target, n=8)))
    cfg = TuneConfig(steps=25, batch_size=4, seq_len=16, lr=3e-3, warmup=2, kl_weight=0.5, eval_every=0)
    with pytest.raises(ValueError, match="needs the target"):
        train_draft(derive_draft(target, "layers:1"), data, cfg)
    stats = train_draft(derive_draft(target, "layers:1"), data, cfg, teacher=target)
    assert np.mean([v for _, v in stats.losses[-5:]]) < np.mean([v for _, v in stats.losses[:5]])


def test_an_npz_corpus_is_data_like_its_npy_pair(tmp_path):
    """--data takes the bundled sample (.npz with tokens and offsets) as it takes NAME.tokens.npy."""
    from sssd.data import sample_corpus, sample_corpus_path
    from sssd.models.tuning import load_corpus

    tokens, offsets = sample_corpus()
    np.save(tmp_path / "s.tokens.npy", tokens)
    np.save(tmp_path / "s.offsets.npy", offsets)
    from_npz, from_npy = load_corpus(sample_corpus_path()), load_corpus(tmp_path / "s.tokens.npy")
    assert len(from_npz) == len(from_npy) > 1000
    assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(from_npz, from_npy, strict=True))
    np.savez(tmp_path / "bad.npz", tokens=tokens)
    with pytest.raises(ValueError, match="holds the arrays 'tokens' and 'offsets'"):
        load_corpus(tmp_path / "bad.npz")
