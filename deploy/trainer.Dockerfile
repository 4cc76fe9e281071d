# The trainer image: what a TrainJob on the tuneloop ClusterTrainingRuntime runs.
#
#   docker build -f deploy/trainer.Dockerfile -t tuneloop-trainer .
#
# The entrypoint is torchrun, which reads Kubeflow's PET_* variables (nodes, processes per
# node, rank, master address/port), so the same image runs one process or many, on one node
# or several. Settings come from TrainJob args/env (docs/trainer.md). CUDA wheels come with
# torch from PyPI; on a CPU-only node the same image runs on CPU.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    TUNELOOP_CACHE=/workspace/cache

WORKDIR /opt/tuneloop
COPY pyproject.toml constraints.txt README.md ./
COPY orchestrator ./orchestrator
COPY runtimes ./runtimes
COPY handlers ./handlers
RUN pip install --constraint constraints.txt ".[train]"

# Kubeflow's initializers put the model and data here; outputs go to a volume.
WORKDIR /workspace
RUN useradd --uid 1000 --create-home trainer && mkdir -p /workspace/output /workspace/cache \
    && chown -R trainer /workspace
USER trainer

ENTRYPOINT ["torchrun", "--module", "runtimes.trainer"]
CMD ["--help"]
