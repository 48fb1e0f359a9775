"""Configuration of how the model is spread over GPUs (owned by ``train.parallel``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ParallelConfig:
    strategy: str = "ddp"  # ddp | fsdp (fsdp covers FSDP2, HSDP and FSDP+TP through the mesh dims)
    # Mesh dims; -1 = whatever is left of the world size. The product must equal it.
    dp_replicate: int = -1
    dp_shard: int = 1
    tp: int = 1
    # DDP knobs
    bucket_cap_mb: float = 25.0
    first_bucket_mb: float = 0.0  # 0 = torch's default first bucket
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    # activation checkpointing / compile
    ac: str = "none"  # none | full | selective | op
    ac_every: int = 2  # selective: checkpoint every k-th block
    compile: bool = False
    compile_mode: str = "default"  # default | max-autotune | reduce-overhead | max-autotune-no-cudagraphs

    def validate(self) -> None:
        from train.config import ConfigError

        if self.strategy not in ("ddp", "fsdp"):
            raise ConfigError(f"parallel.strategy: must be ddp or fsdp, got {self.strategy!r}")
        for name in ("dp_replicate", "dp_shard", "tp"):
            v = getattr(self, name)
            if v == 0 or v < -1:
                raise ConfigError(f"parallel.{name}: must be >= 1 or -1 (auto), got {v}")
        if self.bucket_cap_mb <= 0 or self.first_bucket_mb < 0:
            raise ConfigError("parallel.bucket_cap_mb: must be > 0 (first_bucket_mb >= 0)")
        if self.ac not in ("none", "full", "selective", "op"):
            raise ConfigError(f"parallel.ac: must be none, full, selective or op, got {self.ac!r}")
        if self.ac_every < 1:
            raise ConfigError(f"parallel.ac_every: must be >= 1, got {self.ac_every}")
        modes = ("default", "max-autotune", "reduce-overhead", "max-autotune-no-cudagraphs")
        if self.compile_mode not in modes:
            raise ConfigError(f"parallel.compile_mode: must be one of {', '.join(modes)}")


def resolve_mesh(cfg: ParallelConfig, world_size: int, n_heads: int, n_kv_heads: int) -> tuple[int, int, int]:
    """(dp_replicate, dp_shard, tp) for ``world_size`` ranks, or a ConfigError naming the
    culprit. Pure arithmetic: called before any process group or tensor exists."""
    from train.config import ConfigError

    dims = {"dp_replicate": cfg.dp_replicate, "dp_shard": cfg.dp_shard, "tp": cfg.tp}
    if cfg.strategy == "ddp":
        if cfg.dp_shard not in (1, -1) or cfg.tp != 1:
            raise ConfigError("parallel.strategy=ddp: dp_shard and tp must be 1 (use strategy=fsdp for sharding/TP)")
        dims = {"dp_replicate": -1, "dp_shard": 1, "tp": 1}
    auto = [k for k, v in dims.items() if v == -1]
    if len(auto) > 1:
        raise ConfigError(f"parallel: only one of {', '.join(auto)} may be -1 (auto)")
    fixed = 1
    for k, v in dims.items():
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
    tp = dims["tp"]
    if n_heads % tp or n_kv_heads % tp:
        raise ConfigError(f"parallel.tp: {tp} does not divide model.n_heads={n_heads} and n_kv_heads={n_kv_heads}")
    return dims["dp_replicate"], dims["dp_shard"], tp
