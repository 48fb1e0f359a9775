"""``train bench step``: training-step throughput over a grid of configurations.

One process group for the whole grid (run under torchrun for several GPUs)::

    torchrun --nproc-per-node 2 -m train bench step --preset 1b --strategy ddp,fsdp \\
        --fp8 none,tensorwise --ac none,full --compile on --batch 4 --seq 2048 --steps 20 --warmup 5
    python -m train bench step --preset tiny --ac none,full --steps 5      # CPU, one process

Every grid point (preset x strategy x fp8 x ac x compile x batch x seq) builds a fresh
:class:`~train.trainer.Trainer` from a job config (synthetic data unless ``--data
embedded``) and calls its ``train_step()``: the same model build, parallelization,
FP8 conversion and step as ``train run``, no second training loop. ``--warmup`` steps
(compile, allocator, autotuning; their time is reported as ``warmup_s``), then
``--steps`` timed steps: CUDA events around each step, median. Reported per point:
step time, tokens/s (all GPUs), tokens/s/GPU, MFU, peak memory per GPU, activation memory
(memory held at the end of the forward pass minus before it), the caching allocator's peak
(``reserved_gib``) and its cudaMalloc retries (max over ranks; ``train.bench.gpu_stats``),
first and final loss. A point that runs out of memory, or whose
config cannot run here, becomes a row with its status; the grid goes on.

Strategies: ``ddp``; ``fsdp`` (shard over all ranks); ``hsdp`` (2 replicas x shard);
``tp`` (tensor parallel over all ranks); ``fsdp_tp`` (TP 2 x shard). FP8: ``none``,
torchao recipes (``tensorwise``, ``rowwise``, ``rowwise_with_gw_hp``, ``mxfp8``) or
Transformer Engine ones (``te:current``, ``te:delayed``, ``te:mxfp8``).

The loss and attention levers go through ``--set`` like any config key (the step is the
trainer's own, so they apply here as in ``train run``): ``--set train.loss=chunked``
(eager | compiled | chunked, ``train.loss_chunk_tokens``), ``--set parallel.sdpa_backend=cudnn``
(auto | flash | cudnn | efficient | math); a plan's per-grid ``set`` measures them side by side.

``--plan FILE.yaml`` runs several grids in one launch: a list of mappings with the
option names as keys (``preset``, ``strategy``, ``fp8``, ``ac``, ``compile``, ``batch``,
``seq``, ``steps``, ``warmup``, ``data``, ``set``); unset keys take the command-line
values (a grid's ``set`` list is added to the command line's ``--set``).

Output in ``--out``: ``NAME.json`` (rows, with every step's loss), ``NAME.md``,
``NAME.png`` (tokens/s/GPU per point), via ``train.bench.report.write_report``.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from train.bench.gpu_stats import ForwardMemory, memory_columns, reduce_max
from train.bench.grid import FP8_CHOICES, GRID_KEYS, STRATEGIES, expand_all, job_overrides, load_plan
from train.bench.stopping import Stopped, StopSignals
from train.config import DATA_SOURCES, MAX_TIMEOUT_S
from train.console import fail, setup
from train.errors import RUNTIME_ERRORS, ConfigError
from train.parallel.config import AC_MODES

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

COLUMNS = ["preset", "strategy", "mesh", "fp8", "ac", "compile", "batch", "seq", "overrides", "gpus", "status",
           "step_ms", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "peak_mem_gib", "act_mem_gib", "warmup_s",
           "first_loss", "final_loss"]


class _StepClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def time(self, fn) -> tuple[float, object]:
        import torch

        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0, out
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out


def _step(trainer):
    """One training step; a stop the ranks agreed on ends the benchmark, not just the point."""
    out = trainer.train_step()
    if out[2]:
        raise Stopped(trainer.preemption.signum or signal.SIGTERM)
    return out


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:200]


def _row_and_job(point: dict, info) -> tuple[dict, object]:
    """The point's report row and its job config (None, the row saying why, when the
    config cannot run on this world size)."""
    from train import preflight
    from train.errors import ConfigError

    row = {k: point[k] for k in GRID_KEYS}
    row["compile"] = "on" if point["compile"] else "off"
    row["overrides"] = " ".join(point["set"])
    row["gpus"] = info.world_size
    try:
        job = _point_job(point)
        preflight.check_job(job, info.world_size)
    except ConfigError as exc:
        row["status"] = f"skipped: {' '.join(str(exc).split())}"[:200]
        return row, None
    return row, job


def _point_job(point: dict):
    """The point's job config, loaded once (kept in the point); its ConfigError each time."""
    from train.config import load_config
    from train.errors import ConfigError

    if "_job" not in point:
        try:
            point["_job"] = load_config(None, job_overrides(point))
        except ConfigError as exc:
            point["_job"] = exc
    if isinstance(point["_job"], ConfigError):
        raise ConfigError(str(point["_job"]))
    return point["_job"]


