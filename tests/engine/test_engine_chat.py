"""The engine speaks chat: messages go through the tokenizer's chat template (with the generation prompt),
plain strings stay raw, malformed conversations and tokenizers without a template get clear errors."""

from __future__ import annotations

import pytest
import torch
from cli_models import tiny_tokenizer
from sssd.engine.chat import chat_prompt_ids, is_messages
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import TinyTokenizer, hf_greedy, tiny_model

torch.set_num_threads(1)

# The tiny chat template: "<|user|> w5 w6 <|assistant|> " -> ids 2, 9, 10, 3 (w<i> is id i + 4).
ASK = [{"role": "user", "content": "w5 w6"}]
ASK_IDS = [2, 9, 10, 3]


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_model("llama"), tiny_tokenizer(chat=True), config=EngineConfig(budget=0))


def test_messages_are_rendered_with_the_generation_prompt(engine):
    assert chat_prompt_ids(ASK, engine.tokenizer) == ASK_IDS
    conversation = [*ASK, {"role": "assistant", "content": "w7"}, {"role": "user", "content": "w8"}]
    assert chat_prompt_ids(conversation, engine.tokenizer) == [2, 9, 10, 3, 11, 2, 12, 3]
    (r,) = engine.generate(ASK, max_new_tokens=5)
    assert r.prompt_tokens == ASK_IDS
    assert r.tokens == hf_greedy(engine.model, ASK_IDS, 5)[: len(r.tokens)]  # the same model, by hand


def test_plain_strings_stay_raw(engine):
    (r,) = engine.generate("w5 w6", max_new_tokens=3)
    assert r.prompt_tokens == [9, 10]


def test_a_list_of_conversations_is_several_prompts(engine):
    other = [{"role": "user", "content": "w9"}]
    results = engine.generate([ASK, other], max_new_tokens=3)
    assert [r.prompt_tokens for r in results] == [ASK_IDS, [2, 13, 3]]
    # the same with tuples, and mixed with a raw string and token ids
    results = engine.generate([tuple(ASK), "w5 w6", [9, 10]], max_new_tokens=3)
    assert [r.prompt_tokens for r in results] == [ASK_IDS, [9, 10], [9, 10]]


def test_stream_and_add_request_take_messages(engine):
    events = list(engine.stream(ASK, max_new_tokens=4))
    assert events[-1].finished and events[-1].result.prompt_tokens == ASK_IDS
    rid = engine.add_request(ASK, max_new_tokens=3)
    while engine.has_unfinished():
        engine.step()
    assert engine.result(rid).prompt_tokens == ASK_IDS


@pytest.mark.parametrize(
    "messages,error,match",
    [
        ([{"role": "user"}], ValueError, 'chat message 1 has no "content"'),
        ([{"content": "w1"}], ValueError, 'chat message 1 has no "role"'),
        ([{"role": "user", "content": 5}], TypeError, '"content" must be a str, got int'),
        ([{"role": "", "content": "w1"}], ValueError, 'empty "role"'),
        ([*ASK, "w1"], TypeError, "chat message 2 is a str, not a dict"),
        ([*ASK, [3, 4]], TypeError, "chat message 2 is a list"),
    ],
)
def test_malformed_messages_say_which_and_why(engine, messages, error, match):
    with pytest.raises(error, match=match):
        engine.add_request(messages, max_new_tokens=3)
    with pytest.raises(error, match=match):
        engine.generate([messages], max_new_tokens=3)
    assert not engine.has_unfinished()  # nothing was queued


def test_a_tokenizer_without_a_template_or_no_tokenizer_is_a_clear_error():
    model = tiny_model("llama")
    for tok in (tiny_tokenizer(chat=False), TinyTokenizer()):
        e = Engine(model, tok, config=EngineConfig(budget=0))
        with pytest.raises(ValueError, match="need the tokenizer's chat template, and this tokenizer"):
            e.generate(ASK, max_new_tokens=2)
        raw = list(tok("w5 w6")["input_ids"])
        assert e.generate("w5 w6", max_new_tokens=2)[0].prompt_tokens == raw  # text still works
    e = Engine(model, config=EngineConfig(budget=0))
    with pytest.raises(ValueError, match="chat messages need a tokenizer"):
        e.add_request(ASK)


def test_what_counts_as_a_conversation():
    assert is_messages(ASK) and is_messages(tuple(ASK)) and is_messages([{"role": "x"}, 3])
    for other in ("w1", [], [1, 2], [ASK], b"x", {"role": "user", "content": "x"}):
        assert not is_messages(other), other
