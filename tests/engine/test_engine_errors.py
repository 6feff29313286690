"""Every bad input of the engine raises a clear exception of the right type."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
import sssd
import torch
import transformers
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.sampling import SamplingParams
from tiny_models import VOCAB, TinyTokenizer, hf_greedy, tiny_model
from torch import nn
from toy_drafters import ToyBatch, ToyDrafter, TreeBuilder, pack

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_model("llama"), TinyTokenizer(), config=EngineConfig(budget=0))


@pytest.mark.parametrize("prompt", ["", [], np.zeros(0, np.int64)])
def test_empty_prompt(engine, prompt):
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request(prompt, max_new_tokens=3)


def test_no_prompts(engine):
    with pytest.raises(ValueError, match="no prompts"):
        engine.generate([], max_new_tokens=3)


def test_prompt_longer_than_context(engine):
    with pytest.raises(ValueError, match="does not fit the model's context of 256"):
        engine.add_request(list(range(2, 90)) * 3, max_new_tokens=3)


@pytest.mark.parametrize("prompt", [[5, VOCAB], [-1, 3], [[1, 2]], [1.5, 2.0]])
def test_prompt_token_ids_out_of_range_or_wrong_shape(engine, prompt):
    with pytest.raises((ValueError, TypeError)):
        engine.add_request(prompt)


def test_text_prompt_needs_a_tokenizer():
    e = Engine(tiny_model("llama"), config=EngineConfig(budget=0))
    with pytest.raises(ValueError, match="need a tokenizer"):
        e.add_request("w1 w2")
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        e.add_request([3, 4], stop=["x"])


@pytest.mark.parametrize(
    "kw",
    [
        dict(max_new_tokens=0),
        dict(max_new_tokens=-3),
        dict(temperature=-0.5),
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-1),
        dict(stop=[""]),
        dict(eos_token_ids=[-2]),
    ],
)
def test_invalid_sampling_parameters(engine, kw):
    with pytest.raises(ValueError):
        engine.generate([3, 4], **kw)
    with pytest.raises(ValueError):
        SamplingParams(**kw)


@pytest.mark.parametrize("kw", [dict(max_new_tokens=2.5), dict(seed="x")])
def test_wrongly_typed_sampling_parameters(kw):
    with pytest.raises(TypeError):
        SamplingParams(**kw)


@pytest.mark.parametrize(
    "kw,name",
    [
        (dict(stop=123), "stop"),  # seen: TypeError: 'int' object is not iterable
        (dict(stop=[1]), "stop"),
        (dict(stop=b"x"), "stop"),
        (dict(eos_token_ids=2.0), "eos_token_ids"),  # seen: TypeError: 'float' object is not iterable
        (dict(eos_token_ids=[2, "3"]), "eos_token_ids"),
        (dict(temperature="0.7"), "temperature"),
        (dict(top_k=4.0), "top_k"),
        (dict(top_p="1"), "top_p"),
        (dict(max_new_tokens=True), "max_new_tokens"),
        (dict(max_tokens=3), "max_tokens"),  # not a field: its name, and the fields there are
    ],
)
def test_a_wrongly_typed_sampling_parameter_is_named(engine, kw, name):
    with pytest.raises(TypeError, match=name):
        engine.add_request([3, 4], **kw)
    if name != "max_tokens":
        with pytest.raises(TypeError, match=name):
            SamplingParams(**kw)


def test_numpy_scalars_are_accepted_alike():
    """Seen: temperature=np.float32(0.7) refused ("must be a finite number >= 0, got np.float32(0.7)")
    while top_k=np.int32(4) was accepted."""
    p = SamplingParams(max_new_tokens=np.int64(5), temperature=np.float32(0.7), top_k=np.int32(4),
                       top_p=np.float64(0.9), seed=np.uint8(3), eos_token_ids=np.int64(2))  # fmt: skip
    plain = SamplingParams(max_new_tokens=5, temperature=float(np.float32(0.7)), top_k=4, top_p=0.9, seed=3,
                           eos_token_ids=2)  # fmt: skip
    assert p == plain and type(p.temperature) is float and type(p.top_k) is int
    assert SamplingParams(eos_token_ids=np.array([1, 2])).eos_token_ids == (1, 2)
    assert SamplingParams(stop=np.array(["ab", "c"])).stop == ("ab", "c")
    engine = Engine(tiny_model("llama"), config=EngineConfig(budget=0))
    got = engine.generate([3, 4], p, budget=np.int32(2))
    want = engine.generate([3, 4], plain, budget=2)
    assert got[0].tokens == want[0].tokens


@pytest.mark.parametrize(
    "kw", [dict(budget=-1), dict(max_batch_size=0), dict(prefill_chunk=0), dict(initial_cache_rows=0)]
)
def test_invalid_engine_config(kw):
    with pytest.raises(ValueError):
        EngineConfig(**kw)
    with pytest.raises(TypeError):
        EngineConfig(policy=object())


def test_negative_request_budget(engine):
    with pytest.raises(ValueError, match="budget"):
        engine.add_request([3, 4], budget=-2)


class OpaqueConfig(transformers.PretrainedConfig):
    model_type = "opaque-test"


class OpaqueSelfAttention(nn.Module):  # does not dispatch through transformers' attention registry
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(x)


class OpaqueLM(transformers.PreTrainedModel):
    config_class = OpaqueConfig

    def __init__(self, config):
        super().__init__(config)
        self.attn = OpaqueSelfAttention()

    def forward(self, input_ids=None, **kw):
        raise AssertionError("never reached")


def test_model_whose_attention_cannot_be_replaced():
    cfg = OpaqueConfig(num_hidden_layers=1, num_attention_heads=1, hidden_size=8, vocab_size=10)
    with pytest.raises(ValueError, match="OpaqueLM"):
        Engine(OpaqueLM(cfg))
    with pytest.raises(ValueError, match="Linear"):
        Engine(nn.Linear(2, 2))


def test_tokenizer_datastore_fingerprint_mismatch(tmp_path):
    docs = [np.arange(2, 40, dtype=np.int32), np.arange(5, 30, dtype=np.int32)]
    path = tmp_path / "ds.sssd"
    sssd.build_datastore(docs, path, vocab_size=VOCAB, tokenizer=TinyTokenizer("a"))
    drafter = sssd.Drafter(datastore=sssd.Datastore.open(path))
    with pytest.raises(sssd.TokenizerMismatchError):
        Engine(tiny_model("llama"), TinyTokenizer("b"), drafter=drafter)
    Engine(tiny_model("llama"), TinyTokenizer("a"), drafter=drafter)  # the right tokenizer is fine


def _datastore(path, tokenizer=None, vocab=VOCAB):
    docs = [np.arange(2, 40, dtype=np.int32), np.arange(5, 30, dtype=np.int32)]
    sssd.build_datastore(docs, path, vocab_size=vocab, tokenizer=tokenizer)
    return sssd.Datastore.open(path)


def test_every_source_of_a_merged_drafter_is_checked(tmp_path):
    """Seen: only the first source's datastore was checked; a second one built with another tokenizer
    was accepted silently (its drafts useless)."""
    good = _datastore(tmp_path / "a.sssd", TinyTokenizer("a"))
    other = _datastore(tmp_path / "b.sssd", TinyTokenizer("b"))
    merged = sssd.MergedDrafter([sssd.Drafter(datastore=good), sssd.Drafter(datastore=other)])
    with pytest.raises(sssd.TokenizerMismatchError, match=r"b\.sssd"):
        Engine(tiny_model("llama"), TinyTokenizer("a"), drafter=merged)
    assert merged.datastores == [good, other] and merged.datastore is good
    big = _datastore(tmp_path / "big.sssd", vocab=VOCAB + 50)
    merged = sssd.MergedDrafter([sssd.Drafter(datastore=good), sssd.Drafter(datastore=big)])
    with pytest.raises(sssd.TokenizerMismatchError, match=r"big\.sssd .* is larger than the model's"):
        Engine(tiny_model("llama"), drafter=merged)  # no tokenizer: the vocabulary is still checked
    same = _datastore(tmp_path / "c.sssd", TinyTokenizer("a"))
    merged = sssd.MergedDrafter([sssd.Drafter(datastore=good), sssd.Drafter(datastore=same)])
    Engine(tiny_model("llama"), TinyTokenizer("a"), drafter=merged)


def test_a_datastore_recording_no_tokenizer_is_used_with_one_warning_as_by_the_cli(tmp_path):
    """Seen: ``Engine(tokenizer=...)`` refused a datastore that records no tokenizer, which docs/cli.md
    says ``sssd generate`` uses with a warning. Now both apply sssd.datastore.compat's rule."""
    ds = _datastore(tmp_path / "ids.sssd")
    with pytest.warns(UserWarning, match="ids.sssd records no tokenizer; using it") as caught:
        engine = Engine(tiny_model("llama"), TinyTokenizer(), drafter=sssd.Drafter(datastore=ds))
    assert len(caught) == 1
    (res,) = engine.generate([3, 4, 5], max_new_tokens=4, eos_token_ids=())
    assert res.tokens == hf_greedy(tiny_model("llama"), [3, 4, 5], 4)
    big = _datastore(tmp_path / "big.sssd", vocab=VOCAB + 50)
    with pytest.raises(sssd.TokenizerMismatchError, match="records no tokenizer and its vocabulary"):
        Engine(tiny_model("llama"), TinyTokenizer(), drafter=sssd.Drafter(datastore=big))


