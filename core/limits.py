"""Upper bounds on numbers in profiles, fabrics and flags, shared by the schema and ``launch``.

A leaf module: it imports nothing.
"""

from __future__ import annotations

MAX_NPROC_PER_NODE = 4096  # --nproc-per-node and a profile's gpus_per_node
MAX_BUSBW_GBPS = 1e6  # a fabric's busbw_GBps and --preflight-busbw: finite, far above any link
MAX_CPUS_PER_NODE = 65533  # Slurm's cpus_per_task is 16-bit (0xfffe, 0xffff are reserved)
