"""build-datastore end to end: every input kind through the CLI (in process), shards, errors, interrupts."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from sssd import Datastore, SearchConfig, tokenizer_fingerprint

from datastore_tools import cli, progress

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

SENTENCES = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "def add ( a , b ) : return a + b",
    "user assistant system hello world",
]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"


@pytest.fixture(scope="module")
def tiny_tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WordLevel tokenizer trained on SENTENCES, saved as a Hugging Face directory with a chat template.

    Its post-processor wraps a text in <s> ... </s>, which only --add-special-tokens should apply.
    """
    from cli_models import save_wordlevel_tokenizer

    return save_wordlevel_tokenizer(tmp_path_factory.mktemp("tok") / "tiny-tok", SENTENCES, CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def tiny_tok(tiny_tok_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(str(tiny_tok_dir))


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def run(args: list[str], capsys) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def docs(path: Path) -> list[list[int]]:
    ds = Datastore.open(path)
    return [ds.document(k).tolist() for k in range(ds.num_documents)]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_jsonl_text_field_builds_a_searchable_datastore(tmp_path, tiny_tok_dir, tiny_tok, capsys):
    src = write_jsonl(tmp_path / "c.jsonl", [{"body": s, "id": i} for i, s in enumerate(SENTENCES)])
    out = tmp_path / "ds.sssd"
    rc, stdout, _ = run([src, "-o", out, "--tokenizer", tiny_tok_dir, "--text-field", "body"], capsys)
    assert rc == 0
    assert docs(out) == [encode(tiny_tok, s) for s in SENTENCES]
    ds = Datastore.open(out, tokenizer=tiny_tok)  # the fingerprint in the header matches
    assert ds.tokenizer_fingerprint == tokenizer_fingerprint(tiny_tok)
    assert ds.vocab_size == len(tiny_tok)
    # "sat on the" is followed by "mat" and by "log" in the corpus.
    context = np.asarray(encode(tiny_tok, "sat on the"), dtype=np.int32)
    trie = ds.search_one(context, SearchConfig(min_occurrences=1))  # the longest match only
    firsts = {path[0] for path in trie.paths()}
    assert firsts == {tiny_tok.convert_tokens_to_ids("mat"), tiny_tok.convert_tokens_to_ids("log")}
    assert "documents:   4" in stdout and f"tokens:      {len(ds)}" in stdout


def test_add_special_tokens_only_when_asked(tmp_path, tiny_tok_dir, tiny_tok, capsys):
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": SENTENCES[0]}])
    plain, special = tmp_path / "a.sssd", tmp_path / "b.sssd"
    assert run([src, "-o", plain, "--tokenizer", tiny_tok_dir], capsys)[0] == 0
    assert run([src, "-o", special, "--tokenizer", tiny_tok_dir, "--add-special-tokens"], capsys)[0] == 0
    ids = encode(tiny_tok, SENTENCES[0])
    assert docs(plain) == [ids]
    assert docs(special) == [[tiny_tok.bos_token_id, *ids, tiny_tok.eos_token_id]]


def test_jsonl_chat_records_use_the_chat_template(tmp_path, tiny_tok_dir, tiny_tok, capsys):
    conv = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "the cat sat"}]
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": conv}, {"messages": conv[:1]}])
    out = tmp_path / "chat.sssd"
    assert run([src, "-o", out, "--tokenizer", tiny_tok_dir, "-q"], capsys)[0] == 0
    expected = [encode(tiny_tok, tiny_tok.apply_chat_template(c, tokenize=False)) for c in (conv, conv[:1])]
    assert docs(out) == expected
    start = tiny_tok.convert_tokens_to_ids("<|im_start|>")
    assert docs(out)[0].count(start) == 2  # special tokens in the rendered text are single ids


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("output", [[7, 8, 9], [4]]),
        ("prompt", [[1, 2], [3]]),
        ("both", [[1, 2], [7, 8, 9], [3], [4]]),
        ("concat", [[1, 2, 7, 8, 9], [3, 4]]),
    ],
)
def test_jsonl_pairs_choose_the_ids(tmp_path, capsys, choice, expected):
    records = [{"prompt_ids": [1, 2], "output_ids": [7, 8, 9]}, {"prompt_ids": [3], "output_ids": [4]}]
    src = write_jsonl(tmp_path / "pairs.jsonl", records)
    out = tmp_path / "p.sssd"
    assert run([src, "-o", out, "--vocab-size", 10, "--pair-ids", choice, "-q"], capsys)[0] == 0
    assert docs(out) == expected
    assert Datastore.open(out).tokenizer_fingerprint == ""


