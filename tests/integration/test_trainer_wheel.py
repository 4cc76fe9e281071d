"""The trainer as the image installs it: the wheel built from what deploy/trainer.Dockerfile
copies, installed into a clean virtual environment, run from there (no Docker here, so this
is the part of the image build that can run).

The heavy dependencies (torch, transformers, peft) are not downloaded: a `.pth` file makes the
project environment's site-packages visible *after* the new environment's own, so the
installed wheel, not the repository, provides `orchestrator`, `runtimes` and `handlers`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from runtimes.models import catalog

pytestmark = [pytest.mark.training, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "deploy" / "trainer.Dockerfile").read_text()


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=600, **kwargs
    )
    assert completed.returncode == 0, (command, completed.stdout[-2000:], completed.stderr[-3000:])
    return completed


def _build_stage_sources() -> list[str]:
    """What the Dockerfile's build stage copies from the repository into its /src."""
    build_stage = DOCKERFILE.split("\nFROM ", 2)[1]
    sources: list[str] = []
    for line in build_stage.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources += line.split()[1:-1]
    return sources


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("image")
    source = root / "src"  # the image's /src: only what the Dockerfile copies
    source.mkdir()
    for name in _build_stage_sources():
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, source / name)
    # As the Dockerfile: pip wheel --no-deps (without build isolation: nothing to download).
    wheels = root / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--wheel-dir", str(wheels), str(source)],
        cwd=root,
    )  # fmt: skip
    (wheel,) = wheels.glob("tuneloop-*.whl")

    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    (site / "zz-project-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index",
         "--disable-pip-version-check", str(wheel)],
    )  # fmt: skip
    return venv


def _env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TUNELOOP_", "PET_"))}
    # As the image: no hub, the catalogue models where the image built them.
    return {**clean, "HF_HUB_OFFLINE": "1", "TUNELOOP_CACHE": str(catalog.cache_root())}


def test_the_installed_packages_come_from_the_wheel_not_the_repository(installed: Path, tmp_path):
    found = _run(
        [str(installed / "bin" / "python"), "-c",
         "import runtimes.trainer, orchestrator; print(runtimes.trainer.__file__); "
         "print(orchestrator.__file__)"],
        cwd=tmp_path,
    ).stdout.split()  # fmt: skip
    assert found
    assert all(Path(path).is_relative_to(installed) for path in found), found


def test_the_console_script_answers_help(installed: Path, tmp_path: Path):
    completed = _run(
        [str(installed / "bin" / "tuneloop-train"), "--help"], cwd=tmp_path, env=_env()
    )
    assert completed.stdout.startswith("usage: tuneloop-train")


def test_the_image_entrypoint_trains_two_steps_on_a_shipped_model(
    installed: Path, tiny_model_dir: Path, reverse_dataset: Path, tmp_path: Path
):
    (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])$", DOCKERFILE, flags=re.MULTILINE)
    program, *arguments = json.loads(entrypoint)
    assert program == "torchrun"  # the image's torchrun is `python -m torch.distributed.run`
    command = [str(installed / "bin" / "python"), "-m", "torch.distributed.run", *arguments]
    command += ["--base-model", "tiny", "--dataset", str(reverse_dataset)]
    command += ["--output-dir", str(tmp_path / "out"), "--max-steps", "2", "--batch-size", "4"]
    command += ["--save-steps", "0", "--eval-fraction", "0", "--cpu-threads", "1"]
    command += ["--progress", "json"]

    _run(command, cwd=tmp_path, env=_env())

    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["metrics"]["steps"] == 2
    assert result["base_model_path"] == str(tiny_model_dir)
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()
