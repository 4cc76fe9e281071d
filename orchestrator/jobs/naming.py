"""Deterministic job names: the same decision always gets the same name.

Called by the rule engine when it resolves a launch. Backends create jobs by name and treat
"already exists" as success, so a replayed or retried launch creates nothing new. The name
comes from the rule, the key and the window that fired (its event ids), not from the rule
version: a hot reload that touches a rule must not relaunch a window that already launched.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

MAX_LENGTH = 33
"""Kubeflow Trainer derives pod and JobSet names from the TrainJob name; 33 leaves room."""
_HASH_LENGTH = 10
_NOT_ALLOWED = re.compile(r"[^a-z0-9-]+")


def job_name(*, rule: str, key: str, window_event_ids: Iterable[str]) -> str:
    """An RFC 1035 label of at most 33 characters, readable and unique per fired window.

    The readable part is as much of `rule` and `key` as fits; the hash suffix covers the full
    rule, key and window, so two windows never share a name even when the readable parts are
    cut to the same text.
    """
    ids = sorted(set(window_event_ids))
    digest = hashlib.sha256("\0".join([rule, key, *ids]).encode()).hexdigest()[:_HASH_LENGTH]
    room = MAX_LENGTH - _HASH_LENGTH - 1
    rule_part = _label(rule)
    key_part = _label(key)
    if key_part:
        rule_room = min(len(rule_part), max(room // 2, room - len(key_part) - 1))
        readable = f"{rule_part[:rule_room].strip('-')}-{key_part}"[:room]
    else:
        readable = rule_part[:room]
    readable = readable.strip("-")
    if not readable or not readable[0].isalpha():
        readable = ("j-" + readable)[:room].strip("-")
    return f"{readable}-{digest}"


def trial_name(*, sweep: str, index: int) -> str:
    """The job of trial *index* of the sweep started as job *sweep*: an RFC 1035 label of at
    most 33 characters, the same for the same sweep and index (a sweep replayed after a crash
    relaunches its trials by the same names, which creates nothing new).

    The readable part is the sweep's (its name without the hash) and `-t<index>`; the hash
    covers the full sweep name and the index.
    """
    digest = hashlib.sha256(f"{sweep}\0trial\0{index}".encode()).hexdigest()[:_HASH_LENGTH]
    suffix = f"-t{index}"
    room = MAX_LENGTH - _HASH_LENGTH - 1 - len(suffix)
    readable = sweep.rsplit("-", 1)[0] if "-" in sweep else sweep
    readable = _label(readable)[:room].strip("-")
    if not readable or not readable[0].isalpha():
        readable = ("j-" + readable)[:room].strip("-")
    return f"{readable}{suffix}-{digest}"


def _label(text: str) -> str:
    return _NOT_ALLOWED.sub("-", text.lower()).strip("-")


def is_valid_job_name(name: str) -> bool:
    """RFC 1035 label, at most MAX_LENGTH characters."""
    return len(name) <= MAX_LENGTH and re.fullmatch(r"[a-z]([a-z0-9-]*[a-z0-9])?", name) is not None
