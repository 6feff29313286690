"""Seeded tiny random causal LMs of several families (float32, CPU) for the engine tests.

Weights are drawn with a large init range so next-token distributions are peaked: greedy argmax gaps are
far above float32 rounding noise, which keeps "same tokens" comparisons meaningful and not flaky.
"""

from __future__ import annotations

import functools
import os

import torch

VOCAB = 96
# The device the engine tests run on: SSSD_TEST_DEVICE=cuda runs the lossless suite on a GPU (float32;
# choose the attention path with SSSD_ATTENTION=sdpa|packed, see sssd.engine.adapter).
TEST_DEVICE = os.environ.get("SSSD_TEST_DEVICE", "cpu")


def _config(family: str):
    import transformers as tf

    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        initializer_range=0.3,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if family == "llama":
        return tf.LlamaConfig(num_key_value_heads=4, **common)
    if family == "qwen2":  # grouped-query attention: 4 query heads share 2 K/V heads
        return tf.Qwen2Config(num_key_value_heads=2, use_sliding_window=False, **common)
    if family == "mistral":
        return tf.MistralConfig(num_key_value_heads=1, sliding_window=None, **common)
    if family == "gemma":
        return tf.GemmaConfig(num_key_value_heads=2, head_dim=8, **common)
    if family == "phi3":  # fused QKV and gate/up projections, partial rotary
        return tf.Phi3Config(num_key_value_heads=2, partial_rotary_factor=0.5, **common)
    raise ValueError(family)


FAMILIES = ("llama", "qwen2", "mistral", "gemma")
# the families the compiled verification forward is checked on (phi3 beyond the lossless suite's four)
COMPILE_FAMILIES = (*FAMILIES, "phi3")


@functools.cache
def _state(family: str):
    import transformers as tf

    torch.manual_seed(1234 + COMPILE_FAMILIES.index(family))
    model = tf.AutoModelForCausalLM.from_config(_config(family), attn_implementation="sdpa")
    return model.state_dict()


def tiny_model(family: str = "llama"):
    """A fresh model instance (own attention setting) with the family's seeded weights, on TEST_DEVICE."""
    import transformers as tf

    torch.set_num_threads(1)
    model = tf.AutoModelForCausalLM.from_config(_config(family), attn_implementation="sdpa")
    model.load_state_dict(_state(family))
    return model.to(TEST_DEVICE).eval()


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Reference: transformers' own generate (sdpa attention, its own cache), greedy, no EOS stop."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


class TinyTokenizer:
    """A word-level tokenizer over the tiny vocabulary: token ``i`` is the word ``w{i}``; ``tag``
    changes the vocabulary (and so its fingerprint)."""

    def __init__(self, tag: str = "", eos_token_id: int | None = 1):
        self.words = [f"w{i}{tag}" for i in range(VOCAB)]
        self.eos_token_id = eos_token_id
        self.name_or_path = f"tiny{tag}"

    def __len__(self) -> int:
        return VOCAB

    def get_vocab(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    def __call__(self, text: str) -> dict[str, list[int]]:
        index = self.get_vocab()
        return {"input_ids": [index[w] for w in text.split()]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(
            self.words[int(i)] for i in ids if not (skip_special_tokens and i == self.eos_token_id)
        )
