"""Every default value a user can see (``launch --help``, rendered files), in one place.

A leaf module: the CLI reads it at start-up (so it imports nothing), the spec, the
builder and the backends read the same names.
"""

from __future__ import annotations

# --------------------------------------------------------------------------- the job

PROFILE = "generic"
ENTRYPOINT = "python -m train run"
RDZV_PORT = 29400
CHECKPOINT_DIR = "/checkpoints"
GRACE_PERIOD_S = 300
IMAGE_REPOSITORY = "hopper-train"  # default --image: <repository>:<the profile's image target>
ELASTIC_MAX_RESTARTS = 3  # torchrun --max-restarts of an elastic job (fixed-size jobs: 0)
FLIGHT_RECORDER_ENTRIES = 2000  # bare --flight-recorder
PREFLIGHT_MIN_FRACTION = 0.5

# --------------------------------------------------------------------------- Slurm

SLURM_GPU_GRES = "gpu"  # --gpus-per-node
SLURM_NODE_RESOURCES = "node"  # whole nodes: --exclusive --mem=0, every CPU of the node

# --------------------------------------------------------------------------- Kubernetes

K8S_PVC = "checkpoints"
K8S_SHM_SIZE = "64Gi"  # --shm-size: the memory-backed /dev/shm of each trainer pod
K8S_PVC_ACCESS_MODE = "ReadWriteMany"  # --pvc-access-mode: what the checkpoint claim is declared to allow
K8S_BACKOFF_LIMIT = 3
K8S_TTL_S = 7 * 24 * 3600
