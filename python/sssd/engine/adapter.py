"""Drive any Hugging Face causal LM with tree attention over our own KV cache.

Only public extension points are used: an attention function registered by name in
``transformers.AttentionInterface`` (the model is switched to it with ``set_attn_implementation``), explicit
``position_ids`` (context length + node depth), and an extra keyword argument (``sssd_step``) that
transformers forwards untouched from ``model(...)`` down to every attention call. That argument is the
per-forward ``StepContext``: which cache slots the forward covers, where each new node's K/V goes, which
keys each query may see. The model is called with ``use_cache=False`` and no attention mask, so
transformers builds no mask and keeps no cache of its own.

All requests' trees are packed into one row (``input_ids`` ``[1, N]``). Attention then runs one of two ways
(``ModelAdapter(attention=...)``):

- ``"sdpa"``: the queries are laid out per request (``[B, H, n_max, D]``, padded) for one fused torch SDPA
  call per layer with a dense boolean mask over each request's rows;
- ``"packed"``: the packed layout goes as is to :func:`sssd.kernels.tree_attention.hf_tree_attention`, which
  runs the CUDA tree kernel (CUDA tensors, fp16/bf16, head dim 64/128: committed rows unmasked, tree nodes
  through 128-bit ancestor masks, no padding), on a CPU in float32 sssd's CPU tree kernel (the same
  layout; each request reads its own rows only, once per KV head) and otherwise the float64 reference of
  the CUDA kernel (slow; the GPU suite's "float32 reference mode"). Trees of more than 128 nodes (long
  prefill chunks) use SDPA.
- ``"emulated"`` (tests): the packed path through the host emulation of the kernel's tiling (float32).
- ``"auto"`` (default): the backend named by the environment variable ``SSSD_ATTENTION`` if set, else
  ``"packed"`` when a kernel can run the model (the CUDA kernel: built extension, CUDA device, fp16/bf16
  weights, head dim 64 or 128; the CPU kernel: float32 weights on a CPU), else ``"sdpa"``.

Both paths first write the step's K/V into the cache rows after each request's committed rows (the
scratch tail); ``commit`` then gathers the accepted nodes into place for all layers at once.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sssd.engine.attention import tree_attention
from sssd.engine.kv_cache import CacheShape, KVCache, StepWrites
from sssd.engine.masks import ancestor_bits, dense_visibility
from sssd.engine.shadow import shadow_model
from sssd.engine.static_step import (
    CompileError,
    StaticArgs,
    StaticStep,
    bucket_for,
    pow2_at_least,
    resolve_compile,
    static_attention,
)
from sssd.engine.trees import Tree, chain_tree
from sssd.kernels.linear import fast_linears
from sssd.kernels.tree_attention import MAX_TREE_NODES

ATTENTION_NAME = "sssd_tree"
ATTENTION_BACKENDS = ("auto", "sdpa", "packed", "emulated")


@dataclass
class StepContext:
    """What the attention function needs for one forward (shared by all layers)."""

    cache: KVCache
    slot_start: int
    slot_stop: int
    rows: int  # keys read per request: max(committed + nodes)
    n_max: int  # nodes per request after padding
    writes: StepWrites
    visible: torch.Tensor | None  # bool [B, n_max, rows]; None = everything visible
    pad_src: torch.Tensor | None  # int64 [B * n_max]: packed index of each padded query; None = no padding
    unpad: torch.Tensor | None  # int64 [N]: padded index of each packed node
    calls: list[int] = field(default_factory=list)  # layer ids seen (only filled by the probe)
    record: bool = False
    # packed path: the step's PackedTrees and the function that attends over them (None = SDPA path)
    packed: Any = None
    packed_attention: Any = None


def sssd_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: ``query`` ``[1, H, N, D]``, ``key``/``value`` ``[1, Hkv, N, D]``
    (already rotated by the model). Returns ``([1, N, H, D], None)``."""
    ctx: StepContext | StaticArgs | None = kwargs.get("sssd_step")
    if isinstance(ctx, StaticArgs):  # a static-shape forward (sssd.engine.static_step)
        scale = module.scaling if scaling is None else scaling
        return static_attention(module, query, key, value, ctx, scale), None
    if ctx is None:
        raise RuntimeError(
            f"the '{ATTENTION_NAME}' attention only runs inside an sssd Engine forward; "
            "call model.set_attn_implementation('sdpa') to use the model on its own"
        )
    if kwargs.get("softcap") is not None:
        raise NotImplementedError(f"{type(module).__name__}: attention logit soft-capping is not supported")
    window = kwargs.get("sliding_window")
    if window is not None and ctx.rows > window:
        raise NotImplementedError(
            f"{type(module).__name__}: sliding-window attention beyond {window} tokens is not supported"
        )
    layer = module.layer_idx
    if ctx.record:
        ctx.calls.append(layer)
    ctx.cache.write(layer, key, value, ctx.writes)
    scale = module.scaling if scaling is None else scaling
    if ctx.packed is not None:  # committed rows from the cache, tree K/V straight from this forward
        cache = ctx.cache
        out = ctx.packed_attention(
            query, key, value, cache.keys[layer], cache.values[layer], ctx.packed, scale=scale
        )
        return out, None
    k, v = ctx.cache.view(layer, ctx.slot_start, ctx.slot_stop, ctx.rows)
    b = ctx.slot_stop - ctx.slot_start
    h, d = query.shape[1], query.shape[3]
    q = query[0]
    if ctx.pad_src is not None:
        q = q.index_select(1, ctx.pad_src)
    q = q.reshape(h, b, ctx.n_max, d).transpose(0, 1)
    out = tree_attention(q, k, v, ctx.visible, scale)  # [B, H, n_max, D]
    out = out.transpose(1, 2).reshape(b * ctx.n_max, h, d)
    if ctx.unpad is not None:
        out = out.index_select(0, ctx.unpad)
    return out.unsqueeze(0), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, sssd_attention)


