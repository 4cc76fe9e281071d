"""The backend contract, run against `LocalProcessBackend` with real processes.

The jobs are real subprocesses started by the real supervisor; the program they run is a
controllable stand-in for the trainer (the contract needs a job that *stays* running until
told, and a result with chosen metrics, which a real fine-tune cannot promise). It reads
`control.json` in its job directory and acts as the trainer would: prints a JSON progress
line, writes `result.json` and exits 0, or writes `failure.json` and exits 1. The real trainer
runs under this backend in tests/integration/test_local_backend.py.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.jobs.model import JobPhase, JobRef, JobResult
from runtimes.localprocess.backend import LocalProcessBackend
from runtimes.localprocess.supervisor import write_json_atomically
from tests.contract.backend_contract import BackendContract

CONTROLLED_TRAINER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    config = json.loads(Path(sys.argv[sys.argv.index("--config") + 1]).read_text())
    out = Path(config["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    done = set()
    while True:
        try:
            control = json.loads(Path("control.json").read_text())
        except (FileNotFoundError, ValueError):
            time.sleep(0.02)
            continue
        phase = control["phase"]
        if phase == "Running" and phase not in done:
            done.add(phase)
            print(json.dumps({"event": "progress", "step": 1, "total_steps": 2}), flush=True)
        elif phase == "Succeeded":
            result = control.get("result") or {}
            uri = result.get("adapter_uri") or "file:///adapter"
            (out / "result.json").write_text(json.dumps({
                "adapter_dir": uri.removeprefix("file://"),
                "metrics": result.get("metrics") or {},
            }))
            sys.exit(0)
        elif phase == "Failed":
            kind = control.get("reason") or "TrainerError"
            (out / "failure.json").write_text(json.dumps({"kind": kind, "message": "told to fail"}))
            sys.exit(1)
        time.sleep(0.02)
    """
)


class LocalController:
    """Tells the controlled trainer of a job which phase to be in."""

    def __init__(self, root: Path) -> None:
        self._root = root

    async def move(
        self,
        job: JobRef,
        phase: JobPhase,
        *,
        reason: str | None = None,
        result: JobResult | None = None,
    ) -> None:
        if phase is JobPhase.SUSPENDED:
            pytest.skip("a local process cannot be suspended")
        control: dict[str, object] = {"phase": phase.value, "reason": reason}
        if result is not None:
            control["result"] = {"adapter_uri": result.adapter_uri, "metrics": dict(result.metrics)}
        write_json_atomically(self._root / job.name / "control.json", control)


class TestLocalProcessBackendContract(BackendContract):
    @pytest.fixture
    def root(self, tmp_path: Path) -> Path:
        return tmp_path / "jobs"

    @pytest.fixture
    async def backend(self, root: Path, tmp_path: Path):
        script = tmp_path / "controlled_trainer.py"
        script.write_text(CONTROLLED_TRAINER)
        backend = LocalProcessBackend(
            root,
            max_concurrent=4,
            poll_interval=0.05,
            trainer_command=(sys.executable, str(script)),
            runtimes={"local-cpu": {}},
        )
        yield backend
        await backend.aclose()
        # Stop the stand-ins still waiting for orders.
        for job in root.iterdir() if root.exists() else ():
            if not (job / "exit.json").exists() and (job / "launched.json").exists():
                write_json_atomically(job / "control.json", {"phase": "Failed"})

    @pytest.fixture
    def runtime(self) -> str:
        return "local-cpu"

    @pytest.fixture
    def controller(self, root: Path) -> LocalController:
        return LocalController(root)
