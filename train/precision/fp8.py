"""FP8 training: capability checks, and dispatch to the torchao or Transformer Engine backend.

:func:`check_float8` runs in preflight, before the process group: FP8 asked where it
cannot run (no GPU, compute capability < 8.9, MXFP8 off sm_100, library missing,
unsupported combination) is a :class:`~train.config.ConfigError` naming what is missing.
There is no silent fallback to bf16.

:func:`apply_float8` converts the (meta) model's linears; :func:`attach_float8` adds what
the training step needs to the :class:`~train.parallel.Parallelized` bundle (TE's
autocast as ``forward_context``; torchao's float8 scale precompute after each optimizer
step when FSDP2 all-gathers float8 weights).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from train.hardware import sm_name

PACKAGES = {"torchao": "torchao", "te": "transformer_engine"}
INSTALL_HINT = {
    "torchao": "pip install 'torchao>=0.17' (or the project's [fp8] extra)",
    "te": "pip install 'transformer-engine[pytorch]>=2.9' (or use an NGC PyTorch container)",
}


def torch_supports_torchao_mxfp8() -> bool:
    """torchao 0.17's MXFP8 training tensor needs DTensor internals that only recent
    torch builds have (torchao asserts on the same two names)."""
    try:
        from torch.distributed.tensor import _dispatch, _ops
    except ImportError:
        return False
    return hasattr(_ops, "scaled_mm_single_dim_strategy") and hasattr(_dispatch, "is_pinned_handler")


def float8_problem(cfg, capability: tuple[int, int] | None, installed: bool, tp: int = 1,
                   compile: bool = False, mx_supported: bool = True, ac: str = "none") -> str | None:
    """Why FP8 as configured cannot run here (one line), or None when it can.

    ``capability`` is the GPU's compute capability (None: no GPU); ``installed`` whether
    the backend's package is importable; ``mx_supported`` whether this torch can run
    torchao's MXFP8 training."""
    if cfg.backend == "none":
        return None
    backend, recipe = cfg.backend, cfg.resolved_recipe
    what = f"fp8.backend={backend} (recipe {recipe})"
    if capability is None:
        return f"{what}: FP8 training needs an NVIDIA GPU with compute capability >= 8.9; this process has no GPU (device cpu)"
    if capability < (8, 9):
        return (f"{what}: FP8 training needs compute capability >= 8.9 (Ada, Hopper, Blackwell); "
                f"this GPU is {sm_name(capability)}: use fp8.backend=none with bf16")
    if recipe == "mxfp8" and capability[0] != 10:
        extra = "; TE's MXFP8 does not run on sm_120, use fp8.recipe=current" if capability[0] == 12 else ""
        alt = "tensorwise or rowwise" if backend == "torchao" else "current or delayed"
        return (f"{what}: MXFP8 needs a sm_100 GPU (B200/GB200); this GPU is {sm_name(capability)}{extra} "
                f"(per-tensor FP8 recipes: {alt})")
    if backend == "torchao" and recipe.startswith("rowwise") and capability < (9, 0):
        return f"{what}: row-wise scaled FP8 matmuls need sm_90 or newer; this GPU is {sm_name(capability)} (use tensorwise)"
    if not installed:
        return f"{what}: the {PACKAGES[backend]} package is not installed: {INSTALL_HINT[backend]}"
    if backend == "torchao" and recipe == "mxfp8" and not mx_supported:
        return f"{what}: torchao's MXFP8 training needs a newer torch than {torch.__version__} (DTensor scaled_mm support)"
    if backend == "te" and tp > 1:
        return f"{what}: Transformer Engine layers do not compose with DTensor tensor parallelism (parallel.tp={tp}); use fp8.backend=torchao"
    if backend == "te" and ac != "none":
        return (f"{what}: parallel.ac={ac} recomputes blocks outside te.autocast (TE needs its own "
                "te.distributed.checkpoint); use parallel.ac=none or fp8.backend=torchao")
    if backend == "te" and compile:
        return f"{what}: Transformer Engine layers are not supported with parallel.compile=true; turn compile off or use fp8.backend=torchao"
    return None


