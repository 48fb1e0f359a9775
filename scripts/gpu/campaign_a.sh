#!/usr/bin/env bash
# GPU campaign, part A (2xH200): parallel strategies / FP8 / memory (scripts/gpu/parallel.sh),
# optionally followed by fault-tolerance runs and GPU-marked tests (PART=all).
# Every result is packed into $OUT/results-a.tgz (the device tool returns at most 8 files).
set -uo pipefail
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
FINAL_OUT=$OUT
export OUT=/tmp/campaign-a
mkdir -p "$OUT/pytest"
case "${PART:-parallel}" in
  parallel) bash scripts/gpu/parallel.sh || echo "parallel.sh exit $?" ;;
  rest)
    bash scripts/gpu/fault.sh || echo "fault.sh exit $?"
    timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest/gpu_all.txt" | tail -25 ;;
esac
tar -czf "$FINAL_OUT/results-a-${PART:-parallel}.tgz" -C "$OUT" .
cat "$OUT"/parallel/summary.md 2>/dev/null || true
