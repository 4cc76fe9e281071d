from __future__ import annotations

import pytest

from runtimes.storage import StorageInputError, StorageSettings, parse_location
from runtimes.storage.filesystems import filesystem_for


def test_a_hub_location_fails_at_once_when_the_hub_is_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    with pytest.raises(StorageInputError, match="HF_HUB_OFFLINE"):
        filesystem_for(parse_location("hf://datasets/org/name/train.jsonl"), StorageSettings())


def test_a_local_location_needs_no_settings() -> None:
    fs = filesystem_for(parse_location("/tmp"), StorageSettings())

    assert fs.isdir("/tmp")
