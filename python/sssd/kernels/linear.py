"""The verification forward's linear layers on a CPU: for each row count, the kernel measured fastest here.

A verification forward multiplies a few rows (the trees' nodes) by every weight matrix. torch's
``F.linear`` on a CPU calls a BLAS GEMM with the weight transposed: for one or two rows it runs at the
speed of reading the weights, but from about four rows on it costs far more, so a tree of 8 nodes cost
about twice a one-token forward. Two other kernels keep the cost of a few rows close to the cost of one:

- ``"rows"``: sssd's own ``linear_rows`` (``csrc/core/linear_rows.h``, float32), which reads each block of
  weight rows once, from the layer's own layout, for all input rows: no copy of the weights;
- ``"packed"``: oneDNN with the weight reordered once into its blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``: what torch's inductor does when it freezes a CPU model, and
  vLLM's CPU backend with its own oneDNN), float32 or bfloat16: a second copy of the weights.

Which is fastest depends on the machine (memory, caches, ISA) and the row count, so it is measured, not
assumed: :func:`calibrate` times the model's first layers (a forward's worth of weights streamed in model
order, up to ``CALIBRATION_BYTES``) with each kernel at 1, 2, 4, ... 32 rows, and each row count then uses
the kernel that was fastest at the next measured count. The packed copy is made only when it fits
comfortably in the memory available, and kept only when the packed kernel won somewhere. A layer whose
weight changed since it was prepared (the user trained or edited the model) prepares it again before its
next use. The plan of a model shape is kept for the process (``_PLANS``): engines built over the same
model do not measure again.

``FastLinear`` replaces ``nn.Linear`` in the engine's view of the model (``sssd.engine.shadow``), never in
the user's model.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

log = logging.getLogger("sssd.engine")
LINEAR_BACKENDS = ("auto", "torch", "rows", "packed")  # EngineConfig.linear
KERNELS = ("torch", "rows", "packed")
# row counts measured: each serves the row counts above the one before (a BLAS GEMM's speed jumps between
# neighbouring row counts, so the points are not only powers of two)
CALIBRATION_ROWS = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32)
CALIBRATION_BYTES = 64 << 20  # weights read per calibration pass: the first layers up to this much
MIN_GAIN = 1.05  # sssd's kernel replaces torch's at a row count only when this much faster there
MIN_GAIN_PACKED = 1.10  # the packed kernel, which needs a copy of the weights, only when this much faster


def packing_available(dtype: torch.dtype, device: torch.device) -> bool:
    """torch's oneDNN linear with a prepacked weight exists for this device and dtype."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (
        device.type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def rows_available(dtype: torch.dtype, device: torch.device) -> bool:
    """sssd's ``linear_rows`` runs this device and dtype (float32 on a CPU, the native core built)."""
    if device.type != "cpu" or dtype != torch.float32:
        return False
    try:
        from sssd import _core
    except ImportError:
        return False
    return hasattr(_core, "linear_rows")


@dataclass
class LinearPlan:
    """Which kernel each row count uses: ``choice[i]`` for rows up to ``points[i]`` (and above the one
    before; past the last point, the last choice), with the seconds per calibration pass each kernel took
    at each measured row count (``seconds[kernel][rows]``)."""

    points: tuple[int, ...]
    choice: list[str]
    seconds: dict[str, dict[int, float]] = field(default_factory=dict)
    layers: int = 0  # layers timed per pass
    calibration_s: float = 0.0  # the calibration's own time, preparing the kernels included
    table: list[int] = field(default_factory=list, repr=False)  # kernel index by rows 0..points[-1]

    def __post_init__(self) -> None:
        self.retable()

    def retable(self) -> None:
        """Rebuilds ``table`` (what ``FastLinear`` reads on every call) from ``points`` and ``choice``."""
        table = [0]
        for point, kernel in zip(self.points, self.choice, strict=True):
            table += [KERNELS.index(kernel)] * (point - len(table) + 1)
        self.table = table

    def kernel(self, rows: int) -> str:
        table = self.table
        return KERNELS[table[min(max(int(rows), 0), len(table) - 1)]]

    @property
    def uses(self) -> set[str]:
        return set(self.choice)

    def describe(self) -> str:
        """One line: which kernel serves which rows, and its measured gain over torch's there."""
        parts, low = [], 1
        for point, k in zip(self.points, self.choice, strict=True):
            base, own = self.seconds.get("torch", {}).get(point), self.seconds.get(k, {}).get(point)
            gain = f" {base / own:.2f}x" if k != "torch" and base and own else ""
            parts.append(f"{low if low == point else f'{low}-{point}'}: {k}{gain}")
            low = point + 1
        return "linear kernels by rows (" + ", ".join(parts) + ")"


