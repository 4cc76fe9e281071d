"""What `tuneloop demo` shows of MLflow: where the job's run is, and the registered version.

Over MLflow's REST API: the run is found by the `tuneloop.job` tag the trainer sets, and the
version made from it tells whether the alias `champion` names it (docs/tracking.md). Called
by `handlers/demo.py` once the job has completed (step 6).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class TrackedRun:
    """Where MLflow keeps one job: its run, and the registered version made from it."""

    url: str
    """The run's page in MLflow's UI."""
    model: str | None
    """The registered model, `tuneloop.<rule>.<key>`; None when no version came of the run."""
    version: str | None
    champion: bool
    """Whether the alias `champion` names this version."""


def tracked_run(
    tracking_uri: str, *, rule: str, job: str, wait_for_champion: float = 0.0
) -> TrackedRun | None:
    """The job's run in MLflow, or None when the server has no run of it.

    Args:
        wait_for_champion: seconds to wait for the alias to reach the version (the worker
            moves it when it promotes, which may be a moment after the completion).
    """
    deadline = time.monotonic() + wait_for_champion
    with httpx.Client(base_url=tracking_uri.rstrip("/"), timeout=10.0) as http:
        experiment = _get(http, "experiments/get-by-name", experiment_name=f"tuneloop/{rule}")
        if experiment is None:
            return None
        experiment_id = str(experiment["experiment"]["experiment_id"])
        found = _post(
            http,
            "runs/search",
            experiment_ids=[experiment_id],
            filter=f"tags.`tuneloop.job` = '{job}'",
            max_results=1,
        )
        runs = (found or {}).get("runs", [])
        if not runs:
            return None
        run_id = str(runs[0]["info"]["run_id"])
        url = f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
        versions = (_get(http, "model-versions/search", filter=f"run_id = '{run_id}'") or {}).get(
            "model_versions", []
        )
        if not versions:
            return TrackedRun(url=url, model=None, version=None, champion=False)
        name, number = str(versions[0]["name"]), str(versions[0]["version"])
        while True:
            # A search leaves a version's aliases out; a get fills them in.
            version = _get(http, "model-versions/get", name=name, version=number) or {}
            champion = "champion" in version.get("model_version", {}).get("aliases", [])
            if champion or time.monotonic() > deadline:
                return TrackedRun(url=url, model=name, version=number, champion=champion)
            time.sleep(0.5)


def _get(http: httpx.Client, path: str, **params: str) -> dict[str, Any] | None:
    response = http.get(f"/api/2.0/mlflow/{path}", params=params)
    return _body(response)


def _post(http: httpx.Client, path: str, **body: Any) -> dict[str, Any] | None:
    return _body(http.post(f"/api/2.0/mlflow/{path}", json=body))


def _body(response: httpx.Response) -> dict[str, Any] | None:
    """The answer's JSON; None for a 404 (no such experiment). Other errors raise."""
    if response.status_code == 404:
        return None
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body