def test_text_files_and_source_tree(tmp_path, tiny_tok_dir, tiny_tok, capsys):
    tree = tmp_path / "src"
    (tree / "pkg" / "sub").mkdir(parents=True)
    (tree / ".hidden").mkdir()
    (tree / "vendored").mkdir()
    (tree / "pkg" / "a.py").write_text("def add ( a , b ) : return a + b")
    (tree / "pkg" / "sub" / "b.py").write_text("the cat sat")
    (tree / "pkg" / "notes.txt").write_text("the dog")  # not matched by --glob
    (tree / "pkg" / "bin.py").write_bytes(b"the\x00cat")  # binary: skipped, counted
    (tree / "pkg" / "latin.py").write_bytes("caf\xe9".encode("latin-1"))  # not UTF-8: skipped, counted
    (tree / "pkg" / "empty.py").write_text("")  # no tokens: skipped, counted
    (tree / ".hidden" / "h.py").write_text("the mat")
    (tree / "vendored" / "v.py").write_text("the log")
    single = tmp_path / "one.txt"
    single.write_text("hello world")
    out = tmp_path / "tree.sssd"
    args = [tree, single, "-o", out, "--tokenizer", tiny_tok_dir, "--glob", "*.py", "--exclude", "vendored"]
    rc, stdout, _ = run(args, capsys)
    assert rc == 0
    # Sorted walk: pkg/a.py before pkg/sub/b.py; then the single file, in command-line order.
    assert docs(out) == [
        encode(tiny_tok, t) for t in ("def add ( a , b ) : return a + b", "the cat sat", "hello world")
    ]
    assert "skipped:     2 binary/non-UTF-8 files, 1 empty documents" in stdout


def test_npy_with_offsets_npz_and_several_inputs(tmp_path, capsys):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 300, size=50).astype(np.int32)
    offsets = np.array([0, 10, 10, 35, 50], dtype=np.int64)  # one empty document
    np.save(tmp_path / "c.tokens.npy", tokens)
    np.save(tmp_path / "c.offsets.npy", offsets)
    np.save(tmp_path / "whole.npy", tokens[:5].astype(np.int64))  # no offsets file: one document
    np.savez(tmp_path / "z.npz", tokens=tokens[:7].astype(np.uint16), offsets=np.array([0, 3, 7]))
    out = tmp_path / "arr.sssd"
    # Both .npy files of the pair may be named (as a shell glob c.*.npy gives them).
    inputs = [
        tmp_path / "c.offsets.npy",
        tmp_path / "c.tokens.npy",
        tmp_path / "whole.npy",
        tmp_path / "z.npz",
    ]
    rc, stdout, _ = run([*inputs, "-o", out, "--vocab-size", 300], capsys)
    assert rc == 0
    t = tokens.tolist()
    assert docs(out) == [t[:10], t[10:35], t[35:50], t[:5], t[:3], t[3:7]]
    assert "documents:   6" in stdout and "1 empty documents" in stdout


def test_real_smollm2_tokenizer(tmp_path, capsys):
    """The default tokenizer and --tokenizer FILE.gguf both give SmolLM2's ids (cached conversion)."""
    from sssd.models import local as models

    try:
        gguf = models.find_smollm2_gguf()
        hf_dir = models.ensure_hf_model()  # converted once and cached; later runs only load it
    except FileNotFoundError as e:
        pytest.skip(str(e))
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    src = write_jsonl(tmp_path / "code.jsonl", [{"text": text}, {"text": "Hello, world!"}])
    expected = [encode(tok, text), encode(tok, "Hello, world!")]
    for name, extra in (("default.sssd", []), ("gguf.sssd", ["--tokenizer", gguf])):
        assert run([src, "-o", tmp_path / name, "-q", *extra], capsys)[0] == 0
        ds = Datastore.open(tmp_path / name, tokenizer=tok)
        assert ds.vocab_size == 49152 and ds.info().token_width == 2
        assert docs(tmp_path / name) == expected


