"""One draft chain per request, chosen from the fused tree and ranked batch-wide (sssd.integrations), and
the vLLM proposer's engine-neutral part driven by a simulated serving loop (vLLM itself is tested in
tests/integrations/test_vllm_proposer.py, in its own virtual environment)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import sssd
from sssd.integrations.chains import best_chains
from sssd.integrations.vllm import ChainProposer, ProposerConfig, make_drafter


def _batch(trees):
    """trees: list of (tokens, parents, acc_prob) per request -> a DraftBatch-like object."""
    tokens = np.concatenate([np.asarray(t, np.int32) for t, _, _ in trees])
    parents = np.concatenate([np.asarray(p, np.int32) for _, p, _ in trees])
    f = np.concatenate([np.asarray(a, np.float32) for _, _, a in trees])
    offsets = np.cumsum([0] + [len(t) for t, _, _ in trees]).astype(np.int64)
    return SimpleNamespace(tokens=tokens, parents=parents, acc_prob=f, offsets=offsets)


def test_best_chain_follows_the_most_probable_child():
    b = _batch([
        # root 9 -> {1 (0.6) -> 3 (0.5), 2 (0.3) -> 4 (0.29)}; 3 -> 5 (0.1)
        ([9, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 2, 3], [1, 0.6, 0.3, 0.5, 0.29, 0.1]),
        ([7], [-1], [1]),  # nothing drafted
        ([8, 6], [-1, 0], [1, 0.9]),
    ])  # fmt: skip
    c = best_chains(b, k=8)
    assert [t.tolist() for t in c.tokens] == [[1, 3, 5], [], [6]]
    # ranking by f: 0.9 (req 2), 0.6, 0.5, 0.1 (req 0)
    assert c.order.tolist() == [2, 0, 0, 0]
    np.testing.assert_allclose(c.gain, [0, 0.9, 1.5, 2.0, 2.1], rtol=1e-6)
    assert c.take(2) == [[1], [], [6]]
    assert c.lengths(3).tolist() == [2, 0, 1]
    assert [t.tolist() for t in best_chains(b, k=2).tokens] == [[1, 3], [], [6]]
    assert [t.tolist() for t in best_chains(b, k=8, min_f=0.55).tokens] == [[1], [], [6]]
    assert [t.tolist() for t in best_chains(b, k=8, caps=[1, 5, 0]).tokens] == [[1], [], []]
    with pytest.raises(ValueError):
        best_chains(b, k=-1)


def test_ranking_prefixes_are_chain_prefixes_on_real_drafts():
    rng = np.random.default_rng(0)
    d = sssd.Drafter()
    base = rng.integers(0, 40, size=30)
    for rid in range(6):  # repetitive contexts so the trees are deep and branchy
        d.add_request(rid, np.tile(np.roll(base, rid), 6).astype(np.int32))
    batch = d.propose(list(range(6)), [32] * 6)
    c = best_chains(batch, k=10)
    assert max(len(t) for t in c.tokens) > 3
    for n in range(len(c.gain)):
        lengths = c.lengths(n)
        expect = sum(float(f[:m].sum()) for f, m in zip(c.f, lengths, strict=True))
        assert c.gain[n] == pytest.approx(expect)
    assert np.all(np.diff(c.gain) >= -1e-12) and np.all(np.diff(np.diff(c.gain)) <= 1e-9)


class Serving:
    """A serving loop in vLLM's shape: rows with committed tokens, each request's true continuation
    (what the target would say), chains verified against it (accepted prefix + one token of the target)."""

    def __init__(self, proposer: ChainProposer, rows: int = 8, max_len: int = 600):
        self.p = proposer
        self.token_ids = np.zeros((rows, max_len), np.int32)
        self.num = np.zeros(rows, np.int32)
        self.truth: list[list[int]] = []  # per row: the whole sequence the request will produce
        self.sampled: list[list[int]] = []
        self.steps = self.tokens = self.row_steps = 0

    def add(self, prompt_len: int, seq: list[int]) -> None:
        i = len(self.truth)
        self.truth.append(seq)
        self.token_ids[i, :prompt_len] = seq[:prompt_len]
        self.num[i] = prompt_len
        self.sampled.append([])  # prefill step: nothing sampled yet for drafting

    def step(self) -> None:
        drafts = self.p.propose(self.sampled, self.num, self.token_ids)
        assert len(drafts) == len(self.truth)
        for i, seq in enumerate(self.truth):
            n = int(self.num[i])
            d = drafts[i]
            assert len(d) <= self.p.k and n + len(d) < self.token_ids.shape[1]
            acc = 0
            while acc < len(d) and n + acc < len(seq) and d[acc] == seq[n + acc]:
                acc += 1
            new = seq[n : n + acc + 1]
            self.token_ids[i, n : n + len(new)] = new
            self.num[i] = n + len(new)
            self.sampled[i] = new
            self.tokens += len(new)
        self.steps += 1
        self.row_steps += len(self.truth)
        done = [i for i, s in enumerate(self.truth) if self.num[i] >= len(s)]
        for i in reversed(done):  # finished: the last row moves into the hole
            last = len(self.truth) - 1
            self.truth[i], self.sampled[i] = self.truth[last], self.sampled[last]
            self.token_ids[i], self.num[i] = self.token_ids[last], self.num[last]
            self.truth.pop()
            self.sampled.pop()


def _sequences(rng, count, length=300):
    motifs = [rng.integers(2, 90, size=int(rng.integers(8, 20))).tolist() for _ in range(5)]
    seqs = []
    for _ in range(count):
        s = []
        while len(s) < length:
            s += motifs[int(rng.integers(5))] if rng.random() < 0.8 else rng.integers(2, 90, size=3).tolist()
        seqs.append(s[:length])
    return seqs


@pytest.mark.parametrize("lengths", ["full", "adaptive"])
def test_proposer_drafts_accepted_chains_in_a_serving_loop(lengths):
    rng = np.random.default_rng(1)
    cfg = ProposerConfig(lengths=lengths)
    p = ChainProposer(make_drafter(cfg, vocab_size=100), k=6, max_len=600, config=cfg)
    loop = Serving(p)
    seqs = _sequences(rng, 12)
    while seqs or loop.truth:
        while seqs and len(loop.truth) < 8:
            loop.add(40, seqs.pop())
        loop.step()
    assert loop.tokens == 12 * 260
    mal = loop.tokens / loop.row_steps  # tokens per request per step
    assert p.proposed > 0 and p.accepted > 0 and p.accepted <= p.proposed
    assert mal > 1.5  # repetitive text: chains are accepted
    assert p.errors == 0
    assert len(p.rows) <= 8 + p.config.max_absent * 8


class FlakyDrafter:
    """A drafter whose propose fails now and then."""

    def __init__(self, inner, fail_every):
        self.inner, self.fail_every, self.calls = inner, fail_every, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, *a, **kw):
        self.calls += 1
        if self.calls % self.fail_every == 0:
            raise RuntimeError("injected drafter fault")
        return self.inner.propose(*a, **kw)


def test_a_failing_drafter_costs_drafts_not_requests():
    rng = np.random.default_rng(2)
    cfg = ProposerConfig(lengths="full")
    p = ChainProposer(FlakyDrafter(make_drafter(cfg, vocab_size=100), 7), k=5, max_len=600, config=cfg)
    loop = Serving(p)
    for s in _sequences(rng, 6):
        loop.add(30, s)
    while loop.truth:
        loop.step()
    assert loop.tokens == 6 * 270
    assert p.errors > 3 and p.accepted > 0  # it failed, recovered from the rows and drafted again


def test_config_from_environment(tmp_path):
    assert ProposerConfig.from_env({}) == ProposerConfig()
    c = ProposerConfig.from_env({"SSSD_VLLM_CONFIG": '{"tree_nodes": 8, "drafter": {"max_depth": 6}}'})
    assert c.tree_nodes == 8 and c.drafter == {"max_depth": 6}
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"lengths": "full"}))
    assert ProposerConfig.from_env({"SSSD_VLLM_CONFIG": str(f)}).lengths == "full"
    with pytest.raises(FileNotFoundError, match="not a file"):
        ProposerConfig.from_env({"SSSD_VLLM_CONFIG": str(tmp_path / "missing.json")})
    with pytest.raises(ValueError, match="not valid JSON"):
        ProposerConfig.from_env({"SSSD_VLLM_CONFIG": "{oops"})
    with pytest.raises(ValueError, match="unknown keys"):
        ProposerConfig.from_env({"SSSD_VLLM_CONFIG": '{"datastor": "x"}'})
    with pytest.raises(ValueError, match="lengths"):
        ProposerConfig(lengths="some")


def test_bad_datastore_and_drafter_options_fail_at_start(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_drafter(ProposerConfig(datastore=str(tmp_path / "nope.sssd")), vocab_size=100)
    bad = tmp_path / "bad.sssd"
    bad.write_bytes(b"not a datastore")
    with pytest.raises(sssd.DatastoreError):
        make_drafter(ProposerConfig(datastore=str(bad)), vocab_size=100)
    with pytest.raises(ValueError, match="drafter"):
        make_drafter(ProposerConfig(drafter={"max_dept": 3}), vocab_size=100)
    with pytest.raises(ValueError, match="token ids only"):  # no top-k reaches a vLLM proposer
        make_drafter(ProposerConfig(drafter={"use_recycled": True}), vocab_size=100)
    with pytest.raises(ValueError):
        ChainProposer(make_drafter(ProposerConfig(), 100), k=0, max_len=100)
