"""The hand-off to inference, pure: which promoted adapter each serving target should load.

`tuneloop handoff` (`handlers/handoff/`) reads `io.tuneloop.finetune.completed.v1` events
and drives vLLM's runtime LoRA API; every decision it makes is a function here, of the
ledger, the event and the settings, with no I/O and no clock:

    versions.py    completion event -> `Version` (promoted, with a path the server can read)
                   or `Skipped` (not promoted, not a completion); the adapter's served name
    ledger.py      per (target, rule, key) `Slot`: what it serves, what it should serve,
                   every version it was ever asked to serve (so none is loaded twice);
                   `accept` a version, `loaded` / `rejected` after the calls
    steps.py       the calls for one slot: load, check `/v1/models`, one completion as a smoke
                   test, unload the version it replaces; what a refused step means; backoff
    errors.py      `TargetUnavailableError` (retry with backoff) and `AdapterRejectedError`
                   (publish `handoff_failed`, stop) -- what the vLLM client raises
    announcing.py  `io.tuneloop.adapter.served.v1` and `.handoff_failed.v1`

docs/inference.md tells the whole story.
"""
