import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Deterministic property tests: derandomized, no wall-clock deadline (CI machines are slow and shared).
settings.register_profile("sssd", derandomize=True, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "sssd"))

# The test folders mirror the package's subpackages; a test module may import another one, or a shared
# helper of tests/, by its module name wherever the two live (their names are unique across folders).
for _folder in sorted(Path(__file__).resolve().parent.iterdir()):
    if (
        _folder.is_dir()
        and _folder.name.isidentifier()
        and not _folder.name.startswith("_")
        and str(_folder) not in sys.path
    ):
        sys.path.append(str(_folder))


@pytest.fixture(autouse=True)
def _dtype_auto_is_float32(monkeypatch):
    """``--dtype auto`` on a CPU times float32 against bfloat16 on this machine (``sssd.cli.dtypes``); the
    tests would then run in a dtype that depends on the machine and its load. Here float32 is measured
    faster; the probe's own tests (tests/cli/test_dtype_probe.py) put the real one back."""
    from sssd.cli import dtypes

    measured = dtypes.DtypeProbe((1.0, 2.0), (2.0, 4.0))
    monkeypatch.setattr(dtypes, "probe", lambda model, threads: (measured, None))


@pytest.fixture(autouse=True)
def _no_quiet_environment(monkeypatch):
    """The commands quiet transformers through the environment (``sssd.cli.quiet``); a test calling
    ``main`` in this process must not leave the variables set for the tests after it."""
    from sssd.cli import quiet

    monkeypatch.setattr(quiet, "QUIET_ENV", {})
