"""Shared pytest set-up. Each real service has its own fixture module in tests/fixtures/."""

# Imported here, before any test runs, rather than by hypothesis's pytest plugin at the
# terminal summary: by then faust's compiled (Cython) code may have run, and on CPython 3.11.7
# pytest's parse of the hypothesis sources then fails with "SystemError: AST constructor
# recursion depth mismatch" (seen running tests/unit/events/test_seek_safe_consumer.py alone).
# The same for the module `st.from_regex` imports on first use: CI failed when that first use
# came mid-suite (tests/integration/test_kubernetes_schema.py). Loading it now reads
# hypothesis's unicode tables during start-up, which hypothesis warns about as slow; it is once.
import warnings
from collections.abc import Iterator

import hypothesis
import pytest
import structlog
from hypothesis.errors import HypothesisSideeffectWarning

with warnings.catch_warnings():
    warnings.simplefilter("ignore", HypothesisSideeffectWarning)
    import hypothesis.strategies._internal.regex  # noqa: F401

pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.kubernetes",
    "tests.fixtures.mlflow",
    "tests.fixtures.models",
    "tests.fixtures.object_storage",
    "tests.fixtures.serving",
]


@pytest.fixture(autouse=True)
def _structlog_configured_as_before() -> Iterator[None]:
    """structlog's configuration as it was before each test, whatever the test configured.

    A command run in process (`tuneloop run` through typer's CliRunner) configures structlog
    for a worker process: its own processor list, with each logger cached on first use. Left
    so, a module's logger first used by a later test kept that list, and `capture_logs` in
    any test after that (it swaps the processors of the list in force) missed its lines: the
    rule-reload fault test waited 60 s for a rejection it had been sent, once two processes
    ran the suite in another order (test_run_options, test_reloading, test_logs, then it).
    """
    before = structlog.get_config()
    yield
    if structlog.get_config() != before:
        structlog.configure(**before)
