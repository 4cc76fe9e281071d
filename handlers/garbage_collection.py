"""How a worker process sets Python's cyclic garbage collector: once, just before its event
loop starts (`handlers/app.py`, `run_worker`).

What it costs otherwise: a worker of ~170,000 live objects (its imports, rules, App and
tables) spent 8 % of its CPU in the collector at a backlog of keyed events, 1.35 s of 16.4 s
for ~32,000 events, most of it in 13 full collections of ~65 ms each, which walk every
live object; each full collection is also a 65 ms stall of every partition lane
(a `gc.callbacks` probe in `make bench`'s worker run).

Two settings, measured together (the same probe; 2-core machine): the collector's share fell
from 1.35 s to 0.46 s of the worker's ~16 s of CPU, with 2 full collections of ~25 ms
instead of 13 of ~65 ms. Worker CPU per keyed event (`python -m bench --only worker`, a
noisy figure on this machine) was 452-522 µs in four runs before and 457-474 µs in two runs
after.

- **Freeze what the start built** (`gc.freeze`): the objects alive before the loop starts
  (modules, classes, the compiled rules, the App) are moved to a permanent generation that no
  collection walks. They are still freed by reference counting; only a cycle among them that
  became garbage later would stay (none is expected of objects that live as long as the
  process).
- **A larger young generation**: a young collection every `YOUNG_OBJECTS` new container
  objects instead of every 700. Most of an event's objects die young by reference counting;
  the survivors of fewer collections reach the older generations, so the full collections
  that walk everything come rarely. The price is at most that many objects of cyclic garbage
  waiting a little longer, and a young collection of ~1.2 ms instead of ~0.2 ms.
"""

from __future__ import annotations

import gc

YOUNG_OBJECTS = 10_000
"""Allocations of container objects, less deallocations, between young collections (700 by
default)."""

YOUNG_COLLECTIONS_PER_MIDDLE = 20
"""Young collections between collections of the middle generation (10 by default)."""

MIDDLE_COLLECTIONS_PER_FULL = 10
"""Middle collections before a full one is considered (Python's default); a full one also
waits until the survivors since the last reach a quarter of the old generation."""


def settle_before_serving() -> None:
    """Freeze every object alive now and space the collections out (module docstring). Call
    once, when the process has built what it serves with and before it serves."""
    gc.collect()  # what the start left as garbage is not frozen with the rest
    gc.freeze()
    gc.set_threshold(YOUNG_OBJECTS, YOUNG_COLLECTIONS_PER_MIDDLE, MIDDLE_COLLECTIONS_PER_FULL)
