"""The settings reference page is generated from the code and kept in step with it."""

from pathlib import Path

from handlers.settings_reference import fields_of, render
from orchestrator import settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md"


def test_the_committed_reference_matches_the_code():
    assert PAGE.read_text() == render(), (
        "regenerate: tuneloop settings > docs/reference/settings.md"
    )


def test_every_kafka_setting_has_a_docstring():
    undocumented = [f.name for f in fields_of(settings, "KafkaSettings").values() if not f.doc]
    assert undocumented == []


def test_the_reference_names_the_environment_variable_of_each_group():
    page = render()
    for variable in ("TUNELOOP_RULES", "TUNELOOP_KAFKA_BOOTSTRAP", "TUNELOOP_KUBERNETES_NAMESPACE"):
        assert f"`{variable}`" in page
