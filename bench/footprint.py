"""Footprint: the orchestrator's cold start and memory, and the memory of one tracked key.

Rows (each a ratio to a baseline measured in the same run on the same machine):

- cold start: a fresh `python` process that builds a worker (`handlers.app.build_worker`, the
  local backend, one rule file) and runs it until its consumer has partitions assigned and
  table recovery is done ("worker ready"), against a fresh `python -c "import faust"`. Time
  from process start to ready, and the process's RSS at that moment. The Kafka broker is the
  local one (`devservices`, or `TUNELOOP_KAFKA_BOOTSTRAP`), started before timing.
- memory per tracked key: 100k keys, each with the state one counted event leaves (a window
  of one entry), kept as the worker keeps them: `handlers.app.TableKeyStates` (the worker's
  store of rule state: the encoded state per key, its timer index and its cache of recently
  saved states) over a dict, which is what faust's in-memory Table holds, against a bare dict
  of the same keys. The RSS growth of a fresh process per key.
- changelog bytes per key: what the rule state's changelog topic really carries per key. A
  `tuneloop run` worker (`bench/worker_process.py`) counts one event for each of 2,000 keys
  spread over the 100k (same names, same length), is stopped, and the changelog topic of its
  rule state table is read back: key + value bytes of each key's last record, averaged.
  Baseline: the key alone.

Goals (issue 17): cold start <= 1.5 s, RSS at ready <= 100 MiB, RSS growth <= 800 B and
changelog bytes <= 200 B per key.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench import events, topics, worker_process

ROOT = Path(__file__).resolve().parent.parent
KEYS = 100_000
QUICK_KEYS = 20_000
CHANGELOG_SAMPLE = 2_000
QUICK_CHANGELOG_SAMPLE = 500

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
from handlers.app import TableKeyStates
# warm the code paths and caches before the first reading
warm, _ = engine.evaluate(rules, None, events[0], key=keys[0], now=start)
TableKeyStates({}).save(keys[0], warm)
gc.collect()
before = rss_kib()
table = {}
if mode == "bare":
    for key in keys:
        table[key] = None
else:
    store = TableKeyStates(table)  # the worker's store, over what faust's memory Table holds
    for key, event in zip(keys, events):
        state, _ = engine.evaluate(rules, None, event, key=key, now=event.time)
        store.save(key, state)
gc.collect()
after = rss_kib()
print("RESULT", json.dumps({"growth_kib": after - before}), flush=True)
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


async def _changelog_bytes(
    bootstrap: str, workdir: Path, sample: int, keys: int
) -> tuple[float, float]:
    """Key + value bytes, and key bytes, of the last changelog record of each of *sample* keys
    of the rule state table (means), after a `tuneloop run` worker counted one event for
    each."""
    from handlers.app import RULE_STATE_TABLE

    tag = uuid.uuid4().hex[:6]
    names = worker_process.Topics(
        events=f"fp-cl-in-{tag}",
        out=f"fp-cl-out-{tag}",
        audit=f"fp-cl-audit-{tag}",
        dlq=f"fp-cl-dlq-{tag}",
    )
    await asyncio.to_thread(
        topics.create, bootstrap, {names.events: 1, names.out: 1, names.audit: 1, names.dlq: 1}
    )
    rules = workdir / f"rules-{tag}.yaml"
    rules.write_text(_RULES)
    group = f"fp-cl-{tag}"
    step = max(1, keys // sample)
    models = [f"model-{index * step:07d}" for index in range(sample)]
    arguments = ["--rules", str(rules), "--backend", "local", "--local-root", str(workdir / tag)]
    env = worker_process.environment(bootstrap=bootstrap, topics=names, group=group)
    async with topics.Counter(bootstrap, names.audit) as audit:
        with worker_process.running(arguments, env=env, log=workdir / f"worker-{tag}.log"):
            await topics.produce(
                bootstrap, names.events, events.drift_records(tag, models, keyed=True)
            )
            done = await topics.watch(audit, cpu=lambda: 0.0, until=sample, timeout=300)
    if done[-1].done < sample:
        raise RuntimeError(f"the worker counted {done[-1].done} of {sample} events")
    changelog = f"{group}-{RULE_STATE_TABLE}-changelog"
    last = {r.key: r for r in await topics.read_all(bootstrap, changelog)}
    if len(last) != sample:
        raise RuntimeError(f"{changelog} holds {len(last)} keys, {sample} were counted")
    key_bytes = sum(len(r.key or b"") for r in last.values()) / len(last)
    return key_bytes + sum(len(r.value or b"") for r in last.values()) / len(last), key_bytes


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
        keys = QUICK_KEYS if quick else KEYS
        sample = QUICK_CHANGELOG_SAMPLE if quick else CHANGELOG_SAMPLE
        changelog_bytes, key_bytes = asyncio.run(
            _changelog_bytes(kafka.bootstrap, Path(workdir), sample, keys)
        )
        print(f"bench: footprint changelog done ({changelog_bytes:.0f} B)", file=sys.stderr)
        source = kafka.kind.value
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
            "goal": "<= 1.5 s",
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
            "goal": "<= 100 MiB",
            "notes": f"baseline: RSS after `import faust`; {runs}",
        },
        {
            "benchmark": "footprint",
            "measure": f"RSS growth per tracked key at {keys // 1000}k keys",
            "value": per_key,
            "unit": "bytes/key",
            "baseline": bare_per_key,
            "ratio": per_key / bare_per_key,
            "goal": "<= 800 bytes/key",
            "notes": "TableKeyStates (the worker's store: encoded state, timer index, recent "
            "states) over a dict, as faust's in-memory Table holds it, each key after one "
            "counted event (6h window, count 3, cooldown); baseline: a dict of the same keys",
        },
        {
            "benchmark": "footprint",
            "measure": "rule state changelog bytes per key",
            "value": changelog_bytes,
            "unit": "bytes/key",
            "baseline": key_bytes,
            "ratio": changelog_bytes / key_bytes,
            "goal": "<= 200 bytes/key",
            "notes": f"key + value of each key's last record on the rule state table's "
            f"changelog topic, after a `tuneloop run` worker counted one event for each of "
            f"{sample:,} keys named as the {keys // 1000}k above; baseline: the key alone, as "
            "the changelog carries it",
        },
    ]


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(json.dumps(row))
