"""``train`` command line: ``train run`` trains; other groups (bench, doctor) plug in here.

User errors print one line naming the culprit and exit 2 (usage) or 1 (runtime);
tracebacks are for bugs only (set TRAIN_DEBUG=1 to see them for user errors too).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path

import click

from core.clicktypes import LocalPath, StrictInt, harden_click
from core.errors import InputError
from train.config import SEED_MAX
from train.console import drop_stream, fail, setup
from train.errors import RUNTIME_ERRORS, ConfigError, DataError
from train.paths import expand_path_env
from train.spawn import check_launcher, launcher_options, worker_args

log = logging.getLogger(__name__)
# Under torchrun a config error is printed by each node's first worker; the others wait this long
# before exiting, so that it is printed before torchrun stops the group (it stops it at the first exit).
FIRST_WORKER_GRACE_S = 5.0
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader left


class GuardedGroup(click.Group):
    """Top-level guard: any input error that escapes a command (``InputError`` - config,
    launch-spec and shared input checks - and undecodable text) is one line and exit 2.
    Other exceptions are bugs and keep their traceback."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Click's usage errors as one line too (``error: Invalid value for '--steps': ...``),
        control characters escaped, instead of the Usage/Try/Error block."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        if args is not None:  # called from Python (click's CliRunner, a test): not the process's exit
            return self._standalone(args, prog_name, complete_var, **extra)
        try:
            return self._standalone(args, prog_name, complete_var, **extra)
        except SystemExit as exc:
            if (tdist := _group_module()) is not None:
                tdist.end_process(exc.code)
            raise
        except BaseException as exc:  # a bug (traceback) or ^C
            if (tdist := _group_module()) is not None:
                sys.excepthook(type(exc), exc, exc.__traceback__)
                tdist.end_process(130 if isinstance(exc, KeyboardInterrupt) else 1)
            raise

    def _standalone(self, args, prog_name, complete_var, **extra):
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except getattr(click.exceptions, "NoArgsIsHelpError", ()) as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
            sys.exit(0)
        except click.exceptions.Abort:
            fail("aborted", 1)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        sys.exit(rv if isinstance(rv, int) else 0)

    def make_context(self, info_name, args, parent=None, **extra):
        with _quiet_on_closed_stdout():  # train --help | head
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx):
        try:
            expand_path_env()  # '~' in XDG_CACHE_HOME, TORCHINDUCTOR_CACHE_DIR...: as in every path given
            with _quiet_on_closed_stdout():
                return super().invoke(ctx)
        except InputError as exc:
            if os.environ.get("TRAIN_DEBUG"):
                raise
            fail(str(exc), 2)
        except UnicodeDecodeError as exc:
            if os.environ.get("TRAIN_DEBUG"):
                raise
            fail(f"input is not valid UTF-8 ({exc.reason} at byte {exc.start})", 2)



@contextlib.contextmanager
def _quiet_on_closed_stdout():
    """stdout's reader went away (``| head``): end quietly with 141, as a shell tool does."""
    try:
        yield
    except BrokenPipeError:
        drop_stream(sys.stdout)
        sys.exit(EXIT_CLOSED_PIPE)


def _group_module():
    """train.distributed when this process used a process group (then the process ends through
    its ``end_process``: no interpreter finalization while gloo's threads live), else None."""
    tdist = sys.modules.get("train.distributed")  # never imported: no process group was made
    return tdist if tdist is not None and tdist.group_used() else None


