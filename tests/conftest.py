"""Shared pytest set-up. Each real service has its own fixture module in tests/fixtures/."""

# Imported here, before any test runs, rather than by hypothesis's pytest plugin at the
# terminal summary: by then faust's compiled (Cython) code may have run, and on CPython 3.11.7
# pytest's parse of the hypothesis sources then fails with "SystemError: AST constructor
# recursion depth mismatch" (seen running tests/unit/events/test_seek_safe_consumer.py alone).
import hypothesis  # noqa: F401

pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.kubernetes",
    "tests.fixtures.mlflow",
    "tests.fixtures.models",
    "tests.fixtures.object_storage",
    "tests.fixtures.serving",
]
