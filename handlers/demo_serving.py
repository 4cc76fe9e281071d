"""Steps 7 and 8 of `tuneloop demo`: the hand-off serves the promoted adapter, vLLM answers.

Given a vLLM that is up (`handlers/demo.py` started it in step 1), `serve_and_ask`:

1. runs `tuneloop handoff`, the real command, with that server as the one target of the
   demo's model and a `TUNELOOP_HANDOFF_PATHS` entry saying where vLLM reads what the trainer
   published, and waits for its `adapter.served` (or `handoff_failed`) on the output topic;
2. asks vLLM one question as the base model and as the adapter, through the hand-off's own
   client (`handlers/handoff/vllm.py`), as its smoke test does.

tests/e2e/test_demo_loop.py runs it against the test session's vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from handlers import demo_processes
from handlers.demo_run import DemoError, DemoRun, say, step
from handlers.demo_stream import DemoStream
from handlers.handoff.vllm import VllmClient
from orchestrator.errors import TuneloopError
from orchestrator.events import CloudEvent

MAX_TOKENS = 24
REQUEST_TIMEOUT = 120.0
"""Seconds one completion may take: the first with a new adapter is slow on a CPU."""


@dataclass(frozen=True, slots=True)
class ServingRuntime:
    """A vLLM server that is up: where it answers, and what it calls its base model."""

    base_url: str
    base_model: str
    """The base model's name in `/v1/models` (vLLM names it by the path it was given)."""
    log: Path


@dataclass(frozen=True, slots=True)
class Answers:
    """One prompt, answered by the base model and by the adapter, as vLLM serves them."""

    prompt: str
    base: str
    adapter: str
    adapter_root: str | None
    """The path vLLM lists the adapter under (`/v1/models`): where it read it from."""


async def serve_and_ask(
    run: DemoRun,
    *,
    bootstrap: str,
    vllm: ServingRuntime,
    adapter_paths: Mapping[str, str],
    stream: DemoStream,
    completed: CloudEvent,
    prompt: str,
) -> Answers:
    """Hand the adapter of *completed* to *vllm* with `tuneloop handoff`, then ask both.

    Args:
        adapter_paths: `TUNELOOP_HANDOFF_PATHS`: adapter URI prefix -> where vLLM reads it.

    Raises:
        DemoError: the hand-off died or failed for good, or vLLM did not answer.
    """
    say(f"      tuneloop handoff: TUNELOOP_HANDOFF_PATHS={json.dumps(dict(adapter_paths))}")
    job = str(completed.data["job"])
    with demo_processes.handoff(
        run, bootstrap=bootstrap, vllm_url=vllm.base_url, adapter_paths=adapter_paths
    ) as handoff:
        served = await stream.await_served(job, handoff)
    lora_name = str(served.data["lora_name"])
    say(f"      vLLM loaded it from {served.data['lora_path']}")
    say(f"      the hand-off's smoke test got {served.data.get('smoke_text', '')!r}")

    step(8, "vLLM answers one question as the base model and as the adapter")
    try:
        answers = await ask(
            vllm.base_url, base_model=vllm.base_model, lora_name=lora_name, prompt=prompt
        )
    except TuneloopError as exc:
        raise DemoError(f"vLLM did not answer: {exc} (its log: {vllm.log})") from exc
    say(f"      prompt : {answers.prompt!r}")
    say(f"      base   : {_shown(answers.base)}")
    say(f"      adapter: {_shown(answers.adapter)}   (model={lora_name})")
    return answers


def _shown(answer: str) -> str:
    return repr(answer) if answer else "'' (it ended its answer at once)"


async def ask(base_url: str, *, base_model: str, lora_name: str, prompt: str) -> Answers:
    """Ask vLLM the same *prompt* as the base model and as the adapter *lora_name*.

    Raises:
        TargetUnavailableError, AdapterRejectedError: vLLM did not answer, or refused (the
            hand-off's own errors, `orchestrator/handoff/errors.py`).
    """
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT) as http:
        vllm = VllmClient(base_url, http=http)
        listed = {model.id: model.root for model in await vllm.models()}
        base = await vllm.complete(base_model, prompt, max_tokens=MAX_TOKENS)
        tuned = await vllm.complete(lora_name, prompt, max_tokens=MAX_TOKENS)
    return Answers(
        prompt=prompt,
        base=first_line(base),
        adapter=first_line(tuned),
        adapter_root=listed.get(lora_name),
    )


def first_line(text: str) -> str:
    """Greedy decoding goes on past the answer; the first non-empty line is the answer."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
