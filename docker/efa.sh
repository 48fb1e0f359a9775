#!/usr/bin/env bash
# EFA variant of the image (AWS Elastic Fabric Adapter): builds libfabric and the aws-ofi-nccl
# NCCL net plugin from the source tarballs in /tmp/efa-src (build context "efa_src", filled
# by docker/efa-sources.sh) and installs them where AWS's EFA installer and Deep Learning
# Containers put them:
#   libfabric      /opt/amazon/efa        (providers: efa, shm; CUDA memory via dlopen)
#   aws-ofi-nccl   /opt/amazon/ofi-nccl   (lib/libnccl-net-ofi.so; NCCL_NET_PLUGIN=ofi)
# both registered with ldconfig, the plugin linked with an RPATH to this libfabric.
# Runs as root in the image build; does nothing unless AWS_OFI_NCCL_VERSION is set.
#
# Inputs (build args): LIBFABRIC_VERSION, AWS_OFI_NCCL_VERSION (tags, e.g. v2.5.1, v1.21.1),
#   CUDA_HOME (default /usr/local/cuda). Without CUDA headers there (the CPU stand-in base),
#   the headers of the CUDA 12.8 runtime, nvcc and NVML pip wheels are used for the build only:
#   libfabric dlopens CUDA and the plugin loads libcudart at run time (--enable-cudart-dynamic).
# Records the versions in /usr/local/share/hopper-train/efa.txt.
set -euo pipefail

SRC=/tmp/efa-src
EFA_PREFIX=/opt/amazon/efa
PLUGIN_PREFIX=/opt/amazon/ofi-nccl
STATE=/usr/local/share/hopper-train
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# build-only CUDA headers for bases without a CUDA toolkit (pip wheels, CUDA 12.8)
CUDA_HEADER_WHEELS=(nvidia-cuda-runtime-cu12==12.8.90 nvidia-cuda-nvcc-cu12==12.8.93 nvidia-nvml-dev-cu12==12.8.90)
BUILD_PACKAGES=(autoconf automake libtool make g++ pkg-config libibverbs-dev libhwloc-dev)
JOBS=$(nproc)

log() { printf '[efa.sh] %s\n' "$*"; }
die() { printf '[efa.sh] ERROR: %s\n' "$*" >&2; exit 1; }

if [[ -z ${AWS_OFI_NCCL_VERSION:-} ]]; then
    log "AWS_OFI_NCCL_VERSION empty: no EFA stack in this image"
    exit 0
fi
[[ -n ${LIBFABRIC_VERSION:-} ]] || die "AWS_OFI_NCCL_VERSION is set but LIBFABRIC_VERSION is empty"

