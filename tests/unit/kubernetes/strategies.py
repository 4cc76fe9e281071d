"""Hypothesis strategies for launch specs (`TrainingRequest`) and runtimes, shared by the
builder's unit tests and the real-schema integration test."""

from __future__ import annotations

from hypothesis import strategies as st

from orchestrator.jobs.model import LoraSettings, Resources, TrainingRequest, TrainingSettings
from runtimes.kubernetes.catalog import CLUSTER_KIND, RuntimeInfo

job_names = st.from_regex(r"\A[a-z]([-a-z0-9]{0,31}[a-z0-9])?\Z")
# Event text as producers send it: anything printable, quotes and shell metacharacters included.
free_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=80
)
uris = st.one_of(
    st.builds(lambda p: f"hf://{p}", st.from_regex(r"\A[a-z]{1,10}/[a-z0-9-]{1,20}\Z")),
    st.builds(lambda p: f"s3://bucket/{p}", st.from_regex(r"\A[a-z0-9/]{1,30}\Z")),
    st.builds(lambda p: f"file:///data/{p}.jsonl", st.from_regex(r"\A[a-z0-9]{1,12}\Z")),
    free_text,
)
quantities = st.one_of(st.none(), st.sampled_from(["500m", "1", "4", "16"]))
memories = st.one_of(st.none(), st.sampled_from(["512Mi", "8Gi", "32Gi"]))

requests = st.builds(
    TrainingRequest,
    name=job_names,
    rule=free_text,
    rule_version=st.one_of(st.just("1"), free_text),
    key=free_text,
    decision_id=free_text,
    causing_event_ids=st.lists(free_text, max_size=40).map(tuple),
    runtime=st.just("torch-distributed"),
    base_model=uris,
    dataset=uris,
    lora=st.builds(
        LoraSettings,
        r=st.integers(1, 256),
        alpha=st.integers(1, 512),
        dropout=st.floats(0, 0.5),
        target_modules=st.one_of(
            st.none(),
            st.lists(st.sampled_from(["q_proj", "v_proj", "k_proj"]), min_size=1).map(tuple),
        ),
    ),
    training=st.builds(
        TrainingSettings,
        epochs=st.floats(0.1, 10),
        learning_rate=st.floats(1e-6, 1e-2),
        max_steps=st.one_of(st.none(), st.integers(1, 10_000)),
        batch_size=st.integers(1, 64),
        packing=st.booleans(),
    ),
    resources=st.builds(
        Resources,
        nodes=st.integers(1, 4),
        gpus_per_node=st.integers(0, 8),
        cpu=quantities,
        memory=memories,
    ),
    output_uri=st.one_of(st.none(), st.just("s3://adapters/out")),
    deadline_seconds=st.one_of(st.none(), st.integers(1, 86_400)),
    model_id=st.one_of(st.none(), free_text),
)

runtimes = st.builds(
    RuntimeInfo,
    name=st.just("torch-distributed"),
    kind=st.just(CLUSTER_KIND),
    replicated_jobs=st.just(("node",)),
    has_dataset_initializer=st.booleans(),
    has_model_initializer=st.booleans(),
)
