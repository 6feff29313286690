"""The command lines the README and docs/ show are ones a user can run: every `sssd ...` and
`build-datastore ...` line in their code blocks parses with today's options and values, none needs the
project's development data (`../shared`), the bundled-sample trick they use works, and the architecture
map names every part of the package."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from sssd.cli import make_parser

from datastore_tools.cli import make_parser as build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?P<fence>`{3,})(?P<lang>\w*)\n(?P<code>.*?)\n(?P=fence)(?!`)", re.S)
SAMPLE = "\"$(python -c 'import sssd.data; print(sssd.data.sample_corpus_path())')\""


def command_lines() -> list[tuple[str, list[str]]]:
    """(where, argv) of every sssd / build-datastore command in a code block (continuations joined,
    comments dropped, cut at the first pipe or redirection)."""
    if not (ROOT / "docs").is_dir():
        return []
    out = []
    for path in DOCS:
        for block in FENCE.finditer(path.read_text(encoding="utf-8")):
            if block["lang"] not in ("", "bash", "sh"):
                continue
            for line in block["code"].replace("\\\n", " ").splitlines():
                line = line.strip()
                if not line.startswith(("sssd ", "build-datastore ")) or line.split()[1].endswith(":"):
                    continue  # not a command, or a message the command prints ("sssd info: error: ...")
                argv = shlex.split(line, comments=True)
                stops = [i for i, a in enumerate(argv) if a in ("|", "&&", ";", ">", "2>&1")]
                out.append((f"{path.name}: {line[:70]}", argv[: stops[0]] if stops else argv))
    return out


def _parse(argv: list[str]) -> None:
    if argv[0] == "build-datastore" or argv[1:2] == ["build-datastore"]:
        rest = argv[1:] if argv[0] == "build-datastore" else argv[2:]
        build_parser().parse_intermixed_args(rest)
    else:
        make_parser().parse_args(argv[1:])


def test_there_are_examples_to_check():
    if not (ROOT / "docs").is_dir():
        pytest.skip("an installed copy, not a checkout")
    names = {argv[1] if argv[0] == "sssd" else argv[0] for _, argv in command_lines()}
    assert {"generate", "simulate", "calibrate", "tune-drafter", "build-datastore", "info"} <= names


@pytest.mark.parametrize("where,argv", command_lines(), ids=[w for w, _ in command_lines()])
def test_every_shown_command_line_parses(where, argv, capsys):
    try:
        _parse(argv)
    except SystemExit as e:
        pytest.fail(f"{where}: does not parse: {capsys.readouterr().err.strip()} (exit {e.code})")
    assert not any("../shared" in a or "shared/data" in a for a in argv), (
        f"{where}: a user's example must not need the project's development data"
    )


def test_the_bundled_sample_path_trick_builds_a_datastore(tmp_path):
    """The docs build the bundled sample with `"$(python -c '...sample_corpus_path()')"`: it runs."""
    if (ROOT / "docs").is_dir():
        assert SAMPLE in (ROOT / "docs" / "drafter.md").read_text(encoding="utf-8")
    line = f"{sys.executable} -m sssd.cli build-datastore {SAMPLE} -o sample.sssd -q"
    line = line.replace("$(python ", f"$({sys.executable} ")
    from cli_models import subprocess_env

    run = subprocess.run(
        ["bash", "-c", line], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    from sssd import Datastore
    from sssd.data import sample_tokenizer_fingerprint

    ds = Datastore.open(tmp_path / "sample.sssd")
    assert len(ds) == 182_384 and ds.tokenizer_fingerprint == sample_tokenizer_fingerprint()


def test_the_architecture_map_names_every_subpackage():
    if not (ROOT / "docs").is_dir():
        pytest.skip("an installed copy, not a checkout")
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## Where things live") : text.index("## Rules")]
    pkg = ROOT / "python" / "sssd"
    for sub in sorted(p.parent.name for p in pkg.glob("*/__init__.py")):
        assert f"`{sub}`" in section, f"docs/architecture.md 'Where things live' does not name {sub}"
    for part in ("datastore_tools", "model drafters", "integrations", "csrc/core", "csrc/cuda"):
        assert part in section, part


def test_install_words_work():
    """sssd is not on the package index: every install line installs from a clone (`pip install
    ".[extras]"`), and the README says how to get CPU torch before its first install command."""
    if not (ROOT / "docs").is_dir():
        pytest.skip("an installed copy, not a checkout")
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        bad = re.findall(r"pip install (?:-e )?['\"]?sssd\b[^\n`]*", text)
        assert not bad, f'{path.name}: {bad} (sssd installs from a clone: pip install ".[...]")'
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_install = readme.index("```bash")
    assert readme.index("download.pytorch.org/whl/cpu") < first_install
    assert readme.index("clone") < first_install
