# Two commands do all the set-up on a fresh machine:  make demo  and  make test.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch requirement. On machines like our CI, `torch==2.13.0` resolves to a CPU wheel
# on local disk; on a GPU host it is PyPI's CUDA build. Inside NGC containers torch is
# already installed: it is detected below and never reinstalled.
TORCH_SPEC ?= torch==2.13.0
SYSTEM_HAS_TORCH := $(shell $(PYTHON) -c 'import torch' >/dev/null 2>&1 && echo yes)
EXTRAS ?= train,dev,data
# Processes for the demo: one per GPU when there are at least 2, else 2 CPU processes.
NGPUS := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
NPROC ?= $(if $(filter-out 0 1,$(NGPUS)),$(NGPUS),2)
DEMO_OUT ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
PYTEST_ARGS ?=
# make test's pytest workers (pytest-xdist; each takes whole test files): 2 on a 2-core machine.
TEST_WORKERS ?= 2
# Extra pip flags, e.g. PIP_FLAGS=--no-build-isolation on offline/air-gapped hosts whose
# python already has setuptools (NGC images do).
PIP_FLAGS ?=

.PHONY: help setup demo test test-fast test-cluster test-nodes test-podman test-arm64 lint render-k8s clean-venv

help:  ## list targets (this file and docker/docker.mk)
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@if [ ! -x "$(PY)" ]; then \
	  if [ "$(SYSTEM_HAS_TORCH)" = yes ]; then \
	    echo "torch found in $(PYTHON) (NGC image?): venv shares it, torch is not reinstalled"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	    $(PYTHON) -c 'import site, sys; print("\n".join(site.getsitepackages()))' \
	      > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_parent_site.pth"; \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi
	@if ! $(PY) -c 'import torch' >/dev/null 2>&1; then \
	  echo "installing $(TORCH_SPEC)"; \
	  $(PY) -m pip install --disable-pip-version-check -q "$(TORCH_SPEC)"; \
	fi
	$(PY) -m pip install --disable-pip-version-check -q $(PIP_FLAGS) -e ".[$(EXTRAS)]"
	@touch $@

setup: $(VENV)/.installed  ## create .venv and install the project (idempotent)

demo: setup  ## 2-process training of the tiny preset on the embedded corpus (GPUs: one process per GPU, NCCL + bf16)
	@echo "demo: $(NPROC) processes, output in $(DEMO_OUT)"
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m train run --nproc-per-node $(NPROC) --config tiny --out "$(DEMO_OUT)"

test: setup  ## the test suite (GPU tests run where GPUs are visible, skip elsewhere)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The quick subset (no training processes, no long shellcheck/Kubernetes sweeps): what to run while
# editing; make test runs everything.
FAST_TESTS ?= tests/test_architecture.py tests/train/test_cli_ux.py tests/train/test_config.py \
	tests/train/test_model.py tests/train/test_optim.py tests/train/test_data.py \
	tests/comm/test_comm_formulas.py tests/comm/test_comm_advice.py tests/docker/test_docker_files.py \
	tests/doctor/test_doctor_driver_cuda.py tests/doctor/test_preflight_verdict.py tests/doctor/test_netplugin.py \
	tests/launch/test_launch_cli.py tests/launch/test_launch_env_rules.py tests/launch/test_launch_quoting.py \
	tests/launch/test_launch_preflight.py tests/launch/test_launch_fuzz_inputs.py \
	tests/launch/test_launch_docker_runtime.py tests/launch/test_launch_safety.py \
	tests/launch/test_launch_k8s_behaviour.py tests/launch/test_launch_container_out.py \
	tests/launch/test_launch_slurm_options.py tests/launch/test_launch_golden.py

test-fast: setup  ## the quick subset of the tests (no training processes), for use while editing
	$(PY) -m pytest -q -p no:cacheprovider -m "not gpu and not multigpu and not container and not cluster" \
	  $(FAST_TESTS) $(PYTEST_ARGS)

lint: setup  ## ruff (version pinned in the dev extra) on the Python code, shellcheck on the shell scripts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/shellcheck -x scripts/*.sh scripts/gpu/*.sh docker/*.sh

# The host-side podman tests of rendered `launch docker` scripts.
CLUSTER_PODMAN_TESTS ?= -q -p no:cacheprovider -m container -s tests/docker/test_launch_podman.py

test-cluster: test-nodes test-podman  ## deployment tests as root: the two below, one after the other

test-nodes: setup  ## as root: the emulated cluster (netns nodes: multi-node and elastic torchrun, real Slurm with preemption, a slow link, the preflight gate)
	bash scripts/cluster_deps.sh
	$(PY) -m pytest -q -m cluster -p no:cacheprovider --durations=15 tests/cluster $(PYTEST_ARGS)

test-podman: setup  ## as root: the image built with podman (scripts/container_test.sh), pytest inside it, then podman running rendered `launch docker` scripts against it
	CONTAINER_CI_LAUNCH_TESTS='$(CLUSTER_PODMAN_TESTS)' bash scripts/container_test.sh

# ARM64_PLATFORMS=linux/amd64,linux/arm64: the multi-arch manifest (scripts/arm64_test.sh lists the knobs).
test-arm64:  ## as root: the blackwell image for linux/arm64 (GB200/GH200) built with build-image and run (CLIs, doctor, 2-process training) under QEMU
	bash scripts/arm64_test.sh

render-k8s: setup  ## re-render the committed Kubernetes manifests under k8s/ (TrainJob, runtimes, PyTorchJob, ComputeDomain)
	$(PY) scripts/render_examples.py

clean-venv:  ## remove .venv
	rm -rf $(VENV)

-include docker/docker.mk