def _points_nccl_env(points: list[dict]) -> dict[str, str]:
    """The NCCL variables any point's settings need before the one process group starts."""
    from train.errors import ConfigError
    from train.parallel.symm_comm import nccl_env

    env: dict[str, str] = {}
    for point in points:
        try:
            env.update(nccl_env(_point_job(point)))
        except ConfigError:  # reported as that point's row
            continue
    return env


def _release(point: dict, cuda: bool, workdir: Path) -> None:
    """After a point (its Trainer dropped): free memory, compiled graphs and the work directory."""
    import torch

    gc.collect()
    if point["compile"]:
        torch._dynamo.reset()  # drop compiled graphs (and the modules they reference)
    if cuda:
        torch.cuda.empty_cache()
    shutil.rmtree(workdir, ignore_errors=True)


def _agree(row: dict, code: float, info) -> None:
    """Every rank reports the worst outcome of the point (all ranks must agree on the row)."""
    worst = reduce_max([code], info)[0]
    if worst and code == 0:
        row["status"] = "OOM on another rank" if worst == 1 else "failed on another rank"


def run_point(point: dict, info, signals: StopSignals) -> dict:
    """Build a Trainer for ``point``, run warm-up + timed steps; one report row."""
    import torch

    from train.trainer import Trainer

    row, job = _row_and_job(point, info)
    if job is None:
        return row
    signals.check(info)
    if cuda := info.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(info.device)
        torch.cuda.reset_accumulated_memory_stats(info.device)  # num_alloc_retries: this point's own
    workdir = Path(tempfile.mkdtemp(prefix="bench-step-"))
    trainer, memory, code = None, None, 0.0
    try:
        trainer = Trainer(job, info, workdir)
        signals.hand_over(trainer)
        mesh = trainer.par.mesh
        row["mesh"] = mesh.describe() if hasattr(mesh, "describe") else f"dp={trainer.par.dp_world}"
        clock = _StepClock(info.device)
        losses = []
        t0 = time.perf_counter()
        for _ in range(point["warmup"]):
            losses.append(_step(trainer)[0])
        row["warmup_s"] = time.perf_counter() - t0
        if cuda:
            memory = ForwardMemory(trainer.par.model, info.device)
        times = []
        for _ in range(point["steps"]):
            dt, (loss, _, _) = clock.time(lambda: _step(trainer))
            times.append(dt)
            losses.append(loss)
        step_s = reduce_max([statistics.median(times)], info)[0]
        tokens = job.train.batch_size * job.train.seq_len * trainer.accum * trainer.par.dp_world
        row["step_ms"] = step_s * 1000
        row["tokens_per_s"] = tokens / step_s
        row["tokens_per_s_per_gpu"] = tokens / step_s / info.world_size
        row["mfu"] = trainer.metrics.mfu(row["tokens_per_s_per_gpu"]) if trainer.metrics.peak_tflops else None
        if cuda:
            row.update(memory_columns(info, memory.delta))
        row["first_loss"], row["final_loss"] = losses[0], losses[-1]
        row["losses"] = losses
        row["status"] = "ok"
    except torch.OutOfMemoryError:
        code, row["status"] = 1.0, "OOM"
    except Exception as exc:  # a failing point is a row, not the end of the grid
        code, row["status"] = 2.0, f"error: {_first_line(exc)}"
        if os.environ.get("TRAIN_DEBUG"):
            log.exception("bench point %s failed", _label(row))
    finally:
        if memory is not None:
            memory.remove()
        if trainer is not None:
            trainer.metrics.close()
        trainer = None
        _release(point, cuda, workdir)
    _agree(row, code, info)
    return row


def _label(row: dict) -> str:
    return (f"{row['preset']} {row['strategy']} fp8={row['fp8']} ac={row['ac']} c={row['compile']} "
            f"{row['batch']}x{row['seq']}")


