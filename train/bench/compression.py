"""``train bench compression``: what each gradient-communication scheme buys on this link.

Run under torchrun; every variant is a real training run through :class:`train.trainer.Trainer`
(one Trainer per variant, same seed, data and initial weights) with ``comm.measure=true``::

    torchrun --nproc-per-node 2 -m train bench compression --preset 350m --steps 30 --emulate-link ethernet

Per variant: mean step time, speed-up over ``none``, exposed (non-overlapped)
communication ms per step (``train.comm.overlap``), bytes this rank handed to
collectives per step (from the hook's actual tensors), and the loss at the end.

Compression (PowerSGD, Top-K) and LocalSGD all start after ``--start-iter`` plain
steps; timing uses a window of steps after that (a whole number of LocalSGD periods,
so that averaging steps are counted in proportion), the loss is averaged over the last
``--loss-window`` steps (mean over ranks of each step's batch loss).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import statistics
import sys
from pathlib import Path

import click

from core.clicktypes import LocalPath
from core.safety import excerpt, excerpt_path, parse_ascii_int, parse_finite_float
from train.bench.stopping import Stopped, StopSignals
from train.console import fail, setup

log = logging.getLogger(__name__)


DEFAULT_VARIANTS = "none,fp16,powersgd:1,powersgd:4,powersgd:8,topk:0.01,localsgd:4"


def variant_overrides(spec: str) -> tuple[str, list[str]]:
    """``"powersgd:4"`` -> (``"powersgd r=4"``, ``[..., "comm.powersgd_impl=train"]``;
    ``powersgd-torch:R``: torch's hook)."""
    kind, _, arg = spec.strip().partition(":")
    if kind in ("none", "fp16", "bf16") and not arg:
        return kind, [f"comm.hook={kind}"]
    if kind == "powersgd":
        rank = parse_ascii_int("--variants powersgd:R", arg or "4", 1, 1 << 16)
        return f"powersgd r={rank}", ["comm.hook=powersgd", f"comm.powersgd_rank={rank}", "comm.powersgd_impl=train"]
    if kind == "powersgd-torch":  # torch's own powerSGD_hook, for comparison
        rank = parse_ascii_int("--variants powersgd-torch:R", arg or "4", 1, 1 << 16)
        return f"powersgd-torch r={rank}", ["comm.hook=powersgd", f"comm.powersgd_rank={rank}",
                                             "comm.powersgd_impl=torch"]
    if kind == "topk":
        ratio = parse_finite_float("--variants topk:RATIO", arg or "0.01")
        if not 0 < ratio <= 1:
            raise ValueError(f"--variants {spec!r}: RATIO must be in (0, 1]")
        return f"topk {ratio * 100:g}%", ["comm.hook=topk", f"comm.topk_ratio={ratio}"]
    if kind == "localsgd":
        period = parse_ascii_int("--variants localsgd:PERIOD", arg or "4", 1, 1 << 16)
        return f"localsgd {period}", ["comm.hook=localsgd", f"comm.localsgd_period={period}"]
    raise ValueError(f"--variants: unknown {excerpt(spec)} "
                     "(none, fp16, bf16, powersgd:R, powersgd-torch:R, topk:RATIO, localsgd:PERIOD)")


def timing_window(steps: int, start_iter: int, period: int) -> tuple[int, int]:
    """1-based inclusive step range timed: after ``start_iter`` plain steps and two more
    (allocator/bucket settling), trimmed from the front to a multiple of ``period``."""
    first = min(steps, start_iter + 3)
    length = steps - first + 1
    if length >= period:
        length -= length % period
    return steps - length + 1, steps


def summarize(rows: list[dict], window: tuple[int, int], loss_window: int) -> dict:
    timed = [r for r in rows if window[0] <= r["step"] <= window[1]]
    last = rows[-loss_window:]
    mean = statistics.fmean
    return {
        "step_ms": mean(r["step_time_s"] for r in timed) * 1e3,
        "exposed_comm_ms": mean(r.get("exposed_comm_ms", float("nan")) for r in timed),
        "MB_per_step": mean(r.get("comm_bytes", float("nan")) for r in timed) / 1e6,
        "tokens_per_s": mean(r["tokens_per_s"] for r in timed),
        "loss": mean(r["loss"] for r in last),
        "loss_last": rows[-1]["loss"],
        "steps": rows[-1]["step"],
    }


def _chart(ax, rows):
    ok = [r for r in rows if r.get("step_ms") is not None]
    names = [r["variant"] for r in ok]
    step = [r["step_ms"] for r in ok]
    exposed = [min(r["exposed_comm_ms"], r["step_ms"]) if r["exposed_comm_ms"] == r["exposed_comm_ms"] else 0
               for r in ok]
    ax.bar(names, step, label="step time (ms)", color="#4c72b0")
    ax.bar(names, exposed, label="exposed comm (ms)", color="#dd8452")
    for i, r in enumerate(ok):
        if r.get("speedup"):
            ax.text(i, r["step_ms"], f"{r['speedup']:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per step")
    ax.set_title("gradient communication schemes: step time and exposed communication")
    ax.tick_params(axis="x", rotation=20)
    ax.legend()


COLUMNS = ["variant", "step_ms", "speedup", "exposed_comm_ms", "MB_per_step", "tokens_per_s", "loss",
           "loss_vs_none_pct"]


@click.command("compression")
@click.option("--preset", default="350m", show_default=True, help="Model preset (model.name).")
@click.option("--config", "config_path", default=None, type=LocalPath(),
              help="Base config (file or preset name); default: train/configs/<preset>.yaml if it exists.")
@click.option("--steps", type=int, default=30, show_default=True, help="Training steps per variant (train.steps).")
@click.option("--batch", type=int, default=None, help="Micro-batch per rank (train.batch_size).")
@click.option("--seq", type=int, default=None, help="Sequence length (train.seq_len).")
@click.option("--variants", default=DEFAULT_VARIANTS, show_default=True,
              help="Comma list: none, fp16, bf16, powersgd:R, powersgd-torch:R, topk:RATIO, localsgd:PERIOD.")
@click.option("--start-iter", type=int, default=3, show_default=True,
              help="Plain DDP steps before compression / local SGD start (>= 2).")
@click.option("--loss-window", type=int, default=5, show_default=True, help="Loss = mean over the last N steps.")
@click.option("--emulate-link", type=click.Choice(["nvlink", "pcie", "ethernet"]), default=None,
              help="Set NCCL_P2P_DISABLE / NCCL_SHM_DISABLE before init (docs/communication.md).")
@click.option("--measure/--no-measure", default=True, show_default=True,
              help="Exposed comm time and bytes (routes hook=none through torch's allreduce_hook).")
@click.option("--out", "out_dir", default="runs/bench", show_default=True, type=click.Path(path_type=Path),
              help="Directory of the report (NAME.json/.md/.png).")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=None,
              help="Where each variant's run (metrics.jsonl, log) goes; default: OUT/compression_runs.")