class HeadPlan:
    """When verification should ask the output head for many rows at once: a measured cost per call by
    row count and the measured chance that the walk goes one level deeper.

    Verification needs logits only on the accepted paths, one depth at a time, so it can ask for the rows
    of one level per call (few rows, one call per accepted depth) or for every row it may still need at
    once (the subtrees below the nodes the walks stand on: one call, more rows). Where the head is bound by
    reading its weights (a CPU in bfloat16, a GPU) a call of 32 rows costs about as much as one of a
    single row, and one call replaces all the levels; where it is bound by arithmetic (float32 on a CPU) the
    many rows cost more than the levels usually saved. With ``p`` the chance that a level is followed by
    another, the lazy walk expects ``1 / (1 - p)`` calls from here, so asking for all ``R`` remaining rows
    pays when ``cost(R) <= cost(k) / (1 - p)``, ``k`` the rows of this level. Both come from the steps
    seen so far: call times by row count (powers of two, the newest weighing a quarter), ``p`` over about
    ``memory`` levels.
    A row count never measured is taken to cost as much as the largest smaller one measured (so it is
    tried once and then known), and every ``reprobe`` refusals one call for all rows is made anyway, so a
    cost measured under a passing load is measured again.
    """

    def __init__(self, *, memory: float = 32.0, reprobe: int = 64):
        self.memory = float(memory)
        self.reprobe = int(reprobe)
        self.cost: dict[int, float] = {}  # rows rounded up to a power of two -> seconds per call
        self.p_continue = 0.5  # chance that a level of the walk is followed by another
        self._refused = 0

    @staticmethod
    def bucket(rows: int) -> int:
        return 1 << max(0, int(rows) - 1).bit_length()

    def record(self, rows: int, seconds: float) -> None:
        """One head call over ``rows`` rows took ``seconds``."""
        if rows < 1 or not seconds >= 0:
            return
        b = self.bucket(rows)
        old = self.cost.get(b)
        self.cost[b] = seconds if old is None else old + 0.25 * (seconds - old)

    def level(self, continued: bool) -> None:
        """A level of the walk was verified; ``continued``: some request's walk went one level deeper."""
        self.p_continue += (float(continued) - self.p_continue) / self.memory

    def estimate(self, rows: int) -> float | None:
        b = self.bucket(rows)
        if b in self.cost:
            return self.cost[b]
        smaller = [k for k in self.cost if k < b]
        return self.cost[max(smaller)] if smaller else None

    def all_at_once(self, rows_now: int, rows_all: int) -> bool:
        """Ask for all ``rows_all`` remaining rows now rather than the ``rows_now`` of this level?"""
        if rows_all <= rows_now:
            return False
        now, every = self.estimate(rows_now), self.estimate(rows_all)
        if now is None:
            return False  # measure a plain level first
        p = min(max(self.p_continue, 0.0), 0.95)
        if every is None or every <= now / (1.0 - p):
            return True
        self._refused += 1
        if self.reprobe > 0 and self._refused % self.reprobe == 0:
            return True
        return False


