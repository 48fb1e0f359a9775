#!/usr/bin/env bash
# Final GPU verification (2xH200): GPU-marked tests of every package plus the FSDP2 +
# CPU-offload training run that failed in campaign A. Results packed into $OUT/verify.tgz.
set -uo pipefail
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
R=/tmp/verify
mkdir -p "$R"
timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m train run --config 125m \
  --steps 6 --out "$R/offload" --set parallel.strategy=fsdp --set parallel.cpu_offload=true \
  --set train.batch_size=2 --set train.seq_len=1024 --set train.log_every=1 > "$R/offload.log" 2>&1
echo "offload run exit $?" | tee -a "$R/offload.log"
rm -rf "$R/offload/checkpoints"  # keep the tarball small: the device tool returns files <= 16 MiB
tail -12 "$R/offload.log"
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/train tests/parallel tests/precision tests/doctor \
  2>&1 | tee "$R/gpu_pytest.txt" | tail -30
tar -czf "$OUT/verify.tgz" -C "$R" .
