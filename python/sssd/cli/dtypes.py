"""``--dtype auto`` on a CPU: float32 or bfloat16, chosen by timing this machine's forwards rather than by
its CPU flags. A flag says the CPU has bfloat16 instructions, not whether torch's kernels for this model
are faster with them: on some CPUs with bfloat16 instructions plain bfloat16 decoding is faster than
float32, on others a one-token bfloat16 forward is slower while a many-token one is faster (figures in
docs/benchmarks.md).

The probe times a few of the engine's own forwards in each dtype (after a warm-up), of 1 token (a plain
decoding step) and of 17 tokens (a step verifying a draft tree of 16 nodes), after a short committed
context: the same kernels as the engine's steps (``sssd.kernels.linear`` measures its linear kernels per row
count once per process and model shape, so the engine built next does not measure again). bfloat16 is chosen
when it takes at most ``FASTER`` of float32's time, for speculative decoding on the geometric mean of the
two sizes (its steps are a mix of both), for plain decoding (``--budget 0``) on one token. The result is
kept in ``$SSSD_CACHE_DIR/probes/dtypes.json`` under a key naming the CPU (model name and instruction
flags), its core count, torch's version and threads, and the model's shape, and only when the machine was
quiet while it was measured: another machine, torch or model measures again, and a busy machine's times are
never kept.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sssd.fileio import write_text_atomic
from sssd.policy.contention import ContentionMeter

PROBE_TOKENS = (1, 17)  # a plain step, a step verifying a 16-node tree
FASTER = 0.9  # bfloat16 is chosen when it takes at most this share of float32's time
REPS = 3  # timed forwards per size and dtype, after one warm-up (1 for slow models, see _reps)
CONTEXT_TOKENS = 64  # committed tokens before the timed forwards (they attend to them, as in decoding)
PROBE_VERSION = 2  # part of the cache key: 2 times the engine's own forwards (1 timed plain forwards)


@dataclass(frozen=True)
class DtypeProbe:
    """Median forward times, milliseconds, at ``PROBE_TOKENS`` tokens, in each dtype."""

    float32_ms: tuple[float, ...]
    bfloat16_ms: tuple[float, ...]
    cached: bool = False  # read from the cache (measured on this machine by an earlier run)
    busy: str = ""  # why the machine counted as busy while measuring ('' when quiet; then not cached)

    def ratio(self, speculative: bool = True) -> float:
        """bfloat16's time over float32's: one token, or (speculative) the geometric mean of the sizes."""
        ratios = [b / f for b, f in zip(self.bfloat16_ms, self.float32_ms, strict=True)]
        return math.prod(ratios) ** (1 / len(ratios)) if speculative else ratios[0]

    def faster(self, speculative: bool = True) -> bool:
        """bfloat16 measured faster, on a quiet machine: times taken while other processes took the CPU
        say little, and float32 (exact) is the choice that needs no evidence."""
        return not self.busy and self.ratio(speculative) <= FASTER

    def text(self) -> str:
        (f1, f17), (b1, b17) = self.float32_ms, self.bfloat16_ms
        how = "cached from an earlier run on this machine" if self.cached else "measured now"
        tail = f"; unreliable, the machine was busy: {self.busy}" if self.busy else ""
        return (
            f"a 1-token forward {f1:.1f} ms in float32, {b1:.1f} ms in bfloat16; 17 tokens {f17:.1f} and "
            f"{b17:.1f} ms ({how}{tail})"
        )


def _reps(seconds_per_forward: float) -> int:
    return REPS if seconds_per_forward < 0.25 else 1  # a large model: one timed forward per point


def time_forwards(*models: Any) -> list[tuple[float, ...]]:
    """Median milliseconds of the engine's forward of ``n`` tokens (a chain after a short committed
    context, logits of every row) for each ``n`` in ``PROBE_TOKENS``, per model: the engine's own kernels
    (its linear kernels measured per row count, its tree attention) decide, not a plain forward's. The
    models take turns forward by forward, so that a passing load slows them alike."""
    import numpy as np
    import torch

    from sssd.engine.adapter import ModelAdapter
    from sssd.engine.trees import chain_tree

    vocab = int(models[0].get_input_embeddings().num_embeddings)
    rng = np.random.default_rng(0)
    adapters = [ModelAdapter(model, compile=False) for model in models]
    context = rng.integers(0, vocab, CONTEXT_TOKENS)
    for adapter in adapters:
        adapter.prefill(adapter.cache.add(), context)
    out: list[list[float]] = [[] for _ in models]

    def forward(adapter: Any, tree: Any) -> None:
        adapter.forward_trees(tree).logits(np.arange(tree.num_nodes))
        adapter.synchronize()  # the forward's kernels, not only their launch

    with torch.inference_mode():
        for n in PROBE_TOKENS:
            tree = chain_tree(rng.integers(0, vocab, n))
            t0 = time.perf_counter()
            for adapter in adapters:  # warm-up: kernels chosen, buffers allocated
                forward(adapter, tree)
            times: list[list[float]] = [[] for _ in models]
            for _ in range(_reps((time.perf_counter() - t0) / len(models))):
                for k, adapter in enumerate(adapters):
                    t = time.perf_counter()
                    forward(adapter, tree)
                    times[k].append(time.perf_counter() - t)
            for k in range(len(models)):
                out[k].append(1e3 * statistics.median(times[k]))
    return [tuple(ms) for ms in out]


def bfloat16_copy(model: Any) -> Any:
    import torch

    return copy.deepcopy(model).to(torch.bfloat16)


def measure(model: Any, bf16_model: Any, threads: int) -> DtypeProbe:
    """Times ``model`` (float32) and ``bf16_model`` (the same in bfloat16), taking turns; the probe says
    whether the machine was busy meanwhile."""
    meter = ContentionMeter(threads)
    with meter:
        f32, b16 = time_forwards(model, bf16_model)
    reading = meter.reading()
    return DtypeProbe(f32, b16, busy=reading.why() if reading.busy else "")


def _cpu_name() -> str:
    """The CPU's model name and a hash of its instruction flags (a VM may name every CPU alike)."""
    name = flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key == "model name" and not name:
                    name = value
                elif key in ("flags", "Features") and not flags:
                    flags = value
    except OSError:  # not Linux: what platform says
        pass
    name = name or platform.processor() or platform.machine()
    return f"{name} [{hashlib.sha256(flags.encode()).hexdigest()[:12]}]"


