"""Which runtime a job runs on: parsing runtime objects and the selection policy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.clock import FixedClock
from orchestrator.errors import JobRejectedError
from runtimes.kubernetes.catalog import RuntimeCatalog, RuntimeInfo, runtime_info, select

TORCH_DISTRIBUTED = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {
        "name": "torch-distributed",
        "labels": {"trainer.kubeflow.org/framework": "torch"},
    },
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {
                            "metadata": {
                                "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                            },
                            "spec": {"template": {"spec": {"containers": [{"name": "node"}]}}},
                        },
                    }
                ]
            }
        },
    },
}


def _job(name, step, container, gpus=None):
    resources = {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}
    return {
        "name": name,
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": step}},
            "spec": {
                "template": {"spec": {"containers": [{"name": container, "resources": resources}]}}
            },
        },
    }


GPU_WITH_INITIALIZERS = {
    "metadata": {"name": "lora-gpu", "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {
        "template": {
            "spec": {
                "replicatedJobs": [
                    _job("dataset-initializer", "dataset-initializer", "dataset-initializer"),
                    _job("model-initializer", "model-initializer", "model-initializer"),
                    _job("node", "trainer", "node", gpus=2),
                ]
            }
        }
    },
}


def test_torch_distributed_is_summarised_as_one_cpu_trainer_job():
    info = runtime_info(TORCH_DISTRIBUTED)
    assert info.name == "torch-distributed"
    assert info.replicated_jobs == ("node",)
    assert info.trainer_job == "node"
    assert not info.has_gpus
    assert not info.has_dataset_initializer
    assert not info.has_model_initializer


def test_initializers_and_gpus_are_found():
    info = runtime_info(GPU_WITH_INITIALIZERS)
    assert info.replicated_jobs == ("dataset-initializer", "model-initializer", "node")
    assert info.has_dataset_initializer
    assert info.has_model_initializer
    assert info.gpus_per_node == 2


CPU = RuntimeInfo(name="cpu", labels={"trainer.kubeflow.org/framework": "torch"})
GPU = RuntimeInfo(name="gpu", labels={"trainer.kubeflow.org/framework": "torch"}, gpus_per_node=1)
SMALL = RuntimeInfo(
    name="small",
    labels={"trainer.kubeflow.org/framework": "torch", "tuneloop.io/size": "small"},
)
OLD = RuntimeInfo(
    name="aaa-old",
    labels={
        "trainer.kubeflow.org/framework": "torch",
        "trainer.kubeflow.org/support": "deprecated",
    },
)
NAMESPACED = RuntimeInfo(name="cpu", kind="TrainingRuntime")
ALL = (CPU, GPU, SMALL, OLD, NAMESPACED)


def test_a_runtime_is_picked_by_name():
    assert select(ALL, "gpu", needs_gpu=False) is GPU


def test_a_namespaced_runtime_is_picked_by_kind_and_name():
    assert select(ALL, "TrainingRuntime/cpu", needs_gpu=False) is NAMESPACED


def test_a_runtime_is_picked_by_label_selector():
    assert select(ALL, "selector:tuneloop.io/size=small", needs_gpu=False) is SMALL


def test_default_policy_prefers_cpu_runtimes_for_cpu_jobs_and_skips_deprecated():
    assert select(ALL, "auto", needs_gpu=False) is CPU


def test_default_policy_gives_gpu_jobs_a_gpu_runtime():
    assert select(ALL, "", needs_gpu=True) is GPU


def test_a_runtime_marked_default_wins_among_equals():
    preferred = RuntimeInfo(
        name="zzz",
        labels={"trainer.kubeflow.org/framework": "torch", "tuneloop.io/default": "true"},
    )
    assert select((*ALL, preferred), "auto", needs_gpu=False) is preferred


@pytest.mark.parametrize(
    ("wanted", "needs_gpu", "says"),
    [
        ("missing", False, "ClusterTrainingRuntime 'missing' does not exist"),
        ("selector:tuneloop.io/size=huge", False, "no runtime has labels"),
        ("selector:tuneloop.io/size=small", True, "and GPUs"),
    ],
    ids=["name", "selector", "gpu"],
)
def test_no_match_rejects_the_job_and_names_what_exists(wanted, needs_gpu, says):
    with pytest.raises(JobRejectedError) as error:
        select(ALL, wanted, needs_gpu=needs_gpu)
    assert error.value.reason == "RuntimeNotFound"
    assert says in str(error.value)
    assert "cpu, gpu, small" in str(error.value)


def test_a_malformed_selector_is_rejected():
    with pytest.raises(JobRejectedError) as error:
        select(ALL, "selector:justakey", needs_gpu=False)
    assert error.value.reason == "InvalidRuntimeSelector"


class CountingApi:
    """Answers the two list calls the catalog makes, counting them."""

    def __init__(self, items):
        self.items = items
        self.calls = 0

    def list_cluster_custom_object(self, group, version, plural, **kwargs):
        self.calls += 1
        return {"items": list(self.items)}

    def list_namespaced_custom_object(self, group, version, namespace, plural, **kwargs):
        return {"items": []}


async def test_catalog_lists_once_within_its_ttl():
    api = CountingApi([TORCH_DISTRIBUTED])
    clock = FixedClock(datetime(2026, 1, 1, tzinfo=UTC))
    catalog = RuntimeCatalog(api, clock=clock, namespace="ml", ttl=60)
    await catalog.select("torch-distributed")
    await catalog.select("torch-distributed")
    assert api.calls == 1
    clock.set(clock.now() + timedelta(seconds=61))
    await catalog.select("torch-distributed")
    assert api.calls == 2


async def test_catalog_looks_again_for_a_runtime_created_since_the_last_listing():
    api = CountingApi([TORCH_DISTRIBUTED])
    clock = FixedClock(datetime(2026, 1, 1, tzinfo=UTC))
    catalog = RuntimeCatalog(api, clock=clock, ttl=60, min_refresh=2)
    await catalog.runtimes()
    api.items.append(GPU_WITH_INITIALIZERS)
    clock.set(clock.now() + timedelta(seconds=5))
    assert (await catalog.select("lora-gpu")).name == "lora-gpu"
    assert api.calls == 2
