"""Fault suite 6, injection: event data crafted to steer the TrainJob, on the real API server.

Producers control event data; rule authors control what of it reaches a launch through
`${ CEL }` templates. This suite sends events whose data tries to change the TrainJob's name,
image, command, runtime, labels or trainer arguments (quotes, `${`, newlines, `--flag`
values, 10 kB strings, path traversal in URIs). Each event passes the intake's checks
(`handlers.intake.admit`, the same function the worker calls), then the orchestrator decides
and the real `KubernetesBackend` creates the TrainJob on the local API server. The suite then
reads the created objects back and asserts that every crafted value is carried only as inert
data (an exact annotation, a hashed label, one argv item the trainer reads back verbatim), or
that the event was refused with a reason (an `error` decision or a dead letter).

The broker is not involved: what reaches the backend depends only on admit → decide →
build; the broker path is covered by the other fault suites.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from handlers.codec import encode_event
from handlers.intake import admit
from orchestrator.clock import FixedClock
from orchestrator.errors import InvalidEventError
from orchestrator.events import CloudEvent
from orchestrator.ledger import Outcome
from orchestrator.rules.parsing import Source, parse_files
from orchestrator.rules.state import KeyState
from orchestrator.service import Orchestrator
from orchestrator.testing import InMemoryCompletionStore, RecordingPublisher
from orchestrator.vocabulary.registry import SchemaRegistry
from runtimes.kubernetes import manifests
from runtimes.kubernetes.backend import BackendSettings, KubernetesBackend
from runtimes.kubernetes.catalog import GROUP, VERSION
from runtimes.trainer.config import load as load_trainer_config

pytestmark = [pytest.mark.kubernetes, pytest.mark.timeout(120)]

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DATA_TYPE = "io.tuneloop.data.arrived.v1"
DATASET_PREFIX = "file:///data/"
RFC1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

# Three rules: one builds paths from producer text under fixed prefixes, one takes the
# producer's URI whole, one lets the producer name the runtime, which the allowlist polices.
RULES = """
runtimes: [torch-distributed]
rules:
  - name: data-retrain
    on:
      type: io.tuneloop.data.arrived.v1
      where: "!has(event.data.format)"
    key: "event.data.dataset_id"
    count: 1
    launch:
      runtime: torch-distributed
      base_model: "${ has(event.data.model_id) ? event.data.model_id : 'tiny' }"
      dataset: "file:///data/${ key }.jsonl"
      output_uri: "file:///adapters/${ key }"
  - name: data-by-uri
    on:
      type: io.tuneloop.data.arrived.v1
      where: "has(event.data.format) && event.data.format == 'uri'"
    key: "event.data.dataset_id"
    count: 1
    launch:
      runtime: torch-distributed
      base_model: tiny
      dataset: "${ event.data.uri }"
  - name: data-runtime
    on:
      type: io.tuneloop.data.arrived.v1
      where: "has(event.data.format) && event.data.format == 'runtime'"
    key: "event.data.dataset_id"
    count: 1
    launch:
      runtime: "${ event.data.model_id }"
      base_model: tiny
      dataset: "file:///data/${ key }.jsonl"
"""

HOSTILE_TEXTS = (
    'quote"d',
    "single'quote",
    "${ 1 + 1 }",
    "${event.data.uri}",
    "line\nbreak: injected",
    "carriage\r\nreturn",
    "--output-dir=/etc",
    "--output-dir",
    "-x",
    "; rm -rf / #",
    "$(touch /tmp/pwned)",
    "`id`",
    "a" * 10_240,
    "../../etc/passwd",
    "ünïcode ✓",
    "tab\there",
    "{{ .Values.image }}",
    "image: evil/registry:latest",
)

HOSTILE_URIS = (
    "file:///data/../../etc/shadow",
    "file:///data/%2e%2e/%2e%2e/etc/shadow",
    "s3://bucket/../../other-bucket/x",
    "hf://org/../../etc/passwd",
    "--dataset=/etc/passwd",
    'file:///data/x.jsonl" --output-dir /etc "',
    "file:///data/x.jsonl\n--base-model\nevil",
    "file:///data/" + "d" * 10_240,
    "${ event.data.model_id }",
)


@dataclass(frozen=True, slots=True)
class EventFate:
    """What became of one crafted event."""

    event: CloudEvent
    refused: str | None
    """The dead-letter code or the error decision's message; None when a job was made."""
    job_names: tuple[str, ...]


