"""Training jobs as local processes: `LocalProcessBackend` (backend.py) and the supervisor that
records how each trainer ended (supervisor.py)."""

from runtimes.localprocess.backend import LocalProcessBackend

__all__ = ["LocalProcessBackend"]
