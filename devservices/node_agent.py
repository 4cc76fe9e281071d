"""The local node agent: a kubelet stand-in that runs pods as local processes.

There is no container engine on a developer's machine or in CI here, so the local control plane
(`devservices/control_plane.py`) gets one Node, `tuneloop-local`, from this agent. It:

- registers the Node (Ready, 127.0.0.1) and renews its heartbeat;
- binds every pending pod that names no node to it (it is the scheduler too: there is one node),
  except in a namespace labelled `tuneloop.io/node-agent=hold` (`HOLD_LABEL`), whose pods stay
  Pending and unbound: the test suites that need TrainJobs, JobSets, Jobs and pods from the
  real controllers but no running trainer make their namespaces so;
- runs each pod: init containers one after the other, then the containers together, each as
  `command` + `args` (or the image's entrypoint) in a local process, with the pod's env
  (values, `$(VAR)` expansion, the downward API's fieldRefs, ConfigMap and Secret keys, and so
  the `PET_*` and `KUBEFLOW_TRAINER_SERVER_*` variables the Trainer injects), plus
  `KUBERNETES_SERVICE_HOST`/`_PORT` naming the API server on loopback, as a kubelet sets them,
  so in-cluster clients (the chart's worker) find it;
- gives each TrainJob its own torchrun master port: pods share the host's network, so the
  Trainer's `PET_MASTER_PORT=29500` (and a `MASTER_PORT` a pod sets) becomes one free loopback
  port per JobSet (label `jobset.sigs.k8s.io/jobset-uid`, and its restart attempt), the same
  for all of its pods, and two jobs can rendezvous at once (`MasterPorts`);
- gives each volume a directory: emptyDir per pod, a PersistentVolumeClaim per claim (shared
  by every pod that mounts it), ConfigMap, Secret, downward API and projected volumes written
  as files, a projected ServiceAccount token fetched through the TokenRequest API with the
  audience and expiry the pod asks for;
- gives each container a directory of its own on its working directory (the trainer image's
  `/workspace`) unless a volume is mounted there, as an image's filesystem would
  (`private_working_dir`): the host's `/workspace` is neither written nor shared;
- puts those directories where the pod expects them (`/workspace`, `/var/run/secrets/...`):
  each container runs under `unshare --mount` in a mount namespace of its own, where the
  directories are bind-mounted on the container's paths and a hosts file that resolves the
  pod's own names, the torchrun master (`PET_MASTER_ADDR`) and the Trainer's status server to
  127.0.0.1 is bind-mounted on /etc/hosts. (Rewriting paths in env and args was the other
  choice; programs also build paths themselves, so only real mounts are faithful.) An empty
  directory is created on the host for a mount point that does not exist. Sources are opened
  before anything is mounted, and the project, the interpreter and the cache are bound back
  on themselves where a volume covers them, so an emptyDir on /tmp hides neither a clone under
  /tmp nor the agent's own directory (`mount_script`);
- gives each container an empty file of its own on its `terminationMessagePath` (default
  /dev/termination-log) and reports what the container wrote there as its terminated message,
  else, for `FallbackToLogsOnError`, the log's tail, as a kubelet does;
- maps tuneloop's two images, any tag, to this project's environment (the interpreter running
  the agent, its `bin/` first on PATH): the trainer (`ghcr.io/tuneloop/lora-trainer`:
  entrypoint `torchrun --module runtimes.trainer`, the image's ENV, working directory
  /workspace, the example datasets at /opt/tuneloop/examples) and the orchestrator
  (`ghcr.io/tuneloop/orchestrator`: entrypoint `tuneloop`, so the Helm chart's worker runs);
- fails a container whose image it cannot map as a kubelet does when a pull fails: the pod
  stays Pending with the container waiting, reason `ErrImagePull`, and a message that says
  which images it can run;
- writes the pod's status as a kubelet would: Pending, then Running with the containers'
  start times, then Succeeded or Failed with each container's exit code and reason
  (`Completed`, `Error`), conditions PodScheduled, Initialized, ContainersReady and Ready;
  restartPolicy OnFailure and Always restart a container (restartCount counts them);
- keeps each container's output in `<root>/pods/<namespace>_<pod>_<uid>/logs/<container>.log`
  (it serves no logs API: `kubectl logs` does not work; read the file);
- stops a deleted pod's processes: SIGTERM to each process group, SIGKILL after the pod's
  grace period (at most 30 s), then removes the pod as a kubelet does.

What it does NOT do, on purpose:
- isolation: processes share the host's network, PIDs, users and filesystem (only the mount
  points above are private); `securityContext` (runAsUser, fsGroup, capabilities) is ignored
  and everything runs as the agent's user;
- images: nothing is pulled; only the mapped image runs, from the project's own files;
- resource requests and limits: not enforced (no cgroups); the Node advertises this machine's
  CPUs and memory so that scheduling decisions look sane;
- networking: a pod's IP is 127.0.0.1 and ports are the host's (two pods listening on one
  port collide, except torchrun's, above); no Service environment variables but the API
  server's, no cluster DNS, no kube-proxy: nothing can reach a Service IP. Readiness,
  liveness and startup probes and lifecycle hooks are not run (a started container is Ready).
It needs `unshare --mount` (root, or an unprivileged user namespace) and bash; without the
first a pod fails with reason `MountNamespaceUnavailable`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

TUNELOOP_IMAGE_REPOSITORY = "ghcr.io/tuneloop/lora-trainer"
"""The trainer image of deploy/runtimes/*.yaml and runtimes/kubernetes/manifests.py."""
ORCHESTRATOR_IMAGE_REPOSITORY = "ghcr.io/tuneloop/orchestrator"
"""The worker's image (deploy/orchestrator.Dockerfile), which deploy/helm/tuneloop runs."""
PROJECT_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_DATASETS = "/opt/tuneloop/examples"
"""Where deploy/trainer.Dockerfile puts the example datasets of docs/examples/datasets (the
Helm quick start's rules train on one)."""

MASTER_PORT_VARIABLES = ("PET_MASTER_PORT", "MASTER_PORT")
"""torchrun's rendezvous port (Kubeflow's torch plugin sets `PET_MASTER_PORT=29500` on every
trainer container). Pods here share the host's network, so two jobs at once would both bind
29500: the agent gives each rendezvous group its own free loopback port instead."""
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
"""The labels the JobSet controller (v0.12.0, api/jobset/v1alpha2 and its pod labelling) puts
on every pod of a JobSet; the Trainer names a TrainJob's JobSet after the TrainJob."""

FALLBACK_TO_LOGS = "FallbackToLogsOnError"
"""The `terminationMessagePolicy` under which a failed container with nothing in its
termination-message file gets its log's tail (80 lines, 2 KiB) as its message."""

TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_BYTES = 4096
"""A container's `terminationMessagePath` when it names none, and how much of that file the
kubelet keeps as its terminated message (core/v1 Container; the kubelet reads the file before
it falls back to the log's tail). The agent bind-mounts a file of the container's own there;
the first container to run makes an empty /dev/termination-log on the host to mount on."""

HOLD_LABEL = "tuneloop.io/node-agent"
HOLD_VALUE = "hold"
"""A namespace labelled `tuneloop.io/node-agent=hold` keeps its pods: the agent binds none of
them, so they stay Pending (unscheduled) as on a cluster without room, while the controllers
above them do all they would. Most Kubernetes suites make such namespaces: their TrainJobs get
a real JobSet, Jobs and pods, and no trainer runs. Pods bound before the label was set run on."""

HEARTBEAT_SECONDS = 10.0
POLL_SECONDS = 0.5
MAX_GRACE_SECONDS = 30.0
RESTART_BACKOFF_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class ImageEnvironment:
    """How the agent runs one image here: the image's entrypoint, ENV and working directory,
    the image's own files, and the host directories the stand-in runs from."""

    entrypoint: tuple[str, ...]
    env: Mapping[str, str]
    working_dir: str
    files: Mapping[str, Path] = field(default_factory=dict)
    """A path in the image -> the host file or directory that stands in for it (bind-mounted
    there before the pod's volumes, which may cover it as they would in a container)."""
    host_paths: tuple[Path, ...] = ()
    """The host directories the stand-in runs from (the project, the interpreter's prefixes,
    the cache). A pod volume mounted over one of them (an emptyDir on /tmp over a clone under
    /tmp) would hide the program itself, so each one a volume covers is bound back on itself."""


def _environment_paths(python: Path, *more: Path) -> tuple[Path, ...]:
    """The project, *python*'s environment and its base interpreter, and *more*, resolved."""
    paths = (PROJECT_ROOT, python.parent.parent, Path(sys.base_prefix), *more)
    return tuple(dict.fromkeys(path.resolve() for path in paths))


def tuneloop_image_environment(python: Path, cache: Path) -> ImageEnvironment:
    """deploy/trainer.Dockerfile's ENTRYPOINT, ENV, WORKDIR and example datasets, on this
    project's environment."""
    bin_dir = python.parent
    return ImageEnvironment(
        entrypoint=("torchrun", "--module", "runtimes.trainer"),
        env={
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "HF_HUB_OFFLINE": "1",
            "HOME": "/tmp",  # noqa: S108 (the image's HOME)
            "TUNELOOP_CACHE": str(cache),
        },
        working_dir="/workspace",
        files={EXAMPLE_DATASETS: PROJECT_ROOT / "docs" / "examples" / "datasets"},
        host_paths=_environment_paths(python, cache),
    )


def orchestrator_image_environment(python: Path) -> ImageEnvironment:
    """deploy/orchestrator.Dockerfile's ENTRYPOINT (`tuneloop`), ENV and working directory
    (none: `/`), on this project's environment: what the Helm chart's worker pod runs."""
    bin_dir = python.parent
    return ImageEnvironment(
        entrypoint=("tuneloop",),
        env={
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        },
        working_dir="/",
        host_paths=_environment_paths(python),
    )


def image_repository(image: str) -> str:
    """`registry/name` of an image reference, without its tag or digest."""
    without_digest = image.split("@", 1)[0]
    last_colon = without_digest.rfind(":")
    if last_colon > without_digest.rfind("/"):
        return without_digest[:last_colon]
    return without_digest


# --------------------------------------------------------------------------------------------
# Env (pure)
# --------------------------------------------------------------------------------------------

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known names are replaced, `$$` is a literal `$`,
    unknown references stay as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return variables.get(name, match.group(0))

    return _REFERENCE.sub(replace, text)


_LABEL_REF = re.compile(r"metadata\.(labels|annotations)\['(.+)'\]")


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """The downward API's fieldRef *path* of *pod* (status IPs are loopback here)."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": "127.0.0.1",
        "status.hostIPs": "127.0.0.1",
        "status.podIP": "127.0.0.1",
        "status.podIPs": "127.0.0.1",
    }
    if path in simple:
        return str(simple[path])
    keyed = _LABEL_REF.fullmatch(path)
    if keyed:
        return str((metadata.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        values = metadata.get(path.split(".")[1]) or {}
        return "\n".join(f'{key}="{value}"' for key, value in sorted(values.items()))
    raise ValueError(f"unsupported fieldRef {path!r}")


# --------------------------------------------------------------------------------------------
# torchrun's master port (pure, and the one piece of state that allocates it)
# --------------------------------------------------------------------------------------------


def rendezvous_group(pod: Mapping[str, Any]) -> str:
    """Which pods must agree on one torchrun master port: a JobSet's pods (one TrainJob's
    nodes) of one restart attempt; any other pod is a group of its own."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    jobset = labels.get(JOBSET_UID_LABEL) or labels.get(JOBSET_NAME_LABEL)
    if not jobset:
        return f"pod/{metadata.get('uid', '')}"
    attempt = labels.get(JOBSET_RESTART_LABEL, "0")
    return f"jobset/{metadata.get('namespace', '')}/{jobset}/{attempt}"


class MasterPorts:
    """One loopback port per rendezvous group, kept while any pod of the group is on the node.

    Every pod of a group gets the same port, whenever it starts; two groups never share one.
    *pick* gives a candidate port (by default the OS's choice of a free loopback port).
    """

    def __init__(self, pick: Callable[[], int] | None = None) -> None:
        if pick is None:
            # Imported here: devservices.kubernetes imports this module (HOLD_LABEL).
            from devservices.kubernetes import free_loopback_port

            pick = free_loopback_port
        self._pick = pick
        self._lock = threading.Lock()
        self._ports: dict[str, int] = {}
        self._holders: dict[str, set[str]] = {}

    def claim(self, group: str, holder: str) -> int:
        """The port of *group*, chosen now if it has none; *holder* (a pod uid) keeps it."""
        with self._lock:
            port = self._ports.get(group)
            if port is None:
                taken = set(self._ports.values())
                port = self._pick()
                while port in taken:
                    port = self._pick()
                self._ports[group] = port
            self._holders.setdefault(group, set()).add(holder)
            return port

    def release(self, holder: str) -> None:
        """*holder* is gone; a group nobody holds gives its port back."""
        with self._lock:
            for group in [g for g, holders in self._holders.items() if holder in holders]:
                self._holders[group].discard(holder)
                if not self._holders[group]:
                    del self._holders[group]
                    del self._ports[group]


# --------------------------------------------------------------------------------------------
# A container's private mount namespace (pure)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mount:
    """*source* (on the host) bind-mounted on *target* (the container's path)."""

    source: Path
    target: str
    directory: bool = True


def private_working_dir(working_dir: str, volumes: Sequence[Mount], scratch: Path) -> Mount | None:
    """*scratch* on the container's *working_dir*, as its image's filesystem gives every
    container a directory of its own there (`WORKDIR /workspace`): without it the directory
    would be the host's, shared by every pod, and what a trainer writes there (its output
    before a publish to object storage) would outlive the pod and mix with other pods'.

    None for `/`, and where a volume is mounted on *working_dir* or above it: that volume is
    the directory then, as in a container.
    """
    target = PurePosixPath(working_dir)
    if target == PurePosixPath("/"):
        return None
    for volume in volumes:
        mounted = PurePosixPath(volume.target)
        if mounted == target or mounted in target.parents:
            return None
    return Mount(scratch, working_dir)


def mount_script(
    image_files: Sequence[Mount],
    volumes: Sequence[Mount],
    *,
    keep: Sequence[Path],
    hosts: Path,
    working_dir: str,
) -> str:
    """The bash script that builds a container's mounts in its fresh mount namespace, then
    runs `"$@"` in *working_dir*.

    Order, as in a container: the image's files, then the volumes (parents before children),
    then each *keep* path a mount covered, bound back on itself, and the hosts file on
    /etc/hosts. Every source is opened before anything is mounted and mounted from its file
    descriptor (`/proc/self/fd/N`): a volume on /tmp must not hide the next volume's source,
    or the hosts file, when the agent's own directory is under /tmp.
    """
    ordered = [*image_files, *sorted(volumes, key=lambda m: PurePosixPath(m.target).parts)]
    targets = [PurePosixPath(m.target) for m in ordered]
    for path in keep:
        covered = any(t == PurePosixPath(path) or t in PurePosixPath(path).parents for t in targets)
        if covered:
            ordered.append(Mount(path, str(path)))
    ordered.append(Mount(hosts, "/etc/hosts", directory=False))
    # bash gives each `{name}<path` a free descriptor (10 and up) and keeps it in $name.
    names = [f"source{number}" for number in range(len(ordered))]
    opened = [
        f"{{{name}}}<{shlex.quote(str(m.source))}" for name, m in zip(names, ordered, strict=True)
    ]
    lines = ["exec " + " ".join(opened)]
    for name, mount in zip(names, ordered, strict=True):
        target = shlex.quote(mount.target)
        if mount.directory:
            lines.append(f"mkdir -p {target}")
        else:
            lines.append(f"mkdir -p {shlex.quote(str(PurePosixPath(mount.target).parent))}")
            lines.append(f"{{ [ -e {target} ] || : > {target}; }}")
        lines.append(f'mount --no-canonicalize --bind "/proc/self/fd/${name}" {target}')
    lines.append("exec " + " ".join(f"{{{name}}}<&-" for name in names))
    lines.append(f"mkdir -p {shlex.quote(working_dir)}")
    lines.append(f"cd {shlex.quote(working_dir)}")
    lines.append('exec "$@"')
    return " && ".join(lines)


# --------------------------------------------------------------------------------------------
# The agent
# --------------------------------------------------------------------------------------------


class PodStartError(Exception):
    """A pod cannot start now; the kubelet-style reason and message go into its status."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class _Container:
    name: str
    spec: Mapping[str, Any]
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "Pending"}})
    restart_count: int = 0
    process: subprocess.Popen[bytes] | None = None

    def status(self, image: str) -> dict[str, Any]:
        return {
            "name": self.name,
            "image": image,
            "imageID": "",
            "ready": "running" in self.state,
            "started": "running" in self.state,
            "restartCount": self.restart_count,
            "state": self.state,
        }


class PodRunner:
    """Runs one pod to its end on this node, writing its status as it goes."""

    def __init__(self, agent: NodeAgent, pod: Mapping[str, Any]) -> None:
        self.agent = agent
        self.pod = pod
        metadata = pod["metadata"]
        self.namespace: str = metadata["namespace"]
        self.name: str = metadata["name"]
        self.uid: str = metadata["uid"]
        self.spec: Mapping[str, Any] = pod["spec"]
        self.directory = agent.root / "pods" / f"{self.namespace}_{self.name}_{self.uid}"
        self.stopping = threading.Event()
        self.init_containers = [
            _Container(c["name"], c) for c in self.spec.get("initContainers") or []
        ]
        self.containers = [_Container(c["name"], c) for c in self.spec["containers"]]
        self.phase = "Pending"
        self.initialized = not self.init_containers
        self.started_at = _now()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def terminate(self, grace_seconds: float) -> None:
        """SIGTERM every process group, SIGKILL what is left after *grace_seconds*."""
        self.stopping.set()
        processes = [c.process for c in (*self.init_containers, *self.containers)]
        alive = [p for p in processes if p is not None and p.poll() is None]
        for process in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + min(grace_seconds, MAX_GRACE_SECONDS)
        for process in alive:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def _run(self) -> None:
        try:
            self._run_pod()
        except Exception as exc:  # the pod must not stay Running because the agent failed
            if not self.stopping.is_set():
                self.agent.log(f"pod {self.namespace}/{self.name}: {exc!r}")
                self.phase = "Failed"
                self._write_status(message=f"node agent: {exc}", reason="NodeAgentError")

    def _run_pod(self) -> None:
        self._write_status()
        try:
            environments = {
                c.name: self._image(c) for c in (*self.init_containers, *self.containers)
            }
        except PodStartError:
            return  # _image wrote the waiting state; the pod stays Pending, as a kubelet's does
        if not self.agent.can_unshare:
            self.phase = "Failed"
            self._write_status(
                reason="MountNamespaceUnavailable",
                message="the node agent needs `unshare --mount` (root or user namespaces)",
            )
            return
        volumes = self._prepare_volumes_until_ready()
        if volumes is None:
            return
        restart = self.spec.get("restartPolicy", "Always")
        for container in self.init_containers:
            while True:
                code = self._run_container(container, environments[container.name], volumes)
                if self.stopping.is_set():
                    return
                if code == 0:
                    break
                if restart == "Never":
                    self.phase = "Failed"
                    self._write_status()
                    return
                time.sleep(RESTART_BACKOFF_SECONDS)
                container.restart_count += 1
        self.initialized = True
        threads = [
            threading.Thread(
                target=self._keep_running,
                args=(container, environments[container.name], volumes, restart),
                daemon=True,
            )
            for container in self.containers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.stopping.is_set():
            return
        codes = [c.state.get("terminated", {}).get("exitCode", 1) for c in self.containers]
        self.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        self._write_status()

    def _keep_running(
        self,
        container: _Container,
        environment: ImageEnvironment,
        volumes: Mapping[str, Path],
        restart: str,
    ) -> None:
        while True:
            code = self._run_container(container, environment, volumes)
            if self.stopping.is_set():
                return
            if restart == "Never" or (restart == "OnFailure" and code == 0):
                return
            time.sleep(RESTART_BACKOFF_SECONDS)
            container.restart_count += 1

    # -- images, env, volumes ------------------------------------------------------------

    def _image(self, container: _Container) -> ImageEnvironment:
        image = container.spec.get("image", "")
        environment = self.agent.images.get(image_repository(image))
        if environment is not None:
            return environment
        message = (
            f'Failed to pull image "{image}": the tuneloop node agent runs no container '
            f"engine; it runs only {', '.join(sorted(self.agent.images))} (any tag), "
            "mapped to this project's environment"
        )
        container.state = {"waiting": {"reason": "ErrImagePull", "message": message}}
        self._write_status()
        raise PodStartError("ErrImagePull", message)

    def _prepare_volumes_until_ready(self) -> dict[str, Path] | None:
        """Volumes for every mount; a missing ConfigMap or Secret is waited for, as a kubelet
        does (the containers wait with reason ContainerCreating)."""
        while not self.stopping.is_set():
            try:
                return self._prepare_volumes()
            except PodStartError as waiting:
                for container in (*self.init_containers, *self.containers):
                    container.state = {
                        "waiting": {"reason": waiting.reason, "message": waiting.message}
                    }
                self._write_status()
                time.sleep(1.0)
        return None

    def _prepare_volumes(self) -> dict[str, Path]:
        return {volume["name"]: self._volume(volume) for volume in self.spec.get("volumes") or []}

    def _volume(self, volume: Mapping[str, Any]) -> Path:
        name: str = volume["name"]
        if "persistentVolumeClaim" in volume:
            claim: str = volume["persistentVolumeClaim"]["claimName"]
            directory = self.agent.root / "claims" / self.namespace / claim
            directory.mkdir(parents=True, exist_ok=True)
            return directory
        directory = self.directory / "volumes" / name
        directory.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in volume or "hostPath" in volume:
            # hostPath gets a private directory too: pods never touch the host's paths.
            return directory
        if "configMap" in volume:
            self._write_items(
                directory, self._config_map_data(volume["configMap"]), volume["configMap"]
            )
        elif "secret" in volume:
            self._write_items(directory, self._secret_data(volume["secret"]), volume["secret"])
        elif "downwardAPI" in volume:
            for item in volume["downwardAPI"].get("items") or []:
                self._write_file(
                    directory / item["path"],
                    field_value(self.pod, item["fieldRef"]["fieldPath"]).encode(),
                )
        elif "projected" in volume:
            for source in volume["projected"].get("sources") or []:
                self._projected(directory, source)
        else:
            raise PodStartError(
                "CreateContainerConfigError",
                f"volume {name}: this node agent has no such volume type",
            )
        return directory

    def _projected(self, directory: Path, source: Mapping[str, Any]) -> None:
        if "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            self._write_file(
                directory / token["path"],
                self.agent.request_token(
                    self.namespace,
                    self.spec.get("serviceAccountName") or "default",
                    pod_name=self.name,
                    pod_uid=self.uid,
                    audience=token.get("audience"),
                    expiration_seconds=int(token.get("expirationSeconds", 3600)),
                ).encode(),
            )
        elif "configMap" in source:
            self._write_items(
                directory, self._config_map_data(source["configMap"]), source["configMap"]
            )
        elif "secret" in source:
            self._write_items(directory, self._secret_data(source["secret"]), source["secret"])
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items") or []:
                self._write_file(
                    directory / item["path"],
                    field_value(self.pod, item["fieldRef"]["fieldPath"]).encode(),
                )

    def _config_map_data(self, reference: Mapping[str, Any]) -> dict[str, bytes]:
        found = self.agent.read("configmaps", self.namespace, reference["name"])
        if found is None:
            if reference.get("optional"):
                return {}
            raise PodStartError("ContainerCreating", f'configmap "{reference["name"]}" not found')
        data = {key: value.encode() for key, value in (found.get("data") or {}).items()}
        for key, value in (found.get("binaryData") or {}).items():
            data[key] = base64.b64decode(value)
        return data

    def _secret_data(self, reference: Mapping[str, Any]) -> dict[str, bytes]:
        name = reference.get("secretName") or reference.get("name") or ""
        found = self.agent.read("secrets", self.namespace, name)
        if found is None:
            if reference.get("optional"):
                return {}
            raise PodStartError("ContainerCreating", f'secret "{name}" not found')
        return {key: base64.b64decode(value) for key, value in (found.get("data") or {}).items()}

    def _write_items(
        self, directory: Path, data: Mapping[str, bytes], reference: Mapping[str, Any]
    ) -> None:
        items = reference.get("items")
        if items:
            for item in items:
                if item["key"] in data:
                    self._write_file(directory / item["path"], data[item["key"]])
        else:
            for key, value in data.items():
                self._write_file(directory / key, value)

    @staticmethod
    def _write_file(path: Path, content: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)

    def _env(self, container: _Container, environment: ImageEnvironment) -> dict[str, str]:
        variables: dict[str, str] = dict(environment.env)
        for source in container.spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self._config_map_data(source["configMapRef"])
            else:
                data = self._secret_data(source["secretRef"])
            variables.update({prefix + key: value.decode() for key, value in data.items()})
        hostname = self.spec.get("hostname") or self.name
        variables["HOSTNAME"] = hostname
        # As a kubelet does for every pod: the API server's address (here loopback), so that
        # in-cluster clients (the worker of deploy/helm/tuneloop) find it.
        api_host, api_port = self.agent.api_server
        variables["KUBERNETES_SERVICE_HOST"] = api_host
        variables["KUBERNETES_SERVICE_PORT"] = str(api_port)
        variables["KUBERNETES_SERVICE_PORT_HTTPS"] = str(api_port)
        for entry in container.spec.get("env") or []:
            if entry["name"] in MASTER_PORT_VARIABLES:
                # The torchrun master port: one free port per TrainJob, not the shared 29500.
                port = self.agent.master_ports.claim(rendezvous_group(self.pod), self.uid)
                variables[entry["name"]] = str(port)
            else:
                variables[entry["name"]] = self._env_value(entry, variables)
        return variables

    def _env_value(self, entry: Mapping[str, Any], variables: Mapping[str, str]) -> str:
        if "valueFrom" not in entry:
            return expand(entry.get("value", ""), variables)
        source = entry["valueFrom"]
        if "fieldRef" in source:
            return field_value(self.pod, source["fieldRef"]["fieldPath"])
        if "configMapKeyRef" in source:
            reference = source["configMapKeyRef"]
            return self._config_map_data(reference).get(reference["key"], b"").decode()
        if "secretKeyRef" in source:
            reference = {**source["secretKeyRef"], "secretName": source["secretKeyRef"]["name"]}
            return self._secret_data(reference).get(reference["key"], b"").decode()
        if "resourceFieldRef" in source:
            return str(os.cpu_count() or 1)  # limits are not enforced; the node's CPUs
        raise PodStartError(
            "CreateContainerConfigError", f"env {entry['name']}: unsupported source"
        )

    def _hosts(self, variables: Mapping[str, str]) -> str:
        """/etc/hosts for the pod: its own names, the torchrun master and the Trainer's status
        server resolve to 127.0.0.1 (there is no cluster DNS)."""
        hostname = self.spec.get("hostname") or self.name
        names = {"localhost", hostname}
        subdomain = self.spec.get("subdomain")
        if subdomain:
            for suffix in (
                "",
                f".{self.namespace}",
                f".{self.namespace}.svc",
                f".{self.namespace}.svc.cluster.local",
            ):
                names.add(f"{hostname}.{subdomain}{suffix}")
        for key in ("PET_MASTER_ADDR", "MASTER_ADDR"):
            if variables.get(key):
                names.add(variables[key])
        server = variables.get("KUBEFLOW_TRAINER_SERVER_URL", "")
        host = re.match(r"https?://([^/:]+)", server)
        if host:
            names.add(host.group(1))
        return "127.0.0.1\t" + " ".join(sorted(names)) + "\n::1\tlocalhost\n"

    # -- processes -----------------------------------------------------------------------

    def _run_container(
        self,
        container: _Container,
        environment: ImageEnvironment,
        volumes: Mapping[str, Path],
    ) -> int:
        variables = self._env(container, environment)
        command = [
            expand(part, variables)
            for part in container.spec.get("command") or environment.entrypoint
        ]
        if not container.spec.get("command") and not container.spec.get("args"):
            arguments: list[str] = []
        else:
            arguments = [expand(part, variables) for part in container.spec.get("args") or []]
        hosts = self.directory / "etc" / f"{container.name}.hosts"
        self._write_file(hosts, self._hosts(variables).encode())
        working_dir = container.spec.get("workingDir") or environment.working_dir
        own_mounts = []
        for mount in container.spec.get("volumeMounts") or []:
            source = volumes[mount["name"]]
            if mount.get("subPath"):
                source = source / mount["subPath"]
                if not source.exists():
                    source.mkdir(parents=True)
            own_mounts.append(Mount(source, mount["mountPath"], directory=source.is_dir()))
        image_files = [
            Mount(source, target, directory=source.is_dir())
            for target, source in environment.files.items()
        ]
        # A restarted container gets a new one, as it gets a new writable layer.
        scratch = self.directory / "rootfs" / f"{container.name}-{container.restart_count}"
        workdir = private_working_dir(working_dir, own_mounts, scratch)
        # As the kubelet does: an empty file of the container's own on its
        # terminationMessagePath, whose words become its terminated message.
        termination = self.directory / "termination" / f"{container.name}-{container.restart_count}"
        self._write_file(termination, b"")
        own_mounts.append(
            Mount(
                termination,
                container.spec.get("terminationMessagePath") or TERMINATION_MESSAGE_PATH,
                directory=False,
            )
        )
        if workdir is not None:
            scratch.mkdir(parents=True, exist_ok=True)
            image_files.append(workdir)
        script = mount_script(
            # Parents before children: an image file below the working directory stays seen.
            sorted(image_files, key=lambda m: PurePosixPath(m.target).parts),
            own_mounts,
            keep=environment.host_paths,
            hosts=hosts,
            working_dir=working_dir,
        )
        logs = self.directory / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        # `$PATH` lookup happens inside the namespace with the pod's PATH (the project's bin).
        args = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "bash",
            "-c",
            script,
            "bash",
            *command,
            *arguments,
        ]
        with (logs / f"{container.name}.log").open("ab") as log:
            container.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={
                    **variables,
                    "PATH": variables.get("PATH", environment.env.get("PATH", "/usr/bin:/bin")),
                },
                start_new_session=True,
            )
        started = _now()
        container.state = {"running": {"startedAt": started}}
        if self.phase == "Pending" and container in self.containers:
            self.phase = "Running"
        self._write_status()
        code = container.process.wait()
        if code < 0:
            code = 128 - code  # killed by a signal: a kubelet reports 128 + signal number
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": _now(),
        }
        told = termination.read_bytes()[:TERMINATION_MESSAGE_BYTES]
        if told.strip():
            # As the kubelet does: what the container wrote there, whatever its exit code.
            terminated["message"] = told.decode("utf-8", errors="replace")
        elif code != 0 and container.spec.get("terminationMessagePolicy") == FALLBACK_TO_LOGS:
            # Else, as the kubelet does: the log's last 80 lines, at most 2 KiB of its end.
            tail = b"\n".join((logs / f"{container.name}.log").read_bytes().splitlines()[-80:])
            terminated["message"] = tail[-2048:].decode("utf-8", errors="replace")
        container.state = {"terminated": terminated}
        if not self.stopping.is_set():
            self._write_status()
        return code

    # -- status --------------------------------------------------------------------------

    def _write_status(self, *, reason: str | None = None, message: str | None = None) -> None:
        with self._lock:
            containers_ready = self.phase == "Running" and all(
                "running" in c.state for c in self.containers
            )

            def condition(kind: str, ok: bool) -> dict[str, Any]:
                return {
                    "type": kind,
                    "status": "True" if ok else "False",
                    "lastTransitionTime": _now(),
                }

            status: dict[str, Any] = {
                "phase": self.phase,
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "startTime": self.started_at,
                "conditions": [
                    condition("PodScheduled", True),
                    condition("Initialized", self.initialized),
                    condition("ContainersReady", containers_ready),
                    condition("Ready", containers_ready),
                ],
                "initContainerStatuses": [
                    c.status(c.spec.get("image", "")) for c in self.init_containers
                ]
                or None,
                "containerStatuses": [c.status(c.spec.get("image", "")) for c in self.containers],
            }
            if self.phase != "Pending":
                status["podIP"] = "127.0.0.1"
                status["podIPs"] = [{"ip": "127.0.0.1"}]
            if reason:
                status["reason"] = reason
            if message:
                status["message"] = message
            self.agent.patch_pod_status(self.namespace, self.name, status)


class NodeAgent:
    """Registers the node, binds pending pods to it, and runs the pods bound to it."""

    def __init__(
        self,
        api_client: Any,
        *,
        root: Path,
        node_name: str,
        images: Mapping[str, ImageEnvironment],
        can_unshare: bool = True,
    ) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.root = root
        self.node_name = node_name
        self.images = dict(images)
        self.can_unshare = can_unshare
        self.runners: dict[str, PodRunner] = {}
        self.master_ports = MasterPorts()
        server = urllib.parse.urlsplit(api_client.configuration.host)
        self.api_server = (server.hostname or "127.0.0.1", server.port or 443)
        """The API server as pods reach it (KUBERNETES_SERVICE_HOST and _PORT)."""
        self._last_heartbeat = 0.0
        self._api_lock = threading.Lock()

    def log(self, message: str) -> None:
        print(f"{_now()} node-agent: {message}", file=sys.stderr, flush=True)

    # -- API calls (one at a time: the client's pool is shared by the pod threads) --------

    def _call(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        from kubernetes.client.exceptions import ApiException

        with self._api_lock:
            request = self.api_client.param_serialize(
                method=method,
                resource_path=path,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            answer = self.api_client.call_api(*request, _request_timeout=30)
            data = answer.read()
        if not 200 <= answer.status < 300:
            raise ApiException(http_resp=answer)
        return json.loads(data) if data else None

    def read(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            found: dict[str, Any] = self._call(
                "GET", f"/api/v1/namespaces/{namespace}/{resource}/{name}"
            )
            return found
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._call(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                {"status": status},
                "application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status != 404:  # the pod is gone: nothing to report to
                raise

    def request_token(
        self,
        namespace: str,
        service_account: str,
        *,
        pod_name: str,
        pod_uid: str,
        audience: str | None,
        expiration_seconds: int,
    ) -> str:
        """A ServiceAccount token bound to the pod, through the TokenRequest API."""
        spec: dict[str, Any] = {
            "expirationSeconds": expiration_seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid},
        }
        if audience:
            spec["audiences"] = [audience]
        answer = self._call(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
            "application/json",
        )
        return str(answer["status"]["token"])

    # -- the loop ------------------------------------------------------------------------

    def register(self) -> None:
        from kubernetes.client.exceptions import ApiException

        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {
                    "kubernetes.io/hostname": self.node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
        }
        try:
            self._call("POST", "/api/v1/nodes", node, "application/json")
        except ApiException as exc:
            if exc.status != 409:
                raise
        self.heartbeat()

    def heartbeat(self) -> None:
        now = _now()
        memory_kib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
        resources = {"cpu": str(os.cpu_count() or 1), "memory": f"{memory_kib}Ki", "pods": "110"}
        status = {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node_name},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "tuneloop node agent is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "kubeletVersion": "tuneloop-node-agent",
                "containerRuntimeVersion": "local-process://0",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "osImage": "",
                "kernelVersion": os.uname().release,
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }
        self._call(
            "PATCH",
            f"/api/v1/nodes/{self.node_name}/status",
            {"status": status},
            "application/merge-patch+json",
        )
        self._last_heartbeat = time.monotonic()

    def run(self, stop: threading.Event) -> None:
        self.register()
        self.log(f"node {self.node_name} registered; pods under {self.root}")
        while not stop.is_set():
            try:
                self.step()
                if time.monotonic() - self._last_heartbeat > HEARTBEAT_SECONDS:
                    self.heartbeat()
            except Exception as exc:  # the API server may be restarting: keep going
                self.log(f"step failed: {exc!r}")
                time.sleep(1.0)
            stop.wait(POLL_SECONDS)
        for runner in list(self.runners.values()):
            runner.terminate(0)

    def step(self) -> None:
        """One pass: bind the unbound (outside held namespaces), start the new, stop the
        deleted.

        The pods of the namespaces held when the pass starts are not asked for: they stay
        unbound, so there is nothing to do with them, and a list of every pod twice a second
        had the API server serialize, and this agent decode, the thousands of held pods a
        benchmark leaves behind. The agent's CPU per launch in the endtoend benchmark's
        100/s phase fell from 1.7 ms to 0.1 ms (one run each, same machine)."""
        pods = self.pods_to_look_at()
        # Asked for again before binding, once per pass and only when a pod is unbound: a
        # namespace created held after the first ask must not have its pods bound.
        held: set[str] | None = None
        seen: set[str] = set()
        for pod in pods:
            metadata, spec = pod["metadata"], pod["spec"]
            uid = metadata["uid"]
            if not spec.get("nodeName"):
                if (
                    not metadata.get("deletionTimestamp")
                    and spec.get("schedulerName", "default-scheduler") == "default-scheduler"
                ):
                    if held is None:
                        held = self._held_namespaces()
                    if metadata["namespace"] not in held:
                        self._bind(metadata["namespace"], metadata["name"])
                continue
            if spec["nodeName"] != self.node_name:
                continue
            seen.add(uid)
            phase = (pod.get("status") or {}).get("phase")
            runner = self.runners.get(uid)
            if metadata.get("deletionTimestamp"):
                if runner is None or not runner.stopping.is_set():
                    grace = float(metadata.get("deletionGracePeriodSeconds") or 0)
                    threading.Thread(
                        target=self._stop_and_remove, args=(pod, runner, grace), daemon=True
                    ).start()
                continue
            if runner is None and phase not in ("Succeeded", "Failed"):
                runner = PodRunner(self, pod)
                self.runners[uid] = runner
                self.log(f"starting pod {metadata['namespace']}/{metadata['name']}")
                runner.start()
        for uid in set(self.runners) - seen:
            gone = self.runners.pop(uid)
            self.master_ports.release(uid)
            threading.Thread(target=gone.terminate, args=(0,), daemon=True).start()

    def pods_to_look_at(self) -> list[dict[str, Any]]:
        """Every pod but those of the namespaces held now (`step`)."""
        items: list[dict[str, Any]] = self._call(
            "GET", "/api/v1/pods" + _outside(self._held_namespaces())
        )["items"]
        return items

    def _held_namespaces(self) -> set[str]:
        """The namespaces labelled `HOLD_LABEL=HOLD_VALUE`, whose pods are left unbound."""
        found = self._call("GET", f"/api/v1/namespaces?labelSelector={HOLD_LABEL}%3D{HOLD_VALUE}")[
            "items"
        ]
        return {namespace["metadata"]["name"] for namespace in found}

    def _bind(self, namespace: str, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            self._call(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                binding,
                "application/json",
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _stop_and_remove(
        self, pod: Mapping[str, Any], runner: PodRunner | None, grace: float
    ) -> None:
        from kubernetes.client.exceptions import ApiException

        if runner is not None:
            runner.terminate(grace)
        metadata = pod["metadata"]
        # A kubelet removes the pod once its containers are gone: the deletion completes.
        with contextlib.suppress(ApiException):
            self._call(
                "DELETE",
                f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": metadata["uid"]}},
                "application/json",
            )


def _outside(namespaces: set[str]) -> str:
    """The query of a pod list that leaves out the pods of *namespaces* (none: every pod)."""
    if not namespaces:
        return ""
    selector = ",".join(f"metadata.namespace!={name}" for name in sorted(namespaces))
    return "?fieldSelector=" + urllib.parse.quote(selector, safe="")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m devservices.node_agent --kubeconfig K --root DIR [--node-name N]`."""
    from devservices.control_plane import unshare_available
    from devservices.kubernetes import cache_root, new_api_client

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--node-name", default="tuneloop-local")
    options = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    python = Path(sys.executable)
    images = {
        TUNELOOP_IMAGE_REPOSITORY: tuneloop_image_environment(python, cache_root()),
        ORCHESTRATOR_IMAGE_REPOSITORY: orchestrator_image_environment(python),
    }
    options.root.mkdir(parents=True, exist_ok=True)
    with new_api_client(options.kubeconfig) as api:
        NodeAgent(
            api,
            root=options.root,
            node_name=options.node_name,
            images=images,
            can_unshare=unshare_available(),
        ).run(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
