"""Shared pytest set-up. Each real service has its own fixture module in tests/fixtures/."""

# Imported here, before any test runs, rather than by hypothesis's pytest plugin at the
# terminal summary: by then faust's compiled (Cython) code may have run, and on CPython 3.11.7
# pytest's parse of the hypothesis sources then fails with "SystemError: AST constructor
# recursion depth mismatch" (seen running tests/unit/events/test_seek_safe_consumer.py alone).
# The same for the module `st.from_regex` imports on first use: CI failed when that first use
# came mid-suite (tests/integration/test_kubernetes_schema.py). Loading it now reads
# hypothesis's unicode tables during start-up, which hypothesis warns about as slow; it is once.
import warnings

import hypothesis
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
