"""MLflow tracking of training jobs and the champion in MLflow's registry (docs/tracking.md).

    context.trainer_environment(request, uri)   what a backend gives the trainer to track
    reporting.tracked(reporter, environ, ...)   the trainer's events, also logged as a run
    champions.MlflowChampionStore(settings)     `ChampionStore` on the alias `champion`
    naming.registered_model_name(rule, key)     the names and tags runs and models carry

Spoken over MLflow's REST API with the standard library (`client.py` says why); only the
tests' server (`devservices/mlflow_server.py`) installs MLflow itself. Nothing here imports
torch or transformers: the worker imports the champion store.
"""

from runtimes.tracking.context import (
    RUN_CONTEXT_VARIABLE,
    TRACKING_URI_VARIABLE,
    RunContext,
    trainer_environment,
)
from runtimes.tracking.errors import TrackingError, TrackingRequestError, TrackingUnavailableError
from runtimes.tracking.settings import TrackingSettings

__all__ = [
    "RUN_CONTEXT_VARIABLE",
    "TRACKING_URI_VARIABLE",
    "RunContext",
    "TrackingError",
    "TrackingRequestError",
    "TrackingSettings",
    "TrackingUnavailableError",
    "trainer_environment",
]
