"""Footprint: the orchestrator's cold start and memory, and the memory of one tracked key.

Rows (each a ratio to a baseline measured in the same run on the same machine):

- cold start: a fresh `python` process that builds a worker (`handlers.app.build_worker`, the
  local backend, one rule file) and runs it until its consumer has partitions assigned and
  table recovery is done ("worker ready"), against a fresh `python -c "import faust"`. Time
  from process start to ready, and the process's RSS at that moment. The Kafka broker is the
  local one (`devservices`, or `TUNELOOP_KAFKA_BOOTSTRAP`), started before timing.
- memory per tracked key: 100k keys, each with the state one counted event leaves (a window
  of one entry), kept as the worker keeps them (`KeyState.to_json()` values in a dict, which
  is what faust's in-memory Table holds), against a bare dict of the same keys. Both the RSS
  growth of a fresh process per byte of key and the serialized (JSON) size of one state.

Each side runs in its own fresh process so that allocator reuse does not flatter either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEYS = 100_000
QUICK_KEYS = 20_000

_READY_SCRIPT = """
import asyncio, sys, time
from pathlib import Path

from faust.contrib.asgi import faust_app_running

from handlers.app import build_worker, make_backend
from orchestrator.clock import SystemClock
from orchestrator.settings import KafkaSettings, Settings, WorkerSettings

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

async def main(bootstrap, workdir, tag):
    rules = Path(workdir) / "rules.yaml"
    rules.write_text(RULES)
    clock = SystemClock()
    settings = Settings(kafka=KafkaSettings(
        bootstrap=bootstrap, topics_in=(f"fp-in-{tag}",), topic_out=f"fp-out-{tag}",
        topic_audit=f"fp-audit-{tag}", topic_dlq=f"fp-dlq-{tag}", group_id=f"fp-{tag}",
        internal_partitions=2), worker=WorkerSettings(local_root=Path(workdir) / "jobs"))
    backend = make_backend(settings, clock=clock)
    worker = build_worker(settings, rule_paths=[rules], backend=backend, clock=clock,
                          topic_replication_factor=1)
    app = worker.app
    async with faust_app_running(app, stop_timeout=10):
        while not app.consumer.assignment() or not app.tables.recovery.completed.is_set():
            await asyncio.sleep(0.01)
        print("READY", rss_kib(), flush=True)

asyncio.run(main(*sys.argv[1:4]))
"""

_RULES = """
runtimes: [torch-distributed]
rules:
  - name: retrain-on-drift
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: 6h
    count: 3
    cooldown: 1h
    launch:
      runtime: torch-distributed
      base_model: tiny
      dataset: "file:///data/${ key }.jsonl"
"""

_BASELINE_SCRIPT = """
import faust
for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
        print("READY", int(line.split()[1]), flush=True)
"""

_KEYS_SCRIPT = """
import gc, json, sys
from datetime import UTC, datetime, timedelta

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

mode, count = sys.argv[1], int(sys.argv[2])
keys = [f"model-{i:07d}" for i in range(count)]
from orchestrator.events import CloudEvent
from orchestrator.rules import engine
from orchestrator.rules.parsing import Source, parse_files
rules = parse_files([Source("rules.yaml", RULES)])
start = datetime(2026, 6, 1, 11, 0, tzinfo=UTC)
events = [
    CloudEvent(id=f"e-{i}", source="/monitors/psi", type="io.tuneloop.drift.detected.v1",
               time=start + timedelta(microseconds=i), datacontenttype="application/json",
               data={"model_id": key, "metric": "psi", "value": 0.3, "threshold": 0.2})
    for i, key in enumerate(keys)
]
# warm the code paths and caches before the first reading
engine.evaluate(rules, None, events[0], key=keys[0], now=start)
gc.collect()
before = rss_kib()
table = {}
size = 0
if mode == "bare":
    for key in keys:
        table[key] = None
else:
    for key, event in zip(keys, events):
        state, _ = engine.evaluate(rules, None, event, key=key, now=event.time)
        table[key] = state.to_json()
    size = sum(len(json.dumps(table[k], separators=(",", ":"))) for k in keys[:1000]) / 1000
