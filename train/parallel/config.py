"""Configuration of how the model is spread over GPUs (owned by ``train.parallel``)."""

from __future__ import annotations

from dataclasses import dataclass

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # Inductor's modes with CUDA graphs: refused (validate)
SDPA_BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")
AC_MODES = ("none", "full", "selective", "op", "pointwise")


@dataclass
class ParallelConfig:
    strategy: str = "ddp"  # ddp | fsdp (fsdp covers FSDP2, HSDP and FSDP+TP through the mesh dims)
    # Mesh dims; -1 = whatever is left of the world size. The product must equal it.
    # strategy=fsdp with dp_replicate=-1 and dp_shard=1 (the defaults) or dp_shard=-1 shards over
    # all data-parallel ranks (dp_replicate=1, dp_shard=-1); set dp_replicate > 1 for HSDP.
    dp_replicate: int = -1
    dp_shard: int = 1
    tp: int = 1
    # DDP knobs
    bucket_cap_mb: float = 25.0
    first_bucket_mb: float = 0.0  # 0 = torch's default first bucket
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    # FSDP2 knobs
    fsdp_param_dtype: str = "auto"  # auto (= train.precision) | bf16 | fp32: dtype of the unsharded params in fwd/bwd
    fsdp_reduce_dtype: str = "fp32"  # fp32 | bf16: dtype of the gradient reduce-scatter / all-reduce
    # auto (every block but the last) | always | never (ZeRO-2 like); unset: the plan's never for FSDP2 without AC
    reshard_after_forward: str = "auto"
    cpu_offload: bool = False  # keep sharded params, grads and optimizer state in host memory
    fsdp_prefetch: int = 1  # blocks to all-gather ahead explicitly (forward and backward); 0 = FSDP's implicit
    # FSDP2's collective buffers from symmetric memory (NCCL on CUDA; train/parallel/symm_comm.py):
    # auto (all_gather within one node with NCCL >= 2.28, else none) | none | all_gather | all (also the
    # reduce-scatter, as an all-to-all + local sum); the trainer sets NCCL_CTA_POLICY=2: copy engines;
    # unset: the plan's all for FSDP2 without AC where auto is all_gather
    fsdp_symm_mem: str = "auto"
    # one rank (world size 1): cast = FSDP's mixed precision by casting the parameters in the forward,
    # without fully_shard's one-rank copies (train/parallel/cast.py) | shard = fully_shard as on many ranks
    fsdp_one_rank: str = "cast"
    # tensor parallel knobs (tp > 1)
    sequence_parallel: bool = True  # shard norms/residual stream over the sequence between TP regions
    loss_parallel: bool = False  # keep logits sharded over the vocabulary for the cross-entropy
    # activation checkpointing / compile
    ac: str = "none"  # one of AC_MODES (train/parallel/ac.py)
    ac_every: int = 2  # selective: checkpoint every k-th block
    # the last k blocks are not checkpointed (any ac mode): backward reaches them first, while
    # few gradients are held yet, so their activations raise the peak less than other blocks' would
    ac_skip_last: int = 0  # unset on CUDA with AC on: the plan's (train/plan.py)
    compile: bool = False  # unset on CUDA: the plan turns it on (train/plan.py)
    compile_mode: str = "default"  # default | max-autotune-no-cudagraphs (the CUDA-graph modes are refused)
    compile_backend: str = "inductor"  # inductor | aot_eager (debugging: traces, no code generation)
    # < 1: the compiled blocks' partitioner recomputes in backward what it would have saved,
    # cheapest first, until the saved activations fit this fraction (torch._functorch.config)
    activation_memory_budget: float = 1.0  # unset: the plan's 0.999 on the first 3/8 blocks for FSDP2 without AC
    activation_memory_budget_skip_last: int = 0  # the last k compiled blocks without the budget (inductor)
    # compiled blocks recompute in backward the bf16 casts of the fp32 parameters that autocast makes
    # inside them (DDP, fsdp_one_rank=cast) instead of saving them: 2 bytes per parameter less memory,
    # one more cast per step. Measured at 1b bf16 on one H200: 1.81 GiB less for 0.5% fewer tokens/s;
    # unset on one CUDA GPU with compile: the plan's true (train/plan.py); otherwise off
    recompute_param_casts: bool = False
    # scaled_dot_product_attention kernel, applied around forward and backward (sdpa_kernel):
    # auto (torch picks) | flash | cudnn | efficient | math
    sdpa_backend: str = "auto"

    def validate(self) -> None:
        from train.errors import ConfigError

        if self.strategy not in ("ddp", "fsdp"):
            raise ConfigError(f"parallel.strategy: must be ddp or fsdp, got {self.strategy!r}")
        for name in ("dp_replicate", "dp_shard", "tp"):
            v = getattr(self, name)
            if v == 0 or v < -1:
                raise ConfigError(f"parallel.{name}: must be >= 1 or -1 (auto), got {v}")
        if self.bucket_cap_mb <= 0 or self.first_bucket_mb < 0:
            raise ConfigError("parallel.bucket_cap_mb: must be > 0 (first_bucket_mb >= 0)")
        if self.fsdp_param_dtype not in ("auto", "bf16", "fp32"):
            raise ConfigError(f"parallel.fsdp_param_dtype: must be auto, bf16 or fp32, got {self.fsdp_param_dtype!r}")
        if self.fsdp_reduce_dtype not in ("fp32", "bf16"):
            raise ConfigError(f"parallel.fsdp_reduce_dtype: must be fp32 or bf16, got {self.fsdp_reduce_dtype!r}")
        if self.reshard_after_forward not in ("auto", "always", "never"):
            raise ConfigError(
                f"parallel.reshard_after_forward: must be auto, always or never, got {self.reshard_after_forward!r}"
            )
        if not 0 < self.activation_memory_budget <= 1:
            raise ConfigError(f"parallel.activation_memory_budget: must be in (0, 1], got {self.activation_memory_budget}")
        if self.activation_memory_budget_skip_last < 0:
            raise ConfigError(
                f"parallel.activation_memory_budget_skip_last: must be >= 0, got {self.activation_memory_budget_skip_last}"
            )
        if self.fsdp_one_rank not in ("cast", "shard"):
            raise ConfigError(f"parallel.fsdp_one_rank: must be cast or shard, got {self.fsdp_one_rank!r}")
        if self.fsdp_prefetch < 0:
            raise ConfigError(f"parallel.fsdp_prefetch: must be >= 0, got {self.fsdp_prefetch}")
        if self.fsdp_symm_mem not in ("auto", "none", "all_gather", "all"):
            raise ConfigError(f"parallel.fsdp_symm_mem: must be auto, none, all_gather or all, got {self.fsdp_symm_mem!r}")
        if self.fsdp_symm_mem in ("all_gather", "all") and self.cpu_offload:
            raise ConfigError("parallel.fsdp_symm_mem: not with parallel.cpu_offload (host-resident shards)")
        if self.cpu_offload and self.strategy != "fsdp":
            raise ConfigError("parallel.cpu_offload: needs parallel.strategy=fsdp")
        if self.ac not in AC_MODES:
            raise ConfigError(f"parallel.ac: must be one of {', '.join(AC_MODES)}, got {self.ac!r}")
        if self.ac_every < 1:
            raise ConfigError(f"parallel.ac_every: must be >= 1, got {self.ac_every}")
        if self.ac_skip_last < 0:
            raise ConfigError(f"parallel.ac_skip_last: must be >= 0, got {self.ac_skip_last}")
        if self.compile_mode in CUDA_GRAPH_MODES:
            raise ConfigError(
                f"parallel.compile_mode={self.compile_mode}: CUDA graphs are refused here: the blocks are compiled "
                "one by one and their inputs (FSDP2's gathered parameters, the cast norm weights) move between "
                "steps, so the graphs are recorded again instead of replayed (125m on one H200: 309 against 23.6 "
                "ms/step); use default or max-autotune-no-cudagraphs")
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(f"parallel.compile_mode: must be one of {', '.join(COMPILE_MODES)}")
        if self.sdpa_backend not in SDPA_BACKENDS:
            raise ConfigError(f"parallel.sdpa_backend: must be one of {', '.join(SDPA_BACKENDS)}, got {self.sdpa_backend!r}")
        if self.compile_backend not in ("inductor", "aot_eager"):
            raise ConfigError(f"parallel.compile_backend: must be inductor or aot_eager, got {self.compile_backend!r}")