def cache_key(model: Any, threads: int) -> str:
    import torch

    cfg = model.config
    fields = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
    shape = [getattr(cfg, k, None) for k in fields]
    return (
        f"{_cpu_name()} x{os.cpu_count()} | torch {torch.__version__} x{threads} | {shape} | v{PROBE_VERSION}"
    )


def _cache_path() -> Path:
    from sssd.models.local import cache_dir

    return cache_dir() / "probes" / "dtypes.json"


def _read_cache() -> dict[str, Any]:
    try:
        data = json.loads(_cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or damaged: measure again
        return {}
    return data if isinstance(data, dict) else {}


def cached(key: str) -> DtypeProbe | None:
    entry = _read_cache().get(key)
    try:
        return DtypeProbe(
            tuple(map(float, entry["float32_ms"])), tuple(map(float, entry["bfloat16_ms"])), True
        )
    except (TypeError, KeyError, ValueError):
        return None


def remember(key: str, probe: DtypeProbe) -> None:
    """Keeps a quiet machine's probe; a busy one's is not kept (nor an unwritable cache an error)."""
    if probe.busy or probe.cached:
        return
    data = _read_cache()
    data[key] = {
        "float32_ms": list(probe.float32_ms),
        "bfloat16_ms": list(probe.bfloat16_ms),
        "measured": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    try:
        _cache_path().parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(_cache_path(), json.dumps(data, indent=1) + "\n")
    except OSError:
        pass


def probe(model: Any, threads: int) -> tuple[DtypeProbe, Any]:
    """(the probe, the bfloat16 copy of ``model`` it timed or None when it came from the cache)."""
    key = cache_key(model, threads)
    found = cached(key)
    if found is not None:
        return found, None
    bf16 = bfloat16_copy(model)
    result = measure(model, bf16, threads)
    remember(key, result)
    return result, bf16


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a command runs in, and how ``--dtype auto`` chose it, in words for its header ('' when
    the dtype was given)."""

    dtype: str
    why: str = ""
    probe: DtypeProbe | None = None


def _room_for_copy(model: Any) -> bool:
    """Whether a bfloat16 copy (2 bytes per parameter) fits in half the memory still available."""
    need = 2 * sum(p.numel() for p in model.parameters())
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return need < 2**30  # unknown: only small models
    return need <= avail // 2


def choose(model: Any, threads: int, speculative: bool = True) -> tuple[Any, DtypeChoice]:
    """``--dtype auto`` on a CPU for a model loaded in float32: (the model to run, the choice). The model
    is converted to bfloat16 where the probe finds it faster for the forwards the run will make."""
    import torch

    if not _room_for_copy(model):
        return model, DtypeChoice("float32", "auto: too large to time a bfloat16 copy beside it")
    found, bf16 = probe(model, threads)
    kind = "speculative decoding's forwards" if speculative else "a one-token forward"
    share = f"auto: bfloat16 took {found.ratio(speculative):.2f} of float32's time here on {kind}"
    if found.busy:
        share += f", but the machine was busy while timing ({found.busy})"
    if not found.faster(speculative):
        return model, DtypeChoice("float32", share, found)
    model = bf16 if bf16 is not None else model.to(torch.bfloat16)
    drift = "outputs can drift from float32 decoding, --dtype float32 is exact"
    return model, DtypeChoice("bfloat16", f"{share}; {drift}", found)


def load_model_auto(
    spec: Any, dtype: str, device: str, speculative: bool = True
) -> tuple[Any, Any, Path, DtypeChoice]:
    """``load_model`` for the commands: ``--dtype auto`` on a CPU measures which dtype is faster here
    (:func:`choose`); elsewhere the dtype given, or bfloat16 on a GPU. (model, tokenizer, path, choice)."""
    import torch

    from sssd.models.loading import load_model, resolve_device, resolve_dtype

    device = resolve_device(device)
    if dtype != "auto" or not device.startswith("cpu"):
        model, tok, path = load_model(spec, dtype, device)
        resolved = resolve_dtype(dtype, device)
        return model, tok, path, DtypeChoice(resolved, "" if dtype != "auto" else "auto: on a GPU")
    model, tok, path = load_model(spec, "float32", device)
    model, choice = choose(model, torch.get_num_threads(), speculative)
    return model, tok, path, choice
