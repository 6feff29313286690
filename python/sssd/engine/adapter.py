"""Drive any Hugging Face causal LM with tree attention over our own KV cache.

Only public extension points are used: an attention function registered by name in
``transformers.AttentionInterface`` (the model is switched to it with ``set_attn_implementation``), explicit
``position_ids`` (context length + node depth), and an extra keyword argument (``sssd_step``) that
transformers forwards untouched from ``model(...)`` down to every attention call. That argument is the
forward's attention plan (``sssd.engine.backends``): which cache slots the forward covers, where each new
node's K/V goes, which keys each query may see. The model is called with ``use_cache=False`` and no
attention mask, so transformers builds no mask and keeps no cache of its own.

All requests' trees are packed into one row (``input_ids`` ``[1, N]``, the order of the step's
``TreeBatch``). The attention backend is chosen once, here (``ModelAdapter(attention=...)``):

- ``"sdpa"``: one fused torch SDPA call per layer over each request's rows, queries padded per request;
- ``"packed"``: the tree kernel on the packed layout (CUDA: fp16/bf16, head dim 64/128; CPU: float32;
  otherwise the kernel's float64 reference, slow); trees of more than 128 nodes use SDPA;
- ``"emulated"`` (tests): the packed path through the host emulation of the kernel's tiling (float32);
- ``"auto"`` (default): the backend named by the environment variable ``SSSD_ATTENTION`` if set, else
  ``"packed"`` when a kernel can run the model (the CUDA kernel: built extension, CUDA device, fp16/bf16
  weights, head dim 64 or 128; the CPU kernel: float32 weights on a CPU), else ``"sdpa"``.

Every plan first writes the step's K/V into the cache rows after each request's committed rows (the
scratch tail); ``commit`` then gathers the accepted nodes into place for all layers at once.

``StepOutput`` is what a forward returns: hidden states plus the model's output head (applied lazily, to
the rows asked for), or the full logits. The head's measured cost (``sssd.policy.head_cost.HeadCost``, the
one model of it, which the budget policy's cost model reads too) decides when verification should ask for
many rows in one call (``sssd.engine.verify``); every call's time is recorded into it.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from sssd.engine.backends import (
    ATTENTION_BACKENDS,
    ATTENTION_NAME,
    EagerPlan,
    StepContext,
    backend_for,
    register,
    sssd_attention,
)
from sssd.engine.kv_cache import CacheShape, KVCache
from sssd.engine.shadow import shadow_model
from sssd.engine.static_step import CompileError, StaticStep, bucket_for, pow2_at_least, resolve_compile
from sssd.engine.trees import AcceptedPaths, TreeBatch, chain_tree
from sssd.kernels.linear import fast_linears
from sssd.policy.head_cost import HeadCost


class StepOutput:
    """What one forward produced: either hidden states ``[N, hidden]`` plus the output head (logits are
    computed only for the rows asked for), or the full logits ``[N, vocab]``. ``prefetch(index)`` computes
    the logits of many rows in one head call and keeps them for later ``logits`` calls."""

    def __init__(
        self,
        rows: torch.Tensor,
        head: Any = None,
        row_of: np.ndarray | None = None,
        head_cost: HeadCost | None = None,
    ):
        self.rows, self.head = rows, head
        self.row_of = row_of  # int64 [N]: row of each packed node (a padded static forward), None = same
        self.head_s = 0.0  # seconds spent in the output head so far (part of the forward's cost)
        self.head_calls = 0
        # None: no choice to make (the logits are all here)
        self.head_cost = head_cost if head is not None else None
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

    def all_logits(self) -> torch.Tensor:
        """Logits ``[N, vocab]`` of every packed row, in order, in one head call; kept for later
        ``logits`` calls."""
        n = len(self)
        if self.head is None:
            return self._head_of(None)
        if self._kept_logits is None or len(self._kept) != n or any(self._kept.get(i) != i for i in range(n)):
            self.prefetch(range(n))
        return self._kept_logits

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
        if self.head_cost is not None:
            self.head_cost.record(int(x.shape[0]), dt)
        return out


__all__ = [
    "ATTENTION_BACKENDS", "ATTENTION_NAME", "ModelAdapter", "StepContext", "StepOutput",
    "sssd_attention",
]  # fmt: skip


class ModelAdapter:
    """A causal LM switched to tree attention, with its KV cache.

    ``forward_trees(batch)`` scores a ``TreeBatch`` (tree ``i`` in active slot ``i``) in one forward;
    ``commit(accepted)`` keeps the accepted nodes' K/V; ``prefill(slot, tokens)`` appends a prompt's K/V
    to a slot in chunks.
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
        register()
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
        self.backend = backend_for(self.attention)  # plans every eager forward's attention
        mode = resolve_compile(compile, shape.device, self.attention, explicit_attention=attention != "auto")
        self.static = StaticStep(self, mode) if mode is not None else None
        # the output head's measured cost: when verification asks it for many rows at once
        self.head_cost = HeadCost()
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
    def _run(self, ids: np.ndarray, pos: np.ndarray, ctx: EagerPlan, mode: str) -> torch.Tensor | None:
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
        tree = TreeBatch(np.array([0, 1, 2]), np.array([-1, 0, 0]), np.array([0, 1, 1]), np.array([0, 3]))
        try:
            ctx = self._context(slot, tree)
            ctx.record = True
            logits = self._run(tree.tokens, tree.depth, ctx, "logits")
            view = self.view
            base = getattr(view, "base_model", None)
            head = view.get_output_embeddings() if hasattr(view, "get_output_embeddings") else None
            if base is not None and base is not view and head is not None:
                self._base, self._head = base, head
                try:
                    hidden = self._run(tree.tokens, tree.depth, self._context(slot, tree), "hidden")
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

    def _context(self, slot_start: int, batch: TreeBatch) -> EagerPlan:
        """The attention plan of an eager forward of ``batch`` in slots ``slot_start..``."""
        committed = self.cache.lengths[slot_start : slot_start + batch.num_trees]
        return self.backend.plan(self.cache, slot_start, batch, committed)

    def forward_trees(self, batch: TreeBatch) -> StepOutput:
        """Score the trees of slots ``0..B-1`` (nodes written to their scratch rows). The result gives
        the logits of any of the batch's nodes (rows in the batch's order)."""
        if batch.num_trees != self.cache.num_active:
            raise ValueError(f"{batch.num_trees} trees for {self.cache.num_active} active slots")
        if self.static is not None:
            try:
                return self._forward_static(batch)
            except CompileError as e:  # this model or backend cannot be captured: eager from now on
                warnings.warn(f"{e}; the verification forward runs eagerly", stacklevel=3)
                self.static = None
        ctx = self._context(0, batch)
        pos = self.cache.lengths[batch.tree_of] + batch.depth
        if self.lazy_head:
            hidden = self._run(batch.tokens, pos, ctx, "hidden")
            return StepOutput(hidden, self._head, head_cost=self.head_cost)
        return StepOutput(self._run(batch.tokens, pos, ctx, "logits"), None)

    def _forward_static(self, batch: TreeBatch) -> StepOutput:
        """``forward_trees`` at the static shapes of the step's bucket (``sssd.engine.static_step``)."""
        cache = self.cache
        b, n_max = batch.num_trees, batch.max_size
        committed = cache.lengths[:b].copy()
        rows = int(committed.max()) + pow2_at_least(n_max)  # padding nodes write rows too
        cache.reserve(rows)
        cache.reserve_slots(pow2_at_least(b))
        bucket = bucket_for(b, n_max, rows, cache.capacity, cache.slots)
        out = self.static.run(batch, committed, bucket)
        row_of = batch.tree_of * bucket.nodes + batch.local
        return StepOutput(out, self._head if self.lazy_head else None, row_of, head_cost=self.head_cost)

    def synchronize(self) -> None:
        """Wait for the device's queued work (CUDA); a no-op on the CPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def prefill(self, slot: int, tokens: np.ndarray) -> None:
        """Append ``tokens`` (committed context) to ``slot``'s rows, ``prefill_chunk`` tokens per forward."""
        tokens = np.asarray(tokens, dtype=np.int64)
        for a in range(0, len(tokens), self.prefill_chunk):
            chunk = chain_tree(tokens[a : a + self.prefill_chunk])
            ctx = self._context(slot, chunk)
            start = int(self.cache.lengths[slot])
            self._run(chunk.tokens, start + chunk.depth, ctx, "none")
            self.cache.lengths[slot] = start + chunk.num_nodes

    def commit(self, accepted: AcceptedPaths) -> None:
        """After ``forward_trees``: keep the accepted nodes (``accepted.local``, path ``i`` root first) of
        slot ``i``'s tree in the rows after its committed ones."""
        self.cache.commit(np.arange(len(accepted.offsets) - 1), accepted.local, accepted.offsets)
