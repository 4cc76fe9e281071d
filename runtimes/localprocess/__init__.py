"""Training jobs as local processes: `LocalProcessBackend` (backend.py) and the supervisor that
records how each trainer ended (supervisor.py).

Nothing is imported here, so that `python -m runtimes.localprocess.supervisor` starts without
loading the backend first.
"""
