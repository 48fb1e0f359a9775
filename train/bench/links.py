"""Emulate slower links on one host with NCCL's own (documented) switches.

=========  ===========================================  ==========================================
link       environment                                  what NCCL then uses between local GPUs
=========  ===========================================  ==========================================
nvlink     NCCL_P2P_DISABLE=0 NCCL_SHM_DISABLE=0        its default: P2P over NVLink (or PCIe P2P)
pcie       NCCL_P2P_DISABLE=1                           host shared memory (SHM): a PCIe path
                                                        through system memory, no peer access
ethernet   NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1        the network transport; NCCL_IB_DISABLE=1
           NCCL_IB_DISABLE=1                            keeps it on TCP sockets (loopback)
=========  ===========================================  ==========================================

NCCL reads these when its first communicator is created, so they must be in the
environment before ``init_process_group`` (setting ``os.environ`` in the process before
that, as the bench commands do, is enough; torchrun passes its environment on too).
"""

from __future__ import annotations

import os

LINKS: dict[str, dict[str, str]] = {
    "nvlink": {"NCCL_P2P_DISABLE": "0", "NCCL_SHM_DISABLE": "0"},
    "pcie": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "0"},
    "ethernet": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"},
}


def emulate_link(name: str | None, environ=None) -> dict[str, str]:
    """Set the NCCL variables for ``name`` (None: leave the environment alone) and return
    what was set. Refuses once a process group exists: NCCL would ignore them."""
    if not name:
        return {}
    if name not in LINKS:
        raise ValueError(f"--emulate-link: must be one of {', '.join(LINKS)}, got {name!r}")
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("--emulate-link must be applied before the process group is initialised")
    env = os.environ if environ is None else environ
    env.update(LINKS[name])
    return dict(LINKS[name])


def nccl_environment(environ=None) -> dict[str, str]:
    """The NCCL_* variables in effect (recorded next to benchmark results)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")}
