"""Greedy generation from a base model and from the same model with a LoRA adapter.

Used by `tuneloop demo` to show what a fine-tune changed, and handy for a quick look at any
adapter the trainer wrote: `compare_generations("smollm2-135m", adapter_dir, prompt)`.
The prompt is fed exactly as the trainer fed prompt/completion records (plain text), so the
adapter sees the format it was trained on.
"""

from __future__ import annotations

from pathlib import Path

from runtimes.trainer.training import resolve_base_model


def compare_generations(
    base_model: str, adapter_dir: Path, prompt: str, *, max_new_tokens: int = 40
) -> tuple[str, str]:
    """(base model's continuation, adapted model's continuation) of *prompt*, greedy."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_base_model(base_model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    inputs = tokenizer(prompt, return_tensors="pt")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def continuation(m: object) -> str:
        with torch.no_grad():
            out = m.generate(  # type: ignore[attr-defined]
                **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad
            )
        new = out[0][inputs["input_ids"].shape[1] :]
        return str(tokenizer.decode(new, skip_special_tokens=True)).strip()

    base = continuation(model)
    tuned = continuation(PeftModel.from_pretrained(model, str(adapter_dir)))
    return base, tuned
