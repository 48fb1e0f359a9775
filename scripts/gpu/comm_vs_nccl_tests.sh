#!/usr/bin/env bash
# nccl-tests and `train bench comm` side by side, one call, on N GPUs of one host (default 2):
#
#     OUT=/some/dir [COMM_GPUS=4] bash scripts/gpu/comm_vs_nccl_tests.sh
#
# 1. Builds NVIDIA's nccl-tests from a pinned source tarball (NCCL_TESTS_TARBALL, default
#    .nccltests/nccl-tests-$NCCL_TESTS_VERSION.tar.gz, carried beside the checkout: it is
#    `git archive --format=tar.gz --prefix=nccl-tests-2.19.6/ v2.19.6` of
#    github.com/NVIDIA/nccl-tests; its sha256 is checked before anything is built) against the
#    NCCL that torch loads (the nvidia-nccl wheel: its headers and libnccl.so.2), for sm_90.
# 2. Runs all_reduce_perf, all_gather_perf and reduce_scatter_perf, float32, -b 8K -e 1G -f 2
#    on the N GPUs: the default loop (-g N), CUDA graphs (-G 10), blocking (-z 1) and one thread
#    per GPU (-t N -g 1).
# 3. Runs `train bench comm` over the same operations and sizes with --graph (device_us,
#    graph_us, host_us), and `train bench comm --impl nccl,symm_mem --graph` (4K..4M).
# 4. Writes the comparison (scripts/gpu/nccl_tests_compare.py): per size nccl-tests' time next
#    to the bench's, and whether they agree within 10%.
#
# Files in $OUT (flat): summary.md, compare.json, nccl_tests.txt (every nccl-tests output,
# each after its command), comm.json, comm.md, latency.json, latency.md, registered.json,
# registered.md (all_gather and reduce_scatter with NCCL buffer registration), run.log.
# Wall time: under 8 minutes on 2xH100 (each step has its own timeout).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
# shellcheck source=scripts/gpu/common.sh
source "$here/common.sh"  # NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"

NCCL_TESTS_VERSION=2.19.6
NCCL_TESTS_COMMIT=a0b82b2260cf5152b9f8c061bbf7eaf0ba096432
NCCL_TESTS_SHA256=85c65a240432a5bd8bf8598ac235582921a96e8a968a8a675d23419478a4ab9c
TARBALL="${NCCL_TESTS_TARBALL:-.nccltests/nccl-tests-$NCCL_TESTS_VERSION.tar.gz}"
SIZES=(-b 8K -e 1G -f 2)
PY="${PYTHON:-$(command -v python3 || command -v python)}"
RES="${OUT:-/tmp/out}"
WORK=$(mktemp -d /tmp/nccl_vs_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$RES"
LOG="$RES/run.log"
NT="$RES/nccl_tests.txt"
: > "$LOG"
: > "$NT"
T0=$(date +%s)

say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
die() { say "FAILED: $*"; exit 1; }

say "nccl-tests $NCCL_TESTS_VERSION (commit $NCCL_TESTS_COMMIT), tarball $TARBALL"
[ -f "$TARBALL" ] || die "no $TARBALL: carry .nccltests (see the top of this script)"
got=$(sha256sum "$TARBALL" | cut -d' ' -f1)
[ "$got" = "$NCCL_TESTS_SHA256" ] || die "$TARBALL: sha256 $got, expected $NCCL_TESTS_SHA256"
say "sha256 $got: OK"
N="${COMM_GPUS:-2}"
case "$N" in ""|*[!0-9]*) die "COMM_GPUS=$N: not a GPU count" ;; esac
ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
[ "$ngpu" -ge "$N" ] && [ "$N" -ge 2 ] || die "needs $N GPUs (at least 2), found $ngpu"

# --- the NCCL that torch loads: its headers and library, as an NCCL_HOME for nccl-tests' Makefile
"$PY" - "$WORK/nccl" "$root/.nccltests/include" >> "$LOG" 2>&1 <<'PYEOF' || die "no NCCL headers/library for nccl-tests (see run.log)"
import glob, os, sys
import torch
home, carried = sys.argv[1], sys.argv[2]
version = ".".join(map(str, torch.cuda.nccl.version()))
roots = []
try:
    import nvidia
    roots += list(nvidia.__path__)
except ImportError:
    pass
def find(pattern, extra=()):
    for r in [*roots, *extra]:
        hits = sorted(glob.glob(os.path.join(r, "**", pattern), recursive=True))
        if hits:
            return hits[0]
    return None
lib = find("libnccl.so.2")
header = find("nccl.h", [carried, "/usr/include", "/usr/local/cuda/include"])
print(f"torch {torch.__version__}, NCCL {version}; libnccl.so.2: {lib}; nccl.h: {header}")
if lib is None:
    sys.exit("libnccl.so.2 not found in the nvidia wheels")
if header is None or not os.path.exists(os.path.join(os.path.dirname(header), "nccl_device.h")):
    sys.exit(f"nccl.h and nccl_device.h of NCCL {version} not found: the nvidia-nccl wheel here ships no headers. "
             f"Put the include/ folder of the same NCCL version (the nvidia-nccl wheel's nvidia/nccl/include, "
             f"e.g. unzipped from `pip download --no-deps nvidia-nccl-cu13=={version}` elsewhere) at "
             f".nccltests/include/ and carry .nccltests")
os.makedirs(os.path.join(home, "lib"))
os.symlink(os.path.dirname(header), os.path.join(home, "include"))
for name in ("libnccl.so", "libnccl.so.2"):
    os.symlink(lib, os.path.join(home, "lib", name))
PYEOF
say "NCCL for nccl-tests: $(tail -n 1 "$LOG")"

