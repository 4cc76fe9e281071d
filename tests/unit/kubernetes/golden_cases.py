"""The TrainJob builder's golden cases: the shapes we ship, and how each renders.

Shared by the test that compares (`test_manifests.py`) and the command that rewrites the
golden files after an intended change (`python -m tests.unit.kubernetes.update_golden`),
so both always mean the same cases.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.jobs.model import LoraSettings, Resources, TrainingRequest, TrainingSettings
from runtimes.kubernetes import manifests
from runtimes.kubernetes.catalog import RuntimeInfo, runtime_info

GOLDEN = Path(__file__).parent / "golden"
SHIPPED_RUNTIMES = (
    Path(__file__).resolve().parents[3] / "deploy" / "runtimes" / "tuneloop-lora.yaml"
)


def shipped_runtime(name: str) -> RuntimeInfo:
    """ClusterTrainingRuntime *name* of deploy/runtimes, as the catalog reads it from a cluster
    that has it installed (the Kubernetes suites install these files)."""
    (document,) = (
        d for d in yaml.safe_load_all(SHIPPED_RUNTIMES.read_text()) if d["metadata"]["name"] == name
    )
    return runtime_info(document)


TORCH = RuntimeInfo(name="torch-distributed")
WITH_INITIALIZERS = shipped_runtime("tuneloop-lora-hf")
BASIC = TrainingRequest(
    name="ft-drift-model-a-3f9c2e1b",
    rule="retrain-on-drift",
    rule_version="7",
    key="model-a",
    decision_id="retrain-on-drift/model-a/3f9c2e1b",
    causing_event_ids=("evt-1", "evt-2"),
    runtime="torch-distributed",
    base_model="HuggingFaceTB/SmolLM2-135M",
    dataset="file:///data/model-a/rows.jsonl",
    model_id="model-a",
)
CASES = {
    "basic": (BASIC, TORCH, manifests.Settings()),
    "gpu-initializers-deadline": (
        TrainingRequest(
            name="ft-data-model-b-77aa01",
            rule="new-rows",
            rule_version="2",
            key="model b / eu",
            decision_id="new-rows/model b/77aa01",
            causing_event_ids=tuple(f"rows-{i}" for i in range(5)),
            runtime="tuneloop-lora-hf",
            base_model="hf://HuggingFaceTB/SmolLM2-135M",
            dataset="s3://datasets/model-b/",
            lora=LoraSettings(r=8, alpha=16, dropout=0.0, target_modules=("q_proj", "v_proj")),
            training=TrainingSettings(max_steps=200, learning_rate=1e-4, packing=True),
            resources=Resources(nodes=2, gpus_per_node=1, cpu="4", memory="16Gi"),
            output_uri="s3://adapters/model-b/77aa01",
            deadline_seconds=3600,
        ),
        WITH_INITIALIZERS,
        manifests.Settings(image="registry.local/trainer:1.2.3", model_secret="hf-token"),
    ),
    "many-causing-events": (
        TrainingRequest(
            name="ft-many",
            rule="batch",
            rule_version="1",
            key="k",
            decision_id="d",
            causing_event_ids=tuple(f"event-{i:04d}" for i in range(100)),
            runtime="torch-distributed",
            base_model="tiny",
            dataset="file:///d",
        ),
        TORCH,
        manifests.Settings(causing_ids_budget=200),
    ),
}


def render(case: str) -> str:
    """The TrainJob of *case* as the golden file holds it: sorted keys, two-space indent."""
    request, runtime, build_settings = CASES[case]
    built = manifests.build_trainjob(
        request, namespace="ml", runtime=runtime, settings=build_settings
    )
    return json.dumps(built, indent=2, sort_keys=True) + "\n"


def golden_file(case: str) -> Path:
    return GOLDEN / f"{case}.json"
