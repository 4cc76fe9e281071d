"""e2e-only pytest set-up: the `--soak` option and `soak` marker, and the fault suites' fixtures.

`make soak` runs `pytest tests/e2e -m soak --soak`: the long fault suites. Without `--soak`,
tests marked `soak` are skipped; the short suites always run (they are part of `make test`).

Fixtures:
- `fault_topics`: fresh in (2 partitions) / out / audit / dlq topics;
- `fault_rules`: `harness.FAULT_RULES` written to a file;
- `fault_workers`: `fault_workers(config, count=1) -> list[WorkerProcess]`, each logging under
  the test's tmp dir; all are stopped at the end, and a failing test gets their log tails.
- `fault_env`: all of the above with the broker, the API server and a namespace, as one
  `harness.FaultEnv` that the suites take.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from devservices.kubernetes import KubeEndpoint
from tests.e2e.harness import (
    FAULT_RULES,
    FaultEnv,
    WorkerConfig,
    WorkerProcess,
    workers_log_tails,
)
from tests.fixtures.kafka import TopicFactory

_WORKERS = pytest.StashKey[list[WorkerProcess]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="run the long fault suites (tests marked soak); `make soak` sets it",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "soak: a long fault suite, run only with --soak (`make soak`)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak suite: run with --soak (make soak)")
    for item in items:
        # The marker, not `item.keywords`: keywords hold the names of parent folders too, so
        # a checkout in a folder called "soak" would skip every test.
        if item.get_closest_marker("soak") is not None:
            item.add_marker(skip)


@pytest.fixture
def fault_topics(new_topic: TopicFactory) -> dict[str, str]:
    return {
        "in": new_topic("fault-in", partitions=2),
        "out": new_topic("fault-out"),
        "audit": new_topic("fault-audit"),
        "dlq": new_topic("fault-dlq"),
    }


@pytest.fixture
def fault_rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(FAULT_RULES, encoding="utf-8")
    return path


@pytest.fixture
def fault_workers(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., list[WorkerProcess]]]:
    made: list[WorkerProcess] = []
    request.node.stash[_WORKERS] = made

    def make(config: WorkerConfig, count: int = 1) -> list[WorkerProcess]:
        new = [
            WorkerProcess(config=config, log_path=tmp_path / f"worker-{len(made) + n + 1}.log")
            for n in range(count)
        ]
        made.extend(new)
        return new

    try:
        yield make
    finally:
        for worker in made:
            worker.stop()


@pytest.fixture
def fault_env(
    kafka_bootstrap: str,
    kube_api: KubeEndpoint,
    k8s_namespace: str,
    fault_topics: dict[str, str],
    fault_rules: Path,
    fault_workers: Callable[..., list[WorkerProcess]],
    tmp_path: Path,
) -> FaultEnv:
    return FaultEnv(
        bootstrap=kafka_bootstrap,
        kube_api=kube_api,
        namespace=k8s_namespace,
        topics=fault_topics,
        rules=fault_rules,
        workers=fault_workers,
        tmp_path=tmp_path,
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing fault suite shows the end of each worker's log."""
    report = yield
    workers = item.stash.get(_WORKERS, None)
    if report.failed and call.when == "call" and workers:
        report.sections.append(("tuneloop worker logs", workers_log_tails(workers)))
    return report
