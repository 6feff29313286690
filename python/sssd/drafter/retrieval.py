"""The drafter: retrieval sources, calibrated fusion and budgeted draft trees for a whole batch.

Usage (the shared contract between drafter, engine and scheduler)::

    drafter = Drafter(datastore=ds_or_None, config=DrafterConfig())
    drafter.add_request(rid, prompt_ids)            # int32 1-D array (lists are converted)
    drafter.extend(rid, new_ids)                    # accepted + next token of the last step
    batch = drafter.propose(rids, budget=64)        # global int budget or one budget per request
    drafter.observe(rids, batch, on_path)           # online calibration (on_path: sssd.batch.on_path_mask)
    drafter.remove_request(rid)                     # its output joins the recent-outputs pool

All work happens in one native call per method (the GIL is released; requests run in parallel).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from sssd import _core
from sssd.batch import renumbered, tree_sums
from sssd.checks import check_bool, check_fields, check_int, check_real, int_array
from sssd.datastore.store import Datastore
from sssd.drafter.calibration import CalibrationTable, PathLike, default_table

UnknownRequestError = _core.UnknownRequestError  # a KeyError and a ValueError


RECYCLE_ROWS = ("all", "walked")


@dataclass(frozen=True)
class DrafterConfig:
    """Parameters of the drafter. Lengths are in tokens."""

    use_input: bool = True  # the request's own prompt + output
    use_datastore: bool = True  # the suffix-array datastore (ignored when there is none)
    use_pool: bool = True  # recent outputs of finished requests
    # the verifier's own top-k after each token, as the engine hands it over (``recycle``): candidates
    # for any node of the tree, calibrated by depth and rank (docs/drafter.md, "Recycled candidates")
    use_recycled: bool = False
    recycle_k: int = 8  # candidates kept per token (the engine computes this top-k), in [1, 32]
    recycle_from_every_node: bool = True  # False: below the root and recycled nodes only
    # the rows the engine hands over: "all" (every verified node: the output head runs on every draft
    # row) or "walked" (the root and the accepted nodes, whose logits verification computes anyway)
    recycle_rows: str = "all"
    # rows kept per (previous token, token) pair besides the per-token rows: slots of a direct-mapped
    # table (a power of two, 0: none); each costs 9 + 8 * recycle_k bytes, allocated with use_recycled
    recycle_pair_slots: int = 1 << 16
    # a node with a retrieval child continuing a match at least this long does not consult its row: its
    # children keep their retrieval p and it gets no candidates (a long match outranks the rows; 0: off;
    # 9 = the match length from which a node is never rescored itself, kRescoreMaxMatch)
    recycle_trust_match: int = 9
    # rows recorded before the request was added (the model's predictions in other texts) are calibrated
    # in groups of their own (match feature 17 whatever the rank): they are right far less often than the
    # rows of the request's own text, which a shared group averaged over (the shipped table is fitted
    # with this on)
    recycle_split_stale: bool = True
    max_depth: int = 16  # deepest draft node (also the continuation length read per occurrence)
    max_width: int = 0  # most nodes at one depth of a tree (0: no limit)
    max_tree_nodes: int = 127  # most non-root nodes of one tree (127: trees fit 128-bit ancestor masks)
    index_max_n: int = 4  # n-gram lengths indexed (input source and pool)
    input_max_match: int = 32  # true match lengths are measured up to this
    input_min_n: int = 1
    input_min_occurrences: int = 4  # take shorter suffixes while fewer occurrences were found
    input_max_samples: int = 16
    input_max_chain: int = 64
    pool_max_match: int = 32
    pool_min_n: int = 1
    pool_min_occurrences: int = 4
    pool_max_samples: int = 16
    pool_max_chain: int = 64
    pool_max_tokens: int = 1 << 20  # recent-outputs pool budget (LRU eviction)
    add_finished_to_pool: bool = True  # remove_request adds the request's output to the pool
    ds_max_query_len: int = 16
    ds_min_query_len: int = 1
    ds_min_occurrences: int = 4
    ds_max_samples: int = 64
    ds_max_depth: int = 8  # continuation tokens per datastore occurrence (0: max_depth)
    alpha: float = 1.0  # raw = count / (parent count + alpha)
    noisy_or: bool = False  # fuse sources by noisy-or instead of max
    min_f: float = 1e-4  # candidates with a smaller f are dropped while fusing (saves time)
    # "default" (shipped table), None (uncalibrated raw scores), a path to a JSON table, or a table.
    calibration: str | CalibrationTable | None = "default"
    online_calibration: bool = True  # observe() updates the table
    calibration_max_prior_weight: float = 200.0  # caps the table's weights so online data can move it
    step_time: float = 0.02  # seconds; estimated step time L for SLO-aware allocation
    slo_slack: float = 0.0  # seconds; slack epsilon for SLO-aware allocation
    vocab_size: int = 0  # token ids must be below this: the model's vocabulary (0: unchecked)
    # Threads of propose's parallel region over the batch's requests: 0 = OpenMP's default (the
    # OMP_NUM_THREADS of the process, else one per core); 1 = none started, so no idle thread waits
    # (spins) next to the model's own threads between steps. See docs/drafter.md, "Threads".
    threads: int = 0

    def __post_init__(self) -> None:
        check_fields(self)  # a bool or float is not an int, NaN is not a number
        if not 1 <= self.max_depth <= 64:
            raise ValueError(f"max_depth must be in [1, 64], got {self.max_depth}")
        if self.max_width < 0 or self.max_tree_nodes < 0 or self.pool_max_tokens < 0 or self.vocab_size < 0:
            raise ValueError("max_width, max_tree_nodes, pool_max_tokens and vocab_size must be >= 0")
        if not 1 <= self.recycle_k <= 32:
            raise ValueError(f"recycle_k must be in [1, 32], got {self.recycle_k}")
        if self.recycle_rows not in RECYCLE_ROWS:
            raise ValueError(f"recycle_rows must be one of {RECYCLE_ROWS}, got {self.recycle_rows!r}")
        slots = self.recycle_pair_slots
        if not 0 <= slots <= 1 << 24 or slots & (slots - 1):
            raise ValueError(f"recycle_pair_slots must be 0 or a power of two <= 2^24, got {slots}")
        if not 0 <= self.recycle_trust_match <= 1 << 30:
            raise ValueError(f"recycle_trust_match must be in [0, 2^30], got {self.recycle_trust_match}")
        if not 0 <= self.threads <= 1024:
            raise ValueError(f"threads must be in [0, 1024] (0: OpenMP's default), got {self.threads}")
        if not (self.step_time > 0 and self.slo_slack >= 0):
            raise ValueError("step_time must be > 0 and slo_slack >= 0")

    def native(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in (
            "calibration",
            "add_finished_to_pool",
            "step_time",
            "slo_slack",
            "calibration_max_prior_weight",
            "online_calibration",
            "recycle_rows",
        ):
            d.pop(k)
        d["calibrated"] = self.calibration is not None
        d["online"] = self.online_calibration
        return d


@dataclass(frozen=True, eq=False)
class DraftBatch:
    """Draft trees of a batch, flat. N nodes (one root per request included), B trees, M non-root nodes.

    Tree i is ``slice(offsets[i], offsets[i+1])``; its node 0 is the root (the request's last context
    token). Within a tree, nodes are in selection order, so parents come first and the nodes with
    ``rank < k`` form a prefix of every tree.
    """

    tokens: np.ndarray  # [N] int32
    parents: np.ndarray  # [N] int32: -1 for roots, else the parent's index within the same tree
    probs: np.ndarray  # [N] float32 calibrated p(node | parent); 1 for roots
    depth: np.ndarray  # [N] int32, roots 0
    offsets: np.ndarray  # [B + 1] int64
    rank: np.ndarray  # [N] int32 position in the batch-wide selection order; -1 for roots
    gain: np.ndarray  # [M + 1] float64: gain[k] = sum of f over nodes with rank < k
    acc_prob: np.ndarray  # [N] float32 f(v) = product of probs from the root
    source: np.ndarray  # [N] int8 winning source (0 input, 1 datastore, 2 pool, 3 recycled); -1 for roots
    source_mask: np.ndarray  # [N] uint8 bit s set: source s proposed the node
    match_len: np.ndarray  # [N] int32 match length of the winning source's suffix match (recycled: 1 + rank)
    raw_score: np.ndarray  # [N] float32 the winning source's raw estimate (recycled: the model's probability)
    context_len: np.ndarray  # [B] int64 context length of each request at propose time
    request_ids: np.ndarray  # [B] int64

    _PER_NODE = (
        "tokens",
        "parents",
        "probs",
        "depth",
        "rank",
        "acc_prob",
        "source",
        "source_mask",
        "match_len",
        "raw_score",
    )

    @classmethod
    def _from_arrays(cls, request_ids: np.ndarray, arrays: dict[str, np.ndarray]) -> DraftBatch:
        # The native arrays are exactly the fields: no dataclass __init__ (and its checks) on the hot path.
        obj = object.__new__(cls)
        obj.__dict__.update(arrays)
        obj.__dict__["request_ids"] = request_ids
        return obj

    @property
    def num_trees(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_draft_nodes(self) -> int:
        """M: non-root nodes."""
        return self.num_nodes - self.num_trees

    def tree_sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def expected_accepted(self) -> np.ndarray:
        """[B] sum of f over each tree's draft nodes (expected accepted tokens)."""
        return tree_sums(np.where(self.parents >= 0, self.acc_prob.astype(np.float64), 0.0), self.offsets)

    def truncate(self, k: int) -> DraftBatch:
        """Roots plus the nodes with rank < k (the selection for global budget k)."""
        k = int(k)
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        keep = (self.rank < k) & (self.rank >= 0) | (self.parents < 0)
        counts = (
            np.add.reduceat(keep.astype(np.int64), self.offsets[:-1])
            if self.num_trees
            else np.zeros(0, np.int64)
        )
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        kw: dict[str, Any] = {name: getattr(self, name)[keep] for name in self._PER_NODE}
        return DraftBatch(
            offsets=offsets,
            gain=self.gain[: min(k, self.gain.shape[0] - 1) + 1].copy(),
            context_len=self.context_len,
            request_ids=self.request_ids,
            **kw,
        )

    def take(self, keep: np.ndarray) -> DraftBatch:
        """The nodes ``keep`` (bool ``[N]``, roots included, closed under parents), e.g. the part of the
        batch the engine verified: parents renumbered within each tree, ranks renumbered in their order
        and ``gain`` summed again over the kept ranks."""
        keep = np.asarray(keep, bool)
        offsets, parents = renumbered(self.offsets, self.parents, keep)
        return DraftBatch(**self._taken(keep, offsets, parents))

    def _taken(self, keep: np.ndarray, offsets: np.ndarray, parents: np.ndarray) -> dict[str, Any]:
        kw: dict[str, Any] = {name: getattr(self, name)[keep] for name in self._PER_NODE}
        rank = kw["rank"]
        drafted = rank >= 0
        by_rank = np.sort(rank[drafted])
        new_rank = np.full(len(rank), -1, rank.dtype)
        new_rank[drafted] = np.searchsorted(by_rank, rank[drafted])
        f_of_rank = np.diff(self.gain)  # [M] f of the node of each rank
        gain = np.zeros(len(by_rank) + 1)
        np.cumsum(f_of_rank[by_rank], out=gain[1:])
        kw.update(offsets=offsets, parents=parents, rank=new_rank, gain=gain)
        return {**kw, "context_len": self.context_len, "request_ids": self.request_ids}


