"""What tuneloop's runs, experiments, registered models and tags are called in MLflow.

Pure: no I/O. Used by the trainer's run (`runs.py`), the champion store (`champions.py`) and
the tests, which read the server back by these names.

- one experiment per rule: `tuneloop/<rule>`;
- one registered model per rule and key: `tuneloop.<rule>.<key>` (see `registered_model_name`);
- the alias `champion` on the version whose adapter is the champion;
- tags `tuneloop.*` on runs, registered models and versions, holding the exact values.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence

EXPERIMENT_PREFIX = "tuneloop/"
MODEL_PREFIX = "tuneloop."
CHAMPION_ALIAS = "champion"

TAG_JOB = "tuneloop.job"
TAG_RULE = "tuneloop.rule"
TAG_RULE_VERSION = "tuneloop.rule_version"
TAG_KEY = "tuneloop.key"
TAG_DECISION_ID = "tuneloop.decision_id"
TAG_CAUSING_EVENT_IDS = "tuneloop.causing_event_ids"
TAG_CAUSING_EVENT_IDS_OMITTED = "tuneloop.causing_event_ids_omitted"
TAG_BASE_MODEL = "tuneloop.base_model"
TAG_DATASET = "tuneloop.dataset"
TAG_ADAPTER_URI = "tuneloop.adapter_uri"
"""Where the adapter was published (a path, `file://` or `s3://`): what the champion lookup
returns, since a model version's `source` may be a copy on the tracking server."""
TAG_ARTIFACTS = "tuneloop.artifacts"
"""`uploaded` when the adapter's files are the run's artifacts under `adapter/`, else why not."""
TAG_WARNINGS = "tuneloop.tracking_warnings"
"""What the trainer could not track (steps skipped while the server was away)."""
TAG_SWEEP = "tuneloop.sweep"
"""On a sweep's parent run: the sweep's name (the launch decision's job name)."""
TAG_SWEEP_DECISION_ID = "tuneloop.sweep_decision_id"
"""On a sweep's parent run: the decision id of the launch that started the sweep. Every trial
of a sweep carries that decision id, so a trial's run finds its parent by it."""
TAG_PARENT_RUN = "mlflow.parentRunId"
"""MLflow's own tag making a run the child of another (its UI nests the trials under it)."""
TAG_SCORE_PREFIX = "tuneloop.score."
"""A promoted version's scores, as the gate saw them: `tuneloop.score.eval_loss`."""

MAX_NAME_LENGTH = 200
"""Registered model names are stored in a column of 256 characters; leave room for a hash."""
MAX_TAG_VALUE = 8000
"""MLflow's limit on a run tag's value (`MAX_TAG_VAL_LENGTH`); longer values are cut."""

_RULE_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
"""What `orchestrator/rules/parsing.py` accepts: no dot, so the first dot ends the rule."""
_KEY_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_HASH_LENGTH = 10


def experiment_name(rule: str) -> str:
    """The experiment a rule's runs go to: `tuneloop/<rule>` (any text is a valid name)."""
    return f"{EXPERIMENT_PREFIX}{rule}"


def registered_model_name(rule: str, key: str) -> str:
    """The registered model of *rule* and *key*, one to one.

    `tuneloop.<rule>.<key>` when both are plain: a rule name has no dot, so the first dot
    after the prefix ends it, and a key of letters, digits, `_`, `.` and `-` is kept as is.
    Anything else (a key with `/` or `:`, which MLflow refuses in names, or spaces, or an
    overlong name) is cleaned to those characters and suffixed with a hash of the exact rule
    and key, so two different pairs never share a model; the exact values are tags of the
    model (`tuneloop.rule`, `tuneloop.key`). The hash is set off by `~`, which a readable
    name never contains, so a hashed name never equals a readable one.
    """
    plain_rule = bool(_RULE_NAME.match(rule))
    plain_key = key == "" or _KEY_SAFE.match(key) is not None
    readable = f"{MODEL_PREFIX}{rule}" + (f".{key}" if key else "")
    if plain_rule and plain_key and len(readable) <= MAX_NAME_LENGTH:
        return readable
    digest = hashlib.sha256(json.dumps([rule, key]).encode()).hexdigest()[:_HASH_LENGTH]
    cleaned = f"{MODEL_PREFIX}{_clean(rule)}" + (f".{_clean(key)}" if _clean(key) else "")
    room = MAX_NAME_LENGTH - _HASH_LENGTH - 1
    return f"{cleaned[:room].rstrip('.')}~{digest}"


def _clean(text: str) -> str:
    return _UNSAFE.sub("-", text).strip("-.")


def causing_ids_tags(event_ids: Sequence[str]) -> dict[str, str]:
    """The causing event ids as a JSON list tag, the newest kept where they exceed a tag's
    limit, and how many were left out (as the TrainJob's annotation does)."""
    kept = list(event_ids)
    while kept and len(json.dumps(kept)) > MAX_TAG_VALUE:
        kept.pop(0)
    tags = {TAG_CAUSING_EVENT_IDS: json.dumps(kept)}
    if len(kept) < len(event_ids):
        tags[TAG_CAUSING_EVENT_IDS_OMITTED] = str(len(event_ids) - len(kept))
    return tags