class BadDrafter(ToyDrafter):
    """Returns a good chain tree, then lets a test break one field."""

    def __init__(self, breaker):
        super().__init__(VOCAB)
        self.breaker = breaker

    def tree(self, rid, budget):
        t = TreeBuilder(self.ctx[rid][-1])
        a = t.add(0, 5)
        t.add(a, 6)
        t.add(0, 7)
        return t

    def propose(self, rids, budget=64, slo=None):
        return self.breaker(super().propose(rids, budget))


@dataclass(frozen=True)
class NoDepth:
    tokens: np.ndarray
    parents: np.ndarray
    offsets: np.ndarray


def _set(name, index, value):
    def f(b):
        arr = getattr(b, name).copy()
        arr[index] = value
        return replace(b, **{name: arr})

    return f


@pytest.mark.parametrize(
    "breaker,match,whole",
    [
        (_set("parents", 1, 2), "not topological", False),
        (_set("parents", 2, 2), "not topological", False),
        (_set("parents", 0, 0), "root", False),
        (_set("tokens", 2, VOCAB), "outside the model's vocabulary", False),
        (_set("tokens", 1, -4), "outside the model's vocabulary", False),
        (_set("tokens", 0, 9), "root of tree 0", False),
        (_set("depth", 2, 5), "depth", False),
        (_set("offsets", 1, 2), "root", False),  # tree 1 starts at a non-root node; tree 0 is [root, 5]
        (_set("offsets", 1, 0), "offsets", True),
        (lambda b: replace(b, offsets=b.offsets[:-1]), "offsets", True),
        (lambda b: NoDepth(b.tokens, b.parents, b.offsets), "no 'depth' field", True),
        (lambda b: replace(b, parents=b.parents[:-1]), "parents", True),
        (lambda b: replace(b, tokens=b.tokens.astype(np.float32)), "integer", True),
    ],
)
def test_malformed_draft_trees(breaker, match, whole, caplog):
    """A malformed tree is the drafter's fault: its request decodes without speculation (same tokens), the
    other requests keep their trees; a batch that cannot be split into trees costs the whole step its
    speculation. The error is counted and logged once with the problem named."""
    prompts = [[9, 3, 4], [2, 8]]
    want = [hf_greedy(tiny_model("llama"), p, 5) for p in prompts]
    e = Engine(tiny_model("llama"), drafter=BadDrafter(breaker), config=EngineConfig(budget=8))
    with caplog.at_level("WARNING", logger="sssd.engine"):
        got = e.generate(prompts, max_new_tokens=5, eos_token_ids=())
    assert [r.tokens for r in got] == want
    assert e.stats.drafter_errors >= 1
    assert (e.stats.nodes == 0) == whole  # only a batch-level fault stops the intact tree too
    warnings = [r.getMessage() for r in caplog.records if r.name == "sssd.engine"]
    assert len(warnings) == 1 and "MalformedDraftError" in warnings[0] and match in warnings[0]


def test_drafter_without_the_contract_methods():
    with pytest.raises(TypeError, match="add_request"):
        Engine(tiny_model("llama"), drafter=object())


def test_pack_helper_is_well_formed():  # guards the fixtures above
    b = pack([TreeBuilder(3)])
    assert isinstance(b, ToyBatch) and b.offsets.tolist() == [0, 1]
