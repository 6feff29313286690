"""The package tree reads as the architecture: subpackages with docstrings, imports in one direction."""

import ast
import subprocess
import sys
from pathlib import Path

import sssd

PKG = Path(sssd.__file__).parent

# What each subpackage may import from sssd (besides itself, sssd._core, sssd._cuda and sssd.fileio).
ALLOWED = {
    "datastore": set(),
    "drafter": {"datastore"},
    "kernels": set(),
    "models": set(),
    "policy": {"engine"},  # profiling alone runs the engine to measure it
    "evaluation": {"datastore", "drafter"},
    "engine": {"kernels", "policy", "drafter"},
    "integrations": {"datastore", "drafter", "policy", "models", "evaluation"},
    "cli": {"datastore", "drafter", "engine", "kernels", "policy", "evaluation", "models", "integrations"},
}
# Single files allowed more than their subpackage: the model drafter drives a draft model through the
# engine's ModelAdapter and KVCache (no forked modeling code); nothing else in sssd.drafter may.
EXTRA_ALLOWED = {"drafter/model.py": {"engine"}}
TOP_LEVEL_MODULES = {"__init__.py", "fileio.py", "checks.py"}  # shared: atomic files, strict argument checks


def _sssd_imports(path: Path) -> set[str]:
    """Subpackages of sssd named by the imports of one file (``from sssd.x...``, ``import sssd.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "sssd" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_top_level_holds_only_subpackages_and_the_public_api():
    modules = {p.name for p in PKG.glob("*.py")}
    assert modules == TOP_LEVEL_MODULES, (
        f"modules beside the subpackages: {sorted(modules - TOP_LEVEL_MODULES)}"
    )
    subpackages = {p.parent.name for p in PKG.glob("*/__init__.py")} - {"data"}
    assert subpackages == set(ALLOWED) or subpackages == set(ALLOWED) - {"integrations"}


def test_every_subpackage_says_what_it_owns_and_may_import():
    for sub in ALLOWED:
        init = PKG / sub / "__init__.py"
        if not init.exists():
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 100, f"sssd.{sub} needs a docstring saying what it owns"
        assert "import" in doc, f"sssd.{sub}'s docstring must say what it may import"


def test_imports_go_one_way():
    shared = {"_core", "_cuda", "fileio", "checks", "data"}
    for sub, allowed in ALLOWED.items():
        for path in (PKG / sub).glob("*.py"):
            extra = EXTRA_ALLOWED.get(f"{sub}/{path.name}", set())
            bad = _sssd_imports(path) - allowed - extra - shared - {sub}
            assert not bad, f"{path.relative_to(PKG)} imports sssd.{sorted(bad)} (allowed: {sorted(allowed)})"


def test_only_the_model_drafter_imports_the_engine_from_the_drafter():
    importers = {p.name for p in (PKG / "drafter").glob("*.py") if "engine" in _sssd_imports(p)}
    assert importers == {"model.py"}
    init = (PKG / "drafter" / "__init__.py").read_text()
    assert "model.py" in init and "sssd.engine" in init  # the docstring says so
    assert "from sssd.drafter.model" not in init  # imported lazily only (sssd.ModelDrafter)
    code = "import sys, sssd, sssd.drafter.merge; print('torch' in sys.modules, callable(sssd.MergedDrafter))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]  # merging needs no torch either


def test_datastore_and_drafter_import_without_torch():
    code = "import sys, sssd, sssd.datastore, sssd.drafter, sssd.evaluation; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_public_api_is_importable_as_sssd_x():
    for name in sssd.__all__:
        assert getattr(sssd, name) is not None, name


def test_no_absolute_path_of_a_development_machine_in_the_project():
    """Development data is ``../shared/data`` relative to the repository root (or ``SSSD_DEV_DATA``)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return  # an installed copy, not a checkout
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    needles = [str(root.parent) + "/", "/".join(["", "work", "shared", ""])]  # not spelled out here
    found = []
    for rel in files.split():
        path = root / rel
        if path.suffix in {".so", ".npz", ".npy", ".png", ".gguf"} or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        found += [f"{rel}: {n}" for n in needles if n in text]
    assert not found, found
