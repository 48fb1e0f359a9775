# Container image targets. Included from the top-level Makefile (`include docker/docker.mk`);
# also usable alone from the repo root: make -f docker/docker.mk build-image TARGET=hopper
#
#   make build-image    TARGET=hopper|blackwell|hopper-cu128|blackwell-cu13|hopper-efa|blackwell-efa
#                       [BASE_IMAGE=...] [ENGINE=docker|podman]
#                       [PLATFORMS=linux/amd64,linux/arm64] [PIP_CA_BUNDLE=/path/ca.crt]
#   make push           REGISTRY=registry.example.com/team [TARGET=...]
#   make image-name     [REGISTRY=...] [TARGET=...]   (the name `launch --registry` renders)
#   make test-container TARGET=...   (pytest inside the image; GPU tests when nvidia-smi works)
#   make k8s-apply      FILE=job.yaml [KUBECTL_ARGS=--namespace=...]   (one rendered job)
# See docker/README.md.

# Do not let these rules become the default goal of the including Makefile.
_DOCKER_MK_DEFAULT_GOAL := $(.DEFAULT_GOAL)

# Targets: a Dockerfile each (hopper, blackwell), plus variants on another NGC base whose
# CUDA needs a different driver floor (docker/README.md: targets and driver floors), and the
# EFA variants (AWS): libfabric + the aws-ofi-nccl NCCL net plugin at the versions pinned in
# docker/efa-versions.env, built from the tarballs docker/efa-sources.sh puts in EFA_SRC_DIR.
DOCKER_TARGETS := hopper blackwell hopper-cu128 blackwell-cu13 hopper-efa blackwell-efa
include docker/efa-versions.env
EFA_SRC_DIR ?= build/efa-src
TARGET ?= hopper
# One name from build to push to every render: IMAGE_REPOSITORY is launch/defaults.py's, and
# `launch ... --registry $(REGISTRY)` renders $(IMAGE_NAME) for a profile of image target $(TARGET).
IMAGE_REPOSITORY := hopper-train
IMAGE ?= $(IMAGE_REPOSITORY):$(TARGET)
NGC_CU128 := nvcr.io/nvidia/pytorch:25.03-py3
NGC_CU13 := nvcr.io/nvidia/pytorch:25.12-py3
_VARIANT_hopper-cu128 = --build-arg BASE_IMAGE=$(NGC_CU128) --build-arg BASE_CUDA=12.8 \
	--build-arg DRIVER_FLOOR="525 (570 for all CUDA 12.8 features)"
_VARIANT_blackwell-cu13 = --build-arg BASE_IMAGE=$(NGC_CU13) --build-arg BASE_CUDA=13.1 \
	--build-arg DRIVER_FLOOR="580 (data center GPUs: 535.86+/550.54+ with forward compatibility)"
_EFA_ARGS = --build-arg LIBFABRIC_VERSION=$(LIBFABRIC_VERSION) \
	--build-arg AWS_OFI_NCCL_VERSION=$(AWS_OFI_NCCL_VERSION) --build-context efa_src=$(EFA_SRC_DIR)
_VARIANT_hopper-efa = $(_EFA_ARGS)
_VARIANT_blackwell-efa = $(_EFA_ARGS)
# docker when a Docker engine answers, else podman if installed (evaluated once, lazily).
ENGINE ?= $(eval ENGINE := $(shell if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; \
	then echo docker; elif command -v podman >/dev/null 2>&1; then echo podman; else echo docker; fi))$(ENGINE)
PLATFORMS ?=
REGISTRY ?=
BASE_IMAGE ?=
PIP_CA_BUNDLE ?=
DOCKER_BUILD_ARGS ?=
DOCKERFILE = docker/Dockerfile.$(firstword $(subst -, ,$(TARGET)))
IMAGE_VERSION ?= $(shell sed -n 's/^version *= *"\(.*\)"/\1/p' pyproject.toml | head -n 1)
IMAGE_REVISION ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
IMAGE_SOURCE ?= $(shell sed -n 's/^Source *= *"\(.*\)"/\1/p' pyproject.toml | head -n 1)
# multi-platform docker buildx output: pushed when REGISTRY is set, else an OCI archive
OCI_ARCHIVE ?= build/images/hopper-train-$(TARGET).oci.tar
REMOTE_IMAGE = $(REGISTRY:%/=%)/$(IMAGE)
IMAGE_NAME = $(if $(strip $(REGISTRY)),$(REMOTE_IMAGE),$(IMAGE))

_BUILD_FLAGS = -f $(DOCKERFILE) \
	--build-arg VERSION=$(IMAGE_VERSION) \
	--build-arg REVISION=$(IMAGE_REVISION) \
	$(if $(IMAGE_SOURCE),--build-arg SOURCE_URL=$(IMAGE_SOURCE)) \
	$(if $(findstring -,$(TARGET)),--build-arg TARGET=$(TARGET)) $(_VARIANT_$(TARGET)) \
	$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
	$(if $(PIP_CA_BUNDLE),--secret id=pip_ca$(,)src=$(PIP_CA_BUNDLE)) \
	$(DOCKER_BUILD_ARGS)
