"""Shared pytest set-up. Each real service has its own fixture module in tests/fixtures/."""

pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.kubernetes",
    "tests.fixtures.models",
]