def offload_unavailable(strategy: str, tp: int, fp8_backend: str, fsdp_symm_mem: str) -> str:
    """Why FSDP2's CPU offload cannot serve a job with these settings ("" where it can), for the
    automatic plan and the start-up checks: the settings :meth:`ParallelConfig.validate` and
    :meth:`train.parallel.dims.ParallelDims.from_job` refuse together with ``cpu_offload``, and
    Transformer Engine's layers, with which the plan does not offload."""
    if strategy != "fsdp":
        return "parallel.cpu_offload needs parallel.strategy=fsdp"
    if tp > 1:
        return "parallel.cpu_offload is not available with parallel.tp > 1"
    if fp8_backend == "te":
        return "parallel.cpu_offload is not planned with fp8.backend=te"
    if fsdp_symm_mem in ("all_gather", "all"):
        return f"parallel.cpu_offload is not available with parallel.fsdp_symm_mem={fsdp_symm_mem}"
    return ""


def check_offload_device(job) -> None:
    """parallel.cpu_offload on a machine without a GPU (the layout rules are in
    :meth:`train.parallel.dims.ParallelDims.from_job`)."""
    from train.errors import ConfigError

    if job.parallel.cpu_offload and (job.train.device == "cpu" or not _cuda_available()):
        raise ConfigError("parallel.cpu_offload: offloads GPU memory to the host; it needs train.device=cuda")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