def _local_capability(device_pref: str) -> tuple[int, int] | None:
    if device_pref == "cpu" or not torch.cuda.is_available():
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    index = local_rank if local_rank < torch.cuda.device_count() else 0
    return torch.cuda.get_device_capability(index)


def planned_compile_ac(job) -> tuple[bool, str]:
    """``parallel.compile`` and the AC mode that FP8's checks judge. With TE, what the job leaves
    open is the automatic plan's (train.plan): it keeps compile off and leaves every block out of
    AC, or stops the run where they do not all fit."""
    explicit = getattr(job, "explicit_keys", None)
    te = job.fp8.backend == "te" and explicit is not None

    def planned(key: str) -> bool:
        return te and key not in explicit

    compile = False if planned("parallel.compile") else job.parallel.compile
    every_block_out = planned("parallel.ac_skip_last") or job.parallel.ac_skip_last >= job.model.n_layers
    return compile, "none" if every_block_out else job.parallel.ac


def check_float8(job, dims) -> None:
    """Preflight (no process group yet): raise ConfigError when FP8 cannot run here.
    ``dims``: the run's :class:`~train.parallel.dims.ParallelDims`."""
    from train.errors import ConfigError

    cfg = job.fp8
    if cfg.backend == "none":
        return
    tp = dims.tp
    installed = importlib.util.find_spec(PACKAGES[cfg.backend]) is not None
    compile, ac = planned_compile_ac(job)
    problem = float8_problem(cfg, _local_capability(job.train.device), installed, tp, compile,
                             torch_supports_torchao_mxfp8(), ac)
    if problem:
        raise ConfigError(problem)


def apply_float8(model, cfg, device, dims, emulate: bool = False, high_precision: tuple[str, ...] = ("output",)):
    """Swap the block linears of ``model`` (meta device is fine) for FP8 ones. ``dims``:
    the run's :class:`~train.parallel.dims.ParallelDims` (TP degree, FSDP sharding);
    ``high_precision``: linears left alone (the model spec's, e.g. the output projection)."""
    if cfg.backend == "none":
        return model
    if cfg.backend == "torchao":
        from train.precision import fp8_torchao

        all_gather = cfg.fsdp_float8_all_gather and dims.fsdp_enabled and dims.dp_shard_enabled
        return fp8_torchao.convert(model, cfg.resolved_recipe, dims.tp, all_gather, emulate=emulate,
                                   keep=high_precision)
    if cfg.backend == "te":
        from train.precision import fp8_te

        return fp8_te.convert(model, high_precision)
    raise ValueError(f"fp8.backend: unknown backend {cfg.backend!r}")


def describe_float8(model, cfg) -> str:
    """One phrase for the start-up line: the FP8 layers in ``model`` and how their weights are held."""
    if cfg.backend == "none":
        return ""
    from torch.distributed.tensor import DTensor

    if cfg.backend == "te":
        from train.precision.fp8_te import te_linears as fp8_layers
    else:
        from train.precision.fp8_torchao import float8_linears as fp8_layers
    layers = [m for _, m in fp8_layers(model)]
    sharded = sum(1 for m in layers if isinstance(getattr(m, "weight", None), DTensor))
    held = f", {sharded} with sharded weights (DTensor)" if sharded else ""
    return f" | fp8 {cfg.backend} {cfg.resolved_recipe}: {len(layers)} layers{held}"


def attach_float8(par, fp8_cfg) -> None:
    """Hooks the training step needs for FP8 (called by ``train.parallel.parallelize``)."""
    if fp8_cfg.backend == "te":
        from train.precision import fp8_te

        par.add_forward_context(fp8_te.forward_context(fp8_cfg.resolved_recipe))
    elif fp8_cfg.backend == "torchao":
        from train.precision import fp8_torchao

        if fp8_torchao.uses_fsdp_float8_all_gather(par.inner):
            par.after_optimizer_step.append(fp8_torchao.precompute_scales_hook(par.model))
