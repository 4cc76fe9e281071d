"""The demo's data ships in the package, and the docs show the same files."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from orchestrator.rules import loading

DOCS = Path(__file__).resolve().parents[2] / "docs" / "examples"
PACKAGED = resources.files("handlers.demo_data")


@pytest.mark.parametrize(
    ("packaged", "docs_copy"),
    [
        ("rules.yaml", DOCS / "demo" / "rules.yaml"),
        ("unit-conversions.jsonl", DOCS / "datasets" / "unit-conversions.jsonl"),
    ],
    ids=["rules", "dataset"],
)
def test_the_docs_copy_is_the_packaged_file(packaged, docs_copy) -> None:
    assert PACKAGED.joinpath(packaged).read_bytes() == docs_copy.read_bytes(), (
        f"handlers/demo_data/{packaged} and {docs_copy} differ: change both together"
    )


def test_the_packaged_rules_are_valid(tmp_path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_bytes(PACKAGED.joinpath("rules.yaml").read_bytes())
    assert loading.load_rules([rules]).rules