@click.group(cls=GuardedGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Distributed training for Llama-style models on Hopper/Blackwell GPUs (and CPUs)."""


@main.command("run")
@click.option("--config", "config_path", default="tiny", show_default=True, type=LocalPath(),
              help="YAML file, or a preset name from train/configs (tiny, debug, ...).")
@click.option("--steps", type=StrictInt(1), help="Training steps (train.steps).")
@click.option("--out", "out_dir", default="runs/latest", show_default=True, type=LocalPath(),
              help="Run directory: metrics.jsonl, config.yaml, checkpoints/ (one run at a time: locked).")
@click.option("--resume", is_flag=True, help="Continue from the latest complete checkpoint in --out.")
@click.option("--overwrite", is_flag=True,
              help="Start fresh in an --out that holds an earlier run: its files are moved to OUT/replaced-<time>/.")
@click.option("--allow-config-change", is_flag=True,
              help="--resume even though the config differs from the recorded one in what it trains.")
@click.option("--checkpoint-every", type=StrictInt(0), help="Checkpoint every N steps (checkpoint.every).")
@click.option("--seed", type=StrictInt(0, SEED_MAX), help="Seed (train.seed).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config field, e.g. --set model.name=debug --set train.batch_size=4.")
@click.option("--flight-recorder", type=StrictInt(1, 10_000_000), metavar="N",
              help="NCCL flight recorder: keep the last N collectives per rank and dump them to "
                   "OUT/flight_recorder/ when one times out (sets TORCH_FR_BUFFER_SIZE).")
@launcher_options
@click.pass_context
def run_cmd(ctx, config_path, steps, out_dir, resume, overwrite, allow_config_change, checkpoint_every, seed,
            overrides, flight_recorder, **launcher) -> None:
    """Train. Works as one process, under torchrun (reads RANK, WORLD_SIZE, ...), or as the parent of
    --nproc-per-node workers."""
    setup()  # the train loggers -> stderr, rank-prefixed
    from train import rundir

    if resume and overwrite:
        fail("--resume and --overwrite exclude each other", 2)
    extra = list(overrides)
    for key, value in (("train.steps", steps), ("checkpoint.every", checkpoint_every), ("train.seed", seed)):
        if value is not None:
            extra.append(f"{key}={value}")
    if launcher["nproc_per_node"] is not None:  # the parent: check once, then start the workers
        _checked_job(config_path, extra, out_dir, check_launcher(launcher))
        from train.spawn import start

        start(launcher, worker_args(ctx))
    job, out_dir = _checked_job(config_path, extra, out_dir, None)
    if flight_recorder:
        os.environ["TORCH_FR_BUFFER_SIZE"] = str(flight_recorder)

    from train.trainer import run, should_resume

    is_rank0 = int(os.environ.get("RANK") or "0") == 0  # checked by check_launcher_env
    lock, on_start = rundir.RunLock(out_dir), None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if is_rank0:  # one process per run holds the lock, for the life of the run
            lock.acquire()
            event = rundir.prepare(out_dir, job, should_resume(job, resume), overwrite, allow_config_change,
                                   log.info)

            def on_start(planned) -> None:
                rundir.write_config(out_dir, planned, event)
        summary = run(job, out_dir, resume=resume, on_start=on_start)
    except (ConfigError, DataError) as exc:
        fail(str(exc), 2)
    except RUNTIME_ERRORS as exc:
        if os.environ.get("TRAIN_DEBUG"):
            raise
        fail(str(exc), 1)
    finally:
        lock.release()
    if is_rank0:
        _print_summary(summary, out_dir, job.train.steps)


def _checked_job(config_path: str, extra: list[str], out_dir: str, world_sizes: list[int] | None):
    """The job and its run directory, checked before any process group: one line and exit 2 on error.

    ``world_sizes``: those of a parent's workers (``--nproc-per-node``); None: this process is the run
    (alone or one rank of a launcher). The config's own errors are the same on every rank: under
    torchrun, only each node's first worker prints them (the others exit with the same code, up to
    :data:`FIRST_WORKER_GRACE_S` later: torchrun stops a group when its first worker fails)."""
    from train import preflight
    from train.config import load_config

    local = os.environ.get("LOCAL_RANK") or "0"
    first = not (os.environ.get("TORCHELASTIC_RUN_ID") and local.isascii() and local.isdigit() and int(local) > 0)
    try:
        checked_out = preflight.check_out_dir(out_dir)
        job = load_config(config_path, extra)
        for world in world_sizes or [preflight.world_size_from_env()]:
            preflight.check_job(job, world)
    except (ConfigError, DataError) as exc:
        if not first:  # let the node's first worker print it before torchrun stops the group
            time.sleep(FIRST_WORKER_GRACE_S)
        fail(str(exc), 2, echo=first)
    try:
        if world_sizes is None:
            preflight.check_launcher_env()
        preflight.check_runs_here(job, checked_out)
    except (ConfigError, DataError) as exc:
        fail(str(exc), 2)
    return job, checked_out


def _print_summary(s, out_dir: Path, steps: int) -> None:
    if s.steps_run == 0 and not s.preempted and s.start_step >= steps:  # resumed at or past train.steps
        click.echo(f"\nnothing to train: the run is at step {s.start_step} and train.steps is {steps}; raise --steps "
                   f"to continue (checkpoint {s.checkpoint or 'none'})")
        return
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

from train.doctor.cli import doctor  # noqa: E402

main.add_command(doctor)

from train.nodecheck import preflight_cmd  # noqa: E402

main.add_command(preflight_cmd)

from train.prepare.cli import data  # noqa: E402

main.add_command(data)
harden_click(main)  # every INT/FLOAT option of every command: ASCII digits, finite, bounded

if __name__ == "__main__":  # pragma: no cover
    main()
