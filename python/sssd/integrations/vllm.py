"""sssd's drafter inside vLLM, as its custom speculative proposer (``method="custom_class"``).

```python
import os, vllm
os.environ["SSSD_VLLM_CONFIG"] = '{"datastore": "outputs.sssd"}'     # or the path of a JSON file
llm = vllm.LLM(model, speculative_config={"method": "custom_class",
                                         "model": "sssd.integrations.vllm.SssdProposer",
                                         "num_speculative_tokens": 8})
```

vLLM owns batching, the KV cache, graphs and parallelism; it calls ``propose`` once per step with the
batch rows' committed tokens and the tokens sampled this step. The proposer follows the rows to drafter
requests incrementally (:mod:`sssd.integrations.rows`), drafts the fused trees of every row in one
native call, and returns each row's best chain (:mod:`sssd.integrations.chains`), its length chosen
batch-wide by expected goodput: a cost model of the step fitted online from the time between calls, and
the acceptance it observes (0 tokens where drafting does not pay). vLLM verifies every token, so outputs
are vLLM's own, with or without a draft.

Configuration, without code: the environment variable ``SSSD_VLLM_CONFIG``, the path of a JSON file or a
JSON object (vLLM's speculative config accepts no extra fields). Keys (all optional): ``datastore`` (a
file or directory of shards built by ``build-datastore``), ``drafter`` (``sssd.DrafterConfig`` fields),
``tree_nodes``, ``lengths``, ``min_f``, ``explore_every``, ``max_absent`` (see :class:`ProposerConfig`).
The datastore is checked when vLLM builds the proposer: a bad path or another tokenizer's datastore stops
start-up with the reason, before any request runs.

Imports vLLM only for type names: the module itself needs numpy and the drafter.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from sssd.batch import on_path_mask, take_nodes, tree_index
from sssd.checks import check_fields
from sssd.datastore import Datastore
from sssd.drafter import Drafter, DrafterConfig
from sssd.fileio import json_object
from sssd.integrations.chains import best_chains
from sssd.integrations.rows import RowTracker
from sssd.policy.cost_model import CostModel
from sssd.policy.goodput import choose_budget
from sssd.policy.interface import StepRecord

log = logging.getLogger("sssd.vllm")
ENV = "SSSD_VLLM_CONFIG"


@dataclass(frozen=True)
class ProposerConfig:
    datastore: str | None = None  # a datastore file or directory of shards (None: request tokens + pool)
    drafter: dict = field(default_factory=dict)  # sssd.DrafterConfig fields
    tree_nodes: int = 32  # nodes of each row's fused tree (its best path becomes the chain)
    lengths: str = "adaptive"  # "adaptive": goodput-ranked chain lengths; "full": every chain up to k
    min_f: float = 0.0  # chain nodes with a smaller accumulated probability are never proposed
    explore_every: int = 32  # adaptive: every n-th step proposes full chains, so the cost model sees them
    max_absent: int = 2  # steps a request may be missing from the rows before it is dropped

    def __post_init__(self) -> None:
        check_fields(self)
        if self.tree_nodes < 1 or self.explore_every < 0 or self.max_absent < 1:
            raise ValueError("tree_nodes and max_absent must be >= 1, explore_every >= 0")
        if self.lengths not in ("adaptive", "full"):
            raise ValueError(f"lengths must be 'adaptive' or 'full', got {self.lengths!r}")
        if not 0.0 <= self.min_f <= 1.0:
            raise ValueError(f"min_f must be in [0, 1], got {self.min_f}")

    @classmethod
    def from_env(cls, env: dict | None = None) -> ProposerConfig:
        """The configuration in ``$SSSD_VLLM_CONFIG`` (a JSON object, or the path of a JSON file)."""
        spec = (os.environ if env is None else env).get(ENV, "").strip()
        if not spec:
            return cls()
        if spec.startswith("{"):
            text, where = spec, f"${ENV}"
        else:
            path = Path(spec).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"${ENV} names {spec!r}, which is not a file")
            text, where = path.read_text(), str(path)
        data = json_object(text, where)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**data)


def make_drafter(cfg: ProposerConfig, vocab_size: int, tokenizer: Any = None) -> Drafter:
    """The drafter the proposer uses; opens (and checks) the datastore. Raises with the reason."""
    dcfg = dict(cfg.drafter)
    dcfg.setdefault("vocab_size", int(vocab_size))
    try:
        drafter_config = DrafterConfig(**dcfg)
    except TypeError as e:
        raise ValueError(f"{ENV}: bad 'drafter' options: {e}") from e
    if drafter_config.use_recycled:
        raise ValueError(
            f"{ENV}: 'use_recycled' needs the target model's top-k at every verified position, and vLLM "
            "hands a custom proposer token ids only (its logits stay in the rejection sampler); remove it"
        )
    ds = None
    if cfg.datastore:
        path = Path(cfg.datastore).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{ENV}: datastore {cfg.datastore!r} does not exist")
        ds = Datastore.open(path)
        if tokenizer is not None:
            ds.check_tokenizer(tokenizer)
        if ds.vocab_size > vocab_size:
            raise ValueError(f"datastore vocabulary {ds.vocab_size} is larger than the model's {vocab_size}")
    return Drafter(ds, drafter_config)


class ChainProposer:
    """The engine-neutral part: rows in, one chain per row out (see the module docstring)."""

    def __init__(self, drafter: Drafter, k: int, max_len: int, config: ProposerConfig | None = None):
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
        self.config = config or ProposerConfig()
        self.drafter, self.k, self.max_len = drafter, int(k), int(max_len)
        self.rows = RowTracker(drafter, max_absent=self.config.max_absent)
        self.cost = CostModel()
        self.steps = 0
        self.errors = 0
        self.proposed = 0  # draft tokens returned
        self.accepted = 0  # of those, accepted (seen in the next step's sampled tokens)
        self._pred = 0.0  # forgotten sums of predicted (Σf) and accepted tokens: the correction factor
        self._seen = 0.0
        self._last: dict | None = None  # what the previous call proposed, for feedback

    @property
    def correction(self) -> float:
        return 1.0 if self._pred < 8.0 else float(np.clip(self._seen / self._pred, 0.05, 2.0))

    def propose(self, sampled: list, num_tokens: np.ndarray, token_ids: np.ndarray) -> list[list[int]]:
        t0 = time.perf_counter()
        rows = len(sampled)
        out: list[list[int]] = [[] for _ in range(rows)]
        try:
            last = self._feedback(t0)
            active = [len(s) > 0 and int(num_tokens[i]) < self.max_len - 1 for i, s in enumerate(sampled)]
            upd = self.rows.update(token_ids, num_tokens, active)
            if last is not None:
                self.drafter.observe(*self._accepted(last, sampled, upd.rids))
            idx = [i for i in range(rows) if upd.rids[i] is not None]
            n_ctx = int(np.sum(num_tokens[:rows])) if rows else 0
            if idx:
                self._draft(idx, [upd.rids[i] for i in idx], num_tokens, rows, n_ctx, out)
            else:
                self._last = {"rows": rows, "n": 0, "ctx": n_ctx}
        except Exception as e:  # the drafter's state is a cache: drop it, rebuild from the rows next step
            self._fault(e)
            out = [[] for _ in range(rows)]
        self.steps += 1
        if self._last is not None:
            self._last["draft_s"] = time.perf_counter() - t0
            self._last["end"] = time.perf_counter()
        return out

    def _draft(self, idx, rids, num_tokens, rows, n_ctx, out) -> None:
        cfg = self.config
        batch = self.drafter.propose(rids, [cfg.tree_nodes] * len(rids))
        room = [max(0, self.max_len - 1 - int(num_tokens[i])) for i in idx]
        chains = best_chains(batch, self.k, cfg.min_f, caps=room)
        m = len(chains.gain) - 1
        if cfg.lengths == "full" or (cfg.explore_every and self.steps % cfg.explore_every == 0):
            n = m
        else:
            n = choose_budget(chains.gain, rows, n_ctx, self.cost, correction=self.correction).budget
        lengths = chains.lengths(n)
        drafts = chains.take(n)
        for j, i in enumerate(idx):
            out[i] = drafts[j]
        f_sum = [float(chains.f[j][: lengths[j]].sum()) for j in range(len(idx))]
        self.proposed += int(lengths.sum())
        self._last = {"rows": rows, "n": int(lengths.sum()), "ctx": n_ctx, "batch": batch, "rids": rids,
                      "lengths": lengths, "f": f_sum}  # fmt: skip

    def _feedback(self, now: float) -> dict | None:
        """The step's measured time to the cost model; returns the previous proposal when it drafted."""
        last, self._last = self._last, None
        if last is None or "end" not in last:
            return None
        rows = max(last["rows"], 1)
        self.cost.observe(StepRecord(
            rows, last["ctx"], rows + last["n"], last["n"], forward_s=max(now - last["end"], 0.0),
            draft_s=last["draft_s"],
        ))  # fmt: skip
        return last if "batch" in last else None

    def _accepted(self, last: dict, sampled: list, row_rids: list) -> tuple:
        """What the previous proposal's chains got accepted, read off this step's sampled tokens of the
        row each request is in now (rows move when others finish), into the acceptance correction.
        Returns the drafter's ``observe`` arguments: trees of requests in no active row are cut to
        their roots (nothing is known of them), the others' accepted chain prefixes as the mask."""
        row_of = {rid: i for i, rid in enumerate(row_rids) if rid is not None}
        rows = [row_of.get(rid) for rid in last["rids"]]
        accepted = [
            int(min(max(len(sampled[i]) - 1, 0), n)) if i is not None else 0
            for i, n in zip(rows, last["lengths"].tolist(), strict=True)
        ]
        self.accepted += sum(accepted)
        decay = 1.0 - 1.0 / 64.0
        self._pred = self._pred * decay + sum(last["f"])
        self._seen = self._seen * decay + sum(accepted)
        batch = last["batch"]
        known = np.asarray([i is not None for i in rows], bool)
        if not known.all():
            batch = take_nodes(batch, known[tree_index(batch.offsets)] | (batch.parents < 0))
        tokens = [sampled[i][:a] if a else [] for i, a in zip(rows, accepted, strict=True)]
        return last["rids"], batch, on_path_mask(batch, tokens=tokens)

    def _fault(self, e: Exception) -> None:
        self.errors += 1
        if self.errors == 1 or self.errors % 100 == 0:
            log.warning("sssd drafter failed (%d so far; drafting resumes from the rows): %r", self.errors, e)
        for rid in list(self.rows._all):
            try:
                self.drafter.remove_request(rid, add_to_pool=False)
            except Exception:
                pass
            self.rows.forget(rid)
        self._last = None