, := ,

# test-container: GPUs are used when nvidia-smi lists at least one.
HAVE_GPU ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo 1)
_GPU_FLAGS_docker = --gpus all
_GPU_FLAGS_podman = --device nvidia.com/gpu=all --security-opt=label=disable
_TEST_RUN_FLAGS = $(if $(HAVE_GPU),$(_GPU_FLAGS_$(ENGINE)) --ipc=host --ulimit memlock=-1,--shm-size=1g)
TEST_PYTEST_ARGS ?= -q $(if $(HAVE_GPU),,-m "not gpu") -p no:cacheprovider tests

KUBECTL ?= kubectl
KUBECTL_ARGS ?=

.PHONY: build-image push image-name test-container k8s-apply docker-check-target efa-src

# Expanded only when one of the rules below runs, so other goals never trip on it.
docker-check-target:  ## check that TARGET names an image variant (run by the image targets)
	$(if $(filter $(TARGET),$(DOCKER_TARGETS)),@:,$(error invalid TARGET='$(TARGET)'; valid targets: $(DOCKER_TARGETS)))

# Source tarballs for the EFA variants (LIBFABRIC_GIT / AWS_OFI_NCCL_GIT: local clones;
# otherwise GitHub's tag archives are downloaded).
efa-src:  ## source tarballs of the EFA image variants (EFA_SRC_DIR; LIBFABRIC_GIT/AWS_OFI_NCCL_GIT: local clones)
	bash docker/efa-sources.sh $(EFA_SRC_DIR)

build-image: docker-check-target $(if $(filter %-efa,$(TARGET)),efa-src)  ## build the image TARGET=hopper|blackwell|... [ENGINE= PLATFORMS= BASE_IMAGE=]
ifeq ($(strip $(PLATFORMS)),)
	$(ENGINE) build $(_BUILD_FLAGS) -t $(IMAGE)$(if $(strip $(REGISTRY)), -t $(REMOTE_IMAGE)) .
else ifeq ($(ENGINE),docker)
	@mkdir -p $(dir $(OCI_ARCHIVE))
	docker buildx build --platform $(PLATFORMS) $(_BUILD_FLAGS) \
		$(if $(REGISTRY),-t $(REMOTE_IMAGE) --push,-t $(IMAGE) --output type=oci$(,)dest=$(OCI_ARCHIVE)) .
else
	-podman manifest rm $(IMAGE) >/dev/null 2>&1
	podman build --platform $(PLATFORMS) --manifest $(IMAGE) $(_BUILD_FLAGS) .
endif

push: docker-check-target  ## push the image TARGET to REGISTRY=host[:port]/path
	$(if $(strip $(REGISTRY)),@:,$(error no registry: set REGISTRY=host[:port]/path to push))
ifeq ($(strip $(PLATFORMS)),)
	$(ENGINE) tag $(IMAGE) $(REMOTE_IMAGE)
	$(ENGINE) push $(REMOTE_IMAGE)
else ifeq ($(ENGINE),docker)
	docker buildx build --platform $(PLATFORMS) $(_BUILD_FLAGS) -t $(REMOTE_IMAGE) --push .
else
	podman manifest push --all $(IMAGE) docker://$(REMOTE_IMAGE)
endif

# The image's name as the renders use it (`launch k8s --registry $(REGISTRY)`).
image-name: docker-check-target  ## print the image name the renders use (REGISTRY=)
	@echo $(IMAGE_NAME)

test-container: docker-check-target  ## pytest inside the image TARGET (GPU tests where nvidia-smi works)
	$(ENGINE) run --rm $(_TEST_RUN_FLAGS) -w /opt/hopper-train $(IMAGE) pytest $(TEST_PYTEST_ARGS)

# One rendered job (a multi-document file: TrainJob with its runtime, or a PyTorchJob), never a
# whole folder: k8s/ holds examples for several clusters.
FILE ?=
k8s-apply:  ## kubectl apply one rendered job: FILE=job.yaml [KUBECTL_ARGS=]
	$(if $(strip $(FILE)),@:,$(error k8s-apply: give FILE=job.yaml (one file rendered by launch k8s)))
	$(if $(wildcard $(FILE)),@:,$(error k8s-apply: FILE=$(FILE): no such file))
	@command -v $(KUBECTL) >/dev/null || { echo "docker.mk: $(KUBECTL) not found" >&2; exit 2; }
	$(KUBECTL) apply -f "$(FILE)" $(KUBECTL_ARGS)

.DEFAULT_GOAL := $(_DOCKER_MK_DEFAULT_GOAL)
