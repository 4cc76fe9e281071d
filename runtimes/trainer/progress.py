"""How a run tells the world how it is doing: JSON lines for machines, a bar for people.

`training.py` calls `Reporter.emit(event, **fields)`. Off a terminal every event is one JSON
object per line on stdout (`{"event": "progress", "step": 3, ...}`); the local-process backend
parses these lines into `Observation`s and Kubernetes keeps them in the pod log. On a terminal
the progress events draw a single-line bar on stderr (step, loss, tokens/s, ETA) and other
events print one readable line. Only rank 0 reports.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Protocol, TextIO

from runtimes.trainer.config import ProgressMode


class Reporter(Protocol):
    def emit(self, event: str, /, **fields: Any) -> None: ...


class JsonLinesReporter:
    """One JSON object per line; progress lines throttled to *interval* seconds."""

    def __init__(self, stream: TextIO, *, interval: float = 1.0) -> None:
        self._stream = stream
        self._interval = interval
        self._last_progress = float("-inf")

    def emit(self, event: str, /, **fields: Any) -> None:
        if event == "progress" and not fields.get("final"):
            now = time.monotonic()
            if now - self._last_progress < self._interval:
                return
            self._last_progress = now
        self._stream.write(json.dumps({"event": event, **fields}, default=str) + "\n")
        self._stream.flush()


class BarReporter:
    """A redrawn progress bar for a terminal."""

    def __init__(self, stream: TextIO, *, width: int = 28) -> None:
        self._stream = stream
        self._width = width
        self._drawn = False

    def emit(self, event: str, /, **fields: Any) -> None:
        if event == "progress":
            self._draw(fields)
            return
        if self._drawn:
            self._stream.write("\n")
            self._drawn = False
        details = " ".join(f"{k}={_short(v)}" for k, v in fields.items() if v is not None)
        self._stream.write(f"[train] {event} {details}\n")
        self._stream.flush()

    def _draw(self, fields: dict[str, Any]) -> None:
        step, total = int(fields.get("step", 0)), max(1, int(fields.get("total_steps", 1)))
        done = min(self._width, self._width * step // total)
        bar = "#" * done + "." * (self._width - done)
        loss = fields.get("loss")
        rate = fields.get("tokens_per_second")
        eta = fields.get("eta_seconds")
        parts = [f"\r[{bar}] {step}/{total}"]
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        if rate is not None:
            parts.append(f"{rate:,.0f} tok/s")
        if eta is not None:
            parts.append(f"ETA {int(eta) // 60}:{int(eta) % 60:02d}")
        self._stream.write("  ".join(parts) + "   ")
        self._stream.flush()
        self._drawn = True


class SilentReporter:
    def emit(self, event: str, /, **fields: Any) -> None:
        return None


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def make_reporter(mode: ProgressMode, *, interval: float, is_main: bool) -> Reporter:
    """The reporter for *mode* (`auto`: a bar on a terminal, JSON lines otherwise)."""
    if not is_main or mode is ProgressMode.NONE:
        return SilentReporter()
    if mode is ProgressMode.BAR or (mode is ProgressMode.AUTO and sys.stderr.isatty()):
        return BarReporter(sys.stderr)
    return JsonLinesReporter(sys.stdout, interval=interval)
