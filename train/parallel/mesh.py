"""The device mesh: named dims ``dp_replicate`` x ``dp_shard`` x ``tp``.

One 3-D mesh over all ranks (dims of size 1 included, so names are always valid), and
the sub-meshes each strategy needs:

* pure FSDP: ``dp_shard`` (1-D) for ``fully_shard``;
* HSDP: ``(dp_replicate, dp_shard)`` (2-D: replicate across, shard within) for ``fully_shard``;
* TP: ``tp`` for ``parallelize_module``; with FSDP too, params end up on the 2-D/3-D mesh.

The data-parallel rank combines the replicate and shard coordinates: the ``tp`` ranks of
one data-parallel group share it, so they read the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from train.parallel.config import resolve_mesh

DIM_NAMES = ("dp_replicate", "dp_shard", "tp")


@dataclass
class Mesh:
    world: DeviceMesh
    dp_replicate: int
    dp_shard: int
    tp: int

    @property
    def dp_world(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def dp_rank(self) -> int:
        return self.world["dp_replicate"].get_local_rank() * self.dp_shard + self.world["dp_shard"].get_local_rank()

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """What ``fully_shard`` gets: 1-D for FSDP, 2-D (replicate, shard) for HSDP."""
        if self.dp_replicate > 1:
            return self.world["dp_replicate", "dp_shard"]
        return self.world["dp_shard"]

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.world["tp"]

    def describe(self) -> str:
        return f"dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard} x tp={self.tp}"


# (default process group, device type, dims) -> DeviceMesh. A mesh (and its communicators)
# is made once per process group and shape: `train bench step` and the tests build many
# models in one process group.
_MESHES: dict[tuple, DeviceMesh] = {}


def build_mesh(pcfg, world_size: int, model_cfg, device_type: str) -> Mesh:
    import torch.distributed as dist

    dims = resolve_mesh(pcfg, world_size, model_cfg.n_heads, model_cfg.kv_heads)
    key = (dist.group.WORLD, device_type, dims)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device_type, dims, mesh_dim_names=DIM_NAMES)
    return Mesh(_MESHES[key], *dims)


def forget_meshes() -> None:
    """Drop cached meshes (before the process group is destroyed)."""
    _MESHES.clear()