def _chart(ax, rows) -> None:
    ok = [r for r in rows if r.get("status") == "ok"]
    labels = [_label(r) for r in ok]
    values = [r["tokens_per_s_per_gpu"] for r in ok]
    ax.barh(range(len(ok)), values, color="tab:blue")
    ax.set_yticks(range(len(ok)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("tokens/s per GPU")
    ax.set_title("train bench step")


@click.command("step")
@click.option("--preset", default="tiny", show_default=True, help="Model presets (comma list).")
@click.option("--strategy", default="ddp", show_default=True, help=f"Comma list of: {', '.join(STRATEGIES)}.")
@click.option("--fp8", default="none", show_default=True,
              help=f"Comma list of: {', '.join(FP8_CHOICES)}.")
@click.option("--ac", default="none", show_default=True, help=f"Comma list of: {', '.join(AC_MODES)}.")
@click.option("--compile", "compile_", default="off", show_default=True, help="Comma list of: on, off.")
@click.option("--batch", default="4", show_default=True, help="Micro-batch per rank (comma list).")
@click.option("--seq", default="128", show_default=True, help="Sequence length (comma list).")
@click.option("--steps", default=10, show_default=True, type=int, help="Timed steps per point.")
@click.option("--warmup", default=3, show_default=True, type=int, help="Untimed steps first (compile etc.).")
@click.option("--data", default="synthetic", show_default=True, type=click.Choice(DATA_SOURCES),
              help="Token source; file: a token file named by --set data.path=FILE.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Config override for every point.")
@click.option("--plan", type=click.Path(path_type=Path, dir_okay=False), help="YAML list of grids to run.")
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cuda", "cpu"]),
              help="train.device of every point (auto: cuda when a GPU is visible).")
@click.option("--timeout-s", default=900, show_default=True, type=click.IntRange(1, MAX_TIMEOUT_S),
              help="Process-group timeout (seconds, at most 7 days as train.timeout_s).")
@click.option("--out", "out_dir", default="runs/bench-step", show_default=True, type=click.Path(path_type=Path),
              help="Directory of the report (NAME.json/.md/.png).")
@click.option("--name", default="step", show_default=True, help="Report file name (NAME.json/.md/.png).")
def step_cmd(preset, strategy, fp8, ac, compile_, batch, seq, steps, warmup, data, overrides, plan, device,
             timeout_s, out_dir, name) -> None:
    """Step throughput, MFU and memory over a grid of strategy x FP8 x AC x compile x model x batch."""
    import torch

    from train import distributed as tdist
    from train import preflight
    from train.bench.report import check_report, claim_report, environment_meta

    out_dir = check_report(out_dir, name)
    if steps < 1 or warmup < 0:
        raise ConfigError("--steps must be >= 1 and --warmup >= 0")
    preflight.check_launcher_env()
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA GPU is visible here (use --device auto or cpu)")
    defaults = dict(preset=preset, strategy=strategy, fp8=fp8, ac=ac, compile=compile_, batch=batch, seq=seq,
                    steps=steps, warmup=warmup, data=data, set=list(overrides))
    grids = load_plan(plan, defaults) if plan else [defaults]
    points = expand_all(grids)
    for point in points:  # what train run checks before it starts: device, data, metric files
        job = _point_job(point)
        if device != "auto":  # the points run where --device says
            job = dataclasses.replace(job, train=dataclasses.replace(job.train, device=device))
        preflight.check_runs_here(job, out_dir)

    claim_report(out_dir, name)
    setup()  # per-point progress on stderr
    try:
        info = tdist.init_distributed(device, timeout_s, nccl_env=_points_nccl_env(points))
    except RUNTIME_ERRORS as exc:
        fail(f"process group: {_first_line(exc)}", 1)
    meta = environment_meta() if info.is_main else {}
    meta.update(command=" ".join(["train bench step", *sys.argv[3:]]), world_size=info.world_size,
                device=info.device.type)
    with tdist.group_teardown():
        try:
            table, rows = _run_points(points, info, out_dir, name, meta)
            if info.is_main:
                click.echo(table)
                click.echo(f"\nreport: {out_dir / (name + '.json')}, .md, .png")
            _fail_if_none_ran(rows)
        except Stopped as stop:
            kept = f"; {out_dir / (name + '.json')} keeps them" if stop.done else ""
            fail(f"stopped by {stop.name} after {stop.done} of {len(points)} points{kept}", 128 + stop.signum)
        finally:
            from train.parallel.mesh import forget_meshes

            forget_meshes()
            gc.collect()


def _fail_if_none_ran(rows: list[dict]) -> None:
    """Some points of a grid may not run (OOM, a mesh this world size cannot make): they are
    rows, the exit status stays 0. When none ran, the command failed: exit 2 when every point
    was refused as configured (bad input), else 1."""
    if not rows or any(r.get("status") == "ok" for r in rows):
        return
    more = f" (and {len(rows) - 1} more point(s), see the report)" if len(rows) > 1 else ""
    refused = all(str(r.get("status", "")).startswith("skipped") for r in rows)
    fail(f"no point ran: {rows[0]['status']}{more}", 2 if refused else 1)


def _run_points(points: list[dict], info, out_dir: Path, name: str, meta: dict) -> tuple[str, list[dict]]:
    """Every point in turn; the report (rank 0) is rewritten after each, so a launch cut short
    keeps what it measured. Returns the Markdown table and the rows."""
    from train.bench.report import write_report
    from train.config import TrainConfig

    rows, table = [], ""
    signals = StopSignals(grace_s=TrainConfig.shutdown_grace_s)
    for i, point in enumerate(points):
        try:
            row = run_point(point, info, signals)
        except Stopped as stop:
            stop.done = i
            raise
        rows.append(row)
        if info.is_main:
            extra = ""
            if row.get("status") == "ok":
                extra = f" {row['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, step {row['step_ms']:.1f} ms"
            log.info("[bench step] %d/%d %s: %s%s", i + 1, len(points), _label(row), row["status"], extra)
            table = write_report(out_dir, name, rows, COLUMNS, meta=meta, chart=_chart)
    return table, rows
