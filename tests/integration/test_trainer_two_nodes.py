"""Two TrainJob nodes, as Kubeflow's torch plugin starts them: the container's command
(`runtimes.kubernetes.manifests.TRAINER_COMMAND`, torchrun) on each node, told only by the
`PET_*` variables the plugin injects (PET_NNODES=2, node ranks 0 and 1, one master address).

They must train ONE model with DDP: one process group of world size 2, one `started` event,
one adapter and one `result.json` written by rank 0, and one set of reports to the status
server (a named stand-in for Kubeflow's, `tests/unit/trainer/stand_in_status_server.py`).
Started as `python -m runtimes.trainer` (the defect this test was written for), each node
would train its own copy as rank 0.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runtimes.kubernetes import manifests
from tests.unit.trainer.stand_in_status_server import StandInStatusServer

pytestmark = pytest.mark.training

STEPS = 4
BATCH = 4


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _container_command() -> list[str]:
    # The image puts torchrun on PATH; here it is the project's virtual environment's.
    program, *rest = manifests.TRAINER_COMMAND
    assert program == "torchrun"
    return [str(Path(sys.executable).parent / program), *rest]


@pytest.fixture
def status_server(tmp_path: Path):
    (tmp_path / "status-server").mkdir()
    stand_in = StandInStatusServer().start(tmp_path / "status-server")
    yield stand_in
    stand_in.stop()


def test_two_nodes_train_one_model_and_only_rank_zero_writes_it(
    tiny_model_dir: Path, reverse_dataset: Path, tmp_path: Path, status_server
):
    output = tmp_path / "adapters" / "job"  # the directory both nodes share, as on a PVC
    arguments = [
        "--base-model", str(tiny_model_dir),
        "--dataset", str(reverse_dataset),
        "--output-dir", str(output),
        "--max-steps", str(STEPS),
        "--batch-size", str(BATCH),
        "--save-steps", "0",
        "--eval-fraction", "0",
        "--cpu-threads", "1",
        "--progress", "json",
    ]  # fmt: skip
    port = str(_free_port())
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNELOOP_", "PET_"))}
    nodes = []
    for rank in (0, 1):
        env = {
            **base_env,
            # What the torch plugin injects into the `node` container of pod <rank>.
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "1",
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            # What the trainjobstatus plugin injects into every trainer container.
            **status_server.environ(),
        }
        nodes.append(
            subprocess.Popen(
                [*_container_command(), *arguments],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr[-3000:]

    events = [
        [json.loads(line)["event"] for line in stdout.splitlines() if line.startswith("{")]
        for stdout, _ in outputs
    ]
    assert events[0].count("started") == 1
    assert "completed" in events[0]
    assert events[1] == [], "the second node is rank 1: it neither reports nor writes"
    started = next(json.loads(line) for line in outputs[0][0].splitlines() if '"started"' in line)
    assert started["world_size"] == 2

    result = json.loads((output / "result.json").read_text())
    assert result["training"]["world_size"] == 2
    assert result["metrics"]["steps"] == STEPS
    assert sorted(p.name for p in output.iterdir()) == [
        "adapter",
        "checkpoints",
        "data_card.json",
        "metrics.json",
        "result.json",
    ]
    assert (output / "adapter" / "adapter_model.safetensors").is_file()
    # Only rank 0 reported to the (stand-in) status server: one start, one end.
    progress = [r.body["trainerStatus"].get("progressPercentage") for r in status_server.received]
    assert progress.count(0) == 1
    assert progress.count(100) == 1
