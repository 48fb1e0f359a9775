"""The training loop: wires model, parallelism, precision, data, optimizer, checkpoints
and metrics together. Each of those is its own component; this file only drives them."""

from __future__ import annotations

import contextlib
import gc
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from train import distributed as tdist
from train.checkpoint import CheckpointManager, rng_state, set_rng_state
from train.data import ShardInfo, build_loader
from train.errors import ConfigError, NonFiniteLossError, OutOfMemory
from train.exporters import build_sinks
from train.hardware import peak_bf16_tflops
from train.metrics import MetricsLogger, StepTimer, peak_memory_gib
from train.models.llama import Transformer, count_params, flops_per_token
from train.optim import build_optimizer, build_scheduler
from train.parallel import Parallelized, parallelize
from train.precision import amp
from train.precision.fp8 import apply_float8
from train.trace import StepTracer, parse_window, phase

# What a rank waits on during forward/backward, per strategy (named in timeout errors).
_GRAD_SYNC = {
    "ddp": "all_reduce (DDP gradient buckets, backward)",
    "fsdp": "all_gather/reduce_scatter (FSDP forward/backward)",
}


@dataclass
class Summary:
    first_loss: float = float("nan")
    last_loss: float = float("nan")
    steps_run: int = 0
    start_step: int = 0
    final_step: int = 0
    tokens_per_s: float = 0.0
    mfu: float | None = None
    peak_mem_gib: float = 0.0
    checkpoint: str | None = None
    preempted: bool = False
    losses: list[float] = field(default_factory=list)


def grad_accum_steps(job, dp_world: int) -> int:
    per_step = job.train.batch_size * dp_world
    if not job.train.global_batch_size:
        return 1
    return job.train.global_batch_size // per_step


def _clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """Global gradient norm (DTensor-aware); clips when ``max_norm`` > 0."""
    from train.parallel.fsdp import clip_host_sharded_grads_, host_sharded_grads

    params = list(params)
    if host_sharded_grads(params):  # FSDP CPU offload: NCCL cannot reduce the host-resident grads
        return clip_host_sharded_grads_(params, max_norm)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm


def should_resume(job, resume_flag: bool) -> bool:
    """--resume, checkpoint.resume=always, or (auto) a torchrun restart of the worker group."""
    mode = job.checkpoint.resume
    restarted = tdist.env_int("TORCHELASTIC_RESTART_COUNT", 0) > 0
    return resume_flag or mode == "always" or (mode == "auto" and restarted)


