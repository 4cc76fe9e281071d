"""Greedy generation from a base model, with or without a trained adapter.

For the demo (`tuneloop demo` prints base vs adapter on one prompt) and for anyone checking
what an adapter learned: `python -m runtimes.trainer.generating --base-model M [--adapter DIR]
"prompt"`. Greedy decoding, so the output is reproducible.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def generate(
    base_model: str, prompt: str, *, adapter: Path | None = None, max_new_tokens: int = 32
) -> str:
    """The continuation of *prompt* (without the prompt), decoded greedily."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from runtimes.trainer.base_models import locate

    model_dir = locate(base_model, os.environ)
    tokenizer = AutoTokenizer.from_pretrained(adapter or model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    new_tokens = output[0, inputs["input_ids"].shape[1] :]
    return str(tokenizer.decode(new_tokens, skip_special_tokens=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtimes.trainer.generating")
    parser.add_argument("--base-model", required=True)
    parser.add_argument("--adapter", type=Path)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("prompt")
    args = parser.parse_args(argv)
    text = generate(
        args.base_model, args.prompt, adapter=args.adapter, max_new_tokens=args.max_new_tokens
    )
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
