"""Stop strings end generation at the token that completes them; tokens accepted after it are dropped,
with and without speculation."""

from __future__ import annotations

import pytest
import torch
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import VOCAB, TinyTokenizer, hf_greedy, tiny_model
from toy_drafters import OracleDrafter

torch.set_num_threads(1)


def expected_cut(tok, ref, stops):
    for k in range(1, len(ref) + 1):
        if any(s in tok.decode(ref[:k], skip_special_tokens=True) for s in stops):
            return k
    return None


@pytest.mark.parametrize("speculate", [False, True])
@pytest.mark.parametrize("which", ["one-token", "two-tokens", "never"])
def test_stop_strings(speculate, which):
    tok = TinyTokenizer(eos_token_id=None)
    prompt = [7, 8, 9, 10]
    ref = hf_greedy(tiny_model("llama"), prompt, 20)
    words = [tok.words[t] for t in ref]
    stops = {
        "one-token": [f" {words[6]} "],
        "two-tokens": ["zzz", f"{words[3]} {words[4]}"],
        "never": ["zzz"],
    }[which]
    cut = expected_cut(tok, ref, stops)
    drafter = OracleDrafter(VOCAB, {0: prompt + ref}, p_wrong=0.0) if speculate else None
    engine = Engine(tiny_model("llama"), tok, drafter=drafter, config=EngineConfig(budget=32))
    (res,) = engine.generate(prompt, max_new_tokens=20, stop=stops, eos_token_ids=())
    if cut is None:
        assert res.tokens == ref and res.finish_reason == "length"
    else:
        assert res.tokens == ref[:cut] and res.finish_reason == "stop"
        assert any(s in res.text for s in stops)
    assert res.text == tok.decode(res.tokens)
