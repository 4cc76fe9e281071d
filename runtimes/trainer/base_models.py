"""Where the base model of a run comes from, decided before anything is loaded.

`training.py` and `generating.py` call `locate(name, environ)`. A base model is one of:

* a local directory with a `config.json`: one the caller mounted, or `/workspace/model`, where
  Kubeflow's model initializer copies an `hf://` or `s3://` model before the trainer starts;
* an `s3://` prefix holding such a directory's files: the storage layer
  (`runtimes.storage.fetch_model`) copies it into the job's working directory (`fetch_into`)
  first, saying so on stderr, and a second run on the same volume reuses the copy;
* a name of the offline catalogue (`tiny`, `smollm2-135m`, `runtimes/models/catalog.py`) that
  is already built where the trainer runs: the trainer image builds them all at image build
  time. Only the tiny model, which is built from nothing, is built on first use here;
* a hub id (`org/name` or `hf://org/name`), and only where a hub may be used: with
  `HF_HUB_OFFLINE` set (the trainer image and the shipped runtimes set it) it fails at once.

A job never downloads silently: a catalogue model whose build downloads fails fast with what
to do, and a hub download (allowed outside the image) is announced on stderr first.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from runtimes import storage
from runtimes.models import catalog
from runtimes.trainer.errors import ModelNotFoundError

HUB_SCHEME = "hf://"
OBJECT_STORE_SCHEMES = ("s3://",)
_TRUE = ("1", "true", "yes", "on")


def hub_is_offline(environ: Mapping[str, str]) -> bool:
    """Whether the hub client is told not to download (as transformers reads the variable)."""
    return environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def locate(
    name: str,
    environ: Mapping[str, str],
    *,
    fetch_into: Path | None = None,
    settings: storage.StorageSettings | None = None,
) -> str:
    """What transformers loads *name* from: a local directory, or (hub allowed) a hub id.

    Args:
        name: the base model as the config names it.
        environ: where `HF_HUB_OFFLINE` is read.
        fetch_into: where an `s3://` model is copied (the job's working directory).
        settings: how to reach object storage (default: from the environment).

    Raises:
        ModelNotFoundError: *name* is a directory that holds no model, a catalogue model not
            built here whose build downloads, a missing path, or a hub id while the hub is
            offline. The message says what to do instead.
        StorageError: an `s3://` model could not be fetched (the store failed or refused).
    """
    if name.startswith(OBJECT_STORE_SCHEMES):
        return _fetched(name, fetch_into, settings or storage.StorageSettings.from_env())
    path = Path(name.removeprefix("file://"))
    if path.is_dir():
        return _model_directory(name, path)
    canonical = catalog.canonical_name(name)
    if canonical is not None:
        return _catalogued(name, canonical)
    if name.startswith(("/", "./", "../", "file://")):
        raise ModelNotFoundError(name, f"no directory {path}")
    hub_id = name.removeprefix(HUB_SCHEME)
    if hub_is_offline(environ):
        raise ModelNotFoundError(
            name,
            f"it is neither a directory nor a model this image ships ({_shipped()}), and "
            "HF_HUB_OFFLINE is set, so nothing is downloaded at job time. Name it as "
            f"{HUB_SCHEME}{hub_id} on a runtime with a model initializer (tuneloop-lora-hf), "
            "which copies it to /workspace/model before training, or give a directory on a "
            "mounted volume",
        )
    sys.stderr.write(
        f"tuneloop-train: base model {name!r} is not local; transformers downloads {hub_id} "
        "from the hub now (set HF_HUB_OFFLINE=1 to forbid downloads at job time)\n"
    )
    return hub_id


def _fetched(name: str, into: Path | None, settings: storage.StorageSettings) -> str:
    if into is None:
        raise ModelNotFoundError(name, "a model on object storage needs a directory to copy it to")
    sys.stderr.write(f"tuneloop-train: base model {name} is copied to {into} before training\n")
    try:
        directory = storage.fetch_model(name, settings, into=into)
    except storage.StorageInputError as exc:
        raise ModelNotFoundError(name, exc.message) from exc
    return _model_directory(name, directory)


def _model_directory(name: str, path: Path) -> str:
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            name,
            f"{path} holds no config.json, so it is not a transformers model directory "
            "(an empty /workspace/model means the model initializer did not copy one)",
        )
    return str(path)


def _catalogued(name: str, canonical: str) -> str:
    built = catalog.built_dir(canonical)
    if built is not None:
        return str(built)
    download = catalog.DOWNLOADS.get(canonical)
    if download is not None:
        raise ModelNotFoundError(
            name,
            f"{canonical} is not built under {catalog.models_root()} and building it "
            f"downloads {download}, which a job never does. Build it where the trainer runs "
            f"first: `python -m runtimes.models prepare {canonical}` (the trainer image does "
            "this at build time; set TUNELOOP_CACHE to where it was built)",
        )
    # Built from nothing (no download), in seconds; catalog says so on stderr.
    return str(catalog.model_dir(canonical))


def _shipped() -> str:
    names = [name for name in (catalog.TINY, catalog.SMOLLM2) if catalog.built_dir(name)]
    return ", ".join(names) if names else f"none are built under {catalog.models_root()}"
