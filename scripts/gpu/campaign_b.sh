#!/usr/bin/env bash
# GPU campaign, part B (2xH200): communication benches, doctor, GPU-marked tests of
# train/comm/doctor. Results under $OUT/{comm,doctor,pytest}/.
set -uo pipefail
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
mkdir -p "$OUT/pytest"
bash scripts/gpu/comm.sh || echo "comm.sh exit $?"
bash scripts/gpu/doctor.sh || echo "doctor.sh exit $?"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/train tests/comm tests/doctor \
  2>&1 | tee "$OUT/pytest/gpu_b.txt" | tail -15