class Trainer:
    def __init__(self, job, info: tdist.DistInfo, out_dir: Path, resume: bool = False):
        self.job = job
        self.info = info
        self.out_dir = out_dir
        self.device = info.device
        self.precision = amp.resolve_precision(job.train.precision, self.device)
        torch.manual_seed(job.train.seed)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        with torch.device("meta"):
            model = Transformer(job.model)
        model = apply_float8(model, job.fp8, self.device, job.parallel)

        def materialize(m: torch.nn.Module) -> None:
            m.to_empty(device=self.device)
            m.init_weights(job.train.seed)

        self.par: Parallelized = parallelize(model, job, info, materialize)
        # Anything random that should differ across ranks (dropout, sampling) draws from here.
        torch.manual_seed(job.train.seed + 1000 * info.rank)

        self.optimizer = build_optimizer(self.par.model, job.optim, self.device)
        decay = job.optim.decay_steps or job.train.steps
        self.scheduler = build_scheduler(self.optimizer, job.optim, decay)
        self.scaler = amp.grad_scaler(self.precision, self.device)
        self.accum = grad_accum_steps(job, self.par.dp_world)
        self.loader = build_loader(
            job.data, job.train.seq_len, job.train.batch_size,
            ShardInfo(self.par.dp_rank, self.par.dp_world), job.train.seed, job.model.vocab_size,
        )
        self.ckpt = CheckpointManager(out_dir / "checkpoints", info, job.checkpoint.keep,
                                      async_save=job.checkpoint.async_save, timeout_s=job.train.timeout_s)
        self._ckpt_written = False  # every rank's background checkpoint write has finished
        self.step = 0
        self.at_step: int | str = "resume"  # the step in progress (named in collective errors)
        self.nan_skips = 0
        self.preemption = tdist.Preemption(job.train.shutdown_grace_s)
        self.preemption.install()
        if self._should_resume(resume):
            self._resume()
        elif (existing := self.ckpt.latest()) is not None:
            # A fresh run would interleave its checkpoints with these (and retention would
            # delete the new ones as "older"): refuse instead of destroying saved work.
            raise ConfigError(
                f"--out {out_dir}: holds checkpoints up to {existing.name}; pass --resume to continue "
                "from them, or use a new --out"
            )

        self.flops_per_token = flops_per_token(job.model, job.train.seq_len)
        peak = job.metrics.peak_tflops or (
            peak_bf16_tflops(torch.cuda.get_device_name(self.device)) if self.device.type == "cuda" else None
        )
        self.metrics = MetricsLogger(
            out_dir, info.is_main, self.flops_per_token, peak, info.world_size, job.metrics.tensorboard,
            keep_up_to_step=self.step,
            sinks=build_sinks(job.metrics, out_dir, job.to_dict()) if info.is_main else (),
        )

    # ------------------------------------------------------------------ resume
    def _should_resume(self, resume_flag: bool) -> bool:
        return should_resume(self.job, resume_flag)

    def _resume(self) -> None:
        loaded = self.ckpt.load_latest(self.par.model, self.optimizer)
        if loaded is None:
            self._log("no complete checkpoint found; starting from step 0")
            return
        latest, extra = loaded
        self.step = int(extra["step"])
        self.scheduler.load_state_dict(extra["scheduler"])
        if self.scaler is not None and extra.get("scaler"):
            self.scaler.load_state_dict(extra["scaler"])
        self.loader.load_state_dict(extra["data"])
        self.nan_skips = int(extra.get("nan_skips", 0))
        for name, obj in self.par.extra_state.items():
            if name in extra.get("parallel", {}):
                obj.load_state_dict(extra["parallel"][name])
        if extra.get("world_size") == self.info.world_size:
            set_rng_state(extra["rng"])
        self._log(f"resumed from {latest} at step {self.step}")

    def _params_finite(self) -> bool:
        """All parameters finite on every rank (checked before each checkpoint)."""
        ok = torch.ones((), dtype=torch.bool, device=self.device)
        for p in self.par.model.parameters():
            t = p.detach()
            ok &= torch.isfinite(t.to_local() if hasattr(t, "to_local") else t).all()
        with tdist.collective("all_reduce (parameter finiteness check)"):
            return tdist.all_true(self.info, bool(ok.item()))

    def save_checkpoint(self, wait: bool = True) -> Path:
        """Checkpoint the current step. ``wait=False`` with checkpoint.async_save returns once
        the state is staged; :meth:`_commit_written_checkpoint` commits it later. The logged
        stall is all the time the loop spends here (incl. waiting for a previous write)."""
        t0 = time.perf_counter()
        if not self._params_finite():
            latest = self.ckpt.latest_local()
            where = f"last good checkpoint: {latest}" if latest else "no checkpoint was written"
            raise NonFiniteLossError(
                f"parameters are NaN/Inf after step {self.step}; checkpoint not written ({where})"
            )
        extra = {
            "step": self.step,
            "world_size": self.info.world_size,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "data": self.loader.state_dict(),
            "rng": rng_state(),
            "nan_skips": self.nan_skips,
            "parallel": {name: obj.state_dict() for name, obj in self.par.extra_state.items()},
        }
        self._commit_written_checkpoint()  # at most one save in flight: finish the previous one first
        with phase("checkpoint"):
            path = self.ckpt.save(self.step, self.par.model, self.optimizer, extra, wait=wait)
        mode = "async" if self.job.checkpoint.async_save else "sync"
        waited = " and waiting for the write" if mode == "async" and wait else ""
        self._log(f"checkpoint {path.name}: stall {(time.perf_counter() - t0) * 1000:.1f} ms ({mode}{waited})")
        if self.ckpt.in_flight is None:
            self._log(f"checkpoint saved: {path}")
        return path

    def _commit_written_checkpoint(self) -> str | None:
        """Commit the async save whose write every rank has finished (agreed in _agree)."""
        t0 = time.perf_counter()
        path = self.ckpt.finish()
        if path is None:
            return None
        self._log(f"checkpoint saved: {path} (async: background write {self.ckpt.last_write_s:.2f} s, "
                  f"commit {(time.perf_counter() - t0) * 1000:.1f} ms)")
        return str(path)

    # ------------------------------------------------------------------ the step
    def _forward_backward(self) -> torch.Tensor:
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        for micro in range(self.accum):
            inputs, targets = self.loader.next_batch()
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            sync_ctx = self.par.no_sync() if micro < self.accum - 1 else contextlib.nullcontext()
            with sync_ctx, self.par.loss_context():
                with phase("forward"):
                    with amp.autocast(self.precision, self.device), self.par.forward_context():
                        logits = self.par.model(inputs)
                    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1)) / self.accum
                with phase("backward"):
                    if self.scaler is not None:
                        self.scaler.scale(loss).backward()
                    else:
                        loss.backward()
            # loss_parallel: the loss is a replicated DTensor
            loss_sum += loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach()
        return loss_sum

    def _agree(self, loss: torch.Tensor, nonfinite: bool) -> tuple[float, bool, bool]:
        """One small all-reduce per step: mean loss, any rank non-finite, any rank preempted,
        and (async checkpoints) whether every rank's background write has finished."""
        vec = torch.stack([
            loss.float(),
            torch.tensor(float(nonfinite), device=self.device),
            torch.tensor(float(self.preemption.requested), device=self.device),
            torch.tensor(float(self.ckpt.ready()), device=self.device),
        ])
        if self.info.backend is not None:
            with tdist.collective("all_reduce (per-step loss/NaN/SIGTERM agreement)"):
                dist.all_reduce(vec)
                vec[0] /= self.info.world_size
                mean_loss, bad, stop, written = vec.tolist()
        else:
            mean_loss, bad, stop, written = vec.tolist()
        self._ckpt_written = written >= self.info.world_size
        return mean_loss, bad > 0 or not math.isfinite(mean_loss), stop > 0

    def train_step(self) -> tuple[float, float, bool]:
        with tdist.collective(_GRAD_SYNC.get(self.job.parallel.strategy, "gradient collectives (forward/backward)")):
            loss = self._forward_backward()
        with phase("optimizer"):  # unscale, clip (grad-norm all_reduce), agreement all_reduce, step
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            # On CUDA the host blocks at the first .item() after the collectives were queued:
            # that is where a hung gradient all_reduce is seen, so it is inside the context too.
            with tdist.collective("all_reduce (gradient buckets / gradient norm)"):
                grad_norm = _clip_grad_norm(self.par.model.parameters(), self.job.optim.grad_clip)
                # fp16: inf gradients are expected now and then; GradScaler skips those steps itself.
                norm_bad = self.scaler is None and not torch.isfinite(grad_norm).item()
            mean_loss, nonfinite, stop = self._agree(loss, norm_bad)
            if nonfinite:
                self._handle_nonfinite(mean_loss, float(grad_norm))
            else:
                if self.scaler is not None:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
                self.scheduler.step()
                for hook in self.par.after_optimizer_step:
                    hook()
            self.optimizer.zero_grad(set_to_none=True)
        return mean_loss, float(grad_norm), stop

    def _handle_nonfinite(self, loss: float, grad_norm: float) -> None:
        step = self.step + 1
        what = f"non-finite loss/gradient at step {step} (loss={loss}, grad_norm={grad_norm})"
        if self.job.train.nan_policy == "skip" and self.nan_skips < self.job.train.max_nan_skips:
            self.nan_skips += 1
            self._log(f"{what}: update skipped ({self.nan_skips}/{self.job.train.max_nan_skips})")
            return
        latest = self.ckpt.latest_local()
        where = f"; last good checkpoint: {latest}" if latest else "; no checkpoint was written"
        raise NonFiniteLossError(f"{what}; stopping{where}")

    # ------------------------------------------------------------------ the loop
    def fit(self) -> Summary:
        job, summary = self.job, Summary(start_step=self.step)
        total = job.train.steps
        tokens_per_step = job.train.batch_size * job.train.seq_len * self.accum * self.par.dp_world
        timer = StepTimer(self.device)
        progress = _Progress(self.info.is_main and job.metrics.progress, total, self.step)
        tracer = StepTracer(parse_window(job.metrics.trace_steps), self.out_dir, self.info.rank, self.device)
        timed_tokens, timed_s = 0, 0.0
        try:
            while self.step < total:
                self.at_step = self.step + 1
                tracer.begin(self.step + 1)
                timer.start()
                loss, grad_norm, stop = self.train_step()
                dt = timer.stop()
                step_stats: dict = {}
                for collect in self.par.step_metrics:  # e.g. comm_bytes, exposed_comm_ms (comm.measure)
                    step_stats.update(collect())
                self.step += 1
                if self._ckpt_written:
                    summary.checkpoint = self._commit_written_checkpoint() or summary.checkpoint
                summary.losses.append(loss)
                if summary.steps_run == 0:
                    summary.first_loss = loss
                else:  # the first step includes warm-up (allocator, kernels): not in throughput
                    timed_tokens += tokens_per_step
                    timed_s += dt
                summary.steps_run += 1
                summary.last_loss = loss
                progress.update(self.step, loss)
                if self.step % job.train.log_every == 0 or self.step == total or stop:
                    row = self.metrics.record(
                        self.step, loss, tokens_per_step, dt, self.scheduler.get_last_lr()[0], grad_norm,
                        peak_memory_gib(self.device), **step_stats,
                    )
                    self._log(
                        f"step {self.step:>6}/{total} loss {loss:.4f} grad_norm {grad_norm:.3f} "
                        f"tok/s {row['tokens_per_s']:,.0f} step {dt * 1000:.0f} ms"
                        + (f" mfu {row['mfu'] * 100:.1f}%" if row["mfu"] is not None else "")
                    )
                every = job.checkpoint.every
                if stop:
                    summary.preempted = True
                    summary.checkpoint = str(self.save_checkpoint())
                    self.preemption.checkpointed = True
                    self._log(f"preempted: checkpoint written at step {self.step}; exiting")
                    break
                if every and self.step % every == 0 and self.step < total:
                    path = self.save_checkpoint(wait=False)
                    if self.ckpt.in_flight is None:
                        summary.checkpoint = str(path)
                tracer.end(self.step)
            else:
                summary.checkpoint = self._commit_written_checkpoint() or summary.checkpoint  # waits
                if job.checkpoint.final and (summary.steps_run or summary.checkpoint is None):
                    latest = self.ckpt.latest()
                    if latest is None or latest.name != f"step_{self.step:08d}":
                        summary.checkpoint = str(self.save_checkpoint())
                    else:
                        summary.checkpoint = str(latest)
        finally:
            tracer.close()
            progress.close()
            self.metrics.close()
        summary.final_step = self.step
        summary.tokens_per_s = timed_tokens / timed_s if timed_s else 0.0
        summary.peak_mem_gib = peak_memory_gib(self.device)
        if self.metrics.peak_tflops and summary.tokens_per_s:
            per_gpu = summary.tokens_per_s / self.info.world_size
            summary.mfu = per_gpu * self.flops_per_token / (self.metrics.peak_tflops * 1e12)
        return summary

    def release(self) -> None:
        """Drop the wrapped model (DDP's C++ reducer holds a reference to the process
        group) before the group is destroyed. Otherwise the reducer can end up freeing
        the group itself, with the GIL held, while a gloo worker thread needs the GIL to
        finish its last work: a deadlock at exit (seen here in 3 of 12 kill-and-restart runs on CPU)."""
        if getattr(self, "ckpt", None) is not None:
            self.ckpt.abandon()
        self.par = None
        self.optimizer = None
        self.scheduler = None

    def describe(self) -> str:
        n = count_params(self.par.inner)
        return (
            f"model {self.job.model.name}: {n / 1e6:.2f}M params | {self.info.world_size} rank(s), "
            f"backend {self.info.backend or 'none'}, device {self.device.type} | precision {self.precision} | "
            f"strategy {self.job.parallel.strategy} | batch {self.job.train.batch_size}x{self.job.train.seq_len}"
            f" x accum {self.accum} x dp {self.par.dp_world}"
        )

    def _log(self, msg: str) -> None:
        if self.info.is_main:
            print(f"[train] {msg}", flush=True)


