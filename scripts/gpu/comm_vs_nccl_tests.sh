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
# 2. Runs all_reduce_perf, all_gather_perf and reduce_scatter_perf, float32, 8K to 1G by
#    factors of 2, on the N GPUs, with 5 warm-up calls per size as the bench makes (-w 5): the
#    default loop (-g N), CUDA graphs (-G 10), blocking (-z 1), one thread per GPU (-t N -g 1) and,
#    where the machine has MPI, one process per GPU under mpirun with CUDA graphs (mpi_graph).
#    Each in two runs, 8K-4M and 8M-1G: nccl-tests allocates its buffers for the largest size of
#    a run, and with 1 GiB buffers its reduce_scatter at 2 MiB took 17.1 us where the same
#    binary with 4 MiB buffers took 14.4 (2xH200); the bench allocates each size's tensors.
# 3. Runs `train bench comm` over the same operations and sizes with --graph (device_us,
#    graph_us, host_us), and `train bench comm --impl nccl,symm_mem --graph` (4K..4M).
# 4. Shows what decides reduce_scatter at 1-4 MiB (protocols.txt; COMM_PROTOCOLS=0 skips it):
#    nccl-tests -G with buffers for 4 MiB and for 1 GiB, nccl-tests -G and the bench with
#    NCCL_PROTO forced to each of LL, LL128 and Simple, and NCCL's own choice on both sides as
#    its NCCL_DEBUG_SUBSYS=TUNING log states it.
# 5. Writes the comparison (scripts/gpu/nccl_tests_compare.py): per size nccl-tests' time next
#    to the bench's, and whether they agree within 10%.
#
# Files in $OUT (flat): summary.md, compare.json, nccl_tests.txt (every nccl-tests output,
# each after its command), comm.json, comm.md, latency.json, latency.md, registered.json,
# registered.md (all_gather and reduce_scatter with NCCL buffer registration), protocols.txt,
# protocols_*.json, run.log.
# Wall time: 216 s on 2xH200 (each step has its own timeout).
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
RANGES=("-b 8K -e 4M" "-b 8M -e 1G")  # small (time), large (busbw)
STEP=(-f 2 -w 5)
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
# One process per GPU, as torchrun runs the bench: nccl-tests built again with MPI where the machine
# has mpirun and mpi.h (MPI_HOME, else the usual places); its -G runs are the `mpi_graph` variant.
BUILD_MPI=""
MPI_DIR=""
if command -v mpirun > /dev/null; then
    for d in "${MPI_HOME:-}" /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/mpich /opt/hpcx/ompi /usr/local/mpi /usr; do
        if [ -n "$d" ] && [ -f "$d/include/mpi.h" ]; then MPI_DIR=$d; break; fi
    done
fi
if [ -n "$MPI_DIR" ]; then
    rm -rf "$SRC.mpi" && cp -r "$SRC" "$SRC.mpi"
    if timeout -k 10 300 make -s -j 16 -C "$SRC.mpi/src" MPI=1 MPI_HOME="$MPI_DIR" CUDA_HOME="$CUDA_HOME" CUDA_LIB="$CUDA_LIB" \
        NCCL_HOME="$WORK/nccl" NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$WORK/build-mpi" \
        "$WORK/build-mpi/all_reduce_perf" "$WORK/build-mpi/all_gather_perf" "$WORK/build-mpi/reduce_scatter_perf" \
        >> "$LOG" 2>&1; then
        BUILD_MPI="$WORK/build-mpi"
        say "built with MPI ($MPI_DIR, $(mpirun --version 2>&1 | head -n 1))"
    else
        say "no MPI build (see run.log): the mpi_graph variant is skipped"
    fi
else
    say "no mpirun with mpi.h here: the mpi_graph variant (one process per GPU) is skipped"
fi
NT_LIBS="$WORK/nccl/lib:$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # for nccl-tests only: torch keeps its own

