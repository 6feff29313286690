"""How `sssd` and `build-datastore` end on a user's mistake: one line on stderr, exit status 2 (130 for
Ctrl-C, 141 for a closed output pipe), no traceback; --debug / SSSD_DEBUG=1 show it. The closed pipe and
the minimal install (no torch, no transformers) run in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sssd import DatastoreError, TokenizerMismatchError, build_datastore
from sssd.cli import info as info_cmd
from sssd.cli import main
from sssd.cli.errors import describe, missing_dependency

from datastore_tools.cli import main as build_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def datastore(tmp_path):
    path = tmp_path / "tiny.sssd"
    build_datastore([np.arange(50) % 7, np.arange(30) % 5], path, vocab_size=10)
    return path


@pytest.fixture
def bad_datastore(tmp_path):
    path = tmp_path / "bad.sssd"
    path.write_bytes(b"not a datastore")
    return path


def _one_error_line(err: str, prog: str) -> str:
    assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_datastore_errors_are_one_line(bad_datastore, tmp_path, capsys):
    assert main(["info", str(bad_datastore)]) == 2
    assert f"{bad_datastore}: not an sssd datastore (bad magic bytes)" in _one_error_line(
        capsys.readouterr().err, "sssd info"
    )
    assert main(["info", str(tmp_path / "missing.sssd")]) == 2
    assert "not found" in _one_error_line(capsys.readouterr().err, "sssd info")
    pairs = tmp_path / "p.jsonl"
    pairs.write_text('{"prompt_ids": [1, 2], "output_ids": [3, 4]}\n')
    assert main(["simulate", "--pairs", str(pairs), "--datastore", str(bad_datastore)]) == 2
    _one_error_line(capsys.readouterr().err, "sssd simulate")


def test_tokenizer_mismatch_is_one_line(monkeypatch, capsys):
    def run(args):
        raise TokenizerMismatchError("datastore x was built with tokenizer 'a:1', not 'b:2'")

    monkeypatch.setattr(info_cmd, "run", run)
    assert main(["info", "x.sssd"]) == 2
    assert capsys.readouterr().err == (
        "sssd info: error: datastore x was built with tokenizer 'a:1', not 'b:2'\n"
    )


def test_messages_lose_python_decoration():
    assert (
        describe(FileNotFoundError(2, "No such file or directory", "/x/y"))
        == "No such file or directory: /x/y"
    )
    assert describe(FileNotFoundError("model not found: /x")) == "model not found: /x"
    assert describe(MemoryError()) == "out of memory (use smaller inputs or batches)"


def test_missing_dependency_names_the_extra():
    torch = ModuleNotFoundError("No module named 'torch'", name="torch")
    hf = ModuleNotFoundError("No module named 'transformers'", name="transformers")
    assert missing_dependency(torch, "sssd generate", "torch") == (
        'sssd generate needs torch and transformers: pip install ".[torch]" in the sssd clone '
        "(No module named 'torch')"
    )
    assert missing_dependency(hf, "build-datastore", "tools") == (
        'build-datastore needs transformers and tokenizers: pip install ".[tools]" in the sssd clone '
        "(No module named 'transformers')"
    )
    assert '".[torch]"' in missing_dependency(torch, "build-datastore", "tools")  # tools has no torch
    other = ModuleNotFoundError("No module named 'yaml'", name="yaml")
    assert (
        missing_dependency(other, "sssd info")
        == "No module named 'yaml' (a Python package is missing or broken)"
    )


def test_ctrl_c_exits_130_without_traceback(monkeypatch, tmp_path, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(info_cmd, "run", interrupted)
    assert main(["info", "x.sssd"]) == 130
    assert capsys.readouterr().err == "sssd info: interrupted\n"
    monkeypatch.setattr("datastore_tools.pipeline.build", interrupted)
    out = tmp_path / "out.sssd"
    assert build_main(["corpus.txt", "-o", str(out)]) == 130
    assert capsys.readouterr().err == f"build-datastore: interrupted; nothing was written to {out}\n"


def test_debug_and_sssd_debug_show_the_traceback(bad_datastore, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SSSD_DEBUG", raising=False)
    for argv in (["--debug", "info", str(bad_datastore)], ["info", str(bad_datastore), "--debug"]):
        with pytest.raises(DatastoreError):
            main(argv)
    with pytest.raises(FileNotFoundError):
        build_main([str(tmp_path / "missing.txt"), "-o", str(tmp_path / "o.sssd"), "--debug"])
    monkeypatch.setenv("SSSD_DEBUG", "1")
    with pytest.raises(DatastoreError):
        main(["info", str(bad_datastore)])
    monkeypatch.setenv("SSSD_DEBUG", "0")
    assert main(["info", str(bad_datastore)]) == 2
    capsys.readouterr()


def test_a_bug_keeps_its_traceback(monkeypatch):
    def broken(args):
        raise RuntimeError("internal invariant")

    monkeypatch.setattr(info_cmd, "run", broken)
    with pytest.raises(RuntimeError, match="internal invariant"):
        main(["info", "x.sssd"])


def test_build_datastore_errors_are_one_line(tmp_path, capsys):
    assert build_main([str(tmp_path / "missing.txt"), "-o", str(tmp_path / "o.sssd")]) == 2
    _one_error_line(capsys.readouterr().err, "build-datastore")
    np.save(tmp_path / "c.npy", np.arange(20, dtype=np.int32))
    assert build_main([str(tmp_path / "c.npy"), "-o", str(tmp_path / "o.sssd"), "-q"]) == 2
    assert "--vocab-size" in _one_error_line(capsys.readouterr().err, "build-datastore")


def _python(code: str, *, stdout=subprocess.PIPE) -> subprocess.Popen:
    # the sssd this test imports (the installed wheel in CI, the working tree with PYTHONPATH=python)
    import sssd

    import datastore_tools

    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (sssd, datastore_tools)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env.pop("SSSD_DEBUG", None)
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("command", ["sssd", "build-datastore"])
def test_a_closed_pipe_exits_quietly_with_141(command, datastore, tmp_path):
    if command == "sssd":
        code = f"import sys; from sssd.cli import main; sys.exit(main(['info', {str(datastore)!r}]))"
    else:
        np.save(tmp_path / "c.npy", np.arange(100, dtype=np.int32) % 9)
        argv = [str(tmp_path / "c.npy"), "-o", str(tmp_path / "o.sssd"), "--vocab-size", "9"]
        code = f"import sys; from datastore_tools.cli import main; sys.exit(main({argv!r}))"
    proc = _python(code)
    proc.stdout.close()  # the reader is gone before the command writes (like `| head` that has its lines)
    err = proc.stderr.read()
    assert proc.wait() == 141
    assert "Traceback" not in err and "Broken pipe" not in err and "BrokenPipeError" not in err, err


def test_a_minimal_install_says_what_to_install(datastore, tmp_path):
    from cli_models import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "tok")
    (tmp_path / "corpus.txt").write_text("w1 w2 w3\n")
    build = [
        str(tmp_path / "corpus.txt"),
        "-o",
        str(tmp_path / "o.sssd"),
        "--tokenizer",
        str(tmp_path / "tok"),
    ]
    code = "\n".join(
        [
            "import sys",
            "sys.modules['torch'] = None  # as if `pip install .` without the torch extra",
            "sys.modules['transformers'] = None",
            "from sssd.cli import main",
            "from datastore_tools.cli import main as build_main",
            f"rcs = [main(['info', {str(datastore)!r}]), main(['generate', '--prompt', 'hi'])]",
            f"rcs.append(build_main({build!r}))",
            "print(rcs, 'torch' in sys.modules and sys.modules['torch'] is not None)",
        ]
    )
    proc = _python(code)
    out, err = proc.communicate()
    assert proc.returncode == 0 and out.splitlines()[-1] == "[0, 2, 2] False", (out, err)
    assert err.splitlines() == [
        'sssd generate: error: sssd generate needs torch and transformers: pip install ".[torch]" in the '
        "sssd clone (import of torch halted; None in sys.modules)",
        "build-datastore: error: build-datastore needs transformers and tokenizers: pip install "
        '".[tools]" in the sssd clone (import of transformers halted; None in sys.modules)',
    ]
