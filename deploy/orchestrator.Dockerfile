# The tuneloop orchestrator image: the Kafka consumers, the rules and the Kubernetes backend.
# No torch/transformers/peft here (the `train` extra): training runs in the trainer image,
# inside TrainJobs. Build from the repository root:
#   docker build -f deploy/orchestrator.Dockerfile -t ghcr.io/tuneloop/orchestrator:0.1.0 .
# Deployed by deploy/helm/tuneloop (which runs `tuneloop run --rules /etc/tuneloop/rules`).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Dependencies first, pinned by constraints.txt, so that code changes reuse this layer.
COPY pyproject.toml constraints.txt README.md ./
RUN python -m venv /opt/tuneloop \
 && /opt/tuneloop/bin/pip install --upgrade "pip>=24" \
 && grep -v -E '^(torch|transformers|peft|accelerate|tokenizers|safetensors|gguf|nvidia-|triton)' constraints.txt > /tmp/constraints-orchestrator.txt
COPY orchestrator ./orchestrator
COPY handlers ./handlers
COPY runtimes ./runtimes
RUN /opt/tuneloop/bin/pip install -c /tmp/constraints-orchestrator.txt .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tuneloop orchestrator" \
      org.opencontainers.image.source="https://github.com/tuneloop/tuneloop" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed non-root uid, the one the chart's securityContext expects.
RUN groupadd --gid 10001 tuneloop && useradd --uid 10001 --gid 10001 --no-create-home tuneloop
COPY --from=build /opt/tuneloop /opt/tuneloop
ENV PATH=/opt/tuneloop/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
# The web server: probes, /metrics, the dashboard and POST /events (TUNELOOP_WEB_PORT).
EXPOSE 8080
ENTRYPOINT ["tuneloop"]
CMD ["run", "--rules", "/etc/tuneloop/rules"]
