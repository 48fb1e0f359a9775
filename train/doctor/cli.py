"""The ``train doctor`` command: options, the report (system + profile + memory), output
and exit status (see :mod:`train.doctor`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from core.safety import excerpt, load_yaml_file
from train.console import fail
from train.doctor.memreport import measure_all, memory_section, plan_section
from train.doctor.profiles import capability, load_profile
from train.doctor.render import render_json, render_text
from train.doctor.system import collect_system
from train.memory import GiB
from train.models.registry import PRESETS as MODEL_PRESETS

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def _defaults(preset: str) -> tuple[int, int]:
    """(seq, batch) from ``train/configs/<preset>.yaml`` when it exists, else (2048, 1)."""
    path = CONFIG_DIR / f"{preset}.yaml"
    train = {}
    if path.is_file():
        train = (load_yaml_file(path, "config") or {}).get("train") or {}
    return int(train.get("seq_len", 2048)), int(train.get("batch_size", 1))


def _check_options(preset: str, seq: int | None, batch: int | None, gpus: int | None) -> tuple[int, int]:
    """Usage errors exit 2; returns (seq, batch) with the preset's defaults filled in."""
    if preset not in MODEL_PRESETS:
        fail(f"--preset {excerpt(preset)}: unknown preset (valid: {', '.join(MODEL_PRESETS)})", 2)
    for option, value, top in (("--seq", seq, 1 << 24), ("--batch", batch, 1 << 20), ("--gpus", gpus, 1 << 20)):
        if value is not None and not 1 <= value <= top:  # 0 must not silently mean "the default"
            fail(f"{option} {value}: must be in 1..{top}", 2)
    d_seq, d_batch = _defaults(preset)
    max_seq = MODEL_PRESETS[preset].max_seq_len
    seq = seq if seq is not None else min(d_seq, max_seq)
    batch = batch if batch is not None else d_batch
    if seq > max_seq:
        fail(f"--seq {seq}: longer than model.max_seq_len={max_seq} of preset {preset}", 2)
    return seq, batch


def _memory_target(report: dict, prof: dict | None, gpus: int | None) -> tuple[int, int | None, str]:
    """(GPU count, bytes per GPU or None, where they come from) for the estimate."""
    if prof:
        mem_bytes = int(prof["memory_gb"] * GiB) if prof["memory_gb"] else None
        if not mem_bytes:
            report["notes"].append(f"profile {prof['name']} has no gpu.memory_gb: no recommendation")
        return gpus or prof["gpus_per_node"] or 1, mem_bytes, f"profile {prof['name']}: {prof['model']}"
    if report["gpus"]:
        return (gpus or len(report["gpus"]), min(g["memory_bytes"] for g in report["gpus"]),
                f"visible GPUs: {report['gpus'][0]['name']}")
    return gpus or 8, None, "no GPU visible; use --profile for a recommendation"


def _check_cpu_arch(report: dict, prof: dict) -> None:
    """A note when this host's CPU is not the profile's: the image must also be built for that one."""
    host = report.get("cpu_arch")
    if host and prof.get("cpu_arch") and host != prof["cpu_arch"]:
        report["notes"].append(f"profile {prof['name']} has {prof['cpu_arch']} CPUs, this host is {host} "
                               f"({report['platform']}): its nodes need an image built for linux/{prof['cpu_arch']} "
                               "(make build-image PLATFORMS=linux/amd64,linux/arm64)")


@click.command("doctor")
@click.option("--preset", default="1b", show_default=True, help="Model preset for the memory estimate.")
@click.option("--seq", type=int, help="Sequence length (default: the preset's config, else 2048).")
@click.option("--batch", type=int, help="Micro-batch per GPU (default: the preset's config, else 1).")
@click.option("--gpus", type=int, help="GPU count for the estimate (default: visible GPUs, or the profile's).")
@click.option("--profile", help="Estimate for a hardware profile (h100, h200, b200, gb200, rtx-pro-6000...).")
@click.option("--check-nccl", is_flag=True, help="Also start a one-process NCCL group on GPU 0 and all_reduce.")
@click.option("--measure", is_flag=True, help="Run 3 real steps on GPU 0 (without and with AC) and compare "
                                              "the measured peak memory with the estimate.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def doctor(preset, seq, batch, gpus, profile, check_nccl, measure, as_json) -> None:
    """Check GPUs, drivers, NCCL, FP8 support and libraries; estimate memory per GPU; show the
    automatic plan ``train run --config PRESET`` would take on these GPUs (or the profile's)."""
    seq, batch = _check_options(preset, seq, batch, gpus)
    prof = None
    if profile is not None:  # --profile '' is a mistake, not "no profile"
        try:
            prof = load_profile(profile)
        except KeyError as exc:
            fail(exc.args[0], 2)

    report = collect_system(check_nccl=check_nccl)
    count, mem_bytes, source = _memory_target(report, prof, gpus)
    if prof:
        report["profile"] = prof
        _check_cpu_arch(report, prof)
    report["memory"] = memory_section(preset, seq, batch, count, mem_bytes, source, report["versions"]["torch"])
    caps = [tuple(int(x) for x in g["capability"].split(".")) for g in report["gpus"] if "capability" in g]
    cap = capability(prof["arch"]) if prof else (min(caps) if caps else None)
    report["memory"]["plan"] = plan_section(preset, seq, batch, count, mem_bytes, cap, report["versions"]["torch"])
    if measure:
        report["memory"]["measured"] = measure_all(report, preset, seq, batch)
    report["exit_code"] = 1 if report["problems"] else 0
    report["ok"] = not report["problems"]
    click.echo(render_json(report) if as_json else render_text(report))
    sys.exit(report["exit_code"])