def _tokens(x: Any, what: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        if x.dtype != np.int32:
            raise TypeError(f"{what} must have dtype int32, got {x.dtype}")
        return np.ascontiguousarray(x)
    arr = np.asarray(x)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{what} must be a 1-D sequence of integer token ids")
    if arr.min() < 0 or arr.max() > np.iinfo(np.int32).max:
        raise ValueError(f"{what} holds token ids outside [0, 2^31)")
    return arr.astype(np.int32)


def is_scalar_budget(budget: Any) -> bool:
    """A global budget (one number) rather than one per request; a bool or float is checked as one."""
    return isinstance(budget, (int, float, np.number, np.bool_))


def _request_ids(rids: Any) -> np.ndarray:
    """[B] int64 request ids from a sequence or an array of ints (floats and bools are a TypeError)."""
    if type(rids) is np.ndarray and rids.dtype == np.int64 and rids.ndim == 1:
        return rids  # the engine's own arrays: nothing to convert or check
    if isinstance(rids, (str, bytes)) or is_scalar_budget(rids):
        raise TypeError(f"rids must be a sequence of ints, got {type(rids).__name__}")
    return int_array(rids if isinstance(rids, np.ndarray) else list(rids), "rids")


def _calibration(spec: Any) -> CalibrationTable | None:
    if spec is None or isinstance(spec, CalibrationTable):
        return spec
    if spec == "default":
        return default_table()
    if spec == "identity":
        return CalibrationTable.identity()
    return CalibrationTable.load(spec)


class Drafter:
    """Drafts token trees for a batch of requests (see the module docstring)."""

    def __init__(self, datastore: Datastore | None = None, config: DrafterConfig | None = None):
        self.config = config or DrafterConfig()
        if datastore is not None and not isinstance(datastore, Datastore):
            raise TypeError(f"datastore must be a sssd.Datastore or None, got {type(datastore).__name__}")
        self.datastore = datastore  # keeps the memory maps alive
        shards = list(datastore.shards) if datastore is not None else []
        cfg = self.config
        # A datastore with a smaller vocabulary than cfg.vocab_size (the model's) is fine: tokens past it
        # never match there, the request's own tokens and the pool still draft them.
        self._native = _core.Drafter(shards, cfg.native())
        table = _calibration(cfg.calibration)
        if table is not None:
            self._native.set_calibration(table.native(cfg.calibration_max_prior_weight))

    # ---- requests ----
    # Request ids are ints (a bool or a float is a TypeError: 1.7 is not request 1).
    def add_request(self, rid: int, prompt_ids: Any) -> None:
        """Start a request. ValueError for an empty prompt, a duplicate id or ids outside the vocabulary."""
        self._native.add_request(check_int(rid, "rid"), _tokens(prompt_ids, "prompt_ids"))

    def extend(self, rid: int, new_ids: Any) -> None:
        """Append the tokens committed by the last step (accepted + the next token). UnknownRequestError if
        unknown."""
        self._native.extend(check_int(rid, "rid"), _tokens(new_ids, "new_ids"))

    def remove_request(self, rid: int, *, add_to_pool: bool | None = None) -> None:
        """Forget a request; by default its output (context past the prompt) joins the recent-outputs pool."""
        pool = add_to_pool if add_to_pool is not None else self.config.add_finished_to_pool
        pool = check_bool(pool, "add_to_pool")
        self._native.remove_request(check_int(rid, "rid"), bool(pool))

    def add_to_pool(self, tokens: Any) -> None:
        """Add one document to the recent-outputs pool explicitly."""
        self._native.add_to_pool(_tokens(tokens, "tokens"))

    def has_request(self, rid: int) -> bool:
        return bool(self._native.has_request(check_int(rid, "rid")))

    def __len__(self) -> int:
        return int(self._native.num_requests())

    def context_length(self, rid: int) -> int:
        return int(self._native.context_length(check_int(rid, "rid")))

    @property
    def pool_tokens(self) -> int:
        return int(self._native.pool_tokens())

    # ---- recycled candidates ----
    @property
    def recycle_k(self) -> int:
        """The top-k the engine should hand to ``recycle`` after each verification (0: none wanted)."""
        return self.config.recycle_k if self.config.use_recycled else 0

    @property
    def recycle_rows(self) -> str:
        """Which verified rows the engine hands to ``recycle``: "walked" or "all" (``DrafterConfig``)."""
        return self.config.recycle_rows

    def recycle(
        self,
        tokens: np.ndarray,
        top_ids: np.ndarray,
        top_probs: np.ndarray,
        prev: np.ndarray | None = None,
    ) -> None:
        """The model's top-k after reading each of ``tokens`` ([n] int32; ``top_ids`` [n, k] int32 and
        ``top_probs`` [n, k] float32 in [0, 1], best first) become their recycled candidates (a later row
        of the same token wins). ``prev`` ([n] int32, -1: unknown): the token read before each, for the
        rows kept per (previous token, token) pair. A no-op unless ``use_recycled``."""
        self._native.recycle(tokens, top_ids, top_probs, prev)

    @property
    def recycled_rows(self) -> int:
        """Tokens with recycled candidates."""
        return int(self._native.recycled_rows())

    # ---- drafting ----
    def propose(
        self,
        rids: Sequence[int],
        budget: int | Sequence[int] = 64,
        slo: float | Sequence[float | None] | None = None,
        *,
        step_time: float | None = None,
        slack: float | None = None,
    ) -> DraftBatch:
        """Draft trees for ``rids`` under ``budget`` (global int, or one cap per request).

        ``slo``: TPOT targets in seconds per token (one for all, or per request; None / NaN = none). With
        targets, nodes first go to requests whose expected tokens per step x target fall short of
        ``step_time + slack`` (defaults from the config), then to maximize the expected accepted tokens.
        """
        ids = _request_ids(rids)
        b = ids.shape[0]
        per_request = not is_scalar_budget(budget)
        if per_request:
            if isinstance(budget, (str, bytes)) or not isinstance(budget, (Sequence, np.ndarray)):
                raise TypeError(f"budget must be an int or a sequence of ints, got {type(budget).__name__}")
            budgets = int_array(budget, "budgets", lo=0)
            if budgets.shape[0] != b:
                raise ValueError(f"got {budgets.shape[0]} per-request budgets for {b} requests")
        else:
            budgets = np.asarray([check_int(budget, "budget", lo=0)], dtype=np.int64)
        tpot = self._slo(slo, b)
        st = self.config.step_time if step_time is None else check_real(step_time, "step_time")
        sl = self.config.slo_slack if slack is None else check_real(slack, "slack")
        if not (st > 0 and sl >= 0):
            raise ValueError("step_time must be > 0 and slack >= 0")
        out = self._native.propose(ids, budgets, per_request, tpot, st, sl)
        return DraftBatch._from_arrays(ids, out)

    @staticmethod
    def _slo(slo: Any, b: int) -> np.ndarray | None:
        if slo is None:
            return None
        if isinstance(slo, (int, float, np.number, np.bool_)):
            vals = [check_real(slo, "slo", finite=False)] * b
        else:
            vals = [math.nan if x is None else check_real(x, "slo", finite=False) for x in slo]
            if len(vals) != b:
                raise ValueError(f"got {len(vals)} SLO targets for {b} requests")
        arr = np.asarray(vals, dtype=np.float64)
        if np.any(arr <= 0) or np.any(np.isinf(arr)):
            raise ValueError("SLO targets (seconds per token) must be > 0 and finite (None for no target)")
        return arr

    def observe(self, rids: Sequence[int], batch: DraftBatch, on_path: np.ndarray) -> int:
        """Feed back verification: ``on_path`` (bool ``[N]`` over the batch's nodes) marks each tree's
        accepted path, root included (``sssd.batch.on_path_mask`` builds it from node indices or tokens).

        ``batch``: the proposed batch or a part of it (``take``): each node in it whose parent is on the
        path counts as a trial, accepted when it is on the path itself, so the engine passes back only
        the nodes it verified. Independent of ``extend`` (call it before or after); trees of requests
        removed since are recorded too. Returns the number of trees recorded (0 with online calibration
        off). TypeError for a mask that is not a numpy bool array, ValueError for a wrong length or a
        mask that is not one path from each root.
        """
        ids = _request_ids(rids)
        if ids.shape != batch.request_ids.shape or np.any(ids != batch.request_ids):
            raise ValueError("rids must be the request ids the batch was proposed for, in order")
        if not isinstance(on_path, np.ndarray) or on_path.dtype != np.bool_:
            what = on_path.dtype if isinstance(on_path, np.ndarray) else type(on_path).__name__
            raise TypeError(f"on_path must be a numpy bool array (sssd.batch.on_path_mask), got {what}")
        if on_path.shape != (batch.num_nodes,):
            raise ValueError(
                f"on_path has shape {on_path.shape}, expected ({batch.num_nodes},): one per node"
            )
        arrays = {
            k: getattr(batch, k) for k in ("offsets", "parents", "source", "depth", "match_len", "raw_score")
        }
        return int(self._native.observe(arrays, np.ascontiguousarray(on_path)))

    @property
    def calibration(self) -> CalibrationTable:
        """The current table (including online updates)."""
        return CalibrationTable.from_native(self._native.calibration())

    def set_calibration(self, table: CalibrationTable) -> None:
        self._native.set_calibration(table.native(self.config.calibration_max_prior_weight))


def load_calibration(path: PathLike) -> CalibrationTable:
    return CalibrationTable.load(path)
