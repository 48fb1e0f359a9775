#!/usr/bin/env bash
# Transformer Engine on a device machine that cannot download it: the wheels travel in parts.
#
#   bash scripts/gpu/te.sh prepare          # here (a machine with the package registry): download,
#                                           # check and split into .te/common, .te/p1 .. .te/pN
#   bash scripts/gpu/te.sh receive K        # there, one call per part, carrying .te/pK (and
#                                           # .te/common with part 1), back to back: the machine
#                                           # must stay warm (parts gather in /tmp/te-parts)
#   bash scripts/gpu/te.sh install          # there: join, check sha256, install the core wheel and
#                                           # build transformer-engine-torch against the torch there
#                                           # (sm_90 only), report versions; a second run reuses it
#   OUT=DIR bash scripts/gpu/te.sh measure 1b  # there, after install: TE against torchao and
#                                           # bf16, compile off, AC none (TE's limits), 1b on one GPU;
#                                           # 200 steps of the embedded text, bf16 against te:current;
#                                           # the TE tests (FSDP2 on 2 GPUs, a TE checkpoint resumed)
#   OUT=DIR bash scripts/gpu/te.sh measure 8b  # the same at 8b, FSDP2 on 2 GPUs
#
# Versions: transformer-engine-cu13 2.20.2 (CUDA 13, as torch 2.11+cu130 on the device) and the
# transformer-engine-torch 2.20.2 source distribution; their sha256 are pinned below. The
# extra wheels (pydantic and its dependencies, nvdlfw-inspect) are fetched with pip for
# CPython 3.12 x86_64. A call carries at most 64 MiB with the checkout: parts are 44 MiB.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
TE_VERSION=2.20.2
CORE=transformer_engine_cu13-$TE_VERSION-py3-none-manylinux_2_28_x86_64.whl
CORE_SHA256=30063d3699e779cce63617c3458804f7a504ce8279f2749c98313db9daae273e
SDIST=transformer_engine_torch-$TE_VERSION.tar.gz
SDIST_SHA256=4c40ced8a6261649e689076f198d4feaf02277b1ba18931a66eccdaceb33c43e
META=transformer_engine-$TE_VERSION-py3-none-any.whl  # the package whose metadata TE checks at import
META_SHA256=7dcfad943a1a55b2612db9a0e43697fe98c70f4c42ec391ba3a0f872f6ce2094
EXTRA=(pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2 nvdlfw-inspect==0.2.2)
PART_BYTES=$((44 * 1024 * 1024))
TE_DIR="$root/.te"
# on the device, outside the checkout (its ignored .te/ is replaced by what a call carries)
PARTS=/tmp/te-parts
SITE=/tmp/te-site

die() { echo "te.sh: $*" >&2; exit 2; }
check() {  # check FILE SHA256
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$2" ] || die "$1: sha256 $got, expected $2"
}

fetch() {  # fetch PROJECT FILE DEST: the file's link on the registry's simple index
  python3 - "$1" "$2" "$3" <<'PY'
import re, sys, urllib.request
project, name, dest = sys.argv[1:]
page = urllib.request.urlopen(f"https://pypi.org/simple/{project}/", timeout=30).read().decode()
links = [u for u, f in re.findall(r'href="([^"]+)"[^>]*>([^<]+)<', page) if f == name]
if not links:
    sys.exit(f"{name}: not on the index of {project}")
urllib.request.urlretrieve(links[0].split("#")[0], dest)
PY
}