@click.option("--name", default=None, help="Report name (default: compression, or compression_<link>).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Extra config overrides for every variant.")
def compression_cmd(preset, config_path, steps, batch, seq, variants, start_iter, loss_window, emulate_link, measure,
                    out_dir, runs_dir, name, overrides) -> None:
    """Step time, bytes, exposed comm and loss for each gradient-communication scheme."""
    from train import preflight
    from train.bench.report import check_report, claim_report, comma_list
    from train.rundir import RunLock

    name = name if name is not None else ("compression" + (f"_{emulate_link}" if emulate_link else ""))
    check_report(out_dir, name)
    runs_dir = preflight.check_out_dir(runs_dir or out_dir / "compression_runs", "--runs-dir")
    try:
        specs = comma_list(variants, "--variants")
        for spec in specs:
            variant_overrides(spec)  # a bad variant is named before anything else
    except ValueError as exc:
        fail(str(exc), 2)
    world = preflight.check_launcher_env()  # its ConfigError: one line, exit 2 (train.cli)
    if world < 2:
        fail("train bench compression needs >= 2 processes: run it under torchrun --nproc-per-node N (N >= 2)", 2)
    base = _base_overrides(preset, steps, batch, seq, start_iter, measure, overrides)
    jobs = _variant_jobs(specs, preset, config_path, base, world, steps, loss_window, runs_dir)

    from train import distributed as tdist
    from train.bench.links import emulate_link as apply_link

    setup()
    claim_report(out_dir, name)
    lock = RunLock(runs_dir, label=f"--runs-dir {excerpt_path(runs_dir)}")
    if int(os.environ.get("RANK") or "0") == 0:  # one bench at a time in a runs dir (rank 0 holds it)
        runs_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    try:
        apply_link(emulate_link)
        info = tdist.init_distributed(jobs[0][1].train.device, jobs[0][1].train.timeout_s)
    except (RuntimeError, ValueError) as exc:
        fail(str(exc), 1)
    periods = [j.comm.localsgd_period for _, j in jobs if j.comm.hook == "localsgd"] or [1]
    window = timing_window(steps, start_iter, math.lcm(*periods))
    try:
        with tdist.group_teardown():
            rows = _run_variants(jobs, info, runs_dir, window, loss_window, out_dir, name)
    except Stopped as stop:
        kept = f"; {out_dir / (name + '.json')} keeps what was measured" if stop.done or stop.row else ""
        fail(f"stopped by {stop.name} after {stop.done} of {len(jobs)} variants{kept}", 128 + stop.signum)
    finally:
        lock.release()
    if not info.is_main:
        return
    _relative_to_none(rows)
    j0 = jobs[0][1]
    meta = {"world_size": info.world_size, "model": j0.model.name,
            "batch": f"{j0.train.batch_size}x{j0.train.seq_len} per rank", "steps": steps,
            "timed_steps": f"{window[0]}..{window[1]}", "loss": f"mean of the last {loss_window} steps",
            "start_iter": start_iter, "emulate_link": emulate_link or "none"}
    _final_report(out_dir, name, rows, meta)
    click.echo(f"wrote {out_dir / name}.json/.md/.png; per-variant runs under {runs_dir}")


