"""The backend contract, run against the shipped in-memory fake."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestrator.clock import FixedClock
from orchestrator.jobs.model import JobPhase, JobRef, JobResult
from orchestrator.testing import InMemoryBackend
from tests.contract.backend_contract import BackendContract


class InMemoryController:
    def __init__(self, backend: InMemoryBackend) -> None:
        self._backend = backend

    async def move(
        self,
        job: JobRef,
        phase: JobPhase,
        *,
        reason: str | None = None,
        result: JobResult | None = None,
    ) -> None:
        self._backend.move(job.name, phase, reason=reason, result=result)


class TestInMemoryBackendContract(BackendContract):
    @pytest.fixture
    def backend(self):
        return InMemoryBackend(
            FixedClock(datetime(2026, 1, 1, tzinfo=UTC)),
            runtimes=frozenset({"torch-distributed"}),
        )

    @pytest.fixture
    def runtime(self):
        return "torch-distributed"

    @pytest.fixture
    def controller(self, backend):
        return InMemoryController(backend)
