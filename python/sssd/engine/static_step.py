"""The verification forward at static shapes: one compiled graph (or captured CUDA graph) per shape bucket.

The eager forward (``ModelAdapter.forward_trees``) packs exactly the step's nodes and builds its masks on
the host, so every step has new shapes and the model's ~40 ops per layer are launched one by one from
Python. Here each step is padded to a *bucket* — ``slots`` trees (a power of two >= the active requests) of
``nodes`` nodes each (a power of two >= the largest tree), reading the first ``rows`` rows of every cache
slot (a power of two >= the longest committed context + ``nodes``, at least ``MIN_ROWS``) — and every
per-step input lives in tensors that are updated in place:

- ``input_ids``, ``position_ids`` ``[1, slots * nodes]``: tree ``b``'s node ``t`` at ``b * nodes + t``
  (position = committed length + depth; padding: token 0 at the committed length);
- ``committed`` ``[slots]``: committed cache rows per slot (0 for padding slots);
- ``ancestors`` bool ``[slots, nodes, nodes]``: node ``t`` sees node ``j`` (itself and its ancestors;
  a padding node sees only itself).

Everything else is computed inside the graph from these tensors, with no Python branching on data: the
rows each node's K/V is written to (``committed + t``, in the slot's scratch tail), and the visibility of
each of the ``rows`` keys (every committed row, plus the tree rows of the node's ancestors). Padding nodes
write only scratch rows past their slot's committed length (or rows of unused slots) and verification
never reads them, so they change nothing. Lengths are read from a tensor, so one graph serves every context
length up to ``rows``. The graph also depends on the cache's shape (its slots and capacity: the engine
preallocates the slots of its largest batch, and the capacity grows by doubling), which is part of the
bucket.

Each layer's K/V cache reaches the graph as a view of its own (``keys[layer, :, :, :rows]``): written in
place through a view of one whole-cache tensor, the compiled graph would copy the whole cache per layer.

How a bucket's function runs (``StaticStep(mode=...)``):

- ``"static"``: eagerly (tests; the reference for the compiled modes);
- ``"inductor"``: ``torch.compile(fullgraph=True, dynamic=False)``, on CUDA with ``mode="reduce-overhead"``
  (inductor kernels replayed as CUDA graphs);
- ``"cudagraph"``: the eager function captured once per bucket with ``torch.cuda.CUDAGraph`` and replayed
  (no compiler: a capture costs two forwards);
- a torch.compile backend name prefixed by ``"backend:"`` (e.g. ``"backend:aot_eager"``, tests).

A bucket is compiled (or captured) on its first use; each bucket gets a function of its own, so a graph's
guards are checked against its bucket only and a process compiles each bucket once.
"""

from __future__ import annotations

import os
import time
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from sssd.engine.attention import _SDPA_GQA
from sssd.engine.backends import padded_ancestors

COMPILE_MODES = ("static", "inductor", "cudagraph")
MIN_ROWS = 128  # the smallest rows bucket: short contexts share a graph


class CompileError(RuntimeError):
    """A bucket's forward could not be compiled or captured (the model or the backend does not allow it)."""


def resolve_compile(compile: bool | str, device: torch.device, attention: str, explicit_attention: bool):
    """The mode of ``EngineConfig.compile`` on ``device``: None (the eager forward) or one of
    ``COMPILE_MODES`` / ``"backend:NAME"``. ``"auto"``: CUDA graphs on CUDA (unless the CUDA tree kernel
    was asked for by name: it runs eagerly), eager on the CPU, where compiling does not pay; ``True``:
    torch.compile. With ``"auto"``, the environment variable ``SSSD_COMPILE`` (``0``/``1`` or a mode)
    decides instead."""
    if compile == "auto" and os.environ.get("SSSD_COMPILE", "auto") != "auto":
        env = os.environ["SSSD_COMPILE"]
        compile = {"0": False, "false": False, "1": True, "true": True}.get(env.lower(), env)
    if compile is False or compile is None:
        return None
    if compile is True:
        return "inductor"
    if compile == "auto":
        if device.type == "cuda" and not (explicit_attention and attention in ("packed", "emulated")):
            return "cudagraph"
        return None
    if compile == "cudagraph" and device.type != "cuda":
        raise ValueError(f"compile='cudagraph' needs a CUDA device, the model is on {device}")
    named = isinstance(compile, str) and compile.startswith("backend:") and len(compile) > 8
    if compile in COMPILE_MODES or named:
        return compile
    raise ValueError(
        f"compile must be True, False, 'auto', one of {COMPILE_MODES} or 'backend:NAME', got {compile!r}"
    )