# --- build (sm_90 only: H100/H200), the three binaries
NVCC_BIN=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$NVCC_BIN")")}"
CUDA_LIB=""
for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib"; do
    if [ -z "$CUDA_LIB" ] && [ -e "$d/libcudart.so" ]; then CUDA_LIB=$d; fi
done
[ -n "$CUDA_LIB" ] || die "no libcudart.so under $CUDA_HOME (set CUDA_HOME)"
mkdir -p "$WORK/src"
tar -xzf "$TARBALL" -C "$WORK/src"
SRC="$WORK/src/nccl-tests-$NCCL_TESTS_VERSION"
BUILD="$WORK/build"
say "building with $NVCC_BIN ($("$NVCC_BIN" --version | grep -o 'release [0-9.]*' || true))"
timeout -k 10 300 make -s -j 16 -C "$SRC/src" MPI=0 CUDA_HOME="$CUDA_HOME" CUDA_LIB="$CUDA_LIB" NCCL_HOME="$WORK/nccl" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$BUILD" \
    "$BUILD/all_reduce_perf" "$BUILD/all_gather_perf" "$BUILD/reduce_scatter_perf" >> "$LOG" 2>&1 \
    || die "nccl-tests build (see run.log)"
say "built"
NT_LIBS="$WORK/nccl/lib:$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # for nccl-tests only: torch keeps its own

# --- nccl-tests: 3 operations x 4 ways of timing
nccl_tests() {  # nccl_tests VARIANT OP ARGS...
    local variant=$1 op=$2 rc=0
    shift 2
    echo "### variant=$variant op=$op: ${op}_perf ${SIZES[*]} $*" >> "$NT"
    timeout -k 5 90 env LD_LIBRARY_PATH="$NT_LIBS" "$BUILD/${op}_perf" "${SIZES[@]}" "$@" >> "$NT" 2>&1 || rc=$?
    echo "### exit $rc" >> "$NT"
    say "nccl-tests $variant $op: exit $rc"
}
# COMM_VARIANTS: which of the four (default: all); COMM_LATENCY=0 skips the symmetric-memory run.
read -r -a variants <<< "${COMM_VARIANTS:-default graph blocking threads}"
for op in all_reduce all_gather reduce_scatter; do
    for v in "${variants[@]}"; do
        case "$v" in
            default) nccl_tests default "$op" -g "$N" ;;
            graph) nccl_tests graph "$op" -g "$N" -G 10 -c 0 ;;
            blocking) nccl_tests blocking "$op" -g "$N" -z 1 -c 0 ;;
            threads) nccl_tests threads "$op" -t "$N" -g 1 -c 0 ;;
            *) die "COMM_VARIANTS: unknown variant $v (default, graph, blocking, threads)" ;;
        esac
    done
done

# --- train bench comm: the same operations and sizes, then NCCL against symmetric memory
bench() {  # bench NAME LIMIT ARGS...
    local name=$1 limit=$2 rc=0
    shift 2
    say "train bench comm $*"
    echo "### torchrun --standalone --nproc-per-node $N -m train bench comm $*" >> "$LOG"
    timeout -k 10 "$limit" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$N" \
        -m train bench comm "$@" --out "$WORK/bench" --name "$name" >> "$LOG" 2>&1 || rc=$?
    say "$name: exit $rc"
    for f in "$name.json" "$name.md"; do
        if [ -f "$WORK/bench/$f" ]; then cp "$WORK/bench/$f" "$RES/"; fi
    done
}
bench comm 240 --ops all_reduce,all_gather,reduce_scatter --dtype float32 --min-bytes 8K --max-bytes 1G \
    --factor 2 --graph --no-p2p
if [ "${COMM_LATENCY:-1}" = 1 ]; then
    bench latency 120 --impl nccl,symm_mem --min-bytes 4K --max-bytes 4M --graph
fi
# NCCL user-buffer registration: nccl-tests -G gets it from CUDA-graph capture; here torch's allocator
# registers its segments with NCCL (cuMem-backed: expandable segments). COMM_REGISTERED=0 skips it.
if [ "${COMM_REGISTERED:-1}" = 1 ]; then
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 \
        bench registered 150 --ops all_gather,reduce_scatter --dtype float32 --min-bytes 1M --max-bytes 1G \
        --factor 4 --graph --no-p2p
fi

# --- the comparison
[ -f "$RES/comm.json" ] || die "train bench comm wrote no comm.json (see run.log)"
latency=()
if [ -f "$RES/latency.json" ]; then latency=("$RES/latency.json"); fi
{
    echo "# nccl-tests $NCCL_TESTS_VERSION beside train bench comm"
    echo
    echo "- command: \`OUT=... COMM_GPUS=$N bash scripts/gpu/comm_vs_nccl_tests.sh\`"
    echo "- nccl-tests: commit $NCCL_TESTS_COMMIT, tarball sha256 $NCCL_TESTS_SHA256, built for sm_90"
    echo "- $("$PY" -c 'import torch; print(f"torch {torch.__version__}, NCCL", ".".join(map(str, torch.cuda.nccl.version())), f"GPUs: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")')"
    echo "- NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
    echo
} > "$RES/summary.md"
"$PY" "$here/nccl_tests_compare.py" "$NT" "$RES/comm.json" "${latency[@]}" --md "$WORK/compare.md" \
    --json "$RES/compare.json" >> "$LOG" 2>&1 || say "comparison: exit $? (see run.log)"
if [ -f "$WORK/compare.md" ]; then cat "$WORK/compare.md" >> "$RES/summary.md"; fi
echo "- wall time: $(( $(date +%s) - T0 )) s" >> "$RES/summary.md"
cat "$RES/summary.md"