def _base_overrides(preset: str, steps: int, batch: int | None, seq: int | None, start_iter: int, measure: bool,
                    overrides) -> list[str]:
    """Config overrides every variant shares; a ``--set`` of one of their keys is refused."""
    from train.bench.report import refuse_set_keys

    itself = "train bench compression itself"
    owned = [(f"model.name={preset}", "--preset"), (f"train.steps={steps}", "--steps"),
             ("train.log_every=1", itself), ("checkpoint.final=false", itself), ("checkpoint.every=0", itself),
             ("checkpoint.resume=never", itself), ("metrics.progress=false", itself),
             (f"comm.measure={measure}", "--measure"), (f"comm.powersgd_start_iter={start_iter}", "--start-iter"),
             (f"comm.topk_start_iter={start_iter}", "--start-iter"),
             (f"comm.localsgd_warmup={start_iter}", "--start-iter")]
    owned += [(f"train.batch_size={batch}", "--batch")] * (batch is not None)
    owned += [(f"train.seq_len={seq}", "--seq")] * (seq is not None)
    refuse_set_keys(overrides, {item.split("=", 1)[0]: option for item, option in owned}, "variant")
    return [item for item, _ in owned] + list(overrides)


def _variant_jobs(specs: list[str], preset: str, config_path: str | None, base: list[str], world: int,
                  steps: int, loss_window: int, runs_dir: Path) -> list[tuple[str, object]]:
    """(label, job config) of every variant, each checked for ``world`` processes; usage
    errors exit 2 before any process group exists."""
    from train import preflight
    from train.config import CONFIG_DIR, load_config
    from train.errors import ConfigError, DataError
    from train.models.registry import PRESETS as MODEL_PRESETS

    # Only a known preset names a file: '../x' or a name too long (is_file raised OSError) is model.name's error.
    if config_path is None and preset in MODEL_PRESETS and (CONFIG_DIR / f"{preset}.yaml").is_file():
        config_path = preset
    jobs = []
    try:
        for spec in specs:
            label, extra = variant_overrides(spec)
            job = load_config(config_path, base + extra)
            preflight.check_job(job, world)
            preflight.check_runs_here(job, runs_dir / label)
            jobs.append((label, job))
        if not jobs:
            raise ConfigError("--variants: nothing to run")
        if loss_window < 1 or steps < 2:
            raise ConfigError("--loss-window must be >= 1 and --steps >= 2")
    except (ConfigError, DataError, ValueError) as exc:
        fail(str(exc), 2)
    return jobs