def test_gguf_tokenizer_is_converted_once(tmp_path, monkeypatch, tiny_tok):
    """A .gguf tokenizer is read from the GGUF file once, then from the cached directory."""
    from sssd.models import local as models

    from datastore_tools import tokenizing

    monkeypatch.setenv("SSSD_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    real_load, gguf_reads = models.load_tokenizer, []

    def load(spec=None):
        if Path(spec).suffix == ".gguf":
            gguf_reads.append(spec)
            return tiny_tok  # stands for the slow GGUF vocabulary conversion
        return real_load(spec)

    monkeypatch.setattr(models, "load_tokenizer", load)
    first = tokenizing.load_tokenizer(str(gguf))
    second = tokenizing.load_tokenizer(str(gguf))
    assert len(gguf_reads) == 1
    assert tokenizer_fingerprint(second).split(":")[1] == tokenizer_fingerprint(first).split(":")[1]
    assert (tmp_path / "cache" / "tokenizers" / f"m-{gguf.stat().st_size}" / "tokenizer.json").is_file()


def test_sample_corpus_builds(tmp_path, capsys):
    from sssd import data

    tokens, offsets = data.sample_corpus()
    assert tokens.dtype == np.int32 and offsets.dtype == np.int64
    assert offsets[0] == 0 and offsets[-1] == tokens.size and len(offsets) == 1501
    assert int(tokens.max()) < data.sample_vocab_size() == 49152
    out = tmp_path / "sample.sssd"
    # The .npz records its vocabulary, so neither --vocab-size nor --tokenizer is needed.
    assert run([data.sample_corpus_path(), "-o", out, "-q"], capsys)[0] == 0
    ds = Datastore.open(out)
    assert ds.num_documents == 1500 and len(ds) == tokens.size
    assert ds.tokenizer_fingerprint == data.sample_tokenizer_fingerprint()
    assert ds.document(1499).tolist() == tokens[offsets[1499] :].tolist()


def test_shards_split_at_documents_and_open_as_one(tmp_path, capsys):
    lengths = [5, 5, 3, 12, 4, 1]
    tokens = np.arange(sum(lengths), dtype=np.int32) % 97
    np.save(tmp_path / "c.tokens.npy", tokens)
    np.save(tmp_path / "c.offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    out = tmp_path / "shards"
    rc, stdout, _ = run(
        [tmp_path / "c.tokens.npy", "-o", out, "--vocab-size", 97, "--shard-tokens", 10], capsys
    )
    assert rc == 0
    names = sorted(p.name for p in out.iterdir())
    # Greedy by whole documents: [5, 5] [3] [12] (longer than 10: alone) [4, 1].
    assert names == [f"shard-{k:05d}.sssd" for k in range(4)]
    assert [len(Datastore.open(out / n)) for n in names] == [10, 3, 12, 5]
    ds = Datastore.open(out)
    assert ds.num_shards == 4 and len(ds) == tokens.size
    assert [ds.document(k).size for k in range(ds.num_documents)] == lengths
    assert "(4 shards)" in stdout
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask  # an ordinary directory, not mkdtemp's 0700
    # Replacing needs --force; then the new shards replace the old ones.
    assert (
        run([tmp_path / "c.tokens.npy", "-o", out, "--vocab-size", 97, "--shard-tokens", 100], capsys)[0] == 2
    )
    args = [tmp_path / "c.tokens.npy", "-o", out, "--vocab-size", 97, "--shard-tokens", 100, "--force", "-q"]
    assert run(args, capsys)[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["shard-00000.sssd"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.offsets.npy", "c.tokens.npy", "shards"]


def _only_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith("build-datastore: ") or "error" in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _error_cases(tmp: Path) -> dict[str, tuple[list, str]]:
    """name -> (arguments before -o, text the one error line must contain)."""
    write_jsonl(tmp / "pairs.jsonl", [{"prompt_ids": [1], "output_ids": [2, 3]}, {"output_ids": [4, 99]}])
    (tmp / "bad.jsonl").write_text('{"text": "the cat"}\n\n{"text": "the dog"\n')
    (tmp / "empty.jsonl").write_text('{"text": ""}\n{"text": "   "}\n')
    np.save(tmp / "big.tokens.npy", np.array([1, 2, 500, 3], dtype=np.int32))
    np.save(tmp / "big.offsets.npy", np.array([0, 2, 4], dtype=np.int64))
    return {
        "missing file": ([tmp / "nope.jsonl"], "input not found"),
        "bad json line": ([tmp / "bad.jsonl"], "bad.jsonl:3: not valid JSON"),
        "empty corpus": ([tmp / "empty.jsonl"], "empty"),
        "ids out of range (jsonl)": ([tmp / "pairs.jsonl", "--vocab-size", 50], "pairs.jsonl:2: token id 99"),
        "ids out of range (npy)": (
            [tmp / "big.tokens.npy", "--vocab-size", 50],
            "token id 500 at position 2",
        ),
        "no vocabulary": ([tmp / "big.tokens.npy"], "--vocab-size"),
        "offsets alone": ([tmp / "big.offsets.npy", "--vocab-size", 50], "document-offsets file"),
        "vocab below tokenizer": ([tmp / "bad.jsonl", "--vocab-size", 3], "smaller than the tokenizer"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing file",
        "bad json line",
        "empty corpus",
        "ids out of range (jsonl)",
        "ids out of range (npy)",
        "no vocabulary",
        "offsets alone",
        "vocab below tokenizer",
    ],
)
@pytest.mark.parametrize("sharded", [False, True])
def test_errors_print_one_line_exit_2_and_write_nothing(tmp_path, tiny_tok_dir, capsys, case, sharded):
    args, expected = _error_cases(tmp_path)[case]
    if case in ("bad json line", "empty corpus", "vocab below tokenizer"):
        args = [*args, "--tokenizer", tiny_tok_dir]
    out = tmp_path / "out" / ("shards" if sharded else "ds.sssd")
    out.parent.mkdir()
    rc, _, err = run([*args, "-o", out, *(["--shard-tokens", 2] if sharded else [])], capsys)
    assert rc == 2
    line = _only_error_line(err)
    assert line.startswith("build-datastore: error: ") and expected in line, line
    assert list(out.parent.iterdir()) == []  # no datastore, no temporary file or directory


def test_existing_output_needs_force(tmp_path, capsys):
    np.save(tmp_path / "t.npy", np.array([1, 2, 3], dtype=np.int32))
    out = tmp_path / "ds.sssd"
    out.write_bytes(b"keep me")
    rc, _, err = run([tmp_path / "t.npy", "-o", out, "--vocab-size", 5], capsys)
    assert rc == 2 and "--force" in _only_error_line(err)
    assert out.read_bytes() == b"keep me"
    assert run([tmp_path / "t.npy", "-o", out, "--vocab-size", 5, "--force", "-q"], capsys)[0] == 0
    assert docs(out) == [[1, 2, 3]]


@pytest.mark.parametrize("sharded", [False, True])
def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch, capsys, sharded):
    """Ctrl-C while the suffix array of the (second) shard is sorted: no file, no temporary left."""
    tokens = np.arange(40, dtype=np.int32) % 11
    np.save(tmp_path / "c.tokens.npy", tokens)
    np.save(tmp_path / "c.offsets.npy", np.arange(0, 41, 10, dtype=np.int64))
    seen: list[str] = []
    real_phase = progress.Progress.phase

    def interrupt(self, name, done, total):
        seen.append(name)
        if "sorting suffixes" in name and (not sharded or name.startswith("shard-00001")):
            raise KeyboardInterrupt
        real_phase(self, name, done, total)

    monkeypatch.setattr(progress.Progress, "phase", interrupt)
    out = tmp_path / "out" / ("shards" if sharded else "ds.sssd")
    out.parent.mkdir()
    extra = ["--shard-tokens", 20] if sharded else []
    rc, _, err = run([tmp_path / "c.tokens.npy", "-o", out, "--vocab-size", 11, *extra], capsys)
    assert rc == 130 and "interrupted" in err
    assert any("sorting suffixes" in s for s in seen)
    assert list(out.parent.iterdir()) == []


def test_progress_redraws_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    from datastore_tools.stats import ReadStats

    stream = Tty()
    bar = progress.Progress(total_bytes=1000, stream=stream, interval=0.0)
    bar.reading(ReadStats(input_bytes=500, documents=3, tokens=1200), force=True)
    bar.phase("sorting suffixes", 1, 2)
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\rreading [" + "#" * 12 + "-" * 12 + "]  50% 3 docs 1.2k tokens")
    assert "\rsorting suffixes  50%" in text and text.endswith("\n")
