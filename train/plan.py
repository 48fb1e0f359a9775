"""The automatic plan: the tuning keys a job leaves unset, chosen once at start-up.

:func:`plan` is a pure function of :class:`PlanInputs` (what the run knows: device kind, the
card's memory, world size and mesh, model, batch, precision, and which keys the job set
itself) and returns the values of the keys in :data:`PLAN_KEYS` that it decides, with one
line saying what and why. A key the job sets (in its YAML file, a preset, or ``--set``) is
never changed; on CPU nothing is decided (today's CPU behaviour). ``train.plan_apply``
gathers the inputs on the ranks, applies the values and pins a resumed run to the plan its
``config.yaml`` recorded; ``train doctor`` prints the plan for a machine.

The rules (each one measured: docs/plan.md):

* ``parallel.compile``: on (Inductor, per block) on CUDA GPUs of capability >= 7.0; off with
  Transformer Engine layers (``fp8.backend=te``).
* ``train.loss`` / ``train.loss_chunk_tokens``: the chunked loss (output projection and loss
  fused over chunks, no full logits) where compile is on and the vocabulary is not sharded
  (``parallel.tp == 1``); the chunk is the largest power of two <= 8192 tokens (4096 on one
  GPU) whose fp32 logits fit in 1 GiB (1b, 32k vocabulary: 8192, on one GPU 4096; 8b, 128k
  vocabulary: 2048).
* ``parallel.ac_skip_last`` (activation checkpointing on): every block is left out of AC where
  all their saved activations fit the card (the allocator's reserved memory, by the memory
  model ``train.memory``, stays :data:`HEADROOM_BYTES` below the card's memory): nothing is
  recomputed. Otherwise the last k blocks are left out where their saved activations fit under
  the step's end-of-backward peak (FP8 blocks save :data:`FP8_ACTIVATION_FRACTION` of bf16's),
  so the peak stays that of AC on every block. With ``fp8.backend=te`` every block must be left
  out (torch's AC recomputes outside ``te.autocast``): where they do not fit, the run stops
  with :attr:`PlanResult.problem`.
* FSDP2 without AC (or with every block left out of it) on several GPUs: the reduce-scatter on
  the copy engines too (``fsdp_symm_mem=all``, where ``auto`` would take the copy-engine
  all-gather; the bf16 gradients travel as they are and are summed in fp32), and the activation
  budget 0.999 on the first 3/8 of the blocks.
* ``fp8.fsdp_float8_all_gather``: off with FSDP2 within one node (bf16 all-gather, cast inside
  the blocks); across nodes float8's half of the bytes stays.
* ``parallel.recompute_param_casts``: on for a compiled run on one GPU (the blocks cast the fp32
  weights themselves there: recasting them in backward instead of saving the bf16 copies is 2
  bytes per parameter less memory for about 0.5% of the step).
* ``parallel.cpu_offload``: on (FSDP2's ``CPUOffloadPolicy``, ``parallel.tp`` = 1) where the step
  does not fit the card by the memory model's peak even with AC on every block (with AC off where
  the job has it off) while the node's memory holds every local rank's parameters, gradients and
  optimizer state (at most :data:`OFFLOAD_HOST_FRACTION` of it): 8b on one 80 GB card; FP8
  weights are then all-gathered in bf16. The rest of the plan sees only what stays on the GPU.
  Where the state alone fits neither, the run stops before building the model
  (:attr:`PlanResult.problem`).
* ``checkpoint.async_save``: on where the node's host memory holds every local rank's staged
  state twice over (with CPU offload: twice over beside the offloaded state).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from train.memory import GiB, block_activation_bytes, estimate
from train.memory import Plan as Layout
from train.models.presets import ModelConfig
from train.models.registry import param_count
from train.parallel.config import offload_unavailable

# The keys the plan decides when the job leaves them unset.
PLAN_KEYS = (
    "parallel.compile",
    "train.loss",
    "train.loss_chunk_tokens",
    "parallel.ac_skip_last",
    "parallel.fsdp_symm_mem",
    "parallel.activation_memory_budget",
    "parallel.activation_memory_budget_skip_last",
    "fp8.fsdp_float8_all_gather",
    "checkpoint.async_save",
    "parallel.recompute_param_casts",
    "parallel.cpu_offload",
)

# The allocator's reserved memory must stay this far below the card's total. 2xH100 80GB
# (79.19 GiB), 8b FSDP2 4x2048: 76.10 GiB reserved ran without a cudaMalloc retry, 76.79 GiB
# with 12 retries and 5% fewer tokens/s (measured 2026-11-27). The rest holds the
# CUDA context, NCCL's buffers and the allocator's slack.
HEADROOM_BYTES = 3 * GiB
# This process's own share of a card before the model exists (CUDA context, NCCL communicator
# buffers: about 0.5 + 1 GiB on an H100), part of the headroom above.
OWN_BYTES = 2 * GiB
# Reserved memory with AC on every block over the memory model's end-of-backward estimate
# (the step phase): 72.69 / 59.83 GiB bf16, 73.45 / 59.83 FP8 tensorwise (same run).
RESERVED_OVER_STEP = {"bf16": 1.215, "fp8": 1.228}
# Each block left out of AC adds to the reserved memory this fraction of what the model says it
# saves (bf16 torch 2.11: 1.22 GiB a block at 8b 4x2048): +3.41 GiB for 4 blocks bf16, +2.46 GiB
# for 3 blocks FP8 (same run): 0.70 and 0.67.
RESERVED_PER_BLOCK = 0.70
# FP8 (torchao, float8 linear inputs) blocks save this fraction of a bf16 block's activations:
# 8b on 2xH200, the peak stayed at AC-full's with 8 blocks left out in bf16 and 11 in FP8, and
# rose with 9 / 12 (measured 2026-11-26).
FP8_ACTIVATION_FRACTION = 0.73
# The chunked loss's fp32 logits per chunk stay under this, and a chunk is at most
# MAX_LOSS_CHUNK tokens. On one GPU (no sharded state: the loss runs near the step's peak) at
# most MAX_LOSS_CHUNK_ONE_GPU: 1b 4x2048 on one H200, 4096 against 8192 tokens: 72,763 against
# 72,193 tok/s, peak 22.69 against 22.92 GiB (torchtitan 22.89; 2026-11-29,
# docs/results/h200-defaults/loss-chunk).
LOSS_CHUNK_BYTES = GiB
MAX_LOSS_CHUNK = 8192
MAX_LOSS_CHUNK_ONE_GPU = 4096
# 1b FSDP2 without AC: the activation budget 0.999 on the first 6 of 16 blocks kept the peak
# under torchtitan's for 0.3% of the step (2xH100, seven runs in three calls, 2026-11-26).
BUDGET = 0.999
BUDGET_BLOCK_FRACTION = 6 / 16
# Async checkpoints stage the state in pinned host memory: only where the node's ranks' states
# take at most this fraction of its memory.
ASYNC_HOST_FRACTION = 0.5
# CPU offload pins every local rank's fp32 parameters, gradients and AdamW moments in host
# memory: only where they take at most this fraction of it (the rest: the processes, the data
# loader, the page cache).
OFFLOAD_HOST_FRACTION = 0.75


@dataclass(frozen=True)
class PlanInputs:
    """What the plan is a function of. Memory in bytes, per card (the least over the ranks)."""

    device: str  # cpu | cuda
    model: ModelConfig
    batch: int
    seq: int
    world: int = 1
    strategy: str = "ddp"  # ddp | fsdp
    dp_shard: int = 1  # FSDP2 shard degree (resolved mesh)
    tp: int = 1
    ac: str = "none"
    compile: bool = False  # the job's parallel.compile (where it sets it)
    precision: str = "bf16"
    fp8: str = "none"  # none | the torchao / TE recipe
    fp8_backend: str = "none"  # none | torchao | te
    total_bytes: int = 0
    free_bytes: int = 0
    capability: tuple[int, int] = (0, 0)
    host_bytes: int = 0  # this node's memory
    local_world: int = 1  # ranks on this node
    symm_auto: str = "none"  # what parallel.fsdp_symm_mem=auto resolves to here
    norm_fp32: bool = False  # autocast runs rms_norm in fp32 (train.compat)
    cpu_offload: bool = False  # the job's parallel.cpu_offload
    fsdp_symm_mem: str = "auto"  # the job's parallel.fsdp_symm_mem
    explicit: frozenset[str] = frozenset()  # keys the job set itself: never changed


def job_inputs(job, dims) -> dict[str, Any]:
    """The :class:`PlanInputs` fields that come from the job and its resolved mesh (``dims``: a
    :class:`~train.parallel.dims.ParallelDims`); the machine's are the caller's."""
    pcfg = job.parallel
    return dict(
        model=job.model, batch=job.train.batch_size, seq=job.train.seq_len, strategy=pcfg.strategy,
        dp_shard=dims.dp_shard, tp=dims.tp, ac=pcfg.ac, compile=pcfg.compile,
        fp8=job.fp8.resolved_recipe if job.fp8.backend != "none" else "none", fp8_backend=job.fp8.backend,
        cpu_offload=pcfg.cpu_offload, fsdp_symm_mem=pcfg.fsdp_symm_mem,
        explicit=frozenset(getattr(job, "explicit_keys", frozenset())),
    )


@dataclass
class PlanResult:
    values: dict[str, Any] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    budget_bytes: int = 0
    problem: str = ""  # set where the job cannot run as asked on this machine (the run stops)

    def line(self, inputs: PlanInputs) -> str:
        """The one line a run logs at start."""
        if inputs.device != "cuda":
            return f"plan: {inputs.device}: nothing to decide (the config's values)"
        head = (f"plan: {inputs.world} x {inputs.total_bytes / GiB:.1f} GiB, {inputs.model.name} {inputs.strategy} "
                f"{inputs.batch}x{inputs.seq} {inputs.fp8 if inputs.fp8 != 'none' else inputs.precision}")
        return head + ": " + ("; ".join(self.reasons) or "nothing left open")


def _open(inputs: PlanInputs, key: str) -> bool:
    return key not in inputs.explicit


def _set(res: PlanResult, inputs: PlanInputs, key: str, value: Any) -> bool:
    if _open(inputs, key):
        res.values[key] = value
        return True
    return False


def card_bytes(inputs: PlanInputs) -> int:
    """The card's memory this process may use: all of it, or less what other processes hold on
    it: the free memory at start plus :data:`OWN_BYTES` (this process's CUDA context and NCCL
    buffers)."""
    return min(inputs.total_bytes, inputs.free_bytes + OWN_BYTES) if inputs.free_bytes else inputs.total_bytes


def memory_budget(inputs: PlanInputs) -> int:
    """Bytes the allocator may reserve: :func:`card_bytes` less :data:`HEADROOM_BYTES` (which
    covers this process's own share as well)."""
    return max(0, card_bytes(inputs) - HEADROOM_BYTES)


def layout(inputs: PlanInputs, ac: str | None = None) -> Layout:
    """The memory model's layout for these inputs (AC ``ac``, default the job's)."""
    mode = ac or inputs.ac
    mode = mode if mode in ("none", "full", "selective") else "full"
    if inputs.cpu_offload:  # through fully_shard, one GPU too
        strategy, gpus = "fsdp", inputs.dp_shard
    elif inputs.world == 1:
        strategy, gpus = "single", 1
    elif inputs.strategy == "fsdp" and inputs.tp > 1:
        strategy, gpus = "tp", inputs.dp_shard * inputs.tp
    elif inputs.strategy == "fsdp":
        strategy, gpus = "fsdp", inputs.dp_shard
    else:
        strategy, gpus = "ddp", inputs.world
    return Layout(strategy=strategy, gpus=gpus, tp=inputs.tp, ac=mode,
                  precision="fp32" if inputs.precision == "fp32" else "bf16", norm_fp32=inputs.norm_fp32,
                  offload=inputs.cpu_offload)


def loss_chunk(vocab: int, world: int = 2) -> int:
    """The largest power of two <= :data:`MAX_LOSS_CHUNK` (:data:`MAX_LOSS_CHUNK_ONE_GPU` where
    ``world`` is 1) whose fp32 logits fit :data:`LOSS_CHUNK_BYTES`."""
    chunk = MAX_LOSS_CHUNK if world > 1 else MAX_LOSS_CHUNK_ONE_GPU
    while chunk > 256 and chunk * vocab * 4 > LOSS_CHUNK_BYTES:
        chunk //= 2
    return chunk


def ac_skip(inputs: PlanInputs, budget: int) -> tuple[int, str]:
    """How many of the last blocks to leave out of AC, and why."""
    cfg = inputs.model
    fp8 = inputs.fp8 != "none"
    if inputs.cpu_offload:  # no state on the card: the step's activations are the peak
        reserved = int(estimate(cfg, inputs.batch, inputs.seq, layout(inputs, "none")).peak
                       * RESERVED_OVER_STEP["fp8" if fp8 else "bf16"])
        if reserved <= budget:
            return cfg.n_layers, (f"AC off every block (all {cfg.n_layers} fit beside the offloaded state: "
                                  f"reserved est {reserved / GiB:.1f} of {budget / GiB:.1f} GiB)")
        return 0, (f"AC on every block (without it reserved est {reserved / GiB:.1f} of "
                   f"{budget / GiB:.1f} GiB)")
    lay = layout(inputs)
    est = estimate(cfg, inputs.batch, inputs.seq, lay)
    logits = (2 if lay.precision == "bf16" else 4) * inputs.batch * inputs.seq * cfg.vocab_size
    a_in = lay.residual_bytes * cfg.dim * inputs.batch * inputs.seq // inputs.tp
    a_block = block_activation_bytes(cfg, inputs.batch, inputs.seq, lay)
    extra = max(1, int(a_block * (FP8_ACTIVATION_FRACTION if fp8 else 1.0)) - a_in)  # one block left out
    step = est.phases["step"]
    slack = step - (est.phases["forward"] - logits)  # what fits under the end-of-backward peak
    k_peak = max(0, slack // extra)
    reserved0 = int(step * RESERVED_OVER_STEP["fp8" if fp8 else "bf16"])
    per_block = max(1, int(RESERVED_PER_BLOCK * (a_block - a_in)))
    k_mem = max(0, (budget - reserved0) // per_block)
    if k_mem >= cfg.n_layers:  # every block's activations fit the card: no recompute at all
        k = cfg.n_layers
        why = (f"AC off every block (all {k} fit: reserved est {(reserved0 + k * per_block) / GiB:.1f} of "
               f"{budget / GiB:.1f} GiB)")
        return k, why
    k = int(min(k_peak, k_mem))
    why = (f"AC off the last {k} of {cfg.n_layers} blocks (peak allows {k_peak}, memory {k_mem}: "
           f"reserved est {(reserved0 + k * per_block) / GiB:.1f} of {budget / GiB:.1f} GiB)")
    if reserved0 > budget:
        why = (f"AC on every block: reserved est {reserved0 / GiB:.1f} GiB, over the {budget / GiB:.1f} GiB "
               "budget (a conservative estimate; should memory run out: more GPUs, a smaller batch, or "
               "parallel.cpu_offload=true)")
    return k, why


def _fsdp_no_ac(inputs: PlanInputs, res: PlanResult) -> None:
    """FSDP2 without AC on several GPUs: the 1b FSDP2 winner (docs/plan.md). Parameters are
    resharded after forward as FSDP2 does by default: keeping them gathered (``never``) gained
    speed but cost 1.1 GiB at 1b 4x2048 on 2 GPUs, more than torchtitan's peak."""
    cfg = inputs.model
    # the reduce-scatter on the copy engines too (an all-to-all of the bf16 gradients, summed in
    # fp32): 2xH200, against the all-gather alone, 8b +1.1% and 1b +3.8% (docs/plan.md)
    if inputs.symm_auto == "all_gather" and _set(res, inputs, "parallel.fsdp_symm_mem", "all"):
        res.reasons.append("all-gather and reduce-scatter on the copy engines")
    budgeted = round(cfg.n_layers * BUDGET_BLOCK_FRACTION)
    if budgeted and _open(inputs, "parallel.activation_memory_budget_skip_last") \
            and _set(res, inputs, "parallel.activation_memory_budget", BUDGET):
        res.values["parallel.activation_memory_budget_skip_last"] = cfg.n_layers - budgeted
        res.reasons.append(f"activation budget {BUDGET} on the first {budgeted} blocks")


def _state_bytes(inputs: PlanInputs) -> int:
    """One rank's fp32 parameters, gradients and AdamW moments."""
    return 16 * param_count(inputs.model) // max(1, inputs.dp_shard * inputs.tp if inputs.strategy == "fsdp" else 1)


def _offload(inputs: PlanInputs, res: PlanResult) -> PlanInputs:
    """``parallel.cpu_offload`` where the state cannot stay on the card but the host holds it
    (the inputs the rest of the plan sees: with the offload); a stop where neither holds it."""
    if inputs.cpu_offload or inputs.strategy != "fsdp":
        return inputs
    mode = "none" if inputs.ac == "none" else "full"
    full = estimate(inputs.model, inputs.batch, inputs.seq, layout(inputs, mode))
    if full.peak <= res.budget_bytes:
        return inputs
    state = full.params + full.grads + full.optimizer  # this rank's, on the card
    host = state * inputs.local_world
    step = "even AC on every block" if mode == "full" else "the step (AC off)"
    where = (f"{inputs.model.name} {inputs.batch}x{inputs.seq} on {inputs.world} GPU(s): {step} "
             f"needs {full.peak / GiB:.1f} GiB of the {res.budget_bytes / GiB:.1f} GiB budget")
    blocked = offload_unavailable(inputs.strategy, inputs.tp, inputs.fp8_backend, inputs.fsdp_symm_mem)
    if not blocked and not _open(inputs, "parallel.cpu_offload"):
        blocked = "parallel.cpu_offload=false is set"
    if not blocked and not inputs.host_bytes:
        blocked = "this node's memory is not known, for parallel.cpu_offload"
    if not blocked and host > OFFLOAD_HOST_FRACTION * inputs.host_bytes:
        blocked = (f"parallel.cpu_offload=true needs {host / OFFLOAD_HOST_FRACTION / GiB:.0f} GiB of host memory, "
                   f"this node has {inputs.host_bytes / GiB:.0f}")
    if not blocked:
        res.values["parallel.cpu_offload"] = True
        res.reasons.append(f"parameters, gradients and optimizer state in host memory ({where}; "
                           f"{host / GiB:.0f} of {inputs.host_bytes / GiB:.0f} GiB host)")
        if inputs.fp8 == "tensorwise" and _set(res, inputs, "fp8.fsdp_float8_all_gather", False):
            res.reasons.append("FP8 weights all-gathered in bf16 (their scales need the weights on the GPU)")
        return replace(inputs, cpu_offload=True)
    seen = card_bytes(inputs)
    if state > seen:  # cannot fit the card whatever the plan
        res.problem = (f"{where}: its parameters, gradients and optimizer state alone take {state / GiB:.1f} GiB "
                       f"of the card's {seen / GiB:.1f} GiB; shard them over more GPUs ({blocked})")
    return inputs


def _checkpoint(inputs: PlanInputs, res: PlanResult) -> None:
    state = _state_bytes(inputs)
    staged = state * inputs.local_world
    host = inputs.host_bytes - (staged if inputs.cpu_offload else 0)
    if inputs.host_bytes and staged <= ASYNC_HOST_FRACTION * host:
        if _set(res, inputs, "checkpoint.async_save", True):
            res.reasons.append(f"async checkpoints ({staged / GiB:.0f} of {inputs.host_bytes / GiB:.0f} GiB host)")
    elif _open(inputs, "checkpoint.async_save"):
        left = " the offload leaves" if host < inputs.host_bytes else ""
        res.reasons.append(f"checkpoints synchronous ({staged / GiB:.0f} GiB staged over half the host's memory{left})")


def plan(inputs: PlanInputs) -> PlanResult:
    """The values of the open keys of :data:`PLAN_KEYS` for ``inputs`` (pure)."""
    res = PlanResult(budget_bytes=memory_budget(inputs))
    if inputs.device != "cuda":
        return res
    te = inputs.fp8_backend == "te"
    compiled = inputs.capability >= (7, 0) and not te
    if _set(res, inputs, "parallel.compile", compiled):
        res.reasons.append("compile on" if compiled else "compile off (Transformer Engine layers)" if te
                           else f"compile off (capability {inputs.capability})")
    compiled = res.values.get("parallel.compile", inputs.compile)
    if param_count(inputs.model) is None:  # a user's model (model.builder): no shapes, no memory model
        res.reasons.append("the rest as configured (model.builder: no memory model to plan with)")
        return res
    if compiled and inputs.tp == 1 and _set(res, inputs, "train.loss", "chunked"):
        chunk = loss_chunk(inputs.model.vocab_size, inputs.world)
        if _set(res, inputs, "train.loss_chunk_tokens", chunk):
            res.reasons.append(f"loss chunked by {chunk} tokens")
        else:
            res.reasons.append("loss chunked")
    inputs = _offload(inputs, res)
    no_ac = inputs.ac == "none"
    if inputs.ac != "none" and _open(inputs, "parallel.ac_skip_last"):
        k, why = ac_skip(inputs, res.budget_bytes)
        res.values["parallel.ac_skip_last"] = k
        res.reasons.append(why)
        no_ac = k >= inputs.model.n_layers
        if te and not no_ac:
            res.problem = (f"fp8.backend=te: {inputs.model.name} {inputs.batch}x{inputs.seq} on {inputs.world} GPU(s) "
                           f"needs activation checkpointing here ({why}), which Transformer Engine layers do not "
                           "support: use fp8.backend=torchao, more GPUs or a smaller train.batch_size")
    if no_ac and inputs.strategy == "fsdp" and inputs.world > 1 and inputs.tp == 1 and not inputs.cpu_offload:
        _fsdp_no_ac(inputs, res)
    if compiled and inputs.world == 1 and not inputs.cpu_offload \
            and _set(res, inputs, "parallel.recompute_param_casts", True):
        res.reasons.append("weight casts recomputed in backward")
    one_node = inputs.local_world >= inputs.world  # NVLink: the bf16 all-gather's extra bytes are cheap
    if inputs.fp8 == "tensorwise" and inputs.strategy == "fsdp" and 1 < inputs.world and one_node \
            and "fp8.fsdp_float8_all_gather" not in res.values:
        if _set(res, inputs, "fp8.fsdp_float8_all_gather", False):
            res.reasons.append("FP8 weights all-gathered in bf16")
    _checkpoint(inputs, res)
    return res