class FastLinear(torch.nn.Linear):
    """An ``nn.Linear`` (sharing its weight and bias) whose product uses the kernel its plan chose for the
    row count of each call. It runs for every layer of every forward, so its own Python is kept short."""

    plan: LinearPlan

    @classmethod
    def of(cls, linear: torch.nn.Linear, plan: LinearPlan) -> FastLinear:
        twin = object.__new__(cls)
        twin.__dict__.update(linear.__dict__)
        twin._parameters = dict(linear._parameters)
        twin.plan = plan
        twin._packed = twin._array = None
        twin._packed_from = twin._array_from = None
        return twin

    def _stamp(self) -> tuple:
        w = self._parameters["weight"]
        return (w.data_ptr(), w._version)

    def packed(self) -> torch.Tensor:
        """The weight in oneDNN's blocked layout (prepared again when the weight changed)."""
        stamp = self._stamp()
        if self._packed_from != stamp:
            with torch.no_grad():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
            self._packed_from = stamp
        return self._packed

    def array(self) -> tuple:
        """numpy views of the weight and bias for ``linear_rows`` (no copy)."""
        stamp = self._stamp()
        if self._array_from != stamp:
            b = self.bias
            self._array = (self.weight.detach().numpy(), None if b is None else b.detach().numpy())
            self._array_from = stamp
        return self._array

    def drop_packed(self) -> None:
        self._packed = self._packed_from = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = self._parameters
        w = params["weight"]
        depth = x.shape[-1]
        rows = x.numel() // depth if depth else 0
        table = self.plan.table
        kernel = table[rows] if rows < len(table) else table[-1]
        if kernel == TORCH or x.dtype != w.dtype or not x.is_cpu:
            return F.linear(x, w, params["bias"])
        if kernel == ROWS:
            if self._array_from != (w.data_ptr(), w._version):
                self.array()
            wn, bn = self._array
            y = torch.empty((*x.shape[:-1], wn.shape[0]), dtype=x.dtype)
            _core_linear_rows(x.contiguous().numpy(), wn, bn, y.numpy(), _threads())
            return y
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, depth), self.packed(), params["bias"],
                                               "none", [], "")  # fmt: skip
        return y.view(*x.shape[:-1], y.shape[-1])


TORCH, ROWS, PACKED = 0, 1, 2  # LinearPlan.table entries: KERNELS[i]
_threads = torch.get_num_threads


def _core_linear_rows(*args) -> None:
    from sssd import _core

    globals()["_core_linear_rows"] = _core.linear_rows  # bound once: it runs for every layer
    _core.linear_rows(*args)


def _pass(layers: list[FastLinear], inputs: dict[int, torch.Tensor], kernel: str) -> float:
    """One pass over ``layers`` with ``kernel`` (rows = the inputs' rows); seconds."""
    for lin in layers:
        lin.plan = LinearPlan((1,), [kernel])
    t0 = time.perf_counter()
    for lin in layers:
        lin(inputs[lin.in_features])
    return time.perf_counter() - t0


def _timings(layers: list[FastLinear], kernels: list[str], repeats: int) -> dict[str, dict[int, float]]:
    """Seconds per pass over ``layers`` by kernel and row count: the minimum of ``repeats`` passes, the
    kernels taking turns so that a passing load slows them alike, after one warm-up pass each."""
    out: dict[str, dict[int, float]] = {k: {} for k in kernels}
    dtype = layers[0].weight.dtype
    with torch.inference_mode():
        for r in CALIBRATION_ROWS:
            inputs = {}
            for lin in layers:
                if lin.in_features not in inputs:
                    inputs[lin.in_features] = torch.randn(r, lin.in_features).to(dtype)
            if "packed" in kernels:  # oneDNN prepares a primitive on the first call of each row count
                _pass(layers, inputs, "packed")
            times: dict[str, list[float]] = {k: [] for k in kernels}
            for _ in range(repeats):
                for k in kernels:
                    times[k].append(_pass(layers, inputs, k))
            for k in kernels:
                out[k][r] = min(times[k])
    return out


