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

from train.parallel.dims import ParallelDims

DIM_NAMES = ("dp_replicate", "dp_shard", "tp")


@dataclass
class Mesh:
    world: DeviceMesh
    dims: ParallelDims

    @property
    def dp_replicate(self) -> int:
        return self.dims.dp_replicate

    @property
    def dp_shard(self) -> int:
        return self.dims.dp_shard

    @property
    def tp(self) -> int:
        return self.dims.tp

    @property
    def dp_world(self) -> int:
        return self.dims.dp

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
        return self.dims.describe()


# (default process group, device type, dims) -> DeviceMesh. A mesh (and its communicators)
# is made once per process group and shape: `train bench step` and the tests build many
# models in one process group.
_MESHES: dict[tuple, DeviceMesh] = {}


def build_mesh(dims: ParallelDims, device_type: str) -> Mesh:
    import torch.distributed as dist

    key = (dist.group.WORLD, device_type, dims.shape)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device_type, dims.shape, mesh_dim_names=DIM_NAMES)
    return Mesh(_MESHES[key], dims)


def forget_meshes() -> None:
    """Drop cached meshes (before the process group is destroyed)."""
    _MESHES.clear()
