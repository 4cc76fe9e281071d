"""What one `tuneloop demo` run is: its files, its names, its narration and its one error.

Shared by the demo's modules (`handlers/demo.py` runs the steps; `demo_processes.py`,
`demo_stream.py`, `demo_tracking.py` and `demo_serving.py` do the work of one step each).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MODEL_ID = "units-assistant"
"""The model the demo's events are about: the rule's key, and the hand-off's target model."""
BUCKET = "tuneloop-demo"
"""The bucket on the demo's S3 server: `datasets/` in, `adapters/` out (the rule names both)."""
DATASET_KEY = "datasets/unit-conversions.jsonl"
PROMPT = "Question: How many feet is 7 metres?\nAnswer:"
"""What vLLM is asked at the end: a question of the dataset's kind that is not in it."""
MODELS = {"smollm2": "smollm2-135m", "smollm2-135m": "smollm2-135m", "tiny": "tiny"}
"""What `--model` accepts, and the catalogue name each means (`runtimes/models`)."""
NOT_SERVED = {
    "tiny": (
        "vLLM cannot serve the tiny model: its head size is 16 and vLLM's CPU attention "
        "refuses it on the first request ('Unsupported CPU attention configuration: "
        "head_dim=16'); SmolLM2-135M (head size 64), the default, is served"
    ),
}
"""Why a model is fine-tuned but not handed to vLLM (devservices/serving.py has the spike)."""


@dataclass(frozen=True, slots=True)
class DemoTopics:
    """The Kafka topics of one run (a test gives its run names of its own)."""

    events: str = "demo.events"
    """The worker's input: the events the demo emits."""
    finetune: str = "demo.finetune"
    """The worker's output (the job's events), which the hand-off reads and writes to."""
    audit: str = "demo.audit"
    dlq: str = "demo.dlq"
    ledger: str = "demo.handoff.ledger"
    """The hand-off's ledger, a compacted topic `tuneloop handoff` creates itself."""

    @property
    def plain(self) -> tuple[str, ...]:
        """The topics the demo creates (all but the ledger)."""
        return (self.events, self.finetune, self.audit, self.dlq)


class DemoError(Exception):
    """The demo could not finish; the message says which step and where the logs are."""


@dataclass(frozen=True, slots=True)
class DemoRun:
    """Where one demo run keeps its files, and what it fine-tunes."""

    root: Path
    model: str
    """The catalogue name of the base model (`smollm2-135m` or `tiny`)."""
    topics: DemoTopics = DemoTopics()

    @property
    def serves(self) -> bool:
        """Whether the promoted adapter is handed to vLLM (see `NOT_SERVED`)."""
        return self.model not in NOT_SERVED

    @property
    def rules(self) -> Path:
        return self.root / "rules.yaml"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def worker_log(self) -> Path:
        return self.root / "worker.log"

    @property
    def handoff_log(self) -> Path:
        return self.root / "handoff.log"

    @property
    def dataset(self) -> Path:
        """The local copy of the dataset, uploaded from here to `dataset_uri`."""
        return self.root / "dataset.jsonl"

    @property
    def dataset_uri(self) -> str:
        return f"s3://{BUCKET}/{DATASET_KEY}"


def say(message: str) -> None:
    print(message, flush=True)


STEPS = 8


def step(number: int, message: str) -> None:
    say(f"\n[{number}/{STEPS}] {message}")
