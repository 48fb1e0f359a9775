"""``train`` command line: ``train run`` trains; other groups (bench, doctor) plug in here.

User errors print one line naming the culprit and exit 2 (usage) or 1 (runtime);
tracebacks are for bugs only (set TRAIN_DEBUG=1 to see them for user errors too).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from train.config import ConfigError


def _rank_prefix() -> str:
    world = os.environ.get("WORLD_SIZE", "1")
    return f"[rank {os.environ.get('RANK', '0')}] " if world != "1" else ""


def fail(msg: str, code: int) -> None:
    """Print ``error: msg`` on one line and exit with ``code``."""
    one_line = " ".join(str(msg).split())
    click.echo(f"{_rank_prefix()}error: {one_line}", err=True)
    sys.exit(code)



def _user_errors() -> tuple[type[BaseException], ...]:
    from train.checkpoint import CheckpointError
    from train.data import DataError
    from train.dist import CollectiveError
    from train.trainer import NonFiniteLossError, OutOfMemory

    return (DataError, CheckpointError, NonFiniteLossError, CollectiveError, OutOfMemory, FileNotFoundError,
            PermissionError, OSError)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Distributed training for Llama-style models on Hopper/Blackwell GPUs (and CPUs)."""


@main.command("run")
@click.option("--config", "config_path", default="tiny", show_default=True,
              help="YAML file, or a preset name from train/configs (tiny, debug, ...).")
@click.option("--steps", type=int, help="Training steps (train.steps).")
@click.option("--out", "out_dir", default="runs/latest", show_default=True, type=click.Path(path_type=Path),
              help="Run directory: metrics.jsonl, config.yaml, checkpoints/.")
@click.option("--resume", is_flag=True, help="Continue from the latest complete checkpoint in --out.")
@click.option("--checkpoint-every", type=int, help="Checkpoint every N steps (checkpoint.every).")
@click.option("--seed", type=int, help="Seed (train.seed).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config field, e.g. --set model.name=debug --set train.batch_size=4.")
@click.option("--flight-recorder", type=click.IntRange(min=1), metavar="N",
              help="NCCL flight recorder: keep the last N collectives per rank and dump them to "
                   "OUT/flight_recorder/ when one times out (sets TORCH_FR_BUFFER_SIZE).")
def run_cmd(config_path, steps, out_dir, resume, checkpoint_every, seed, overrides, flight_recorder) -> None:
    """Train. Works as one process or under torchrun (reads RANK, WORLD_SIZE, ...)."""
    from train import preflight
    from train.config import load_config
    from train.dist import env_int

    if flight_recorder:
        os.environ["TORCH_FR_BUFFER_SIZE"] = str(flight_recorder)

    extra = list(overrides)
    for key, value in (("train.steps", steps), ("checkpoint.every", checkpoint_every), ("train.seed", seed)):
        if value is not None:
            extra.append(f"{key}={value}")
    try:
        job = load_config(config_path, extra)
        preflight.check_job(job, preflight.world_size_from_env())
        for name in ("RANK", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT"):
            env_int(name, 0)
        preflight.check_out_dir(out_dir)
    except ConfigError as exc:
        fail(str(exc), 2)

    from train.trainer import run

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_config(job, out_dir)
        summary = run(job, out_dir, resume=resume)
    except ConfigError as exc:
        fail(str(exc), 2)
    except _user_errors() as exc:
        if os.environ.get("TRAIN_DEBUG"):
            raise
        fail(str(exc), 1)
    if int(os.environ.get("RANK", "0")) == 0:
        _print_summary(summary, out_dir)


def _write_config(job, out_dir: Path) -> None:
    """Record the resolved config once; an existing different one is kept, not replaced."""
    import yaml

    if int(os.environ.get("RANK", "0")) != 0:
        return
    text = yaml.safe_dump(job.to_dict(), sort_keys=False)
    path = out_dir / "config.yaml"
    if path.exists():
        if path.read_text() != text:
            click.echo(f"[train] note: {path} from an earlier run differs from this run's config; kept as is",
                       err=True)
        return
    tmp = path.with_name(".config.yaml.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _print_summary(s, out_dir: Path) -> None:
    lines = [
        "",
        "=== summary ===",
        f"steps      {s.start_step} -> {s.final_step}" + (" (preempted)" if s.preempted else ""),
        f"loss       {s.first_loss:.4f} -> {s.last_loss:.4f}",
        f"tokens/s   {s.tokens_per_s:,.0f} (all ranks, after the first step)",
    ]
    if s.mfu is not None:
        lines.append(f"MFU        {s.mfu * 100:.1f}%")
    if s.peak_mem_gib:
        lines.append(f"peak mem   {s.peak_mem_gib:.2f} GiB per GPU")
    lines += [f"metrics    {out_dir / 'metrics.jsonl'}", f"checkpoint {s.checkpoint or 'none'}"]
    click.echo("\n".join(lines))


from train.bench.cli import bench  # noqa: E402

main.add_command(bench)

from train.doctor import doctor  # noqa: E402

main.add_command(doctor)

from train.prepare import data  # noqa: E402

main.add_command(data)

if __name__ == "__main__":  # pragma: no cover
    main()
