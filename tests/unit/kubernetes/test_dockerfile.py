"""The orchestrator and trainer Dockerfiles (no Docker on this machine: the checks that need
none)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from runtimes.kubernetes import manifests

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = (REPO / "deploy" / "orchestrator.Dockerfile").read_text()


def test_everything_it_copies_from_the_repository_exists():
    sources = []
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources += line.split()[1:-1]
    assert sources
    assert [s for s in sources if not (REPO / s).exists()] == []


def test_it_runs_as_the_non_root_user_the_chart_expects():
    (user,) = re.findall(r"^USER (\d+):(\d+)$", DOCKERFILE, flags=re.MULTILINE)
    values = yaml.safe_load((REPO / "deploy" / "helm" / "tuneloop" / "values.yaml").read_text())
    assert int(user[0]) == values["podSecurityContext"]["runAsUser"] != 0


def test_it_leaves_the_training_stack_out():
    assert "torch" in DOCKERFILE.split("grep -v -E", 1)[1].splitlines()[0]
    assert ".[train" not in DOCKERFILE


# The trainer image. It cannot be built here, so these hold it consistent with what runs it:
# the ClusterTrainingRuntimes we ship (deploy/runtimes/*.yaml) and the TrainJob builder.

TRAINER_DOCKERFILE = (REPO / "deploy" / "trainer.Dockerfile").read_text()
RUNTIME_FILES = sorted((REPO / "deploy" / "runtimes").glob("*.yaml"))


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")),
    )
    out = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _final_stage(text: str) -> list[tuple[str, str]]:
    instructions = _instructions(text)
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def _image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in _final_stage(TRAINER_DOCKERFILE):
        if keyword == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", rest))
    return env


def _one(keyword: str) -> str:
    (value,) = [rest for k, rest in _final_stage(TRAINER_DOCKERFILE) if k == keyword]
    return value


def _trainer_pods():
    """(runtime name, pod spec, trainer container) of every runtime we ship."""
    for path in RUNTIME_FILES:
        for runtime in yaml.safe_load_all(path.read_text()):
            for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
                step = job["template"]["metadata"]["labels"][
                    "trainer.kubeflow.org/trainjob-ancestor-step"
                ]
                if step != "trainer":
                    continue
                pod = job["template"]["spec"]["template"]["spec"]
                (container,) = [c for c in pod["containers"] if c["name"] == "node"]
                yield runtime["metadata"]["name"], pod, container


def test_the_runtimes_we_ship_all_run_the_trainer_image():
    pods = list(_trainer_pods())
    assert {name for name, _, _ in pods} == {"tuneloop-lora", "tuneloop-lora-hf"}
    for name, _, container in pods:
        assert container["image"] == manifests.Settings().image, name


def test_the_trainer_copies_only_what_the_repository_has():
    sources = []
    for keyword, rest in _instructions(TRAINER_DOCKERFILE):
        if keyword == "COPY" and "--from=" not in rest:
            sources += rest.split()[:-1]
    assert sources
    assert [s for s in sources if not (REPO / s).exists()] == []


def test_the_image_user_is_the_uid_and_gid_every_runtime_runs_the_trainer_as():
    uid, gid = (int(part) for part in _one("USER").split(":"))
    assert uid != 0
    for name, pod, _ in _trainer_pods():
        context = pod.get("securityContext") or {}
        assert context.get("runAsNonRoot") is True, name
        assert (context.get("runAsUser"), context.get("runAsGroup")) == (uid, gid), name
        assert context.get("fsGroup") == gid, f"{name}: volumes must be writable by the group"
    assert re.search(rf"useradd --uid {uid} --gid {gid}", TRAINER_DOCKERFILE)


def test_the_entrypoint_is_the_command_every_trainjob_runs():
    entrypoint = json.loads(_one("ENTRYPOINT"))
    assert tuple(entrypoint) == manifests.TRAINER_COMMAND == manifests.Settings().command
    for name, _, container in _trainer_pods():
        assert container["command"] == entrypoint, name


def test_the_image_and_the_runtimes_forbid_hub_downloads_and_agree_on_home():
    env = _image_env()
    assert env["HF_HUB_OFFLINE"] == "1"
    for name, _, container in _trainer_pods():
        runtime_env = {item["name"]: item.get("value") for item in container.get("env", [])}
        assert runtime_env.get("HF_HUB_OFFLINE") == "1", name
        assert runtime_env.get("HOME", env["HOME"]) == env["HOME"], name


def test_the_shipped_models_are_built_into_a_path_no_runtime_mounts_over():
    cache = _image_env()["TUNELOOP_CACHE"]
    assert re.search(
        rf"TUNELOOP_CACHE={re.escape(cache)} \S*python -m runtimes.models prepare\b",
        " ".join(rest for _, rest in _instructions(TRAINER_DOCKERFILE)),
    )
    for name, _, container in _trainer_pods():
        for mount in container.get("volumeMounts", []):
            mounted = mount["mountPath"].rstrip("/") + "/"
            assert not (cache.rstrip("/") + "/").startswith(mounted), (name, mount)


def test_the_working_directory_is_the_workspace_the_initializers_fill_and_the_user_owns():
    assert _one("WORKDIR") == manifests.WORKSPACE_MODEL.rsplit("/", 1)[0] == "/workspace"
    uid, gid = _one("USER").split(":")
    assert re.search(rf"chown -R {uid}:{gid} /workspace\b", TRAINER_DOCKERFILE)


def test_the_image_installs_the_wheel_with_the_training_extra_under_the_constraints():
    run = " ".join(rest for keyword, rest in _instructions(TRAINER_DOCKERFILE) if keyword == "RUN")
    assert re.search(r"pip wheel --no-deps --wheel-dir /wheels \.", run)
    assert re.search(
        r"pip install --constraint constraints\.txt \"\$\(ls /wheels/tuneloop-\*\.whl\)\[train\]\"",
        run,
    )