prepare() {
  mkdir -p "$TE_DIR/common"
  [ -f "$TE_DIR/$CORE" ] || fetch transformer-engine-cu13 "$CORE" "$TE_DIR/$CORE"
  check "$TE_DIR/$CORE" "$CORE_SHA256"
  [ -f "$TE_DIR/common/$SDIST" ] || fetch transformer-engine-torch "$SDIST" "$TE_DIR/common/$SDIST"
  check "$TE_DIR/common/$SDIST" "$SDIST_SHA256"
  [ -f "$TE_DIR/common/$META" ] || fetch transformer-engine "$META" "$TE_DIR/common/$META"
  check "$TE_DIR/common/$META" "$META_SHA256"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$TE_DIR/common" "${EXTRA[@]}"
  rm -rf "$TE_DIR"/p[0-9]*
  local tmp
  tmp=$(mktemp -d)
  split -b "$PART_BYTES" -d -a 2 "$TE_DIR/$CORE" "$tmp/part."
  local k=0 f
  for f in "$tmp"/part.*; do
    k=$((k + 1))
    mkdir -p "$TE_DIR/p$k"
    mv "$f" "$TE_DIR/p$k/$(basename "$f")"
  done
  rmdir "$tmp"
  echo "$k" > "$TE_DIR/common/parts"
  grep -qx '/.te/' "$root/.git/info/exclude" 2>/dev/null || echo '/.te/' >> "$root/.git/info/exclude"
  echo "te.sh: $k parts of $CORE in .te/p1..p$k; .te/common: $(find "$TE_DIR/common" -maxdepth 1 -type f -printf '%f ')"
  echo "te.sh: on the device, back to back: carry .te/common and .te/p1 with 'bash scripts/gpu/te.sh receive 1'," \
       "then .te/pK with 'receive K' up to $k, then 'bash scripts/gpu/te.sh install'"
}

receive() {
  local k=$1
  [ -d "$TE_DIR/p$k" ] || die "no .te/p$k here: carry it"
  mkdir -p "$PARTS"
  cp "$TE_DIR/p$k"/part.* "$PARTS/"
  if [ -d "$TE_DIR/common" ]; then cp -r "$TE_DIR/common" "$PARTS/"; fi
  echo "te.sh: part $k received; $PARTS holds $(find "$PARTS" -maxdepth 1 -name 'part.*' | wc -l) parts"
}

