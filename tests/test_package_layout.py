"""The package tree reads as the architecture: subpackages with docstrings, imports in one direction."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import sssd

PKG = Path(sssd.__file__).parent

# What each subpackage imports from sssd, exactly (besides itself); its docstring's "Imports:" paragraph
# names the same modules and the tests below hold both to the code. The graph has no cycle: read bottom
# up, _core/_cuda/batch/checks/fileio/data, then datastore, kernels, models, policy, engine, drafter (its
# model drafter runs a draft model through the engine's ModelAdapter and KVCache, so the engine never
# imports a drafter: drafters are duck-typed), evaluation, integrations, cli.
ALLOWED = {
    "data": set(),
    "datastore": {"_core", "checks"},
    "kernels": {"_core", "_cuda"},
    "models": {"fileio"},
    "policy": {"batch", "checks", "fileio"},
    "engine": {"batch", "checks", "datastore", "kernels", "policy"},
    "drafter": {"_core", "batch", "checks", "datastore", "engine", "fileio"},
    "evaluation": {"batch", "drafter", "fileio"},
    "integrations": {"batch", "checks", "data", "datastore", "drafter", "fileio", "models", "policy"},
    "cli": {"_core", "data", "datastore", "drafter", "engine", "evaluation", "fileio", "models", "policy"},
}
SHARED = {"_core", "_cuda", "batch", "checks", "fileio"}  # modules that import nothing of sssd
# the public API; atomic files; argument checks; the algebra of a flat batch of draft trees
TOP_LEVEL_MODULES = {"__init__.py", "fileio.py", "checks.py", "batch.py"}


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


def _subpackage_imports(sub: str) -> set[str]:
    return set().union(*(_sssd_imports(p) for p in (PKG / sub).rglob("*.py"))) - {sub}


def _docstring_imports(sub: str) -> set[str]:
    """The modules ``sssd.x`` (lower case, not ``sssd.Engine``) that the "Imports:" paragraph names."""
    doc = ast.get_docstring(ast.parse((PKG / sub / "__init__.py").read_text())) or ""
    paragraphs = [p for p in doc.split("\n\n") if p.startswith("Imports:")]
    assert len(paragraphs) == 1, f"sssd.{sub}'s docstring needs one paragraph starting 'Imports:'"
    return set(re.findall(r"``sssd\.([a-z_]+)``", paragraphs[0]))


def test_top_level_holds_only_subpackages_and_the_public_api():
    modules = {p.name for p in PKG.glob("*.py")}
    assert modules == TOP_LEVEL_MODULES, (
        f"modules beside the subpackages: {sorted(modules - TOP_LEVEL_MODULES)}"
    )
    subpackages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert subpackages == set(ALLOWED) or subpackages == set(ALLOWED) - {"integrations"}


def test_every_subpackage_says_what_it_owns():
    for sub in ALLOWED:
        init = PKG / sub / "__init__.py"
        if init.exists():
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            assert len(doc) > 100, f"sssd.{sub} needs a docstring saying what it owns"


def test_docstrings_name_exactly_what_each_subpackage_imports():
    for sub, allowed in ALLOWED.items():
        if not (PKG / sub).is_dir():
            continue
        said, real = _docstring_imports(sub), _subpackage_imports(sub)
        assert real == allowed, f"sssd.{sub} imports {sorted(real)}; the layout says {sorted(allowed)}"
        assert said == real, f"sssd.{sub}'s docstring names {sorted(said)}; it imports {sorted(real)}"


def test_imports_go_one_way():
    for name in TOP_LEVEL_MODULES - {"__init__.py"}:
        assert not _sssd_imports(PKG / name), f"sssd.{name} must import nothing of sssd"
    graph = {**ALLOWED, **{m: set() for m in SHARED}}
    assert set().union(*graph.values()) <= set(graph)
    done: set[str] = set()
    while len(done) < len(graph):  # peel off what imports only what is peeled: stuck = a cycle
        ready = {m for m in graph if m not in done and graph[m] <= done}
        assert ready, f"import cycle among {sorted(set(graph) - done)}"
        done |= ready


def test_only_what_needs_torch_loads_it():
    """The drafter's modules that need torch (the model drafter) load lazily (``sssd.ModelDrafter``)."""
    init = (PKG / "drafter" / "__init__.py").read_text()
    assert "from sssd.drafter.model" not in init
    code = (
        "import sys, sssd, sssd.drafter.merge, sssd.policy.profiling;"
        "print('torch' in sys.modules, 'sssd.engine' in sys.modules, callable(sssd.MergedDrafter))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "True"]  # merging and profiling need no torch either


def test_datastore_and_drafter_import_without_torch():
    code = "import sys, sssd, sssd.datastore, sssd.drafter, sssd.evaluation; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_importing_sssd_leaves_the_environment_alone():
    """Importing changes no environment variable (OpenMP's reads them once, for every library in the
    process): thread counts are set per object (``DrafterConfig.threads``, ``torch.set_num_threads``)."""
    code = (
        "import os; before = dict(os.environ);"
        "import sssd, sssd.cli, sssd.datastore, sssd.drafter.merge, sssd.evaluation, sssd.policy.profiling;"
        "print(dict(os.environ) == before, os.environ.get('OMP_WAIT_POLICY'))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["True", "None"]


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
