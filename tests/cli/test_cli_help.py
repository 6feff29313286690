"""--help of `sssd` and `build-datastore`: every option explained with its default, the model cache
documented (epilog, docs/cli.md, `sssd cache`), and docs/cli.md naming every option of every command."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from sssd.cli import COMMANDS, main, make_parser
from sssd.cli.helpfmt import DefaultsHelpFormatter

from datastore_tools.cli import make_parser as build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
# options allowed without a help text (none)
NO_HELP_YET: set[tuple[str, str]] = set()


def _parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {**{f"sssd {name}": p for name, p in sub.choices.items()}, "build-datastore": build_parser()}


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_option_has_help_and_states_its_default():
    for prog, parser in _parsers().items():
        fmt = DefaultsHelpFormatter(prog)
        for action in _options(parser):
            name = action.option_strings[-1]
            if (prog.removeprefix("sssd "), name) in NO_HELP_YET:
                continue
            assert action.help, f"{prog} {name} has no help text"
            default = action.default
            if default not in (None, False, "", [], ()) and default is not argparse.SUPPRESS:
                assert "default" in fmt._get_help_string(action), (
                    f"{prog} {name}: default {default!r} not shown"
                )


def test_help_prints_the_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for piece in (
        "--budget BUDGET draft nodes per step for the whole batch (adaptive mode: at most; per_request: "
        "for each request); 0 = plain decoding (default: 16)",
        "(default: on when the model has one)",
        "--no-chat",
        "(default: adaptive)",
        "(default: auto)",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ):
        assert piece in text
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "texts per tokenizer call (default: 256)" in text and "(default: output)" in text


def test_top_level_help_tells_where_the_model_cache_is_and_how_to_clear_it(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for piece in (
        "$SSSD_CACHE_DIR/models",
        "~/.cache/sssd/models",
        "517 MiB",
        "sssd cache --clear",
        "SSSD_DEBUG=1",
    ):
        assert piece in text
    assert all(name in text for name, _, _ in COMMANDS)


def test_the_documented_size_of_the_default_model_is_what_the_cache_holds():
    from sssd.cli.cache import tree_bytes
    from sssd.models.local import cache_dir

    converted = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1"
    if not (converted / "config.json").is_file():
        pytest.skip("the default model has not been converted on this machine")
    size = tree_bytes(converted)
    assert round(size / 2**20) == 517
    assert f"{size:,} bytes = 517 MiB" in DOCS.read_text()


def _doc_sections() -> dict[str, str]:
    """docs/cli.md split at its '## ' headings: {heading: text}."""
    parts = re.split(r"^## ", DOCS.read_text(), flags=re.M)
    return {p.split("\n", 1)[0].strip(): p for p in parts[1:]}


def test_docs_name_every_option_of_every_command():
    sections = _doc_sections()
    for prog, parser in _parsers().items():
        prog = "sssd build-datastore" if prog == "build-datastore" else prog  # one section for both
        assert prog in sections, f"docs/cli.md has no section '## {prog}'"
        for action in _options(parser):
            if action.dest in ("debug", "verbose") and prog != "sssd build-datastore":
                continue  # sssd's --debug and --verbose are documented once, before the commands
            name = max(action.option_strings, key=len)
            assert f"`{name}" in sections[prog], f"docs/cli.md, {prog}: {name} is not documented"


def test_cache_command_shows_and_clears_only_what_sssd_made(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SSSD_CACHE_DIR", str(tmp_path))
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "model.safetensors").write_bytes(b"\0" * 2**20)
    (tmp_path / "tokenizers" / "t-1").mkdir(parents=True)
    (tmp_path / "tokenizers" / "t-1" / "tokenizer.json").write_bytes(b"\0" * 2**19)
    (tmp_path / "mine.txt").write_text("not sssd's")
    assert main(["cache"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"cache directory: {tmp_path} (from SSSD_CACHE_DIR)",
        "  models/m: 1.0 MiB",
        "  tokenizers/t-1: 0.5 MiB",
        "total: 1.5 MiB",
    ]
    assert main(["cache", "--clear"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "cleared 1.5 MiB"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    assert main(["cache"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "total: empty"