gc.collect()
after = rss_kib()
print("RESULT", json.dumps({"growth_kib": after - before, "json_bytes": size}), flush=True)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def _until_ready(argv: list[str], *, timeout: float) -> tuple[float, int]:
    """Seconds from process start to its READY line, and the RSS (KiB) it reported."""
    started = time.perf_counter()
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=_env()
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("READY"):
                return time.perf_counter() - started, int(line.split()[1])
        raise RuntimeError(f"{argv[:3]} exited ({process.wait()}) before it was ready")
    finally:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _keys(mode: str, count: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _KEYS_SCRIPT.replace("RULES", repr(_RULES)), mode, str(count)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(),
        timeout=300,
        check=True,
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    result: dict[str, float] = json.loads(line.split(" ", 1)[1])
    return result


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def run(*, quick: bool) -> list[dict[str, object]]:
    from devservices.kafka import kafka_for_tests

    repeats = 1 if quick else 3
    ready_script = _READY_SCRIPT.replace("RULES", repr(_RULES))
    starts: list[float] = []
    rss: list[float] = []
    bare_starts: list[float] = []
    bare_rss: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-footprint-") as workdir,
        kafka_for_tests(Path(workdir) / "kafka") as kafka,
    ):
        for attempt in range(repeats + 1):  # attempt 0 warms the page cache, not counted
            seconds, kib = _until_ready([sys.executable, "-c", _BASELINE_SCRIPT], timeout=30)
            if attempt:
                bare_starts.append(seconds)
                bare_rss.append(kib)
            tag = uuid.uuid4().hex[:6]
            seconds, kib = _until_ready(
                [sys.executable, "-c", ready_script, kafka.bootstrap, workdir, tag], timeout=60
            )
            if attempt:
                starts.append(seconds)
                rss.append(kib)
            print(f"bench: footprint cold start {attempt}: {seconds:.2f} s", file=sys.stderr)
        source = kafka.kind.value
    keys = QUICK_KEYS if quick else KEYS
    bare_keys = _keys("bare", keys)
    state_keys = _keys("keystate", keys)
    print("bench: footprint keys done", file=sys.stderr)
    per_key = state_keys["growth_kib"] * 1024 / keys
    bare_per_key = max(bare_keys["growth_kib"] * 1024 / keys, 1.0)
    start_s, bare_start_s = _median(starts), _median(bare_starts)
    rss_mib, bare_rss_mib = _median(rss) / 1024, _median(bare_rss) / 1024
    runs = f"median of {repeats} fresh process(es) after a warm-up one"
    return [
        {
            "benchmark": "footprint",
            "measure": "cold start to worker ready",
            "value": start_s,
            "unit": "s",
            "baseline": bare_start_s,
            "ratio": start_s / bare_start_s,
            "goal": "",
            "notes": f"ready = partitions assigned + tables recovered, {source} Kafka; baseline "
            f'`python -c "import faust"`; {runs}',
        },
        {
            "benchmark": "footprint",
            "measure": "RSS at worker ready",
            "value": rss_mib,
            "unit": "MiB",
            "baseline": bare_rss_mib,
            "ratio": rss_mib / bare_rss_mib,
            "goal": "",
            "notes": f"baseline: RSS after `import faust`; {runs}",
        },
        {
            "benchmark": "footprint",
            "measure": f"RSS growth per tracked key at {keys // 1000}k keys",
            "value": per_key,
            "unit": "bytes/key",
            "baseline": bare_per_key,
            "ratio": per_key / bare_per_key,
            "goal": "",
            "notes": "KeyState.to_json() after one counted event (6h window, count 3, cooldown) "
            "in a dict, as the in-memory Table holds it; baseline: a dict of the same keys",
        },
        {
            "benchmark": "footprint",
            "measure": "serialized KeyState per key",
            "value": state_keys["json_bytes"],
            "unit": "bytes/key",
            "baseline": bare_per_key,
            "ratio": state_keys["json_bytes"] / bare_per_key,
            "goal": "",
            "notes": "compact JSON of one key's state (what the changelog carries per key); "
            "baseline: the bare dict's RSS growth per key",
        },
    ]


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(json.dumps(row))
