#!/usr/bin/env bash
# GPU campaign, part B (2xH200): communication benches, doctor, GPU-marked tests of
# train/comm/doctor. Results under $OUT/{comm,doctor,pytest}/.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
mkdir -p "$OUT/pytest"
bash scripts/gpu/comm.sh || echo "comm.sh exit $?"
bash scripts/gpu/doctor.sh || echo "doctor.sh exit $?"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/train tests/comm tests/doctor \
  2>&1 | tee "$OUT/pytest/gpu_b.txt" | tail -15