class DictStates:
    """`KeyStateStore` in a dict: the rule state is not what this suite is about."""

    def __init__(self) -> None:
        self.states: dict[str, KeyState] = {}

    def load(self, key: str) -> KeyState | None:
        return self.states.get(key)

    def save(self, key: str, state: KeyState) -> None:
        self.states[key] = state


def arrival(n: int, **data: Any) -> CloudEvent:
    body: dict[str, Any] = {"dataset_id": f"ds-{n}", "uri": f"file:///data/ds-{n}.jsonl"}
    body["rows"] = 10
    body.update(data)
    return CloudEvent(
        id=f"inject-{n}",
        source="/producers/untrusted",
        type=DATA_TYPE,
        time=NOW - timedelta(minutes=5),
        datacontenttype="application/json",
        data=body,
        subject=f"s-{n}",
    )


def crafted_events() -> list[CloudEvent]:
    events: list[CloudEvent] = []
    for text in HOSTILE_TEXTS:
        n = len(events)
        events.append(arrival(n, dataset_id=text))  # key → name, labels, output URI
        events.append(arrival(n + 1, model_id=text))  # base model → argv, annotation
        events.append(arrival(n + 2, model_id=text, format="runtime"))  # runtime
    for uri in HOSTILE_URIS:
        events.append(arrival(len(events), uri=uri, format="uri"))
    return events


async def submit(
    orchestrator: Orchestrator, registry: SchemaRegistry, event: CloudEvent
) -> EventFate:
    record = encode_event(event)
    try:
        admit(
            record,
            arrived_at=NOW,
            now=NOW,
            registry=registry,
            accepts_unknown_type=lambda _type: False,
            max_event_bytes=1_048_576,
            max_age=timedelta(days=1),
        )
    except InvalidEventError as exc:
        return EventFate(event, f"dead-letter {exc.code}: {exc.message}", ())
    refusals: list[str] = []
    jobs: list[str] = []
    for key in await orchestrator.keys_for(event):
        for decision in await orchestrator.handle(key, event, arrived_at=NOW):
            if decision.outcome is Outcome.ERROR:
                refusals.append(decision.message)
            elif decision.outcome is Outcome.LAUNCH and decision.job is not None:
                jobs.append(decision.job.name)
    if not jobs and not refusals:
        # a rule that could not route the event leaves its error in the audit only
        refusals.append("no rule routed the event")
    return EventFate(event, "; ".join(refusals) or None, tuple(jobs))


def trainjobs(api: client.CustomObjectsApi, namespace: str) -> dict[str, dict[str, Any]]:
    listing: Any = api.list_namespaced_custom_object(GROUP, VERSION, namespace, manifests.PLURAL)
    return {item["metadata"]["name"]: item for item in listing["items"]}


def assert_inert(job: dict[str, Any], event: CloudEvent) -> None:
    """The TrainJob of *event* carries the producer's text only as data."""
    data = event.data
    assert isinstance(data, dict)
    metadata, spec = job["metadata"], job["spec"]
    # the name is derived from the decision: an RFC 1035 label that no text can stretch
    assert RFC1035_LABEL.match(metadata["name"])
    assert len(metadata["name"]) <= manifests.MAX_NAME_LENGTH
    # labels are label-safe; the exact values live in annotations
    for value in metadata["labels"].values():
        assert LABEL_VALUE.match(value), value
        assert len(value) <= 63, value
    assert metadata["labels"][manifests.MANAGED_BY_LABEL] == manifests.MANAGED_BY
    annotations = metadata["annotations"]
    # the rule named no runtime from data: producer text never replaces the allowlisted one
    assert annotations[manifests.RUNTIME].endswith("torch-distributed")
    assert spec["runtimeRef"]["name"] == "torch-distributed"
    # image and command come only from the deployment's settings, never from an event
    trainer = spec["trainer"]
    defaults = manifests.Settings()
    assert trainer.get("image", defaults.image) == defaults.image
    assert tuple(trainer.get("command", defaults.command)) == defaults.command
    # the trainer reads its argv back as exactly the values the templates produced
    config = load_trainer_config(trainer["args"], {})
    assert annotations[manifests.KEY] == data["dataset_id"]
    assert json.loads(annotations[manifests.CAUSING_EVENT_IDS]) == [event.id]
    if data.get("format") == "uri":
        assert config.dataset == data["uri"]
        assert annotations[manifests.DATASET] == data["uri"]
        assert config.base_model == "tiny"
    else:
        dataset = f"{DATASET_PREFIX}{data['dataset_id']}.jsonl"
        assert config.dataset == dataset
        assert annotations[manifests.DATASET] == dataset
        assert config.base_model == data.get("model_id", "tiny")
        assert annotations[manifests.BASE_MODEL] == data.get("model_id", "tiny")
        assert annotations[manifests.OUTPUT_URI] == f"file:///adapters/{data['dataset_id']}"
    # nothing the producer wrote reached env names or values other than the decision id
    for item in trainer.get("env", []):
        assert item["name"].startswith("TUNELOOP_")


