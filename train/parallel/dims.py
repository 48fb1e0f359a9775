"""The parallel dimensions of a run, resolved once.

:meth:`ParallelDims.from_job` turns the ``parallel`` section (where ``-1`` means "what is
left of the world size") and the world size into concrete mesh degrees
``dp_replicate x dp_shard x tp`` and checks every job-level rule of the layout once: the
product matches the world size, TP divides the heads and the MLP, fp16 is not used with
FSDP, CPU offload is not combined with TP. Pure arithmetic: it runs before any process
group or tensor exists (preflight) and again where the trainer starts; everything after
that (mesh, FSDP, TP, FP8) receives the resulting object instead of re-deriving it.
"""

from __future__ import annotations

from dataclasses import dataclass

from train.errors import ConfigError


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    dp_replicate: int
    dp_shard: int
    tp: int
    strategy: str = "ddp"  # ddp | fsdp

    @property
    def dp(self) -> int:
        """Data-parallel degree: ranks that read different batches."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_enabled(self) -> bool:
        return self.strategy == "fsdp"

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def shape(self) -> tuple[int, int, int]:
        """(dp_replicate, dp_shard, tp): the device mesh's shape."""
        return self.dp_replicate, self.dp_shard, self.tp

    def describe(self) -> str:
        return f"dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard} x tp={self.tp}"

    @classmethod
    def resolve(cls, pcfg, world_size: int, model_cfg) -> ParallelDims:
        """The mesh for ``world_size`` ranks from the ``parallel`` section, or a ConfigError
        naming the culprit; checks that TP divides the model's heads and MLP."""
        r, s, t = _mesh_degrees(pcfg, world_size)
        if t > 1:
            from train.models.registry import model_spec

            spec = model_spec(model_cfg)
            if spec.tp is None:
                what = f"model.builder={spec.source}" if spec.source else f"model.family={spec.family}"
                raise ConfigError(f"parallel.tp: {t} needs a tensor-parallel plan, and {what} has none "
                                  "(use a registered family, see docs/extending.md)")
        if model_cfg.n_heads % t or model_cfg.kv_heads % t:
            raise ConfigError(f"parallel.tp: {t} does not divide model.n_heads={model_cfg.n_heads} and "
                              f"n_kv_heads={model_cfg.kv_heads}")
        if t > 1 and model_cfg.hidden_dim % t:
            raise ConfigError(f"parallel.tp: {t} does not divide the MLP hidden size {model_cfg.hidden_dim}")
        return cls(world_size, r, s, t, pcfg.strategy)

    @classmethod
    def from_job(cls, job, world_size: int) -> ParallelDims:
        """:meth:`resolve` plus the rules that need the rest of the job (precision)."""
        dims = cls.resolve(job.parallel, world_size, job.model)
        if dims.fsdp_enabled and job.train.precision == "fp16":
            raise ConfigError("train.precision: fp16 is not supported with parallel.strategy=fsdp (use bf16)")
        if job.parallel.cpu_offload and dims.tp_enabled:
            raise ConfigError("parallel.cpu_offload: not supported together with parallel.tp > 1")
        return dims


def _mesh_degrees(pcfg, world_size: int) -> tuple[int, int, int]:
    dims = {"dp_replicate": pcfg.dp_replicate, "dp_shard": pcfg.dp_shard, "tp": pcfg.tp}
    if pcfg.strategy == "ddp":
        if pcfg.dp_shard not in (1, -1) or pcfg.tp != 1:
            raise ConfigError("parallel.strategy=ddp: dp_shard and tp must be 1 (use strategy=fsdp for sharding/TP)")
        dims = {"dp_replicate": -1, "dp_shard": 1, "tp": 1}
    elif pcfg.dp_replicate == -1 and pcfg.dp_shard in (1, -1):
        # strategy=fsdp with the mesh left at its defaults, or dp_shard=-1 ("shard over all that is
        # left") beside the default dp_replicate=-1: shard, do not replicate.
        dims = {"dp_replicate": 1, "dp_shard": -1, "tp": pcfg.tp}
    auto = [k for k, v in dims.items() if v == -1]
    if len(auto) > 1:
        raise ConfigError(f"parallel: only one of {', '.join(auto)} may be -1 (auto)")
    fixed = 1
    for v in dims.values():
        if v != -1:
            fixed *= v
    if auto:
        if world_size % fixed:
            raise ConfigError(f"parallel: world size {world_size} is not divisible by the fixed mesh dims ({fixed})")
        dims[auto[0]] = world_size // fixed
    product = dims["dp_replicate"] * dims["dp_shard"] * dims["tp"]
    if product != world_size:
        raise ConfigError(
            f"parallel: mesh dp_replicate={dims['dp_replicate']} x dp_shard={dims['dp_shard']} x tp={dims['tp']}"
            f" = {product} does not match world size {world_size}"
        )
    return dims["dp_replicate"], dims["dp_shard"], dims["tp"]
