"""The training loop: wires model, parallelism, precision, data, optimizer, checkpoints
and metrics together. Each of those is its own component; this file only drives them."""

from __future__ import annotations

import contextlib
import gc
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from train import console
from train import distributed as tdist
from train.checkpoint import (
    RNG,
    Checkpointer,
    CheckpointManager,
    ComponentState,
    DataPosition,
    ModelOptimizer,
    Progress,
    Schedule,
)
from train.data import ShardInfo, build_loader, to_device
from train.errors import ConfigError, NonFiniteLossError, OutOfMemory
from train.exporters import build_sinks
from train.hardware import peak_bf16_tflops
from train.loss import head_args, loss_from
from train.metrics import MetricsLogger, ProgressBar, StepTimer, allocator_stats, mfu, peak_memory_gib
from train.models.registry import flops_per_token, model_spec, param_count
from train.models.weights import count_params
from train.optim import build_optimizer, build_scheduler, clip_divisor, clip_in_step, device_gated
from train.parallel import ParallelDims, Parallelized, parallelize
from train.parallel.attention import attention_context
from train.parallel.symm_comm import nccl_env
from train.plan_apply import apply_plan
from train.precision import amp
from train.precision.fp8 import apply_float8, describe_float8
from train.preemption import Preemption
from train.trace import StepTracer, parse_window, phase

log = logging.getLogger(__name__)

# What a rank waits on during forward/backward, per strategy (named in timeout errors).
_GRAD_SYNC = {
    "ddp": "all_reduce (DDP gradient buckets, backward)",
    "fsdp": "all_gather/reduce_scatter (FSDP forward/backward)",
}
_AGREEMENT = "all_reduce (per-step loss/NaN/SIGTERM agreement)"


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
    timed_tokens: int = 0  # tokens and seconds of the steps after the first (warm-up excluded)
    timed_s: float = 0.0

    def add_step(self, loss: float, tokens: int, dt: float) -> None:
        self.losses.append(loss)
        if self.steps_run == 0:
            self.first_loss = loss
        else:  # the first step includes warm-up (allocator, kernels): not in throughput
            self.timed_tokens += tokens
            self.timed_s += dt
        self.steps_run += 1
        self.last_loss = loss


def grad_accum_steps(job, dp_world: int) -> int:
    per_step = job.train.batch_size * dp_world
    if not job.train.global_batch_size:
        return 1
    return job.train.global_batch_size // per_step


def should_resume(job, resume_flag: bool) -> bool:
    """--resume, checkpoint.resume=always, or (auto) a torchrun restart of the worker group."""
    mode = job.checkpoint.resume
    restarted = tdist.env_int("TORCHELASTIC_RESTART_COUNT", 0) > 0
    return resume_flag or mode == "always" or (mode == "auto" and restarted)