def escapes_prefix(uri: str) -> bool:
    """True when *uri* names a path outside the directory it starts in."""
    from posixpath import normpath
    from urllib.parse import unquote

    for prefix in ("file:///data/", "file:///adapters/", "s3://bucket/", "hf://org/"):
        if uri.startswith(prefix):
            inside = prefix.split("//", 1)[1]
            path = normpath(unquote(uri.split("//", 1)[1]))
            return not path.startswith(inside)
    return False


async def test_crafted_event_data_reaches_the_trainjob_only_as_inert_data_or_is_refused(
    kube_api: Any, k8s_namespace: str
) -> None:
    rules = parse_files([Source("rules.yaml", RULES)])
    clock = FixedClock(NOW)
    registry = SchemaRegistry.builtin()
    with kube_api.api_client() as api_client:
        api = client.CustomObjectsApi(api_client)
        backend = KubernetesBackend(
            api,
            clock=clock,
            settings=BackendSettings(namespace=k8s_namespace, request_timeout=10.0),
        )
        orchestrator = Orchestrator(
            rules=rules,
            backend=backend,
            publisher=RecordingPublisher(),
            states=DictStates(),
            completions=InMemoryCompletionStore(),
            clock=clock,
            audit_topic="audit",
            output_topic="out",
        )
        events = crafted_events()
        outcomes = [await submit(orchestrator, registry, event) for event in events]
        created = trainjobs(api, k8s_namespace)

    made = [o for o in outcomes if o.refused is None]
    refused = [o for o in outcomes if o.refused is not None]
    names = [name for o in made for name in o.job_names]
    print(
        f"\ninjection: events sent={len(events)} jobs expected={len(names)} "
        f"TrainJobs created={len(created)} refused with reason={len(refused)} "
        f"duplicates={len(names) - len(set(names))} lost={len(set(names) - set(created))}"
    )
    assert len(names) == len(set(names)), "two decisions share a job name"
    assert set(names) == set(created), "a launch decision has no TrainJob, or one is extra"
    for outcome in made:
        (name,) = outcome.job_names
        assert_inert(created[name], outcome.event)
    for outcome in refused:
        assert str(outcome.refused).strip(), outcome.event.id
    by_id = {o.event.id: o for o in outcomes}
    escaped = []
    for event in events:
        data = event.data
        assert isinstance(data, dict)
        outcome = by_id[event.id]
        if data.get("format") == "runtime":
            # a runtime named by a producer must be in the rule file's allowlist
            assert outcome.refused is not None, data["model_id"][:60]
            assert "runtime" in outcome.refused
        if outcome.refused is None:
            annotations = created[outcome.job_names[0]]["metadata"]["annotations"]
            for where in (annotations[manifests.DATASET], annotations[manifests.OUTPUT_URI]):
                if escapes_prefix(where):
                    escaped.append(where[:80])
        elif ".." in str(data["dataset_id"]) + str(data["uri"]):
            assert "'..' path segment" in outcome.refused, outcome.refused
    # a key the rule author put under a directory must not name a file outside it
    assert not escaped, f"dataset paths left the rule's directory: {escaped}"
