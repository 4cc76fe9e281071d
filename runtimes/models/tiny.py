"""A tiny Llama-style causal LM and its byte-level BPE tokenizer, built from nothing.

`catalog.tiny_model_dir()` calls `build()` once per cache; tests and `TUNELOOP_DEMO_MODEL=tiny`
train on the result. Everything is deterministic (a generated corpus, a seeded init, a
single-threaded tokenizer trainer), so a rebuild writes identical bytes and a test failure is
never "the model changed". The model is random-init: it learns little, but every code path
of a real fine-tune (LoRA on q/v, masking, packing, save/reload, resume) runs in a second.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

CORPUS_SEED = 0
"""Seed of the generated corpus; changing it changes the tokenizer and every golden value."""

_ANIMALS = ("cat", "dog", "fox", "owl", "bee", "cow", "hen", "eel", "ant", "yak")
_COLOURS = ("red", "blue", "green", "black", "white", "pink", "gold", "grey")
_VERBS = ("chases", "sees", "likes", "follows", "finds", "meets")

SPECIAL_TOKENS = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}

CHAT_TEMPLATE = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}"
)

MODEL_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def corpus_lines(count: int = 4000) -> list[str]:
    """The sentences and reverse-three-words tasks the tokenizer is trained on."""
    rng = random.Random(CORPUS_SEED)  # noqa: S311 -- reproducible data, not secrets
    lines: list[str] = []
    for _ in range(count):
        lines.append(
            f"the {rng.choice(_COLOURS)} {rng.choice(_ANIMALS)} {rng.choice(_VERBS)} "
            f"the {rng.choice(_COLOURS)} {rng.choice(_ANIMALS)} ."
        )
        words = [rng.choice(_ANIMALS + _COLOURS) for _ in range(3)]
        lines.append(f"reverse: {' '.join(words)} => {' '.join(reversed(words))}")
    return lines


def reverse_task_rows(count: int, *, seed: int = 1) -> list[dict[str, str]]:
    """Prompt/completion rows of the task the tiny model is fine-tuned on in tests."""
    rng = random.Random(seed)  # noqa: S311 -- reproducible data, not secrets
    rows = []
    for _ in range(count):
        words = [rng.choice(_ANIMALS + _COLOURS) for _ in range(3)]
        rows.append(
            {
                "prompt": f"reverse: {' '.join(words)} =>",
                "completion": f" {' '.join(reversed(words))}",
            }
        )
    return rows


def build(out_dir: Path) -> None:
    """Write config, weights and tokenizer of the tiny model into *out_dir* (must be empty)."""
    # Single-threaded BPE training: the merge order must not depend on thread timing.
    os.environ["RAYON_NUM_THREADS"] = "1"
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    bpe_trainer = trainers.BpeTrainer(
        vocab_size=512,
        min_frequency=2,
        special_tokens=["<|pad|>", "<|bos|>", "<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), bpe_trainer)
    hf_tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        **SPECIAL_TOKENS,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(hf_tokenizer),
        bos_token_id=hf_tokenizer.bos_token_id,
        eos_token_id=hf_tokenizer.eos_token_id,
        pad_token_id=hf_tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **MODEL_SHAPE,
    )
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    hf_tokenizer.save_pretrained(out_dir)
    (out_dir / "tuneloop-model.json").write_text(
        json.dumps(
            {
                "name": "tiny-llama",
                "parameters": sum(p.numel() for p in model.parameters()),
                "vocab_size": len(hf_tokenizer),
                "corpus_seed": CORPUS_SEED,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
