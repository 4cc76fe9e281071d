"""Hyperparameter sweeps: one rule firing runs N LoRA trials, the best one goes on.

A rule whose `launch:` has a `sweep:` block (docs/sweeps.md) still decides one launch; the
service starts a sweep for it instead of one job. The sweep is a small state machine, pure
like the rule engine, driven by what the backend observes of its trials:

    spec.py        SweepSpec: objective, parameters, algorithm, limits (frozen values, JSON)
    parameters.py  the launch fields a sweep may vary, and a trial's request from the base one
    state.py       SweepState and Trial: what a sweep remembers, JSON-safe (kept in KeyState)
    suggesting.py  the Suggester port: random and grid here, seeded; TPE (optuna) in runtimes/
    stopping.py    the median rule: is a running trial behind the completed ones?
    machine.py     start / progress / finished / tick -> (state', actions)
    driving.py     what the service calls: observations in, launches, cancels and the end out
    announcing.py  `io.tuneloop.finetune.sweep.completed.v1`

Nothing here does I/O, reads a clock or draws an unseeded random number: given the same
state and input, the same trials with the same names and parameters come out, which is what
makes a sweep replayed after a crash launch nothing twice.
"""
