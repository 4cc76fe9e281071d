"""Which completion events the hand-off serves, under which name, from which path."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.events import CloudEvent
from orchestrator.handoff.versions import (
    Skipped,
    SkipReason,
    Version,
    serving_path,
    targets_for,
    version_of,
)

JOB = "reverse-words-chat-3f9a1c2b7d"


def completed(**data: Any) -> CloudEvent:
    base = {
        "job": JOB,
        "phase": "Succeeded",
        "rule": "reverse-words",
        "key": "chat",
        "model": "chat-model",
        "decision_id": "d-1",
        "adapter_uri": f"file:///var/adapters/{JOB}/adapter",
        "metrics": {},
        "promoted": True,
    }
    base.update(data)
    return CloudEvent(
        id=f"{JOB}.completed",
        source="/tuneloop/orchestrator",
        type="io.tuneloop.finetune.completed.v1",
        data={key: value for key, value in base.items() if value is not ...},
    )


def test_a_promoted_completion_is_a_version_named_after_its_job():
    assert version_of(completed(), paths={}) == Version(
        lora_name=JOB,
        job=JOB,
        rule="reverse-words",
        key="chat",
        model="chat-model",
        adapter_uri=f"file:///var/adapters/{JOB}/adapter",
        lora_path=f"/var/adapters/{JOB}/adapter",
        completion_id=f"{JOB}.completed",
        decision_id="d-1",
    )


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (completed(promoted=False), SkipReason.NOT_PROMOTED),
        (completed(promoted=...), SkipReason.NOT_PROMOTED),
        (completed(promoted="true"), SkipReason.NOT_PROMOTED),
        (
            CloudEvent(id="x", source="/s", type="io.tuneloop.finetune.failed.v1", data={}),
            SkipReason.NOT_A_COMPLETION,
        ),
        (
            CloudEvent(id="y", source="/s", type="io.tuneloop.adapter.served.v1", data={}),
            SkipReason.NOT_A_COMPLETION,
        ),
    ],
    ids=[
        "promoted false",
        "no promoted field",
        "promoted as a string is not true",
        "a failed job",
        "the hand-off's own event",
    ],
)
def test_what_is_not_a_promoted_completion_is_skipped(event, reason):
    skipped = version_of(event, paths={})

    assert isinstance(skipped, Skipped)
    assert skipped.reason is reason


def test_a_completion_without_a_model_uses_its_key_as_the_model():
    version = version_of(completed(model=None), paths={})

    assert isinstance(version, Version)
    assert version.model == "chat"


def test_a_promoted_completion_without_an_adapter_is_a_version_with_no_path():
    version = version_of(completed(adapter_uri=None), paths={})

    assert isinstance(version, Version)
    assert (version.adapter_uri, version.lora_path) == (None, None)


PATHS = {
    "s3://adapters/": "/mnt/adapters/",
    "s3://adapters/team-b/": "/mnt/team-b/",
}


@pytest.mark.parametrize(
    ("uri", "paths", "path"),
    [
        (f"file:///data/jobs/{JOB}/adapter", {}, f"/data/jobs/{JOB}/adapter"),
        (f"/data/jobs/{JOB}/adapter/", {}, f"/data/jobs/{JOB}/adapter"),
        (f"file:///data/out/{JOB}", {}, f"/data/out/{JOB}/adapter"),
        (f"file:///data/out/{JOB}/", {}, f"/data/out/{JOB}/adapter"),
        (f"file://localhost/data/my%20adapters/{JOB}", {}, f"/data/my adapters/{JOB}/adapter"),
        (f"s3://adapters/{JOB}", PATHS, f"/mnt/adapters/{JOB}/adapter"),
        (f"s3://adapters/team-b/{JOB}", PATHS, f"/mnt/team-b/{JOB}/adapter"),
        (f"s3://adapters/{JOB}", {}, None),
        (f"s3://other-bucket/{JOB}", PATHS, None),
        (f"file://fileserver/data/{JOB}", {}, None),
        (f"relative/{JOB}", {}, None),
    ],
    ids=[
        "a local run names its adapter folder",
        "a trailing slash is dropped",
        "a published folder holds the adapter in adapter/",
        "a published folder with a trailing slash",
        "percent-escapes are decoded, localhost is this host",
        "a mapped prefix",
        "the longest mapped prefix wins",
        "s3 without a mapping reaches no server",
        "an unmapped bucket reaches no server",
        "a file URI on another host reaches no server",
        "a relative path reaches no server",
    ],
)
def test_the_path_a_server_reads_comes_from_the_uri_and_the_path_map(uri, paths, path):
    assert serving_path(uri, job=JOB, paths=paths) == path


def test_a_model_without_its_own_targets_gets_the_wildcard_ones():
    targets = {"chat-model": ("http://a:8000",), "*": ("http://b:8000", "http://c:8000")}

    assert targets_for(targets, "chat-model") == ("http://a:8000",)
    assert targets_for(targets, "other") == ("http://b:8000", "http://c:8000")
    assert targets_for({"chat-model": ("http://a:8000",)}, "other") == ()


def test_a_version_survives_its_json_form():
    version = version_of(completed(), paths={})
    assert isinstance(version, Version)

    assert Version.from_json(version.to_json()) == version
