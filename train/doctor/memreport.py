"""The memory section of ``train doctor``'s report: the estimate and recommendation for a
preset (``train.memory``, ``train.doctor.planning``) and, with ``--measure``, the
peak of real training steps on GPU 0 to compare with."""

from __future__ import annotations

from pathlib import Path

from train.compat import rms_norm_fp32_in_autocast
from train.doctor.planning import recommend
from train.memory import (
    USABLE_FRACTION,
    GiB,
    Plan,
    estimate,
)
from train.models.registry import PRESETS as MODEL_PRESETS
from train.models.registry import param_count
from train.plan import PLAN_KEYS, PlanInputs, job_inputs, plan


def memory_section(preset: str, seq: int, batch: int, gpus: int, gpu_bytes: int | None, source: str,
                   torch_version: str) -> dict:
    """The estimate of every candidate layout and the recommended one, for ``gpus`` GPUs
    of ``gpu_bytes`` each (None: unknown, no recommendation)."""
    cfg = MODEL_PRESETS[preset]
    rec = recommend(cfg, seq, batch, gpus, gpu_bytes, norm_fp32=rms_norm_fp32_in_autocast(torch_version))
    return {
        "preset": preset,
        "params": param_count(cfg),
        "seq": seq,
        "batch": batch,
        "gpus": gpus,
        "gpu_memory_gib": round(gpu_bytes / GiB, 1) if gpu_bytes else None,
        "usable_fraction": USABLE_FRACTION,
        "source": source,
        "precision": "bf16 autocast, fp32 master weights and gradients, AdamW fp32 m/v",
        "torch": torch_version,  # rms_norm's autocast policy depends on it (train.memory)
        "estimates": rec.rows,
        "recommendation": rec.to_dict(),
    }


def plan_section(preset: str, seq: int, batch: int, gpus: int, gpu_bytes: int | None,
                 capability: tuple[int, int] | None, torch_version: str) -> dict:
    """What the automatic plan (``train.plan``) would choose for ``train run --config PRESET``
    (the preset's config where one exists) on ``gpus`` GPUs of ``gpu_bytes`` each, in one node."""
    from train.config import CONFIG_DIR, load_config
    from train.hardware import host_memory_bytes
    from train.parallel.dims import ParallelDims

    named = (CONFIG_DIR / f"{preset}.yaml").is_file()
    job = load_config(preset if named else None, [*([] if named else [f"model.name={preset}"]),
                                                  f"train.seq_len={seq}", f"train.batch_size={batch}"])
    dims = ParallelDims.from_job(job, gpus)
    inputs = PlanInputs(
        **job_inputs(job, dims), device="cuda" if gpu_bytes else "cpu", world=gpus,
        total_bytes=gpu_bytes or 0, capability=capability or (9, 0), host_bytes=host_memory_bytes(), local_world=gpus,
        symm_auto="all_gather" if job.parallel.strategy == "fsdp" and gpus > 1 else "none",
        norm_fp32=rms_norm_fp32_in_autocast(torch_version),
    )
    result = plan(inputs)
    line = result.line(inputs) + (f" -- would stop: {result.problem}" if result.problem else "")
    return {"config": preset if named else f"model.name={preset}", "line": line,
            "values": result.values, "budget_gib": round(result.budget_bytes / GiB, 2)}


def measure_step_peak(preset: str, seq: int, batch: int, ac: str = "none", steps: int = 3,
                      device_index: int = 0) -> dict:
    """Run ``steps`` real training steps of the preset on one GPU through ``train.trainer``
    (synthetic data, bf16, ``parallel.ac=ac``) and compare ``torch.cuda.max_memory_allocated``
    (less what was allocated before) with the estimate."""
    import gc
    import tempfile

    import torch

    from train.config import load_config
    from train.distributed import DistInfo
    from train.trainer import Trainer

    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    job = load_config(None, [
        f"model.name={preset}", f"train.seq_len={seq}", f"train.batch_size={batch}", f"train.steps={steps}",
        "data.source=synthetic", "train.precision=bf16", f"parallel.ac={ac}", "metrics.progress=false",
    ])
    job.explicit_keys |= frozenset(PLAN_KEYS)  # the step the estimate models, not the automatic plan's
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(job, DistInfo(0, 0, 1, device, None), Path(tmp))
        wrapped = sum("checkpoint" in type(m).__name__.lower() for m in trainer.par.inner.modules())
        if (ac == "none") != (wrapped == 0):
            raise RuntimeError(f"parallel.ac={ac} but the trainer wrapped {wrapped} block(s) for checkpointing")
        for _ in range(steps):
            trainer.train_step()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        del trainer
    gc.collect()
    torch.cuda.empty_cache()
    plan = Plan("single", 1, ac=ac, norm_fp32=rms_norm_fp32_in_autocast(torch.__version__))
    est = estimate(job.model, batch, seq, plan)
    return {
        "preset": preset, "seq": seq, "batch": batch, "ac": ac, "steps": steps,
        "measured_bytes": int(peak), "estimate_bytes": est.peak, "estimate_phase": est.peak_phase,
        "error": (est.peak - peak) / peak if peak else None,
        "device": torch.cuda.get_device_name(device),
    }


def measure_all(report: dict, preset: str, seq: int, batch: int) -> list[dict]:
    if not report["gpus"]:
        report["notes"].append("--measure needs a CUDA GPU: skipped")
        return [{"ac": ac, "skipped": "no CUDA GPU"} for ac in ("none", "full")]
    results = []
    for ac in ("none", "full"):
        try:
            results.append(measure_step_peak(preset, seq, batch, ac))
        except Exception as exc:  # an OOM or a trainer error is reported, not fatal
            results.append({"ac": ac, "failed": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"})
    return results
