"""The automatic plan (:mod:`train.plan`) applied to a run, once, before the model is built.

Every rank gathers the plan's inputs; the memory figures are the least over the ranks, so
every rank computes the same plan. A resumed run takes the values its ``config.yaml``
recorded for the keys the job leaves open (rank 0 reads the file and sends them): it trains
under the plan it started with, not a new one for a machine that may have changed. The
values are set on a copy of the job, which is what ``config.yaml`` then records.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from core.errors import InputError
from core.runlayout import CONFIG_NAME
from core.safety import load_yaml_file
from train import distributed as tdist
from train.compat import rms_norm_fp32_in_autocast
from train.config import JobConfig, set_key
from train.errors import ConfigError
from train.hardware import host_memory_bytes
from train.plan import PLAN_KEYS, PlanInputs, job_inputs, plan
from train.precision import amp


def recorded_plan(out_dir: Path) -> dict:
    """The values ``OUT/config.yaml`` recorded for the plan's keys ({} when there is none)."""
    path = out_dir / CONFIG_NAME
    if not path.is_file():
        return {}
    try:
        data = load_yaml_file(path, "--out config.yaml")
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    out = {}
    for key in PLAN_KEYS:
        section, _, name = key.partition(".")
        node = data.get(section) if isinstance(data, dict) else None
        if isinstance(node, dict) and name in node:
            out[key] = node[name]
    return out


def gather_inputs(job: JobConfig, info: tdist.DistInfo, dims) -> PlanInputs:
    """This run's :class:`PlanInputs` (a collective on CUDA: the least memory over the ranks)."""
    cuda = info.device.type == "cuda"
    free = total = 0
    capability = (0, 0)
    host = host_memory_bytes()
    if cuda:
        free, total = torch.cuda.mem_get_info(info.device)
        capability = torch.cuda.get_device_capability(info.device)
        free, total, host = (tdist.min_max(info, v)[0] for v in (free, total, host))
    symm = "none"
    if cuda and job.parallel.strategy == "fsdp":
        from train.parallel.symm_comm import resolved_mode

        symm = resolved_mode(replace_key(job, "parallel.fsdp_symm_mem", "auto"))
    return PlanInputs(
        **job_inputs(job, dims), device=info.device.type, world=info.world_size,
        precision=amp.resolve_precision(job.train.precision, info.device),
        total_bytes=total, free_bytes=free, capability=tuple(capability), host_bytes=host,
        local_world=tdist.env_int("LOCAL_WORLD_SIZE", info.world_size), symm_auto=symm,
        norm_fp32=rms_norm_fp32_in_autocast(torch.__version__),
    )


def replace_key(job: JobConfig, key: str, value) -> JobConfig:
    new = copy.deepcopy(job)
    set_key(new, key, value)
    return new


def apply_plan(job: JobConfig, info: tdist.DistInfo, dims, out_dir: Path, resuming: bool, log) -> JobConfig:
    """The job with the plan's values (and, resuming, the recorded ones); its line goes to ``log``.
    A job built without :func:`train.config.load_config` (no ``explicit_keys``) is left as it is."""
    explicit = getattr(job, "explicit_keys", None)
    if explicit is None:
        return job
    inputs = gather_inputs(job, info, dims)
    result = plan(inputs)
    if result.problem:
        raise ConfigError(result.problem)
    pinned = {}
    if resuming:
        pinned = recorded_plan(out_dir) if info.is_main else {}
        pinned = tdist.broadcast_object(info, pinned)
        pinned = {k: v for k, v in pinned.items() if k not in explicit}
    new = copy.deepcopy(job)
    for key, value in {**result.values, **pinned}.items():
        set_key(new, key, value)
    new.validate()
    new.explicit_keys = explicit
    line = result.line(inputs)
    changed = sorted(k for k, v in pinned.items() if result.values.get(k, _get(job, k)) != v)
    if pinned:
        line += f"; resumed under the recorded plan ({len(changed)} of its values differ from a new plan's)"
    if inputs.device == "cuda" or pinned:
        log(line)
    return new


def _get(job: JobConfig, key: str):
    section, _, name = key.partition(".")
    return getattr(getattr(job, section), name)