def _run_variants(jobs, info, runs_dir: Path, window, loss_window: int, out_dir: Path, name: str) -> list[dict]:
    """One row per variant; rank 0 rewrites a partial report after each (what is done
    survives a time limit)."""
    from train.bench.report import write_report
    from train.config import TrainConfig

    rows: list[dict] = []
    signals = StopSignals(grace_s=TrainConfig.shutdown_grace_s)

    def partial_report(what: str) -> None:
        if info.is_main:
            _relative_to_none(rows)
            meta = {"partial": what, "command": " ".join(["train", *sys.argv[1:]])}
            write_report(out_dir, name, rows, COLUMNS + ["error"] * any("error" in r for r in rows), meta)

    for label, job in jobs:
        try:
            signals.check(info)
            rows.append(_run_variant(label, job, info, runs_dir, window, loss_window, signals))
        except Stopped as stop:
            stop.done = len(rows)
            if stop.row is not None:
                rows.append(stop.row)
            if rows:
                partial_report(f"{stop.done} of {len(jobs)} variants; stopped by {stop.name}")
            raise
        if len(rows) < len(jobs):
            partial_report(f"{len(rows)} of {len(jobs)} variants")
    return rows


def _final_report(out_dir: Path, name: str, rows: list[dict], run_meta: dict) -> None:
    """The table on stdout, and NAME.json/.md/.png with how the numbers were made."""
    from train.bench.links import nccl_environment
    from train.bench.report import environment_meta, write_report

    meta = {**environment_meta(), "command": " ".join(["train", *sys.argv[1:]]), **run_meta,
            "nccl_env": nccl_environment() or "defaults",
            "bytes": "per rank per step, handed to collectives (incl. LocalSGD averaging, amortised)",
            "exposed_comm": "backward compute end -> last gradient collective done, + averaging (train.comm.overlap)"}
    cols = COLUMNS + ["error"] * any("error" in r for r in rows)
    click.echo(write_report(out_dir, name, rows, cols, meta, chart=_chart))


def _relative_to_none(rows: list[dict]) -> None:
    base_row = next((r for r in rows if r["variant"] == "none" and r.get("step_ms")), None)
    for r in rows:
        if base_row and r.get("step_ms"):
            r["speedup"] = base_row["step_ms"] / r["step_ms"]
            r["loss_vs_none_pct"] = 100.0 * (r["loss"] / base_row["loss"] - 1)


def _run_variant(label: str, job, info, runs_dir: Path, window, loss_window: int, signals: StopSignals) -> dict:
    import torch

    from train import distributed as tdist
    from train.metrics import read_metrics
    from train.rundir import move_aside
    from train.trainer import Trainer

    vdir = runs_dir / label.replace(" ", "_").replace("=", "").replace("%", "pct")
    if info.is_main:  # an earlier bench's run of this variant is kept, never deleted
        if os.path.lexists(vdir):
            log.info("[bench] %s: the earlier run moved to %s", label,
                     move_aside(runs_dir, [vdir.name], f"--runs-dir {excerpt_path(runs_dir)}"))
        vdir.mkdir(parents=True)
    tdist.barrier(info)
    row: dict = {"variant": label}
    trainer, stopped = None, None
    try:
        log_file = open(vdir / f"train_rank{info.rank}.log", "w") if info.is_main else open(os.devnull, "w")
        with log_file, contextlib.redirect_stdout(log_file):
            trainer = Trainer(job, info, vdir)
            signals.hand_over(trainer)
            log_file.write(trainer.describe() + "\n")
            log_file.flush()
            summary = trainer.fit()
        if summary.preempted:  # every rank agreed to stop: this variant's numbers are cut short
            stopped = Stopped(trainer.preemption.signum or signals.signum)
            row["error"] = f"stopped by {stopped.name} at step {summary.final_step} of {job.train.steps}"
            stopped.row = row
        elif info.is_main:
            metrics = read_metrics(vdir / "metrics.jsonl")
            row.update(summarize(metrics, window, loss_window))
            row["loss_curve"] = [m["loss"] for m in metrics]
            log.info("[bench] %s: %.1f ms/step, exposed comm %.1f ms, %.2f MB/step, loss %.4f", label, row["step_ms"],
                     row["exposed_comm_ms"], row["MB_per_step"], row["loss"])
    except (RuntimeError, ValueError, OSError) as exc:  # e.g. out of memory: report it, go on
        row["error"] = " ".join(str(exc).split())[:200]
        log.warning("[bench] %s: failed: %s", label, row["error"])
    finally:
        del trainer
        gc.collect()
        if info.device.type == "cuda":
            torch.cuda.empty_cache()
    tdist.barrier(info)
    if stopped is not None:
        raise stopped
    return row