# --- nccl-tests: 3 operations x 5 ways of timing
nccl_tests() {  # nccl_tests VARIANT OP ARGS...
    local variant=$1 op=$2 rc=0
    shift 2
    local range sizes
    for range in "${RANGES[@]}"; do
        read -r -a sizes <<< "$range"
        rc=0
        if [ "$variant" = mpi_graph ] && [ -z "$BUILD_MPI" ]; then continue; fi  # an earlier mpirun run failed
        echo "### variant=$variant op=$op: ${op}_perf ${sizes[*]} ${STEP[*]} $*" >> "$NT"
        if [ "$variant" = mpi_graph ]; then
            timeout -k 5 45 mpirun --allow-run-as-root --oversubscribe -np "$N" -x LD_LIBRARY_PATH="$NT_LIBS" \
                -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS \
                "$BUILD_MPI/${op}_perf" "${sizes[@]}" "${STEP[@]}" "$@" >> "$NT" 2>&1 || rc=$?
            if [ "$rc" != 0 ]; then BUILD_MPI=""; fi  # one failure skips the rest of the variant
        else
            timeout -k 5 90 env LD_LIBRARY_PATH="$NT_LIBS" "$BUILD/${op}_perf" "${sizes[@]}" "${STEP[@]}" "$@" >> "$NT" 2>&1 \
                || rc=$?
        fi
        echo "### exit $rc" >> "$NT"
        say "nccl-tests $variant $op ${sizes[*]}: exit $rc"
    done
}
# COMM_VARIANTS: which of the five (default: all); COMM_LATENCY=0 skips the symmetric-memory run.
read -r -a variants <<< "${COMM_VARIANTS:-default graph blocking threads mpi_graph}"
for op in all_reduce all_gather reduce_scatter; do
    for v in "${variants[@]}"; do
        case "$v" in
            default) nccl_tests default "$op" -g "$N" ;;
            graph) nccl_tests graph "$op" -g "$N" -G 10 -c 0 ;;
            blocking) nccl_tests blocking "$op" -g "$N" -z 1 -c 0 ;;
            threads) nccl_tests threads "$op" -t "$N" -g 1 -c 0 ;;
            mpi_graph) if [ -n "$BUILD_MPI" ]; then nccl_tests mpi_graph "$op" -g 1 -G 10 -c 0; fi ;;
            *) die "COMM_VARIANTS: unknown variant $v (default, graph, blocking, threads, mpi_graph)" ;;
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

# --- which protocol each side runs, reduce_scatter 1-4 MiB (both sides, NCCL_PROTO forced, then NCCL's choice)
if [ "${COMM_PROTOCOLS:-1}" = 1 ]; then
    PT="$RES/protocols.txt"
    : > "$PT"
    for ends in 4M 1G; do  # NCCL's own choice, buffers sized for 4 MiB and for 1 GiB (rows up to 4 MiB kept)
        echo "### NCCL's choice, nccl-tests: reduce_scatter_perf -b 1M -e $ends -f 2 -w 5 -g $N -G 10 -c 0" >> "$PT"
        timeout -k 5 60 env LD_LIBRARY_PATH="$NT_LIBS" "$BUILD/reduce_scatter_perf" -b 1M -e "$ends" -f 2 -w 5 -g "$N" \
            -G 10 -c 0 2>&1 | grep -E '^ +(1048576|2097152|4194304) ' >> "$PT" || true
    done
    for proto in LL LL128 Simple; do
        echo "### NCCL_PROTO=$proto nccl-tests: reduce_scatter_perf -b 1M -e 4M -f 2 -w 5 -g $N -G 10 -c 0" >> "$PT"
        timeout -k 5 60 env LD_LIBRARY_PATH="$NT_LIBS" NCCL_PROTO="$proto" "$BUILD/reduce_scatter_perf" \
            -b 1M -e 4M -f 2 -w 5 -g "$N" -G 10 -c 0 2>&1 | grep -v '^#  Rank' >> "$PT" || true
        NCCL_PROTO="$proto" bench "protocols_$proto" 90 --ops reduce_scatter --dtype float32 --min-bytes 1M \
            --max-bytes 4M --factor 2 --graph --no-p2p
        if [ -f "$RES/protocols_$proto.md" ]; then
            { echo "### NCCL_PROTO=$proto train bench comm --ops reduce_scatter --min-bytes 1M --max-bytes 4M --graph"
              grep '^|' "$RES/protocols_$proto.md"; } >> "$PT"
            rm -f "$RES/protocols_$proto.md"
        fi
    done
    # NCCL's own choice at 2 MiB, as its tuning log states it: the distinct (algorithm, protocol, channels) lines,
    # counted, without the operation counters, pointers and predicted times that make each line unique
    tuning_lines() {
        grep -i 'ReduceScatter' | sed -E 's/^[^ ]+ +[0-9]+:[0-9]+ +\[[0-9]+\] +//; s/opCount [0-9a-f]+//; s/0x[0-9a-f]+//g; s/time [0-9.]+//' \
            | sort | uniq -c | sort -rn | head -n 12
    }
    echo "### NCCL_DEBUG_SUBSYS=TUNING nccl-tests reduce_scatter 2M -G 10" >> "$PT"
    timeout -k 5 60 env LD_LIBRARY_PATH="$NT_LIBS" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING "$BUILD/reduce_scatter_perf" \
        -b 2M -e 2M -w 5 -g "$N" -G 10 -c 0 2>&1 | tuning_lines >> "$PT" || true
    echo "### NCCL_DEBUG_SUBSYS=TUNING train bench comm reduce_scatter 2M" >> "$PT"
    timeout -k 10 90 env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING "$PY" -m torch.distributed.run --standalone \
        --nproc-per-node "$N" -m train bench comm --ops reduce_scatter --dtype float32 --min-bytes 2M --max-bytes 2M \
        --no-p2p --out "$WORK/bench" --name tuning 2>&1 | tuning_lines >> "$PT" || true
    say "protocols: $(wc -l < "$PT") lines"
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