class _Progress:
    """A rich progress bar on rank 0 when stdout is a terminal; silent otherwise."""

    def __init__(self, enabled: bool, total: int, start: int):
        self.bar = None
        if enabled and sys.stdout.isatty():
            try:
                from rich.progress import (
                    BarColumn,
                    Progress,
                    TextColumn,
                    TimeRemainingColumn,
                )
            except ImportError:
                return
            self.bar = Progress(TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(), transient=True)
            self.task = self.bar.add_task("train", total=total, completed=start, loss="-")
            self.bar.start()

    def update(self, step: int, loss: float) -> None:
        if self.bar:
            self.bar.update(self.task, completed=step, loss=f"{loss:.4f}")

    def close(self) -> None:
        if self.bar:
            self.bar.stop()



def _out_of_memory(exc: BaseException, job, info: tdist.DistInfo, at) -> OutOfMemory | None:
    text = str(exc).strip()
    cuda_oom = isinstance(exc, getattr(torch, "OutOfMemoryError", ()))
    if not (cuda_oom or "can't allocate memory" in text or "CUDA out of memory" in text):
        return None
    first = text.splitlines()[0] if text else type(exc).__name__
    first = first.split("] ", 1)[-1] if first.startswith("[enforce fail") else first
    first = first.replace("err == 0. ", "")[:300]
    m = job.model
    try:
        with torch.device("meta"):
            params = f"{count_params(Transformer(m)) / 1e9:.2f}B parameters"
    except Exception:  # noqa: BLE001 - only for the message
        params = "parameters"
    where = {"startup": "while building the model", "resume": "while loading the checkpoint"}.get(at, f"at step {at}")
    return OutOfMemory(
        f"out of memory on rank {info.rank} ({info.device}) {where}: {first}; model.name={m.name} has "
        f"{params} (model.dim={m.dim}, model.n_layers={m.n_layers}, model.vocab_size={m.vocab_size}), "
        f"train.batch_size={job.train.batch_size}, train.seq_len={job.train.seq_len}: use a smaller model or "
        "batch, or shard it (parallel.strategy=fsdp)"
    )


def run(job, out_dir: Path, resume: bool = False, on_start=None) -> Summary:
    """Initialise the process group, train, tear down. Used by ``train run``.

    ``on_start()`` runs once the model is built and any checkpoint loaded, before the
    first step (``train run`` records the start/resume in config.yaml there)."""
    info = tdist.init_distributed(job.train.device, job.train.timeout_s, out_dir / "flight_recorder")
    trainer, tear_down = None, True
    try:
        trainer = Trainer(job, info, out_dir, resume=resume)
        if on_start is not None:
            on_start()
        trainer._log(trainer.describe())
        return trainer.fit()
    except Exception as exc:
        # A timed-out collective or a dead peer: one line naming the op, rank and step.
        at = trainer.at_step if trainer else "startup"
        failure = tdist.collective_failure(exc, info, job.train.timeout_s, at)
        if failure is not None:
            tear_down = False  # the group is broken: destroying it could block; exiting frees it
            raise failure from None
        oom = _out_of_memory(exc, job, info, at)
        if oom is not None:
            raise oom from None
        raise
    finally:
        if trainer is not None:
            trainer.release()
        trainer = None
        gc.collect()
        if tear_down:
            tdist.shutdown()