class Trainer:
    def __init__(self, job, info: tdist.DistInfo, out_dir: Path, resume: bool = False):
        self.info = info
        self.out_dir = out_dir
        self.device = info.device
        self.dims = ParallelDims.from_job(job, info.world_size)  # resolved once, passed down
        # the automatic plan (train/plan.py): the tuning keys the job leaves open, once, logged in one line
        self.job = job = apply_plan(job, info, self.dims, out_dir, should_resume(job, resume), self._log)
        self.precision = amp.resolve_precision(job.train.precision, self.device)
        self.par: Parallelized = self._build_model()
        # Anything random that should differ across ranks (dropout, sampling) draws from here.
        torch.manual_seed(job.train.seed + 1000 * info.rank)

        self.optimizer = build_optimizer(self.par.model, job.optim, self.device)
        decay = job.optim.decay_steps or job.train.steps
        self.scheduler = build_scheduler(self.optimizer, job.optim, decay)
        self.scaler = amp.grad_scaler(self.precision, self.device)
        # fused AdamW decides on the GPU whether to apply a step (found_inf): no wait before it
        self.device_gated = device_gated(self.optimizer, self.scaler, self.par)
        self.clip_in_step = clip_in_step(job.optim, self.device_gated)
        self._agree_host: torch.Tensor | None = None  # pinned copy of the step's agreement (CUDA)
        self._agree_done: torch.cuda.Event | None = None
        self.accum = grad_accum_steps(job, self.par.dp_world)
        self.loader = build_loader(
            job.data, job.train.seq_len, job.train.batch_size,
            ShardInfo(self.par.dp_rank, self.par.dp_world), job.train.seed, job.model.vocab_size,
        )
        self.progress = Progress(info.world_size)
        self.checkpointer = self._build_checkpointer()
        self._ckpt_written = False  # every rank's background checkpoint write has finished
        self.at_step: int | str = "resume"  # the step in progress (named in collective errors)
        self.preemption = Preemption(job.train.shutdown_grace_s,
                                     chosen="train.shutdown_grace_s" in getattr(job, "explicit_keys", ()))
        self.preemption.install()
        if should_resume(job, resume):
            self.checkpointer.resume()
        elif (existing := self.checkpointer.manager.latest()) is not None or self.checkpointer.manager.rejected:
            # A fresh run would interleave its checkpoints with these (and retention would
            # delete the new ones as "older", or the unverified ones): refuse instead of destroying saved work.
            held = f"checkpoints up to {existing.name}" if existing else \
                f"step directories that fail verification ({self.checkpointer.manager.unusable()})"
            raise ConfigError(
                f"--out {out_dir}: holds {held}; pass --resume to continue from them, or use a new --out"
            )
        self.flops_per_token = flops_per_token(job.model, job.train.seq_len, count_params(self.par.inner))
        self.metrics = self._build_metrics()

    # ------------------------------------------------------------------ components
    def _build_model(self) -> Parallelized:
        job = self.job
        torch.manual_seed(job.train.seed)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        spec = model_spec(job.model)  # the family's, or a user's model (model.builder)
        cfg = replace(job.model, max_seq_len=job.train.seq_len) if spec.seq_len_sized else job.model
        with torch.device("meta"):
            model = spec.build(cfg)
        model = apply_float8(model, job.fp8, self.device, self.dims, high_precision=spec.high_precision)

        def materialize(m: torch.nn.Module) -> None:
            m.to_empty(device=self.device)
            spec.init_weights(m, job.train.seed)

        return parallelize(model, job, self.info, materialize, self.dims, spec)

    def _build_checkpointer(self) -> Checkpointer:
        job, info = self.job, self.info
        manager = CheckpointManager(self.out_dir / "checkpoints", info, job.checkpoint.keep,
                                    async_save=job.checkpoint.async_save, timeout_s=job.train.timeout_s)
        per_rank = [Schedule(self.scheduler, self.scaler), DataPosition(self.loader),
                    ComponentState(self.par.extra_state), RNG(info.world_size)]
        return Checkpointer(manager, job.checkpoint, job.train.steps, ModelOptimizer(self.par.model, self.optimizer),
                            self.progress, per_rank, info)

    def _build_metrics(self) -> MetricsLogger:
        job, info = self.job, self.info
        peak = job.metrics.peak_tflops or (
            peak_bf16_tflops(torch.cuda.get_device_name(self.device)) if self.device.type == "cuda" else None
        )
        return MetricsLogger(
            self.out_dir, info.is_main, self.flops_per_token, peak, info.world_size, job.metrics.tensorboard,
            keep_up_to_step=self.step,
            sinks=build_sinks(job.metrics, self.out_dir, job.to_dict()) if info.is_main else (),
        )

    @property
    def step(self) -> int:
        """The last finished step (restored on resume, advanced by :meth:`train_step`)."""
        return self.progress.step

    @property
    def nan_skips(self) -> int:
        return self.progress.nan_skips

    def save_checkpoint(self, wait: bool = True) -> Path:
        """Checkpoint the current step now (the loop's cadence is :meth:`Checkpointer.maybe_save`)."""
        return self.checkpointer.save(self.step, wait=wait)

    # ------------------------------------------------------------------ the step
    def compute_loss(self, out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean token cross-entropy of one micro-batch (fp32), before the accumulation scaling;
        ``out`` is the logits, or the loss itself under ``train.loss=chunked`` (train/loss.py)."""
        return loss_from(out, targets, self.job.train)

    def forward_backward(self) -> torch.Tensor:
        """Forward and backward over the step's micro-batches; returns the summed (scaled) loss."""
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        for micro in range(self.accum):
            inputs, targets = self.loader.next_batch()
            inputs, targets = to_device(inputs, self.device), to_device(targets, self.device)
            sync_ctx = self.par.no_sync() if micro < self.accum - 1 else contextlib.nullcontext()
            attention = attention_context(self.job.parallel, self.device, self.par.inner)  # forward and backward (AC)
            with sync_ctx, self.par.micro_batch_context(), self.par.loss_context(), attention:
                with phase("forward"):
                    with amp.autocast(self.precision, self.device), self.par.forward_context():
                        out = self.par.model(inputs, *head_args(self.par, self.job.train, targets))
                    loss = self.compute_loss(out, targets) / self.accum
                with phase("backward"):
                    if self.scaler is not None:
                        self.scaler.scale(loss).backward()
                    else:
                        loss.backward()
            # loss_parallel: the loss is a replicated DTensor
            loss_sum += loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach()
        return loss_sum

    def _agree_start(self, loss: torch.Tensor, nonfinite: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """Queue the one small all-reduce of the step: summed loss, any rank non-finite (a device
        tensor: the gradient norm is never waited for on its own), any rank preempted, and (async
        checkpoints) whether every rank's background write has finished; then, on CUDA, the copy
        of it and of the gradient norm into pinned host memory. Read by ``_agree_read``."""
        vec = torch.stack([
            loss.float(),
            nonfinite.to(device=self.device, dtype=torch.float32),
            # torch.full is a fill kernel; torch.tensor(x, device=cuda) would copy from pageable
            # host memory, which waits for the whole backward before the optimizer is queued
            torch.full((), float(self.preemption.requested), device=self.device),
            torch.full((), float(self.checkpointer.ready()), device=self.device),
        ])
        if self.info.backend is not None:
            with tdist.collective(_AGREEMENT):
                torch.distributed.all_reduce(vec)
        vec = torch.cat([vec, grad_norm.detach().reshape(1).to(device=self.device, dtype=torch.float32)])
        if self.device.type == "cuda":
            # Queued before the optimizer step: the host then waits for this copy alone
            # (``_agree_read``), not for the step, and queues the next step's forward while the
            # GPU runs the optimizer. A read of a device tensor would wait for the whole stream.
            if self._agree_host is None:
                self._agree_host = torch.empty(vec.shape, dtype=vec.dtype, pin_memory=True)
                self._agree_done = torch.cuda.Event()
            self._agree_host.copy_(vec, non_blocking=True)
            self._agree_done.record()
        return vec

    def _agree_read(self, vec: torch.Tensor) -> tuple[float, bool, bool, float]:
        """The host's one wait per step: (mean loss, anything non-finite, stop requested, gradient norm)."""
        with tdist.collective(_AGREEMENT):
            if self.device.type == "cuda":
                self._agree_done.synchronize()
                total, bad, stop, written, norm = self._agree_host.tolist()
            else:
                total, bad, stop, written, norm = vec.tolist()
        mean_loss = total / self.info.world_size
        self._ckpt_written = written >= self.info.world_size
        return mean_loss, bad > 0 or not math.isfinite(mean_loss), stop > 0, norm

    def _device_gated_step(self, vec: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Queue the fused AdamW step before the host waits: the kernel itself skips the update
        when the agreement says non-finite (``found_inf``; torch also takes back its step count),
        so the optimizer's CPU work overlaps the GPU's backward instead of following a sync."""
        opt = self.optimizer
        opt.found_inf = ((vec[1] > 0) | ~torch.isfinite(vec[0])).float()
        if self.clip_in_step:  # the fused AdamW kernel scales the gradients (train/optim.py)
            opt.grad_scale = clip_divisor(grad_norm, self.job.optim.grad_clip)
        try:
            opt.step()
        finally:
            opt.__dict__.pop("grad_scale", None)
            opt.__dict__.pop("found_inf", None)

    def _host_step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def train_step(self) -> tuple[float, float, bool]:
        """One optimizer step over all micro-batches; advances :attr:`step`. Returns the mean
        loss over ranks, the gradient norm, and whether any rank was asked to stop."""
        with tdist.collective(_GRAD_SYNC.get(self.job.parallel.strategy, "gradient collectives (forward/backward)")):
            loss = self.forward_backward()
        with phase("optimizer"):  # unscale, clip (grad-norm all_reduce), agreement all_reduce, step
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            # On CUDA the host blocks at the first read after the collectives were queued: that
            # is where a hung gradient all_reduce is seen, so it is inside the context too.
            with tdist.collective("all_reduce (gradient buckets / gradient norm)"):
                grad_norm = self.par.grad_norm() if self.clip_in_step else self.par.clip_grads(self.job.optim.grad_clip)
                # fp16: inf gradients are expected now and then; GradScaler skips those steps itself.
                norm_bad = (~torch.isfinite(grad_norm) if self.scaler is None
                            else torch.zeros((), dtype=torch.bool, device=grad_norm.device))
                vec = self._agree_start(loss, norm_bad, grad_norm)
                # hooks after the step may read gradients (LocalSGD's averager): zero them after those
                zero_early = self.device_gated and not self.par.after_optimizer_step
                if self.device_gated:
                    self._device_gated_step(vec, grad_norm)
                    if zero_early:
                        self.optimizer.zero_grad(set_to_none=True)
                mean_loss, nonfinite, stop, norm = self._agree_read(vec)
            if nonfinite:
                self._handle_nonfinite(mean_loss, norm)  # device-gated: the update was skipped
            else:
                if not self.device_gated:
                    self._host_step()
                self.scheduler.step()
                for hook in self.par.after_optimizer_step:
                    hook()
            if not zero_early:
                self.optimizer.zero_grad(set_to_none=True)
        self.progress.step += 1
        return mean_loss, norm, stop

    def _handle_nonfinite(self, loss: float, grad_norm: float) -> None:
        step = self.step + 1
        what = f"non-finite loss/gradient at step {step} (loss={loss}, grad_norm={grad_norm})"
        if self.job.train.nan_policy == "skip" and self.nan_skips < self.job.train.max_nan_skips:
            self.progress.nan_skips += 1
            self._log(f"{what}: update skipped ({self.nan_skips}/{self.job.train.max_nan_skips})")
            return
        latest = self.checkpointer.manager.latest_local()
        where = f"; last good checkpoint: {latest}" if latest else "; no checkpoint was written"
        raise NonFiniteLossError(f"{what}; stopping{where}")

    # ------------------------------------------------------------------ the loop
    def fit(self) -> Summary:
        job, summary = self.job, Summary(start_step=self.step)
        tokens_per_step = job.train.batch_size * job.train.seq_len * self.accum * self.par.dp_world
        # step_metrics read what the finished step did: those runs wait for it; else the host
        # queues the next step while the GPU still runs the optimizer (the step's one wait is
        # the agreement read), and a step's time runs from the loop's top to that read
        timer = StepTimer(self.device, sync=bool(self.par.step_metrics))
        progress = ProgressBar(self.info.is_main and job.metrics.progress, job.train.steps, self.step)
        tracer = StepTracer(parse_window(job.metrics.trace_steps), self.out_dir, self.info.rank, self.device)
        try:
            while self.step < job.train.steps:
                self.at_step = self.step + 1
                tracer.begin(self.step + 1)
                timer.start()
                loss, grad_norm, stop = self.train_step()
                dt = timer.stop()
                step_stats: dict = allocator_stats(self.device)  # reserved_gib, alloc_retries (CUDA)
                for collect in self.par.step_metrics:  # e.g. comm_bytes, exposed_comm_ms (comm.measure)
                    step_stats.update(collect())
                summary.add_step(loss, tokens_per_step, dt)
                progress.update(self.step, loss)
                if self.step % job.train.log_every == 0 or self.step == job.train.steps or stop:
                    self._log_step(loss, grad_norm, tokens_per_step, dt, step_stats)
                summary.checkpoint = self.checkpointer.maybe_save(self.step, written=self._ckpt_written,
                                                                  preempted=stop)
                if stop:
                    summary.preempted = True
                    self.preemption.checkpointed = True
                    self._log(f"preempted: checkpoint written at step {self.step}; exiting")
                    break
                tracer.end(self.step)
            else:
                summary.checkpoint = self.checkpointer.maybe_save(self.step, final=True)
        finally:
            tracer.close()
            progress.close()
            self.metrics.close()
        return self._finish(summary)

    def _log_step(self, loss: float, grad_norm: float, tokens: int, dt: float, step_stats: dict) -> None:
        row = self.metrics.record(self.step, loss, tokens, dt, self.scheduler.get_last_lr()[0], grad_norm,
                                  peak_memory_gib(self.device), **step_stats)
        self._log(
            f"step {self.step:>6}/{self.job.train.steps} loss {loss:.4f} grad_norm {grad_norm:.3f} "
            f"tok/s {row['tokens_per_s']:,.0f} step {dt * 1000:.0f} ms"
            + (f" mfu {row['mfu'] * 100:.1f}%" if row["mfu"] is not None else "")
        )

    def _finish(self, summary: Summary) -> Summary:
        summary.final_step = self.step
        summary.tokens_per_s = summary.timed_tokens / summary.timed_s if summary.timed_s else 0.0
        summary.peak_mem_gib = peak_memory_gib(self.device)
        if summary.tokens_per_s:
            summary.mfu = mfu(summary.tokens_per_s / self.info.world_size, self.flops_per_token,
                              self.metrics.peak_tflops)
        return summary

    def release(self) -> None:
        """Drop the wrapped model (DDP's C++ reducer holds a reference to the process
        group) before the group is destroyed. Otherwise the reducer can end up freeing
        the group itself, with the GIL held, while a gloo worker thread needs the GIL to
        finish its last work: a deadlock at exit (seen here in 3 of 12 kill-and-restart runs on CPU)."""
        if getattr(self, "checkpointer", None) is not None:
            self.checkpointer.manager.abandon()
        self.par = None
        self.optimizer = None
        self.scheduler = None
        self.checkpointer = None

    def describe(self) -> str:
        n = count_params(self.par.inner)
        return (
            f"model {self.job.model.builder or self.job.model.name}: {n / 1e6:.2f}M params | {self.info.world_size} rank(s), "
            f"backend {self.info.backend or 'none'}, device {self.device.type} | precision {self.precision} | "
            f"strategy {self.job.parallel.strategy} | batch {self.job.train.batch_size}x{self.job.train.seq_len}"
            f" x accum {self.accum} x dp {self.par.dp_world}{describe_float8(self.par.inner, self.job.fp8)}"
        )

    def _log(self, msg: str) -> None:
        if self.info.is_main:
            log.info("%s", msg)


def _out_of_memory(exc: BaseException, job, info: tdist.DistInfo, at) -> OutOfMemory | None:
    text = str(exc).strip()
    cuda_oom = isinstance(exc, getattr(torch, "OutOfMemoryError", ()))
    if not (cuda_oom or "can't allocate memory" in text or "CUDA out of memory" in text):
        return None
    first = text.splitlines()[0] if text else type(exc).__name__
    first = first.split("] ", 1)[-1] if first.startswith("[enforce fail") else first
    first = first.replace("err == 0. ", "")[:300]
    m = job.model
    n = param_count(m)
    params = f"{n / 1e9:.2f}B parameters" if n is not None else f"the model of model.builder={m.builder}"
    where = {"startup": "while building the model", "resume": "while loading the checkpoint"}.get(at, f"at step {at}")
    return OutOfMemory(
        f"out of memory on rank {info.rank} ({info.device}) {where}: {first}; model.name={m.name} has "
        f"{params} (model.dim={m.dim}, model.n_layers={m.n_layers}, model.vocab_size={m.vocab_size}), "
        f"train.batch_size={job.train.batch_size}, train.seq_len={job.train.seq_len}: use a smaller model or "
        "batch, or shard it (parallel.strategy=fsdp)"
    )


# The run's progress (model, steps, checkpoints, resume) is what ``train run`` produces: it goes
# to stdout, as it always did (console.setup(stdout=...)); diagnostics (warnings, errors) go to stderr.
PROGRESS_LOGGERS = (__name__, "train.checkpoint.checkpointer")


def run(job, out_dir: Path, resume: bool = False, on_start=None) -> Summary:
    """Initialise the process group, train, tear down. Used by ``train run``.

    ``on_start(job)`` runs once the model is built and any checkpoint loaded, before the
    first step, with the job as planned (``train run`` records it and the start/resume in config.yaml)."""
    console.setup(stdout=PROGRESS_LOGGERS)  # progress lines on stdout, once per process
    info = tdist.init_distributed(job.train.device, job.train.timeout_s, out_dir / "flight_recorder",
                                  nccl_env=nccl_env(job))
    trainer = None
    with tdist.group_teardown():  # an error path neither waits at a barrier nor destroys the group
        try:
            trainer = Trainer(job, info, out_dir, resume=resume)
            if on_start is not None:
                on_start(trainer.job)  # the job as planned: what config.yaml records
            trainer._log(trainer.describe())
            return trainer.fit()
        except Exception as exc:
            # A timed-out collective or a dead peer: one line naming the op, rank and step.
            at = trainer.at_step if trainer else "startup"
            failure = tdist.collective_failure(exc, info, job.train.timeout_s, at)
            if failure is not None:
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