class StepOutput:
    """What one forward produced: either hidden states ``[N, hidden]`` plus the output head (logits are
    computed only for the rows asked for), or the full logits ``[N, vocab]``. ``prefetch(index)`` computes
    the logits of many rows in one head call and keeps them for later ``logits`` calls."""

    def __init__(
        self,
        rows: torch.Tensor,
        head: Any = None,
        row_of: np.ndarray | None = None,
        plan: HeadPlan | None = None,
    ):
        self.rows, self.head = rows, head
        self.row_of = row_of  # int64 [N]: row of each packed node (a padded static forward), None = same
        self.head_s = 0.0  # seconds spent in the output head so far (part of the forward's cost)
        self.head_calls = 0
        self.plan = plan if head is not None else None  # None: no choice to make (the logits are all here)
        self._kept: dict[int, int] = {}  # packed row -> its row in self._kept_logits
        self._kept_logits: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.rows.shape[0]) if self.row_of is None else len(self.row_of)

    def logits(self, index: Any = None) -> torch.Tensor:
        """Logits ``[k, vocab]`` of the packed rows ``index`` (all rows when None)."""
        if index is not None and self._kept:
            where = [self._kept.get(int(i)) for i in index]
            if all(w is not None for w in where):
                return self._kept_logits[torch.as_tensor(where, device=self._kept_logits.device)]
        return self._head_of(index)

    def prefetch(self, index: Any) -> None:
        """Computes the logits of the packed rows ``index`` in one head call and keeps them."""
        if self.head is None:
            return
        index = [int(i) for i in index]
        self._kept_logits = self._head_of(index)
        self._kept = {r: j for j, r in enumerate(index)}

    def _head_of(self, index: Any) -> torch.Tensor:
        if self.row_of is not None:
            index = self.row_of if index is None else self.row_of[np.asarray(index, dtype=np.int64)]
        x = self.rows if index is None else self.rows[torch.as_tensor(index, device=self.rows.device)]
        if self.head is None:
            return x
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.head(x)
        if out.device.type == "cuda":  # its time, not its launch time (the caller reads it at once anyway)
            torch.cuda.synchronize(out.device)
        dt = time.perf_counter() - t0
        self.head_s += dt
        self.head_calls += 1
        if self.plan is not None:
            self.plan.record(int(x.shape[0]), dt)
        return out