unpack() { # unpack NAME VERSION -> prints the source directory
    local tarball=$SRC/$1-${2#v}.tar.gz
    [[ -f $tarball ]] || die "$tarball missing: run docker/efa-sources.sh and pass --build-context efa_src=build/efa-src"
    tar -xzf "$tarball" -C /tmp/efa-build
    echo "/tmp/efa-build/$1-${2#v}"
}

cuda_headers() { # prints a directory with include/cuda.h for the build
    if [[ -f $CUDA_HOME/include/cuda.h ]]; then
        echo "$CUDA_HOME"
        return 0
    fi
    local pip_args=() dir=/tmp/efa-build/cuda w
    [[ -s /run/secrets/pip_ca ]] && pip_args=(--cert /run/secrets/pip_ca)
    mkdir -p "$dir/include" /tmp/efa-build/wheels
    python3 -m pip download -q --no-deps "${pip_args[@]}" -d /tmp/efa-build/wheels "${CUDA_HEADER_WHEELS[@]}" >&2
    for w in /tmp/efa-build/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/efa-build/wheels/x >&2; done
    # cuda.h & co., crt/ (nvcc wheel), nvml.h (libfabric's CUDA support includes it); the
    # plugin's configure links a test program against libcudart
    for w in /tmp/efa-build/wheels/x/nvidia/*/include; do cp -r "$w"/. "$dir/include/"; done
    mkdir -p "$dir/lib64"
    cp /tmp/efa-build/wheels/x/nvidia/cuda_runtime/lib/libcudart.so.12 "$dir/lib64/"
    ln -s libcudart.so.12 "$dir/lib64/libcudart.so"
    log "no CUDA toolkit in $CUDA_HOME: building against the headers of ${CUDA_HEADER_WHEELS[*]}" >&2
    echo "$dir"
}

build_libfabric() { # build_libfabric SRC_DIR CUDA_DIR
    (cd "$1" && { [[ -x configure ]] || ./autogen.sh >/dev/null; } \
        && ./configure -q --prefix="$EFA_PREFIX" --enable-only --enable-efa --enable-shm \
            --with-cuda="$2" --enable-cuda-dlopen --disable-static >/dev/null \
        && make -s -j"$JOBS" >/dev/null && make -s install >/dev/null)
}

build_plugin() { # build_plugin SRC_DIR CUDA_DIR
    local dynamic=()
    # static cudart when the toolkit has it (NGC), else load libcudart at run time
    [[ -f $2/lib64/libcudart_static.a ]] || dynamic=(--enable-cudart-dynamic)
    (cd "$1" && { [[ -x configure ]] || ./autogen.sh >/dev/null 2>&1; } \
        && LDFLAGS="-Wl,--disable-new-dtags,-rpath,$EFA_PREFIX/lib" ./configure -q --prefix="$PLUGIN_PREFIX" \
            --with-libfabric="$EFA_PREFIX" --with-cuda="$2" "${dynamic[@]}" --without-nvcc \
            --disable-tests --enable-platform-aws >/dev/null \
        && make -s -j"$JOBS" >/dev/null && make -s install >/dev/null)
}

# Keep the shared libraries the new files need; purge the build-only packages we added.
# shellcheck disable=SC2086  # package lists are split on purpose
purge_build_packages() { # purge_build_packages BEFORE_LIST
    local added runtime sonames
    added=$(comm -13 "$1" <(dpkg-query -W -f '${Package}\n' | sort))
    sonames=$(find "$EFA_PREFIX" "$PLUGIN_PREFIX" -name '*.so*' -type f -exec ldd {} + 2>/dev/null \
        | awk '$3 ~ /^\// {print $1}' | sort -u)
    runtime=$(for so in $sonames; do dpkg -S "*/$so" 2>/dev/null; done | cut -d: -f1 | sort -u)
    [[ -z $runtime ]] || apt-mark manual $runtime >/dev/null
    added=$(comm -23 <(echo "$added") <(echo "$runtime"))
    [[ -z $added ]] || DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq --auto-remove $added >/dev/null
    rm -rf /var/lib/apt/lists/*
}

check() {
    local lib=$PLUGIN_PREFIX/lib/libnccl-net-ofi.so
    [[ -f $lib ]] || die "$lib not installed"
    ! ldd "$lib" | grep 'not found' || die "$lib has unresolved libraries"
    ldd "$lib" | grep -q "$EFA_PREFIX/lib/libfabric.so" || die "$lib does not resolve libfabric from $EFA_PREFIX"
    ldd "$EFA_PREFIX/lib/libfabric.so.1" | grep -q 'libefa\.so' || die "libfabric was built without the efa provider"
    # loads the way NCCL loads it (dlopen) and exports the plugin structs; NCCL itself is not needed
    python3 - "$lib" <<'PY' || die "$lib does not load or exports no ncclNetPlugin_v* symbol"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)
found = [f"ncclNetPlugin_v{v}" for v in range(2, 17) if hasattr(lib, f"ncclNetPlugin_v{v}")]
print("[efa.sh]", sys.argv[1], "loads (ctypes); exports", " ".join(found) or "no ncclNetPlugin_v* symbol")
sys.exit(0 if found else 1)
PY
}

main() {
    local before fabric plugin cuda
    log "libfabric $LIBFABRIC_VERSION, aws-ofi-nccl $AWS_OFI_NCCL_VERSION"
    rm -rf /tmp/efa-build && mkdir -p /tmp/efa-build
    before=/tmp/efa-build/packages.before
    dpkg-query -W -f '${Package}\n' | sort >"$before"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${BUILD_PACKAGES[@]}" >/dev/null
    fabric=$(unpack libfabric "$LIBFABRIC_VERSION")
    plugin=$(unpack aws-ofi-nccl "$AWS_OFI_NCCL_VERSION")
    cuda=$(cuda_headers)
    build_libfabric "$fabric" "$cuda" || die "libfabric build failed"
    build_plugin "$plugin" "$cuda" || die "aws-ofi-nccl build failed"
    printf '%s\n%s\n' "$EFA_PREFIX/lib" "$PLUGIN_PREFIX/lib" >/etc/ld.so.conf.d/000-hopper-train-efa.conf
    ldconfig
    purge_build_packages "$before"
    check
    mkdir -p "$STATE"
    {
        echo "libfabric $LIBFABRIC_VERSION ($("$EFA_PREFIX/bin/fi_info" --version | head -n 1)) in $EFA_PREFIX"
        echo "aws-ofi-nccl $AWS_OFI_NCCL_VERSION in $PLUGIN_PREFIX (NCCL_NET_PLUGIN=ofi)"
        [[ ! -f $SRC/SOURCES ]] || sed 's/^/source: /' "$SRC/SOURCES"
    } | tee "$STATE/efa.txt"
    rm -rf /tmp/efa-build
}

main
