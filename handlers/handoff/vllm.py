"""`VllmClient`: the four calls of the hand-off to one vLLM server, over httpx.

Used by the hand-off's per-target loop (`handlers/handoff/service.py`), one client per
target. Statuses and bodies are vLLM's own, read from its source (0.32.0,
`vllm/entrypoints/serve/lora/api_router.py` and `vllm/entrypoints/openai/models/
serving.py`) and seen against the real server in tests/integration/test_serving_runtime.py:

- `POST /v1/load_lora_adapter {lora_name, lora_path}`: 200 with the text `Success: LoRA
  adapter '<name>' added successfully.`; 400 `InvalidUserInput` for a name that `has already
  been loaded`, a base model's name or a missing field; 404 `NotFoundError` when there is no
  adapter at the path; 500 `InternalServerError` when the engine refused it (a rank above
  `--max-lora-rank`, a broken file).
- `POST /v1/unload_lora_adapter {lora_name}`: 200 with `Success: LoRA adapter '<name>'
  removed successfully.`; 404 `NotFoundError` (`... cannot be found.`).
- `GET /v1/models`: 200 `{"data": [{"id", "root", "parent", ...}]}`; an adapter's `root` is
  the path it was loaded from.
- `POST /v1/completions {model, prompt, max_tokens}`: 200 `{"model", "choices": [{"text"}]}`;
  404 `NotFoundError` for a model it does not serve.

Errors are `{"error": {"message", "type", "param", "code"}}`. Without
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` the two LoRA routes do not exist: FastAPI's 404
`{"detail": "Not Found"}`. With `--api-key`, every route wants `Authorization: Bearer`.

Translation (`orchestrator/handoff/errors.py`): no answer, a timeout, 429, 502, 503 or 504
-> `TargetUnavailableError`; any other failure -> `AdapterRejectedError`. Two refusals mean
the work is already done and are success: a load of a name that is already loaded (the
`CHECK` step then proves it is ours), and an unload of a name that is not loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from orchestrator.handoff.errors import AdapterRejectedError, TargetUnavailableError

UNAVAILABLE_STATUSES = frozenset({429, 502, 503, 504})
"""Answers that mean "not now": overloaded, or a proxy in front of a server that is down."""

ALREADY_LOADED = "has already been loaded"
"""In the 400 of a load whose name is loaded already (`_check_load_lora_adapter_request`)."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One entry of `/v1/models`: the base model, or an adapter with the path it came from."""

    id: str
    root: str | None
    parent: str | None


class VllmClient:
    """One vLLM server's runtime LoRA API, `/v1/models` and `/v1/completions`."""

    def __init__(self, base_url: str, *, http: httpx.AsyncClient, api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._http = http
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def load_adapter(self, lora_name: str, lora_path: str) -> bool:
        """Load the adapter at *lora_path* (as the server sees it) as *lora_name*.

        Returns:
            True when it was loaded now, False when the name was loaded already.

        Raises:
            TargetUnavailableError: no useful answer; try again later.
            AdapterRejectedError: the server refused it.
        """
        response = await self._call(
            "POST", "/v1/load_lora_adapter", {"lora_name": lora_name, "lora_path": lora_path}
        )
        if response.status_code == 200:
            return True
        if response.status_code == 400 and ALREADY_LOADED in _message(response):
            return False
        raise _refusal(response, f"load of {lora_name!r} from {lora_path!r}")

    async def unload_adapter(self, lora_name: str) -> bool:
        """Unload *lora_name*.

        Returns:
            True when it was unloaded now, False when it was not loaded.

        Raises:
            TargetUnavailableError: no useful answer; try again later.
            AdapterRejectedError: the server refused.
        """
        response = await self._call("POST", "/v1/unload_lora_adapter", {"lora_name": lora_name})
        if response.status_code == 200:
            return True
        if response.status_code == 404 and _error_type(response) == "NotFoundError":
            return False
        raise _refusal(response, f"unload of {lora_name!r}")

    async def models(self) -> tuple[ServedModel, ...]:
        """What `/v1/models` lists: the base model and every loaded adapter.

        Raises:
            TargetUnavailableError: no useful answer; try again later.
            AdapterRejectedError: the server refused, or answered something else than a list.
        """
        response = await self._call("GET", "/v1/models")
        if response.status_code != 200:
            raise _refusal(response, "GET /v1/models")
        try:
            entries = response.json()["data"]
            return tuple(
                ServedModel(id=str(entry["id"]), root=entry.get("root"), parent=entry.get("parent"))
                for entry in entries
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise AdapterRejectedError(f"/v1/models answered no model list: {exc!r}") from exc

    async def complete(self, model: str, prompt: str, *, max_tokens: int) -> str:
        """One greedy completion of *prompt* by *model* (a base model or an adapter's name).

        Returns:
            The text of the first choice.

        Raises:
            TargetUnavailableError: no useful answer; try again later.
            AdapterRejectedError: the server refused, or answered with no choice.
        """
        response = await self._call(
            "POST",
            "/v1/completions",
            {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        )
        if response.status_code != 200:
            raise _refusal(response, f"a completion with model {model!r}")
        try:
            return str(response.json()["choices"][0]["text"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise AdapterRejectedError(
                f"a completion with model {model!r} answered no choice: {exc!r}", status=200
            ) from exc

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        url = f"{self.base_url}{path}"
        try:
            response = await self._http.request(method, url, json=body, headers=self._headers)
        except httpx.TransportError as exc:
            # Connection refused or reset, DNS, a timeout: the server is down or busy.
            raise TargetUnavailableError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code in UNAVAILABLE_STATUSES:
            raise TargetUnavailableError(
                f"{method} {url}: {response.status_code} {_message(response)[:200]}"
            )
        return response


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (ValueError, json.JSONDecodeError):
        return None


def _error(response: httpx.Response) -> dict[str, Any]:
    body = _body(response)
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


def _message(response: httpx.Response) -> str:
    message = _error(response).get("message")
    return str(message) if message is not None else response.text


def _error_type(response: httpx.Response) -> str | None:
    kind = _error(response).get("type")
    return str(kind) if kind is not None else None


def _refusal(response: httpx.Response, what: str) -> AdapterRejectedError:
    body = _body(response)
    if response.status_code == 404 and isinstance(body, dict) and body.get("detail"):
        # FastAPI's own 404: the route is not there.
        return AdapterRejectedError(
            f"{what}: {response.request.url.path} does not exist on this server; start vLLM "
            "with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora",
            status=404,
        )
    return AdapterRejectedError(
        f"{what}: {response.status_code} {_message(response)[:500]}", status=response.status_code
    )
