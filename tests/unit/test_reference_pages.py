"""The reference pages are generated from the code and kept in step with it."""

from pathlib import Path

import pytest

from handlers.cli.main import app
from handlers.reference_pages import cli_page, fields_of, settings_page
from orchestrator import settings

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"


@pytest.mark.parametrize(
    ("page", "render"), [("settings", settings_page), ("cli", cli_page)], ids=["settings", "cli"]
)
def test_the_committed_reference_page_matches_the_code(page, render):
    expected = render(app)
    assert (REFERENCE / f"{page}.md").read_text() == expected, (
        f"regenerate: tuneloop reference {page} > docs/reference/{page}.md"
    )


@pytest.mark.parametrize(
    "group", ["WorkerSettings", "KafkaSettings", "KubernetesSettings", "HandoffSettings"]
)
def test_every_setting_has_a_docstring(group):
    undocumented = [f.name for f in fields_of(settings, group).values() if not f.doc]
    assert undocumented == []


def test_the_settings_page_names_the_environment_variable_of_each_group():
    page = settings_page(app)
    for variable in ("TUNELOOP_RULES", "TUNELOOP_KAFKA_BOOTSTRAP", "TUNELOOP_KUBERNETES_NAMESPACE"):
        assert f"`{variable}`" in page


def test_the_cli_page_lists_the_commands_other_tools_depend_on():
    page = cli_page(app)
    for command in ("check", "simulate", "explain", "test", "emit", "run", "demo"):
        assert f"## `tuneloop {command}`" in page


def test_the_settings_page_names_the_run_option_that_overrides_a_variable():
    page = settings_page(app)
    assert "| `TUNELOOP_BACKEND` | `--backend` |" in page
    assert "| `TUNELOOP_WEB_PORT` | `--web-port` |" in page
