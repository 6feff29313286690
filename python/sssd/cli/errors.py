"""How the command line tools end: one clear line for a user's mistake, no traceback.

Shared by ``sssd`` and ``build-datastore``. Exit statuses:

- 0 success (a command may return 1 for "ran, but the check failed", e.g. ``sssd demo``);
- 2 a usage error or bad input: an unknown option (argparse), a missing or unreadable file, a corrupt
  or incompatible datastore (``DatastoreError``, ``TokenizerMismatchError``), a bad value
  (``ValueError``/``TypeError``), a missing optional dependency (``ImportError``), out of memory;
- 130 interrupted (Ctrl-C), as a shell reports a process ended by SIGINT;
- 141 stdout was closed early (``sssd ... | head``), as a shell reports a process ended by SIGPIPE: the
  reader has what it wanted, so nothing is printed, but ``set -o pipefail`` scripts can still tell that
  the output was cut short.

``--debug`` or ``SSSD_DEBUG=1`` re-raises instead, so the traceback shows. Anything not listed above is
a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

# Optional dependencies and the extra that installs them (pyproject.toml [project.optional-dependencies]).
TORCH_MODULES = frozenset({"torch", "accelerate"})
HF_MODULES = frozenset(
    {"transformers", "tokenizers", "huggingface_hub", "safetensors", "gguf", "sentencepiece"}
)
EXTRA_PACKAGES = {"torch": "torch and transformers", "tools": "transformers and tokenizers"}


def debug_requested(flag: bool = False) -> bool:
    """``--debug`` given, or ``SSSD_DEBUG`` set to anything but empty/0."""
    return flag or os.environ.get("SSSD_DEBUG", "").strip() not in ("", "0")


def describe(e: BaseException) -> str:
    """The message of a user error, without Python's decoration (``[Errno 2] ...``)."""
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        return f"{e.strerror}: {e.filename}"
    if isinstance(e, MemoryError):
        return f"out of memory{': ' + str(e) if str(e) else ''} (use smaller inputs or batches)"
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0] if isinstance(e, ImportError) else text


def missing_dependency(e: ImportError, prog: str, extra: str = "") -> str:
    """The line for a failed import: which extra installs the missing package. ``extra``: the extra the
    command needs ("torch" or "tools"); a missing torch always points to "torch"."""
    name = (getattr(e, "name", None) or "").split(".")[0]
    if name in TORCH_MODULES:
        extra = "torch"
    elif name and name not in HF_MODULES:
        return f"{describe(e)} (a Python package is missing or broken)"
    extra = extra or "torch"
    # sssd is installed from a clone of its repository (it is not on the package index)
    return f'{prog} needs {EXTRA_PACKAGES[extra]}: pip install ".[{extra}]" in the sssd clone ({describe(e)})'


def _user_errors() -> tuple[type[BaseException], ...]:
    from sssd._core import DatastoreError  # TokenizerMismatchError is one too

    return (DatastoreError, ValueError, TypeError, OSError, MemoryError)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced by an object without a file (tests)
        pass


def run_guarded(
    prog: str,
    body: Callable[[], int],
    *,
    debug: bool = False,
    extra: str = "",
    on_interrupt: str = "",
) -> int:
    """Runs ``body`` and turns the errors a user can cause into one line on stderr and an exit status.

    ``prog``: the name the messages start with (``sssd generate``); ``extra``: the pip extra the command
    needs ("torch", "tools" or ""), named when an import fails; ``on_interrupt``: added to the
    "interrupted" line.
    """
    debug = debug_requested(debug)
    try:
        rc = int(body() or 0)
        sys.stdout.flush()  # a closed pipe shows up here, inside the handler, not at interpreter exit
        return rc
    except BrokenPipeError:  # before OSError: the reader left (| head); not an error of ours
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted{'; ' + on_interrupt if on_interrupt else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ImportError as e:
        if debug:
            raise
        print(f"{prog}: error: {missing_dependency(e, prog, extra)}", file=sys.stderr)
        return EXIT_USAGE
    except _user_errors() as e:
        if debug:
            raise
        print(f"{prog}: error: {describe(e)}", file=sys.stderr)
        return EXIT_USAGE
