#!/usr/bin/env bash
# First look at a GPU machine: environment facts + `make demo` under NCCL on all GPUs.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT/smoke"
{
  nvidia-smi -L; nvidia-smi topo -m || true
  python3 -c 'import torch,sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|torchao|click|jinja2|pyyaml|numpy|rich|matplotlib|pytest|setuptools|wheel) ' || true
} 2>&1 | tee "$OUT/smoke/env.txt"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
  python3 -W always -c 'import torchao; print("torchao", torchao.__version__)' 2>&1 | tee -a "$OUT/smoke/env.txt"
fi
make demo EXTRAS=train PIP_FLAGS=--no-build-isolation DEMO_OUT=runs/demo-gpu 2>&1 | tee "$OUT/smoke/demo.log"