def calibrate(layers: list[FastLinear], kernels: list[str], repeats: int = 2) -> LinearPlan:
    """The plan for ``layers`` (every layer of a model, in model order): time the first of them (up to
    ``CALIBRATION_BYTES`` of weights) with each of ``kernels`` at each row count, and give every row count
    the kernel measured fastest at the next measured count: sssd's if it beats torch's by ``MIN_GAIN``,
    the packed one if it beats both by ``MIN_GAIN_PACKED`` (it costs a copy of the weights)."""
    t0 = time.perf_counter()
    measured, size = [], 0
    for lin in layers:
        if size >= CALIBRATION_BYTES:
            break
        measured.append(lin)
        size += lin.weight.numel() * lin.weight.element_size()
    seconds = _timings(measured, kernels, repeats)
    choice = []
    for r in CALIBRATION_ROWS:
        best = (
            "rows" if "rows" in kernels and seconds["torch"][r] >= MIN_GAIN * seconds["rows"][r] else "torch"
        )
        if "packed" in kernels and seconds[best][r] >= MIN_GAIN_PACKED * seconds["packed"][r]:
            best = "packed"
        choice.append(best)
    return LinearPlan(CALIBRATION_ROWS, choice, seconds, len(measured), time.perf_counter() - t0)


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (``MemAvailable``), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# (weight shapes, dtype, threads, kernels) -> the plan measured for them in this process
_PLANS: dict[tuple, LinearPlan] = {}


def fast_linears(root: torch.nn.Module, backend: str = "auto") -> LinearPlan | None:
    """Replaces every ``nn.Linear`` of ``root`` (the engine's view of a model) with a ``FastLinear`` under
    one plan. ``backend``: ``"auto"`` (measure; the packed kernel only where its copy fits comfortably in
    memory), ``"rows"`` or ``"packed"`` (that kernel from 2 rows on, unmeasured) or ``"torch"`` (nothing
    replaced). Returns the plan, or None where nothing was replaced."""
    if backend not in LINEAR_BACKENDS:
        raise ValueError(f"linear backend must be one of {LINEAR_BACKENDS}, got {backend!r}")
    found = [(name, m) for name, m in root.named_modules() if type(m) is torch.nn.Linear]
    if backend == "torch" or not found:
        return None
    w = found[0][1].weight
    kernels = ["torch"]
    if rows_available(w.dtype, w.device):
        kernels.append("rows")
    if packing_available(w.dtype, w.device):
        extra = sum(m.weight.numel() * m.weight.element_size() for _, m in found)
        free = available_memory()
        if backend == "packed" or free is None or extra <= free // 2:
            kernels.append("packed")
        else:
            log.info(
                "linear weights not prepacked: a copy of %d MiB is over half the free memory", extra >> 20
            )
    if backend != "auto":
        if backend not in kernels:
            raise ValueError(f"linear={backend!r} cannot run {w.dtype} weights on {w.device}")
        plan = LinearPlan((1, 2), ["torch", backend])
    else:
        plan = LinearPlan((1,), ["torch"])
    layers = _replace(root, found, plan)
    if backend == "auto" and len(kernels) > 1:
        key = (tuple(tuple(m.weight.shape) for m in layers), w.dtype, torch.get_num_threads(), tuple(kernels))
        measured = _PLANS.get(key)
        if measured is None:
            measured = _PLANS[key] = calibrate(layers, kernels)
        plan.points, plan.choice, plan.seconds = measured.points, measured.choice, measured.seconds
        plan.layers, plan.calibration_s = measured.layers, measured.calibration_s
        plan.retable()
        for lin in layers:
            lin.plan = plan
    for lin in layers:  # prepared now, so that no step pays for it
        if "packed" in plan.uses:
            lin.packed()
        else:
            lin.drop_packed()
    return plan


def _replace(root: torch.nn.Module, found: list, plan: LinearPlan) -> list[FastLinear]:
    """Puts a ``FastLinear`` in the place of every linear layer of ``found`` (one per distinct module)."""
    twins: dict[int, FastLinear] = {}
    for name, lin in found:
        parent_name, _, attr = name.rpartition(".")
        parent = root.get_submodule(parent_name) if parent_name else root
        twin = twins.get(id(lin))
        if twin is None:
            twin = twins[id(lin)] = FastLinear.of(lin, plan)
        parent._modules[attr] = twin
    return list(twins.values())