def pow2_at_least(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


@dataclass(frozen=True)
class Bucket:
    slots: int  # trees per forward (active requests, padded)
    nodes: int  # nodes per tree (padded)
    rows: int  # cache rows each tree reads (its committed rows and its nodes, padded)
    capacity: int  # the cache's rows per slot and
    cache_slots: int  # its slots: the layout of the K/V views the graph writes through

    @property
    def tokens(self) -> int:
        return self.slots * self.nodes


def bucket_for(num_trees: int, max_nodes: int, max_rows: int, capacity: int, cache_slots: int) -> Bucket:
    """The bucket of a step with ``num_trees`` trees of at most ``max_nodes`` nodes over a cache of
    ``cache_slots`` slots x ``capacity`` rows; ``max_rows`` = the longest committed context + the padded
    tree size (the rows a padded forward writes)."""
    slots = pow2_at_least(num_trees)
    if slots > cache_slots or max_rows > capacity:
        raise ValueError(
            f"{num_trees} trees reading {max_rows} rows do not fit a cache of {cache_slots} slots x "
            f"{capacity} rows"
        )
    rows = min(max(pow2_at_least(max_rows), MIN_ROWS), capacity)
    return Bucket(slots, pow2_at_least(max_nodes), rows, int(capacity), int(cache_slots))


class StaticArgs:
    """The attention plan of a static forward (built inside the graph from the bucket's buffers); every
    layer runs it (``sssd.engine.backends.sssd_attention``)."""

    __slots__ = ("keys", "nodes", "rows", "slots", "values", "visible", "write_rows", "write_slots")

    def __init__(self, keys, values, visible, write_slots, write_rows, slots: int, nodes: int, rows: int):
        self.keys, self.values = keys, values  # per layer: [cache slots, Hkv, rows, D] views of the cache
        self.visible = visible  # bool [slots, nodes, rows]
        self.write_slots, self.write_rows = write_slots, write_rows  # int64 [slots * nodes]
        self.slots, self.nodes, self.rows = slots, nodes, rows

    def run(self, module: Any, query, key, value, scale: float, kwargs: dict) -> torch.Tensor:
        return static_attention(module, query, key, value, self, scale)


def static_attention(module: Any, query, key, value, args: StaticArgs, scale: float) -> torch.Tensor:
    """One layer of a static forward: store the nodes' K/V at their scratch rows, then attend over the
    first ``rows`` rows of every slot. query ``[1, H, S*n, D]``, key/value ``[1, Hkv, S*n, D]``; returns
    ``[1, S*n, H, D]``."""
    layer = module.layer_idx
    keys, values = args.keys[layer], args.values[layer]  # [cache slots, Hkv, rows, D]
    keys[args.write_slots, :, args.write_rows] = key[0].transpose(0, 1)
    values[args.write_slots, :, args.write_rows] = value[0].transpose(0, 1)
    s, n = args.slots, args.nodes
    k, v = keys[:s], values[:s]
    h, d = query.shape[1], query.shape[3]
    q = query[0].reshape(h, s, n, d).transpose(0, 1)  # [S, H, n, D]
    mask = args.visible.unsqueeze(1)
    if h != k.shape[1] and _SDPA_GQA:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    else:
        if h != k.shape[1]:
            k = k.repeat_interleave(h // k.shape[1], dim=1)
            v = v.repeat_interleave(h // v.shape[1], dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).reshape(1, s * n, h, d)


def _static_forward(model, hidden, input_ids, position_ids, committed, ancestors, row_ids, keys, values):
    """The bucket's forward; its shapes come from the arguments (``row_ids`` = ``arange(rows)``). Returns
    hidden states ``[S*n, hidden size]`` when ``hidden`` (``model`` is the base model; the engine applies
    the output head lazily), else logits ``[S*n, vocab]``."""
    s, n, _ = ancestors.shape
    r = row_ids.shape[0]
    dev = committed.device
    rel = row_ids.unsqueeze(0) - committed.unsqueeze(1)  # [S, R] row - committed
    in_tree = ((rel >= 0) & (rel < n)).unsqueeze(1)  # [S, 1, R]
    tree_rows = ancestors.gather(2, rel.clamp(0, n - 1).unsqueeze(1).expand(s, n, r))  # [S, n, R]
    visible = (rel < 0).unsqueeze(1) | (in_tree & tree_rows)
    write_rows = (committed.unsqueeze(1) + torch.arange(n, device=dev)).reshape(-1)
    write_slots = torch.arange(s, device=dev).repeat_interleave(n)
    args = StaticArgs(keys, values, visible, write_slots, write_rows, s, n, r)
    kw = dict(input_ids=input_ids, position_ids=position_ids, use_cache=False, sssd_step=args)
    if hidden:
        return model(**kw).last_hidden_state[0]
    return model(**kw, logits_to_keep=0).logits[0]


class HookWatch:
    """The forward hooks of a model (and torch's global ones): a compiled graph or a captured CUDA graph
    runs without them (dynamo does not guard on hooks; a replay runs no Python), so a model with hooks
    must run its forward eagerly. Checked before every static forward: one glance at each hook dict (the
    engine's view of the model, ``sssd.engine.shadow``, holds the user's modules' very dicts).
    transformers' own output-capturing hooks are left out: they act only when a forward asks for hidden
    states or attentions, which the engine's never do."""

    def __init__(self, model: Any):
        from torch.nn.modules import module

        self._dicts = [d for m in model.modules() for d in (m._forward_hooks, m._forward_pre_hooks)]
        self._dicts += [module._global_forward_hooks, module._global_forward_pre_hooks]

    def hooks(self) -> list[str]:
        """The names of the hooks that matter (usually none: then a glance at each dict)."""
        if not any(self._dicts):
            return []
        return [_name(h) for d in self._dicts for h in d.values() if not _inert(h)]


def _inert(hook: Any) -> bool:
    fn = getattr(hook, "__func__", hook)
    return getattr(fn, "__module__", "") == "transformers.utils.output_capturing"


def _name(hook: Any) -> str:
    return str(getattr(hook, "__qualname__", None) or type(hook).__name__)


class StaticStep:
    """The static-shape verification forward of one ``ModelAdapter``: buffers and a function per bucket.

    ``mode``: see the module docstring. ``stats`` counts compilations and their seconds."""

    def __init__(self, adapter: Any, mode: str):
        self._mempool = None
        self._views: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}  # rows -> cache views
        self._views_of: tuple | None = None  # the cache tensors they view
        self.adapter = adapter
        self.mode = mode
        self._hooks = HookWatch(adapter.model)
        self.device = adapter.device
        self._buffers: dict[Bucket, dict[str, torch.Tensor]] = {}
        self._graphs: dict[Bucket, Any] = {}  # "cudagraph" mode: (graph, output, cache tensors)
        self._ready: set[Bucket] = set()  # buckets compiled (their first call completed)
        self.compiles = 0  # buckets compiled or captured
        self.compile_time = 0.0  # seconds spent in them (first calls)
        self.last_compile_time = 0.0  # of the last run()

    # -- inputs --------------------------------------------------------------------------------------
    def _fill(self, bucket: Bucket, batch: Any, committed: np.ndarray) -> dict[str, torch.Tensor]:
        s, n = bucket.slots, bucket.nodes
        ids = np.zeros((s, n), np.int64)
        com = np.zeros(s, np.int64)
        com[: batch.num_trees] = committed
        pos = np.repeat(com[:, None], n, axis=1)
        ids[batch.tree_of, batch.local] = batch.tokens
        pos[batch.tree_of, batch.local] += batch.depth
        anc = padded_ancestors(batch, s, n)
        host = {"input_ids": ids.reshape(1, -1), "position_ids": pos.reshape(1, -1), "committed": com,
                "ancestors": anc}  # fmt: skip
        bufs = self._buffers.get(bucket)
        if bufs is None:
            bufs = {k: torch.from_numpy(v).to(self.device) for k, v in host.items()}
            bufs["row_ids"] = torch.arange(bucket.rows, device=self.device)
            self._buffers[bucket] = bufs
            return bufs
        for k, v in host.items():  # in place: a captured graph reads these very tensors
            bufs[k].copy_(torch.from_numpy(v), non_blocking=False)
        return bufs

    # -- running a bucket ----------------------------------------------------------------------------
    def _function(self, bucket: Bucket):
        key = (self.mode, self.device.type, bucket)
        fn = _FUNCTIONS.get(key)
        if fn is None:
            fn = _FUNCTIONS[key] = _bucket_function(self.mode, self.device.type, bucket)
        return fn

    def run(self, batch: Any, committed: np.ndarray, bucket: Bucket) -> torch.Tensor:
        """Score ``batch`` (a ``TreeBatch``, tree ``b`` in slot ``b``) at ``bucket``'s shapes. Returns the
        output rows ``[slots * nodes, hidden or vocab]`` (tree ``b``'s node ``t`` at row ``b * nodes + t``).

        A bucket's first use compiles (or captures) it with one call, whose seconds go to
        ``compile_time`` and ``last_compile_time``, then runs it again: the forward only writes scratch
        rows and reads committed ones, so running it twice changes nothing, and the step is timed without
        its compilation."""
        adapter = self.adapter
        cache = adapter.cache
        if (cache.capacity, cache.slots) != (bucket.capacity, bucket.cache_slots):
            raise ValueError(f"{bucket} does not match the cache ({cache.slots} x {cache.capacity} rows)")
        hooks = self._hooks.hooks()
        if hooks:
            raise CompileError(
                f"{adapter.model_class} has forward hooks ({', '.join(sorted(set(hooks)))}), which "
                f"compile={self.mode!r} would skip"
            )
        bufs = self._fill(bucket, batch, committed)
        model = adapter._base if adapter.lazy_head else adapter.view
        names = ("input_ids", "position_ids", "committed", "ancestors", "row_ids")
        args = (model, adapter.lazy_head, *(bufs[k] for k in names))
        self.last_compile_time = 0.0
        ready = self._captured(bucket) if self.mode == "cudagraph" else bucket in self._ready
        if not ready:
            t0 = time.perf_counter()
            self._call(bucket, args, first=True)
            adapter.synchronize()
            self._ready.add(bucket)
            self.last_compile_time = time.perf_counter() - t0
            self.compile_time += self.last_compile_time
            self.compiles += 1
        return self._call(bucket, args)

    def _call(self, bucket: Bucket, args: tuple, first: bool = False) -> torch.Tensor:
        if self.mode == "cudagraph":
            return self._replay(bucket, args)
        fn, views = self._function(bucket), self._cache_views(bucket)
        with torch.inference_mode():
            return self._first_call(bucket, fn, *args, *views) if first else fn(*args, *views)

    def _first_call(self, bucket: Bucket, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, the first call of a bucket's function (which compiles or captures it): an
        exception from it means the bucket cannot be compiled (``CompileError``, the forward runs eagerly
        from then on), except running out of memory. Only this call is covered: an interrupt, or an
        exception raised around it, is no compiler's and propagates as it is (the step resumes and
        compiles the bucket then)."""
        try:
            return fn(*args)
        except (torch.OutOfMemoryError, MemoryError):
            raise
        except Exception as e:
            raise CompileError(
                f"compile={self.mode!r} could not compile the verification forward of "
                f"{self.adapter.model_class} at {bucket}: {type(e).__name__}: {_first_line(e)}"
            ) from e

    def _cache_views(self, bucket: Bucket) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per layer, the first ``rows`` rows of every slot: ``[cache slots, Hkv, rows, D]`` views, the
        same tensor objects from step to step (CUDA graph trees keep inputs mutated in place only when they
        are static; a new view each step would be copied in and out)."""
        cache, r = self.adapter.cache, bucket.rows
        seen = self._views_of
        if seen is None or seen[0] is not cache.keys or seen[1] is not cache.values:  # reallocated
            self._views, self._views_of = {}, (cache.keys, cache.values)
            self._graphs.clear()  # graphs of the old cache would keep it alive, and it is gone
        views = self._views.get(r)
        if views is None:
            layers = range(cache.keys.shape[0])
            views = ([cache.keys[i, :, :, :r] for i in layers], [cache.values[i, :, :, :r] for i in layers])
            if self.mode == "inductor" and self.device.type == "cuda":
                for v in (*views[0], *views[1]):
                    torch._dynamo.mark_static_address(v)
            self._views[r] = views
        return views

    def _captured(self, bucket: Bucket) -> bool:
        entry = self._graphs.get(bucket)
        cache = self.adapter.cache
        return entry is not None and entry[2] is cache.keys and entry[3] is cache.values

    def _replay(self, bucket: Bucket, args: tuple) -> torch.Tensor:
        """``"cudagraph"`` mode: capture the bucket's eager forward once (after a warm-up on a side stream,
        as CUDA graphs require), then replay it. A graph holds the cache tensors' addresses: when the cache
        is reallocated (grown) the bucket is captured again."""
        cache = self.adapter.cache
        fn = self._function(bucket)
        views = self._cache_views(bucket)  # first: drops the graphs of a reallocated cache
        if self._captured(bucket):
            graph, out = self._graphs[bucket][:2]
            graph.replay()
            return out
        with torch.inference_mode():
            graph, out = self._first_call(bucket, self._capture, fn, args, views)
        self._graphs[bucket] = (graph, out, cache.keys, cache.values)
        graph.replay()
        return out

    def _capture(self, fn: Any, args: tuple, views: tuple) -> tuple[Any, torch.Tensor]:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            fn(*args, *views)  # warm-up: lazy initialisations happen outside the capture
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool()):
            out = fn(*args, *views)
        return graph, out

    def _pool(self):
        if self._mempool is None:  # one memory pool shared by every bucket's graph
            self._mempool = torch.cuda.graph_pool_handle()
        return self._mempool


# (mode, device type, bucket) -> the bucket's function: process-wide, so a second engine over the same
# model finds the graphs the first one compiled (dynamo keeps them with the function's code object)
_FUNCTIONS: dict[tuple[str, str, Bucket], Any] = {}


def _bucket_function(mode: str, device_type: str, bucket: Bucket):
    """A copy of ``_static_forward`` with a code object of its own, so its own compiled graph and
    guards (dynamo keeps compiled graphs per code object, up to a recompile limit), compiled for ``mode``."""
    b = bucket
    name = (
        f"sssd_verify_{mode.replace(':', '_')}_s{b.slots}_n{b.nodes}_r{b.rows}_{b.cache_slots}x{b.capacity}"
    )
    code = _static_forward.__code__.replace(co_name=name)
    fn = types.FunctionType(code, _static_forward.__globals__, name)
    if mode == "inductor":
        cuda = device_type == "cuda"
        return torch.compile(fn, fullgraph=True, dynamic=False, mode="reduce-overhead" if cuda else None)
    if mode.startswith("backend:"):
        return torch.compile(fn, fullgraph=True, dynamic=False, backend=mode.split(":", 1)[1])
    return fn


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:300] if lines else ""
