"""Which backends offer the optional capabilities the worker wires only when present."""

from __future__ import annotations

import pytest

from orchestrator.ports import RecallsJobContext, RemovesFinishedJobs
from orchestrator.testing import InMemoryBackend
from runtimes.kubernetes.backend import KubernetesBackend
from runtimes.localprocess.backend import LocalProcessBackend


@pytest.mark.parametrize("capability", [RemovesFinishedJobs, RecallsJobContext])
def test_the_kubernetes_backend_declares_both_capabilities(capability) -> None:
    assert issubclass(KubernetesBackend, capability)


@pytest.mark.parametrize("backend", [LocalProcessBackend, InMemoryBackend])
@pytest.mark.parametrize("capability", [RemovesFinishedJobs, RecallsJobContext])
def test_backends_without_the_capability_are_not_taken_for_having_it(backend, capability) -> None:
    assert not issubclass(backend, capability)
