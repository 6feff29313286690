"""Model directories for the command line tests: a seeded tiny Llama with a tiny word-level tokenizer
(96 words ``w0``..``w91`` + 4 specials, optionally a chat template), saved as a Hugging Face directory or
into a Hugging Face cache layout. No SmolLM2, no network."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
SPECIALS = ["<unk>", "<eos>", "<|user|>", "<|assistant|>"]  # ids 0..3; the model's EOS is id 1


def tiny_tokenizer(chat: bool = True):
    """A fast word-level tokenizer: whitespace-separated ``w<i>`` is id ``i + 4``, anything else ``<unk>``."""
    from tiny_models import VOCAB
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIALS + [f"w{i}" for i in range(VOCAB - len(SPECIALS))]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tiny_model(path: Path, *, chat: bool = True) -> Path:
    """The tiny seeded Llama of ``tiny_models`` and :func:`tiny_tokenizer`, saved to ``path``."""
    from tiny_models import tiny_model

    model = tiny_model("llama").to("cpu")
    model.save_pretrained(path)
    tiny_tokenizer(chat).save_pretrained(path)
    return path


def put_in_hub_cache(src: Path, hub_cache: Path, repo_id: str, commit: str = "0" * 40) -> Path:
    """Copies a model directory into the Hugging Face cache layout (``models--owner--name/snapshots/
    <commit>`` and ``refs/main``) under ``hub_cache``, as a download would leave it. Returns the snapshot."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(src, snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def save_wordlevel_tokenizer(out: Path, texts: list[str], chat_template: str) -> Path:
    """A WordLevel tokenizer trained on ``texts``, saved as a Hugging Face directory with a chat template.

    Specials ``[UNK] <s> </s> <|im_start|> <|im_end|>`` are ids 0..4; its post-processor wraps a text in
    ``<s> ... </s>``, which only ``add_special_tokens`` applies."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[UNK]", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="[UNK]", bos_token="<s>", eos_token="</s>",
        additional_special_tokens=specials[3:],
    )  # fmt: skip
    fast.chat_template = chat_template
    fast.save_pretrained(out)
    return out


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a child Python that imports the sssd and datastore_tools this test imports (the
    installed wheel in CI, the working tree with PYTHONPATH=python), whatever its working directory."""
    import sssd

    import datastore_tools

    paths = [str(Path(m.__file__).resolve().parents[1]) for m in (sssd, datastore_tools)]
    paths += [str(Path(p).resolve()) for p in sys.path if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}