cudnn_home() {  # TE loads cuDNN from CUDNN_HOME first, else the system's: the one torch loaded
  [ -n "${CUDNN_HOME:-}" ] && return 0
  CUDNN_HOME=$(python3 -c 'import os, nvidia.cudnn as c; print(os.path.dirname(c.__file__ or "") or list(c.__path__)[0])' 2>/dev/null || true)
  export CUDNN_HOME
  # libcudnn.so.9 opens its parts (libcudnn_cnn.so.9 ...) by name: from torch's wheel too, not an
  # older system copy (the device image has cuDNN 9.14 in /lib beside torch's 9.19)
  [ -z "$CUDNN_HOME" ] || export LD_LIBRARY_PATH="$CUDNN_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

install() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  if [ -f "$SITE/.done" ]; then
    echo "te.sh: already installed in $SITE"
  else
    [ -d "$PARTS/common" ] || die "no parts in $PARTS: run 'receive K' first (part 1 carries .te/common)"
    local want
    want=$(cat "$PARTS/common/parts")
    [ "$(find "$PARTS" -maxdepth 1 -name 'part.*' | wc -l)" = "$want" ] || die "$PARTS: not all $want parts"
    cat "$PARTS"/part.* > "/tmp/$CORE"
    check "/tmp/$CORE" "$CORE_SHA256"
    check "$PARTS/common/$SDIST" "$SDIST_SHA256"
    check "$PARTS/common/$META" "$META_SHA256"
    # pip --target skips a top-level folder that is already there, and the three wheels share
    # transformer_engine/: the core wheel is installed, the others are unpacked over it
    rm -rf "$SITE" /tmp/te-wheels
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --target "$SITE" "/tmp/$CORE"
    # the torch extension, built against this torch: no download of a prebuilt wheel, Hopper only,
    # without NCCL EP (expert parallelism: unused here). cudnn.h comes from the CUDA toolkit or,
    # where it has none, from the nvidia-cudnn wheel beside torch.
    local inc start=$SECONDS
    inc=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for r in nvidia.__path__ for p in glob.glob(os.path.join(r, "*", "include", "cudnn.h"))})))' 2>/dev/null || true)
    PYTHONPATH="$SITE:${PYTHONPATH:-}" NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_CUDA_ARCHS=90 NVTE_FRAMEWORK=pytorch \
      NVTE_WITH_NCCL_EP=0 NVTE_NO_LOCAL_VERSION=1 CPLUS_INCLUDE_PATH="${inc}${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}" \
      MAX_JOBS="${MAX_JOBS:-$(nproc)}" python3 -m pip wheel -v --no-index --no-deps --no-build-isolation --no-cache-dir \
      -w /tmp/te-wheels "$PARTS/common/$SDIST" > /tmp/te-build.log 2>&1 \
      || { tail -60 /tmp/te-build.log; die "building transformer-engine-torch failed (log above: /tmp/te-build.log)"; }
    echo "te.sh: transformer-engine-torch built in $((SECONDS - start)) s (cudnn.h from ${inc:-the CUDA toolkit})"
    local whl
    for whl in /tmp/te-wheels/*.whl "$PARTS"/common/*.whl; do
      python3 -m zipfile -e "$whl" "$SITE"
    done
    touch "$SITE/.done"
  fi
  cudnn_home
  PYTHONPATH="$SITE:${PYTHONPATH:-}" python3 -c '
import torch, transformer_engine as te, transformer_engine.pytorch as tep
check = getattr(tep, "is_fp8_available", None)
print("torch", torch.__version__, "transformer_engine", te.__version__, "fp8 available", check() if check else "?",
      "cuDNN", torch.backends.cudnn.version())'
}

measure() {  # measure 1b | 8b: one call each (a call runs at most 10 minutes)
  local part=${1:-}
  [ "$part" = 1b ] || [ "$part" = 8b ] || die "measure: which part (1b or 8b)?"
  [ -f "$SITE/.done" ] || die "TE is not installed here: run 'install' first"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
  export PYTHONPATH="$SITE:$root:${PYTHONPATH:-}"
  cudnn_home
  local res="${OUT:-/tmp/te-out}/te" fp8=none,tensorwise,te:current,te:delayed
  mkdir -p "$res"
  cd "$root"
  step() {  # step NAME NPROC ARGS...: one train bench step, its log beside its report
    local name=$1 n=$2
    shift 2
    timeout -k 10 420 python3 -m torch.distributed.run --standalone --nproc-per-node "$n" -m train bench step \
      --device cuda --compile off --ac none --out "$res" --name "$name" "$@" > "$res/$name.log" 2>&1 \
      || echo "te.sh: $name: exit $?" | tee -a "$res/failures.txt"
  }
  if [ "$part" = 8b ]; then
    # FSDP2 on 2 GPUs, every block out of AC: what the plan picks for 8b 4x2048 on 2 x H200
    step te_8b 2 --preset 8b --strategy fsdp --fp8 none,te:current,te:delayed --batch 4 --seq 2048 --steps 10 --warmup 3
  else
    CUDA_VISIBLE_DEVICES=0 step te_1b 1 --preset 1b --strategy fsdp --fp8 "$fp8" --batch 4 --seq 2048 --steps 15 --warmup 4
    CUDA_VISIBLE_DEVICES=0 step te_loss_1b 1 --preset 1b --strategy fsdp --fp8 none,te:current --batch 4 --seq 2048 \
      --steps 195 --warmup 5 --data embedded
    # the project's TE tests (one GPU, and FSDP2 over 2 GPUs with a checkpoint resumed)
    timeout -k 10 240 python3 -m pytest -q -p no:cacheprovider tests/precision/test_fp8_te.py > "$res/pytest.log" 2>&1 \
      || echo "te.sh: pytest: exit $?" | tee -a "$res/failures.txt"
    tail -3 "$res/pytest.log"
  fi
  grep -h "^|" "$res"/te_*.md > "$res/summary.md" 2>/dev/null || true
  cat "$res/summary.md"
}

case "${1:-}" in
  prepare) prepare ;;
  receive) [ -n "${2:-}" ] || die "receive: which part (1..N)?"; receive "$2" ;;
  install) install ;;
  measure) measure "${2:-}" ;;
  *) die "usage: te.sh prepare | receive K | install | measure 1b|8b" ;;
esac
