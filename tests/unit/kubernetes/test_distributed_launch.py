"""How a TrainJob starts the trainer: torchrun, with one process per GPU or per CPU node.

Kubeflow's torch plugin (trainer v2.3.0, pkg/runtime/framework/plugins/torch/torch.go)
describes the nodes only through `PET_NNODES`, `PET_NPROC_PER_NODE`, `PET_NODE_RANK`,
`PET_MASTER_ADDR` and `PET_MASTER_PORT`, which torchrun reads; it rewrites the command only
for torchtune's `tune run`. So the command must start with torchrun, or `numNodes: 2` trains
two unrelated rank-0 copies (tests/integration/test_trainer_two_nodes.py runs the real thing).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.jobs.model import Resources
from runtimes.kubernetes import manifests
from runtimes.kubernetes.catalog import RuntimeInfo
from tests.unit.kubernetes.golden_cases import BASIC, TORCH


def _trainer(request):
    built = manifests.build_trainjob(
        request, namespace="ml", runtime=TORCH, settings=manifests.Settings()
    )
    return built["spec"]["trainer"]


def test_the_trainer_container_runs_torchrun_on_the_trainer_module():
    assert _trainer(BASIC)["command"] == ["torchrun", "--module", "runtimes.trainer"]


def test_no_torchrun_variable_is_set_by_us_since_the_plugin_owns_them():
    names = {item["name"] for item in _trainer(BASIC)["env"]}
    assert not {n for n in names if n.startswith("PET_")}


@pytest.mark.parametrize(
    ("resources", "processes"),
    [
        (Resources(), 1),
        (Resources(nodes=2, cpu="4"), 1),
        (Resources(gpus_per_node=4), 4),
    ],
    ids=["cpu-default", "cpu-request-still-one-process", "one-process-per-gpu"],
)
def test_each_node_runs_one_process_per_gpu_or_one_on_cpu(resources, processes):
    trainer = _trainer(replace(BASIC, resources=resources))
    assert trainer["numProcPerNode"] == processes
    assert trainer["numNodes"] == resources.nodes


def test_a_gpu_runtime_runs_one_process_per_gpu_of_its_template_unless_the_job_says():
    gpu_runtime = RuntimeInfo(name="lora-gpu", gpus_per_node=2)

    def processes(request):
        built = manifests.build_trainjob(
            request, namespace="ml", runtime=gpu_runtime, settings=manifests.Settings()
        )
        return built["spec"]["trainer"]["numProcPerNode"]

    assert processes(BASIC) == 2
    assert processes(replace(BASIC, resources=Resources(gpus_per_node=1))) == 1