def _vllm_tokenizer(model_config: Any) -> Any:
    """The model's Hugging Face tokenizer (to check a datastore against), or None if it cannot load."""
    name = getattr(model_config, "tokenizer", None) or getattr(model_config, "model", None)
    if not name:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name, trust_remote_code=model_config.trust_remote_code)
    except Exception as e:  # a tokenizer that only vLLM can load: the vocabulary size check remains
        log.warning("could not load the tokenizer of %s to check the datastore against: %s", name, e)
        return None


class SssdProposer:
    """vLLM's custom proposer: ``speculative_config={"method": "custom_class", "model":
    "sssd.integrations.vllm.SssdProposer", "num_speculative_tokens": k}``."""

    def __init__(self, vllm_config: Any):
        spec = vllm_config.speculative_config
        model_config = vllm_config.model_config
        cfg = ProposerConfig.from_env()
        tokenizer = _vllm_tokenizer(model_config) if cfg.datastore else None
        drafter = make_drafter(cfg, model_config.get_vocab_size(), tokenizer)
        self.chains = ChainProposer(drafter, spec.num_speculative_tokens, model_config.max_model_len, cfg)
        log.info("sssd proposer: k=%d, datastore=%s, lengths=%s", spec.num_speculative_tokens,
                 cfg.datastore, cfg.lengths)  # fmt: skip

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM asks proposers to load their model: the drafter has none."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
        **kwargs: Any,
    ) -> list[list[int]]:
        return self.chains.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
