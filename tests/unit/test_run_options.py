"""`tuneloop run`: an option given on the command line wins over its environment variable."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from handlers.cli.main import app
from handlers.cli.worker_commands import with_options
from orchestrator.errors import ConfigError
from orchestrator.settings import BackendKind, Settings

ENV = {
    "TUNELOOP_RULES": "from-env.yaml",
    "TUNELOOP_BACKEND": "kubernetes",
    "TUNELOOP_LOCAL_MAX_JOBS": "2",
    "TUNELOOP_KUBERNETES_NAMESPACE": "env-ns",
    "TUNELOOP_METRICS_PORT": "9000",
}


def test_given_options_replace_the_variables_and_the_rest_stay() -> None:
    settings = with_options(
        Settings.from_env(ENV),
        rules=(Path("flag.yaml"),),
        backend=BackendKind.LOCAL,
        namespace="flag-ns",
    )
    assert settings.worker.rules == (Path("flag.yaml"),)
    assert settings.worker.backend is BackendKind.LOCAL
    assert settings.kubernetes.namespace == "flag-ns"
    assert settings.worker.local_max_jobs == 2
    assert settings.worker.web_port == 9000  # TUNELOOP_METRICS_PORT, the old name, still works


def test_without_options_the_environment_decides() -> None:
    assert with_options(Settings.from_env(ENV)) == Settings.from_env(ENV)


def test_an_invalid_option_refuses_to_start_like_its_variable() -> None:
    with pytest.raises(ConfigError, match="TUNELOOP_LOCAL_MAX_JOBS"):
        with_options(Settings.from_env({}), local_max_jobs=0)


def test_run_without_rules_refuses_to_start_and_says_how_to_name_them(monkeypatch) -> None:
    monkeypatch.delenv("TUNELOOP_RULES", raising=False)
    monkeypatch.setenv("TUNELOOP_LOCAL_ROOT", "/nonexistent/tuneloop-test-jobs")
    result = CliRunner().invoke(app, ["run"])
    assert result.exit_code == 1
    assert "--rules or set TUNELOOP_RULES" in result.output


def test_run_help_names_each_options_variable() -> None:
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    for variable in ("TUNELOOP_RULES", "TUNELOOP_BACKEND", "TUNELOOP_WEB_PORT"):
        assert variable in result.output
