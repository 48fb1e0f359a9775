#!/usr/bin/env bash
# Containerized pytest for CI machines without a Docker engine or a registry.
#
# Builds the real docker/Dockerfile.<TARGET> with podman on an offline stand-in
# for the NGC base (Debian bookworm made with debootstrap, tagged with the NGC
# name the Dockerfile pins), installs a CPU torch from a local wheel into it
# (TORCH_SPEC), and runs `pytest -m "not gpu"` inside the image as its non-root
# user. Exits non-zero on any failure and prints per-step timings.
#
# Needs root (rootful podman, debootstrap). Installs podman, debootstrap and runc
# with apt-get when they are missing. The stand-in base and the pip/layer caches
# live in $CONTAINER_CI_DIR, so a rerun only rebuilds what changed.
#
# Environment (all optional):
#   TARGET                      hopper (default) | blackwell | hopper-efa | blackwell-efa
#                               (*-efa: the EFA variant, libfabric + aws-ofi-nccl built from
#                               source; docker/efa-sources.sh gets the tarballs, from local
#                               clones when LIBFABRIC_GIT / AWS_OFI_NCCL_GIT are set)
#   CONTAINER_CI_EFA_ONLY=1     *-efa: build and check the plugin, skip pytest in the image
#   CONTAINER_CI_DIR            work dir (default /var/tmp/hopper-train-container-ci)
#   CONTAINER_CI_CA_BUNDLE      CA bundle pip must trust (default: the host's)
#   CONTAINER_CI_WHEEL_DIR      where the CPU torch wheel lies (default /opt/wheels)
#   CONTAINER_CI_TORCH_SPEC     override the torch requirement for the stand-in
#   CONTAINER_CI_TORCHAO_SPEC   TORCHAO_SPEC build arg (default auto)
#   CONTAINER_CI_PYTEST_ARGS    pytest arguments (default: -q -m "not gpu" -n 2 ... tests)
#   CONTAINER_CI_TEST_TIMEOUT   seconds for the pytest run (default 2400)
#   CONTAINER_CI_DEBIAN_MIRROR  debootstrap mirror (default http://deb.debian.org/debian)
#   CONTAINER_CI_KEEP=1         keep dangling images (default: pruned after the run)
#   CONTAINER_CI_LAUNCH_TESTS   pytest arguments for the host-side tests that run rendered
#                               `launch docker` scripts with podman against the built image
#                               (LAUNCH_PODMAN_IMAGE); empty (default): that step is skipped
#   CONTAINER_CI_HOST_PYTHON    interpreter for that step (default: .venv/bin/python, which
#                               `make test` creates, else python3)
set -Eeuo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${TARGET:-hopper}
WORK=${CONTAINER_CI_DIR:-/var/tmp/hopper-train-container-ci}
CA_BUNDLE=${CONTAINER_CI_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
WHEEL_DIR=${CONTAINER_CI_WHEEL_DIR:-/opt/wheels}
TORCHAO_SPEC=${CONTAINER_CI_TORCHAO_SPEC:-auto}
# The whole non-GPU suite, two pytest workers as in `make test` (cluster and podman tests skip
# inside: no root, no podman, each with its reason).
DEFAULT_PYTEST_ARGS='-q -m "not gpu" -n 2 --dist loadfile -p no:cacheprovider --durations=10 tests'
PYTEST_ARGS=${CONTAINER_CI_PYTEST_ARGS:-$DEFAULT_PYTEST_ARGS}
TEST_TIMEOUT=${CONTAINER_CI_TEST_TIMEOUT:-2400}
MIRROR=${CONTAINER_CI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
IMAGE=localhost/hopper-train:${TARGET}-ci
DOCKERFILE=$REPO/docker/Dockerfile.${TARGET%%-*}
EFA=0
[[ $TARGET != *-efa ]] || EFA=1

T_START=$SECONDS
TIMINGS=()
log() { printf '\n==> [container_test] %s\n' "$*"; }
die() { printf '==> [container_test] ERROR: %s\n' "$*" >&2; exit 1; }
step() { # step NAME CMD...: run CMD, record its wall time
    local name=$1 t0=$SECONDS rc=0
    shift
    log "$name"
    "$@" || rc=$?
    local mark=""
    ((rc == 0)) || mark="  FAILED (exit $rc)"
    TIMINGS+=("$(printf '%-34s %5ss%s' "$name" "$((SECONDS - t0))" "$mark")")
    return "$rc"
}
summary() {
    local rc=$?
    printf '\n==> [container_test] timings (target %s)\n' "$TARGET"
    local t
    for t in "${TIMINGS[@]}"; do printf '    %s\n' "$t"; done
    printf '    %-34s %5ss\n' "total" "$((SECONDS - T_START))"
    if ((rc == 0)); then echo "==> [container_test] PASSED"; else echo "==> [container_test] FAILED (exit $rc)"; fi
}
trap summary EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[[ -f $DOCKERFILE && $TARGET =~ ^(hopper|blackwell)(-efa)?$ ]] \
    || die "unknown TARGET '$TARGET' (valid: hopper blackwell hopper-efa blackwell-efa)"
((EUID == 0)) || die "must run as root (rootful podman and debootstrap)"

ensure_tools() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v runc >/dev/null || missing+=(runc)
    if ((${#missing[@]})); then
        echo "installing: ${missing[*]}"
        # Other jobs on the machine may hold the dpkg/apt locks: wait for them (10 min).
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
    podman --version
}

write_config() {
    mkdir -p "$WORK/storage" "$WORK/run" "$WORK/tmp"
    # runc: crun fails on these hybrid-cgroup CI hosts; nofile/nproc above 16384
    # are refused there, so set them explicitly for builds and runs.
    cat >"$WORK/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    cat >"$WORK/storage.conf" <<EOF
[storage]
driver = "overlay"
runroot = "$WORK/run"
graphroot = "$WORK/storage"
EOF
    echo "CONTAINERS_CONF=$WORK/containers.conf CONTAINERS_STORAGE_CONF=$WORK/storage.conf"
}

pick_torch() {
    if [[ -n ${CONTAINER_CI_TORCH_SPEC:-} ]]; then
        TORCH_SPEC=$CONTAINER_CI_TORCH_SPEC
        TORCH_PIN=${TORCH_SPEC#torch==}
        return 0
    fi
    # bookworm's python3 is 3.11: take the newest cp311 wheel for this machine.
    local whl
    whl=$(find "$WHEEL_DIR" -maxdepth 1 -name "torch-*-cp311-cp311-*$(uname -m).whl" 2>/dev/null \
        | sort -V | tail -n 1)
    [[ -n $whl ]] || die "no CPU torch wheel (torch-*-cp311-*) in $WHEEL_DIR; set CONTAINER_CI_WHEEL_DIR or CONTAINER_CI_TORCH_SPEC (never PyPI's default CUDA build)"
    TORCH_PIN=$(basename "$whl" | cut -d- -f2)
    TORCH_SPEC="torch==$TORCH_PIN"
    rm -rf "$WORK/wheels"
    mkdir -p "$WORK/wheels"
    ln "$whl" "$WORK/wheels/" 2>/dev/null || cp "$whl" "$WORK/wheels/"
    echo "torch wheel: $whl -> TORCH_SPEC=$TORCH_SPEC"
}

build_standin() {
    # The stand-in mimics what the Dockerfile expects of NGC: Python + pip, and a
    # pip constraint file at /etc/pip/constraint.txt pinning torch.
    local recipe key rootfs
    recipe="v1 $SUITE minbase python3,python3-pip,python3-venv torch==$TORCH_PIN"
    key=$(sha256sum <<<"$recipe" | cut -c1-12)
    STANDIN=localhost/hopper-train-standin:$SUITE-$key
    if podman image exists "$STANDIN"; then
        echo "cached: $STANDIN"
        return 0
    fi
    rootfs=$WORK/rootfs
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv \
        "$SUITE" "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -n 20 "$WORK/debootstrap.log"; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc "$rootfs"/usr/share/man
    mkdir -p "$rootfs/etc/pip"
    echo "torch==$TORCH_PIN" >"$rootfs/etc/pip/constraint.txt"
    tar -C "$rootfs" -c . | podman import \
        --change 'CMD ["/bin/bash"]' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        - "$STANDIN" >/dev/null
    rm -rf "$rootfs"
    echo "built: $STANDIN"
}

tag_as_ngc() {
    NGC_BASE=$(sed -n 's/^ARG BASE_IMAGE=//p' "$DOCKERFILE" | head -n 1)
    [[ -n $NGC_BASE ]] || die "no 'ARG BASE_IMAGE=' default in $DOCKERFILE"
    podman tag "$STANDIN" "$NGC_BASE"
    echo "$STANDIN -> $NGC_BASE (local tag only; nothing is pulled)"
}

efa_sources() {
    bash "$REPO/docker/efa-sources.sh" "$WORK/efa-src"
    cat "$WORK/efa-src/SOURCES"
}

build_image() {
    local secret=() version revision efa=()
    if [[ -s $CA_BUNDLE ]]; then
        secret=(--secret "id=pip_ca,src=$CA_BUNDLE")
    fi
    version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$REPO/pyproject.toml" | head -n 1)
    revision=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
    if ((EFA)); then
        # shellcheck source=/dev/null  # docker/efa-versions.env
        source "$REPO/docker/efa-versions.env"
        efa=(--build-arg "LIBFABRIC_VERSION=$LIBFABRIC_VERSION" --build-arg "AWS_OFI_NCCL_VERSION=$AWS_OFI_NCCL_VERSION"
            --build-context "efa_src=$WORK/efa-src")
    fi
    podman build --pull=never --network=host --layers \
        -f "$DOCKERFILE" -t "$IMAGE" \
        --build-arg "TARGET=$TARGET" \
        --build-arg "TORCH_SPEC=$TORCH_SPEC" \
        --build-arg "TORCHAO_SPEC=$TORCHAO_SPEC" \
        --build-arg TORCHAO_CPP_CHECK=version \
        --build-arg "VERSION=${version:-0.0.0.dev0}" \
        --build-arg "REVISION=$revision" \
        --build-context "wheels=$WORK/wheels" \
        "${efa[@]}" "${secret[@]}" \
        "$REPO"
}

smoke() {
    local uid target
    podman run --rm --network=none "$IMAGE" >/dev/null          # CMD: train --help
    podman run --rm --network=none "$IMAGE" launch --help >/dev/null
    uid=$(podman run --rm --network=none "$IMAGE" id -u)
    [[ $uid != 0 ]] || die "image runs as root"
    target=$(podman image inspect --format '{{index .Labels "io.hopper-train.target"}}' "$IMAGE")
    [[ $target == "$TARGET" ]] || die "label io.hopper-train.target is '$target', want '$TARGET'"
    echo "train/launch --help ok; runs as uid $uid; target label $target"
}

# The EFA variant: the plugin NCCL would load with the efa fabric's NCCL_NET_PLUGIN=ofi,
# found through ldconfig, dlopen'ed by train/doctor/netplugin.py (doctor's check) as the image's
# user. No EFA device here: nothing beyond loading the library can be tested.
efa_smoke() {
    local labels
    labels=$(podman image inspect --format \
        '{{index .Labels "io.hopper-train.libfabric"}} {{index .Labels "io.hopper-train.aws-ofi-nccl"}}' "$IMAGE")
    [[ $labels == "v"*" v"* ]] || die "EFA labels missing: '$labels'"
    podman run --rm --network=none "$IMAGE" cat /usr/local/share/hopper-train/efa.txt
    podman run --rm --network=none -e NCCL_NET_PLUGIN=ofi -w /opt/hopper-train "$IMAGE" python3 -c \
        'from train.doctor.netplugin import probe; p = probe(); print(p.line); raise SystemExit(0 if p.usable else 1)'
}

run_pytest() {
    local args
    # The argument string may quote (-m "not gpu"); let the shell split it.
    eval "args=($PYTEST_ARGS)"
    echo "pytest ${PYTEST_ARGS}  (as the image's non-root user, no network)"
    # --network=none leaves only loopback; gloo's hostname-based interface choice
    # then hangs collectives (measured), so point it at lo explicitly.
    timeout --kill-after=30 "$TEST_TIMEOUT" \
        podman run --rm --network=none --shm-size=1g -e GLOO_SOCKET_IFNAME=lo \
        -w /opt/hopper-train "$IMAGE" pytest "${args[@]}"
}

run_launch_tests() {
    local py args
    py=${CONTAINER_CI_HOST_PYTHON:-$REPO/.venv/bin/python}
    [[ -x $py ]] || py=python3
    eval "args=($CONTAINER_CI_LAUNCH_TESTS)"
    echo "$py -m pytest ${CONTAINER_CI_LAUNCH_TESTS}  (host, root, podman; image $IMAGE)"
    (cd "$REPO" && LAUNCH_PODMAN_IMAGE=$IMAGE PYTHONPATH=$REPO \
        timeout --kill-after=30 "$TEST_TIMEOUT" "$py" -m pytest "${args[@]}")
}

main() {
    mkdir -p "$WORK"
    exec 9>"$WORK/lock"
    flock -w 3600 9 || die "another container_test.sh holds $WORK/lock"

    step "install podman/debootstrap/runc" ensure_tools
    step "write containers.conf/storage.conf" write_config
    export CONTAINERS_CONF=$WORK/containers.conf CONTAINERS_STORAGE_CONF=$WORK/storage.conf
    export TMPDIR=$WORK/tmp
    step "pick CPU torch wheel" pick_torch
    step "stand-in base (debootstrap)" build_standin
    step "tag stand-in as the NGC base" tag_as_ngc
    if ((EFA)); then
        step "EFA sources" efa_sources
    fi
    step "podman build $TARGET" build_image
    step "smoke: CLIs, user, labels" smoke
    if ((EFA)); then
        step "EFA: NCCL net plugin loads" efa_smoke
    fi
    if ((EFA == 0)) || [[ ${CONTAINER_CI_EFA_ONLY:-0} != 1 ]]; then
        step "pytest inside the image" run_pytest
    fi
    if [[ -n ${CONTAINER_CI_LAUNCH_TESTS:-} ]]; then
        step "launch docker scripts under podman" run_launch_tests
    fi
    if [[ ${CONTAINER_CI_KEEP:-0} != 1 ]]; then
        step "prune dangling images" podman image prune -f >/dev/null
    fi
}

# Sourcing the file (scripts/arm64_test.sh does) defines the steps without running them.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main
fi