class ModelAdapter:
    """A causal LM switched to tree attention, with its KV cache.

    ``forward_trees(trees)`` scores the trees of the active slots ``0..len(trees)-1`` in one forward;
    ``prefill(slot, tokens)`` appends a prompt's K/V to a slot in chunks.
    """

    def __init__(
        self,
        model: Any,
        *,
        prefill_chunk: int = 512,
        initial_capacity: int = 256,
        attention: str = "auto",
        compile: bool | str = False,
        linear: str = "auto",
    ):
        cls = type(model).__name__
        if attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {attention!r}")
        config = getattr(model, "config", None)
        if config is None or not hasattr(model, "set_attn_implementation"):
            raise ValueError(
                f"{cls} is not a transformers PreTrainedModel (no config / set_attn_implementation)"
            )
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"{cls} is an encoder-decoder model; sssd drives decoder-only causal LMs")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        _register()
        # the engine's own view of the model (sssd.engine.shadow): same weights, its own attention setting
        # and eval mode; the user's model is never switched, so nothing can leave it switched
        view = shadow_model(model)
        try:
            view.set_attn_implementation(ATTENTION_NAME)
            uses_interface = getattr(view.config, "_attn_implementation", None) == ATTENTION_NAME
        except Exception as e:
            raise ValueError(
                f"{cls} cannot switch its attention implementation to '{ATTENTION_NAME}': {e}"
            ) from e
        if not uses_interface:
            raise ValueError(
                f"{cls} does not use transformers' AttentionInterface, so sssd cannot replace its attention"
            )
        self.model = model
        self.view = view
        self.model_class = cls
        self.prefill_chunk = prefill_chunk
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.num_layers = int(text.num_hidden_layers)
        heads = int(text.num_attention_heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        self.vocab_size = int(text.vocab_size)
        self.max_positions = int(getattr(text, "max_position_embeddings", 0) or 1 << 30)
        param = next(model.parameters())
        shape = CacheShape(self.num_layers, kv_heads, head_dim, param.dtype, param.device)
        self.device = param.device
        self.cache = KVCache(shape, capacity=initial_capacity, max_capacity=self.max_positions + 1)
        self.attention = self._resolve_attention(attention, shape)
        mode = resolve_compile(compile, shape.device, self.attention, explicit_attention=attention != "auto")
        self.static = StaticStep(self, mode) if mode is not None else None
        self.head_plan = HeadPlan()  # when verification asks the output head for many rows at once
        # CPU: the linear layers' kernel for each row count, measured here (sssd.kernels.linear)
        self.linear_plan = fast_linears(view, linear) if self.static is None else None
        self._probe()

    @staticmethod
    def _resolve_attention(attention: str, shape: CacheShape) -> str:
        from sssd.kernels import tree_attention as cuda_ops

        fits = cuda_ops.kernel_can_run(shape.device, shape.dtype, shape.head_dim)
        fits = fits or cuda_ops.cpu_kernel_can_run(shape.device, shape.dtype)
        if attention == "auto":
            forced = os.environ.get("SSSD_ATTENTION", "auto")
            if forced not in ATTENTION_BACKENDS:
                raise ValueError(f"SSSD_ATTENTION must be one of {ATTENTION_BACKENDS}, got {forced!r}")
            attention = forced
        if attention == "auto":
            return "packed" if fits else "sdpa"
        if attention == "packed" and shape.device.type == "cuda" and not fits:
            # allowed (the float64 reference serves it) but worth knowing: it is slow
            import warnings

            warnings.warn(
                f"attention='packed' on {shape.device} with {shape.dtype}, head dim {shape.head_dim}: the "
                "CUDA kernel cannot run this (or sssd was built without it); using its float64 reference",
                stacklevel=3,
            )
        return attention

    # -- forward passes -------------------------------------------------------------------------------
    def _run(self, ids: np.ndarray, pos: np.ndarray, ctx: StepContext, mode: str) -> torch.Tensor | None:
        """mode: "logits" (full model, all rows), "hidden" (base model's last hidden states) or "none"."""
        dev = self.device
        input_ids = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(dev).unsqueeze(0)
        position_ids = torch.from_numpy(np.ascontiguousarray(pos, dtype=np.int64)).to(dev).unsqueeze(0)
        kw = dict(input_ids=input_ids, position_ids=position_ids, use_cache=False, sssd_step=ctx)
        with torch.inference_mode():
            if mode == "logits" or (mode == "none" and self._base is None):
                out = self.view(**kw, logits_to_keep=0 if mode == "logits" else 1)
                return out.logits[0] if mode == "logits" else None
            hidden = self._base(**kw).last_hidden_state[0]
        return hidden if mode == "hidden" else None

    def _probe(self) -> None:
        """Tiny forwards on a scratch slot: every layer must call our attention exactly once; and the
        output head is applied lazily (only to the rows verification asks for) when the model's logits
        are exactly ``output_embeddings(base_model(...))``."""
        self._base = None
        slot = self.cache.add()
        tree = Tree(np.array([0, 1, 2], np.int64), np.array([-1, 0, 0]), np.array([0, 1, 1]))
        try:
            ctx = self._context(slot, [tree])
            ctx.record = True
            logits = self._run(tree.tokens, tree.depth, ctx, "logits")
            view = self.view
            base = getattr(view, "base_model", None)
            head = view.get_output_embeddings() if hasattr(view, "get_output_embeddings") else None
            if base is not None and base is not view and head is not None:
                self._base, self._head = base, head
                try:
                    hidden = self._run(tree.tokens, tree.depth, self._context(slot, [tree]), "hidden")
                    with torch.inference_mode():
                        same = torch.allclose(head(hidden).float(), logits.float(), rtol=1e-4, atol=1e-5)
                except Exception:  # any surprise: keep the full forward
                    same = False
                if not same:  # e.g. logit scaling or soft-capping after the head
                    self._base = None
        except torch.OutOfMemoryError:  # transient, not the model's incompatibility: keep its type
            raise
        except (TypeError, RuntimeError, NotImplementedError) as e:
            raise ValueError(f"{self.model_class} cannot run sssd tree attention: {e}") from e
        finally:
            self.cache.remove(slot)
        if sorted(ctx.calls) != list(range(self.num_layers)):
            raise ValueError(
                f"{self.model_class} does not route every layer's attention through transformers' "
                f"AttentionInterface (saw layers {sorted(set(ctx.calls))} of {self.num_layers}); "
                "sssd cannot replace its attention"
            )

    @property
    def lazy_head(self) -> bool:
        return self._base is not None

    def _context(self, slot_start: int, trees: list[Tree]) -> StepContext:
        cache = self.cache
        b = len(trees)
        sizes = np.array([len(t.tokens) for t in trees], dtype=np.int64)
        committed = cache.lengths[slot_start : slot_start + b]
        n_max = int(sizes.max())
        rows = int((committed + sizes).max())
        cache.reserve(rows)
        dev = self.device
        if b == 1:
            writes = StepWrites(None, None, slice_slot=slot_start, slice_start=int(committed[0]))
        else:
            slot_index = np.repeat(np.arange(slot_start, slot_start + b), sizes)
            row_index = np.concatenate([c + np.arange(n) for c, n in zip(committed, sizes, strict=True)])
            writes = StepWrites(torch.from_numpy(slot_index).to(dev), torch.from_numpy(row_index).to(dev))
        if self.attention != "sdpa" and n_max <= MAX_TREE_NODES:
            return self._packed_context(slot_start, trees, sizes, committed, rows, writes)
        visible = None
        if not (b == 1 and n_max == 1):
            visible = torch.from_numpy(dense_visibility(trees, committed, rows)).to(dev)
        pad_src = unpad = None
        if (sizes != n_max).any():
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            t_idx = np.arange(n_max)
            src = starts[:, None] + np.minimum(t_idx[None, :], sizes[:, None] - 1)
            pad_src = torch.from_numpy(src.reshape(-1)).to(dev)
            unpad = torch.from_numpy(
                np.concatenate([i * n_max + np.arange(n) for i, n in enumerate(sizes)])
            ).to(dev)
        return StepContext(cache, slot_start, slot_start + b, rows, n_max, writes, visible, pad_src, unpad)

    def _packed_context(self, slot_start, trees, sizes, committed, rows, writes) -> StepContext:
        from sssd.kernels import tree_attention as cuda_ops

        offsets = np.zeros(len(trees) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        slots = np.arange(slot_start, slot_start + len(trees))
        packed = cuda_ops.PackedTrees.from_numpy(offsets, committed, slots, ancestor_bits(trees), self.device)
        if self.attention == "emulated":
            fn = functools.partial(cuda_ops.hf_tree_attention, emulate=True)
        else:
            fn = cuda_ops.hf_tree_attention
        return StepContext(
            self.cache, slot_start, slot_start + len(trees), rows, int(sizes.max()), writes,
            None, None, None, packed=packed, packed_attention=fn,
        )  # fmt: skip

    def forward_trees(self, trees: list[Tree]) -> StepOutput:
        """Score the trees of slots ``0..B-1`` (nodes written to their scratch rows). The result gives
        the logits of any packed node rows (tree 0's nodes first)."""
        if len(trees) != self.cache.num_active:
            raise ValueError(f"{len(trees)} trees for {self.cache.num_active} active slots")
        if self.static is not None:
            try:
                return self._forward_static(trees)
            except CompileError as e:  # this model or backend cannot be captured: eager from now on
                warnings.warn(f"{e}; the verification forward runs eagerly", stacklevel=3)
                self.static = None
        ctx = self._context(0, trees)
        ids = np.concatenate([t.tokens for t in trees])
        pos = np.concatenate([c + t.depth for c, t in zip(self.cache.lengths, trees, strict=True)])
        if self.lazy_head:
            return StepOutput(self._run(ids, pos, ctx, "hidden"), self._head, plan=self.head_plan)
        return StepOutput(self._run(ids, pos, ctx, "logits"), None)

    def _forward_static(self, trees: list[Tree]) -> StepOutput:
        """``forward_trees`` at the static shapes of the step's bucket (``sssd.engine.static_step``)."""
        cache = self.cache
        committed = cache.lengths[: len(trees)].copy()
        sizes = np.array([len(t.tokens) for t in trees], dtype=np.int64)
        rows = int(committed.max()) + pow2_at_least(int(sizes.max()))  # padding nodes write rows too
        cache.reserve(rows)
        cache.reserve_slots(pow2_at_least(len(trees)))
        bucket = bucket_for(len(trees), int(sizes.max()), rows, cache.capacity, cache.slots)
        out = self.static.run(trees, committed, bucket)
        row_of = np.concatenate([b * bucket.nodes + np.arange(n) for b, n in enumerate(sizes)])
        return StepOutput(out, self._head if self.lazy_head else None, row_of, plan=self.head_plan)

    def synchronize(self) -> None:
        """Wait for the device's queued work (CUDA); a no-op on the CPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def prefill(self, slot: int, tokens: np.ndarray) -> None:
        """Append ``tokens`` (committed context) to ``slot``'s rows, ``prefill_chunk`` tokens per forward."""
        tokens = np.asarray(tokens, dtype=np.int64)
        for a in range(0, len(tokens), self.prefill_chunk):
            chunk = tokens[a : a + self.prefill_chunk]
            n = len(chunk)
            tree = chain_tree(chunk)
            ctx = self._context(slot, [tree])
            start = int(self.cache.lengths[slot])
            self._run(chunk, start + np.arange(n), ctx, "none")
            self.cache.lengths[slot] = start + n

    def commit(self, paths: list[np.ndarray]) -> None:
        """After ``forward_trees``: keep node ``paths[i]`` (root first) of slot ``i``'s tree."""
        self.cache.commit(np.arange(len(paths)), paths)
