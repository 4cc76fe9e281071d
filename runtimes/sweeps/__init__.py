"""Sweep suggesters that need a library: TPE through optuna (`optuna_tpe.py`).

The core's `Suggester` port and its pure suggesters are in `orchestrator/sweeps/`; the
composition root (`handlers/app.py`) adds these.
"""
