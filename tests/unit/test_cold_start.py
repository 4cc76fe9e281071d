"""What a worker does not load before it is ready: libraries only some rules or commands need.

A fresh interpreter builds a worker as `tuneloop run` does (local backend, one rule file) and
lists what it imported; TPE's optuna comes at the first TPE suggestion instead, and cel's
interactive shell never.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from handlers.app import sweep_suggesters
from orchestrator.sweeps.spec import Algorithm, Parameter, Range, Scale, SweepSpec
from runtimes.sweeps.optuna_tpe import OptunaTpeSuggester

ROOT = Path(__file__).resolve().parents[2]

BUILD = """
import json, sys
from pathlib import Path
from handlers.app import build_worker, make_backend
from orchestrator.clock import SystemClock
from orchestrator.settings import KafkaSettings, Settings, WorkerSettings

folder = Path(sys.argv[1])
(folder / "rules.yaml").write_text('''
runtimes: [torch-distributed]
rules:
  - name: retrain-on-drift
    on: {type: io.tuneloop.drift.detected.v1}
    key: event.data.model_id
    count: 3
    launch: {runtime: torch-distributed, base_model: tiny, dataset: "file:///d.jsonl"}
''')
settings = Settings(
    kafka=KafkaSettings(bootstrap="127.0.0.1:9", group_id="cold-start"),
    worker=WorkerSettings(local_root=folder / "jobs"),
)
clock = SystemClock()
backend = make_backend(settings, clock=clock)
build_worker(settings, rule_paths=[folder / "rules.yaml"], backend=backend, clock=clock)
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""

NOT_NEEDED_TO_START = (
    "optuna",  # TPE sweeps only
    "numpy",
    "kubernetes",  # the kubernetes backend only
    "mlflow",
    "pyarrow",
    "torch",
    "prompt_toolkit",  # cel's interactive shell
)


def test_a_worker_with_the_local_backend_is_built_without_the_libraries_it_may_never_use(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    imported = set(json.loads(done.stdout.splitlines()[-1]))
    assert "faust" in imported  # the check sees what the build imported
    assert imported.isdisjoint(NOT_NEEDED_TO_START), imported & set(NOT_NEEDED_TO_START)


def test_the_worker_s_tpe_suggests_what_optuna_s_does() -> None:
    spec = SweepSpec(
        parameters=(Parameter("training.learning_rate", Range(1e-5, 1e-1, Scale.LOG)),),
        algorithm=Algorithm.TPE,
        seed=11,
        max_trials=4,
    )
    worker_tpe = sweep_suggesters()[Algorithm.TPE]
    assert [worker_tpe.suggest(spec, (), index) for index in range(3)] == [
        OptunaTpeSuggester().suggest(spec, (), index) for index in range(3)
    ]


def test_cel_s_shell_is_still_there_for_whoever_imports_it() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from orchestrator.rules import expressions; import cel.cli; print(cel.cli.main)",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert "function" in done.stdout
