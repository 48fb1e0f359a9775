"""Per-GPU memory estimate of one training step of a model preset, without torch.

The parameter shapes and the per-block traits (what a block's norms, attention and MLP save)
come from the family's spec (``train.models.spec.ModelSpec.param_shapes`` and ``memory``);
the formulas below are written for the Llama family, the reference the estimate is
checked against, and take other families' numbers of norm statistics, linear inputs and
MLP-wide tensors from their traits.

What is counted is what ``torch.cuda.max_memory_allocated`` sees for ``train run``:
tensors the caching allocator hands out. The CUDA context, NCCL buffers and allocator
fragmentation are not in it; :func:`train.doctor.planning.recommend` leaves headroom for them.

Persistent state (``P`` parameters on this GPU, after sharding)
    params     fp32 master weights, ``4 P`` (+ the RoPE buffer)
    grads      fp32, ``4 P``. DDP keeps them in its buckets for the whole run; one
               process and FSDP2 free them at ``zero_grad(set_to_none=True)``
    optimizer  AdamW ``m`` and ``v`` in fp32, ``8 P``, + a 4-byte step counter per tensor

Compute weights (bf16)
    autocast   ``torch.autocast`` caches a bf16 copy of every ``nn.Linear`` weight for
               the forward; without AC the linears also save them for backward
               (``2 P_linear``). With full AC only the output projection's copy and the
               copies of the block being recomputed are alive at backward time.
    FSDP2      ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the root
               (embedding, final norm, output) stays unsharded in bf16 from forward to
               backward; about two blocks are unsharded at a time (current + prefetch).
               During backward one block's bf16 gradients plus its fp32 reduce-scatter
               input, and the output projection's bf16 gradient, are in flight.

Activations saved for backward, per block (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", adapted: SwiGLU MLP, GQA with
K/V kept at their own heads (SDPA's ``enable_gqa``), fused SDPA so no ``s x s`` score
matrix, RMSNorm, fp32 residual stream under autocast). With ``T = b s`` tokens,
``d`` model dim, ``f`` FFN hidden, ``h`` query heads, ``c`` = 2 bytes (bf16), TP
degree ``t`` with sequence-parallel norms::

    A_block = T * [ 2 * 4d / t          RMSNorm inputs (fp32: the fused kernel saves input
                                        + rstd; the residual stream is fp32 under autocast)
                  + 2 * 4 / t           rstd of both norms
                  + 3 * c d             bf16 casts of the norm output saved by wq, wk, wv
                  + 2 * c d             ... by w1, w3 (autocast casts per op, no sharing)
                  + 2 * c (d + g) / t   q and attention output (h heads), k and v (g = KV width)
                  + 4 * c f / t ]       w1 out, w3 out, silu(w1 out), their product (w2 in)
              + 4 * b h s / t           attention logsumexp (fp32)

i.e. ``T (8d/t + 5 c d + 2 c (d + g)/t + 4 c f/t)`` plus small terms: ``T (22 d + 4 g + 8 f)`` bytes
for bf16 without TP. (The CPU rms_norm is not fused and saves its normalised output
too: ``+ 4d`` per norm; ``fused_norm=False``.) The linear inputs are all-gathered
under sequence parallelism, so they do not shrink with ``t``.

FSDP2 with bf16 params makes the residual stream bf16. torch >= 2.12 autocast runs
rms_norm in fp32 anyway (an fp32 copy of the input is saved, the formula above holds);
torch <= 2.11 runs it in bf16: the norm saves its bf16 input and the three (two)
projections share one bf16 input, ``T (4d/t + 2 c d + 4 c d/t + 4 c f/t)``
(``Plan.norm_fp32``, from :func:`train.compat.rms_norm_fp32_in_autocast`).

Head: final norm input (fp32) + rstd + the bf16 input of the output projection +
``log_softmax`` output (fp32, ``4 T V``) + input and target token ids (int64).
Loss buffers at the start of backward: the bf16 logits the trainer still holds
(``c T V``), the ``nll_loss`` gradient and the ``log_softmax`` gradient (``4 T V`` each).
Under TP the logits are all-gathered to full size unless ``loss_parallel``.

Activation checkpointing: ``full`` wraps every block, so only block inputs are saved
(``T d r`` each, ``r`` = residual bytes: 4 under autocast, 2 with FSDP2 bf16 params);
backward recomputes one block at a time, adding one ``A_block`` and that block's
bf16 weight copies. ``selective`` checkpoints every ``ac_every``-th block.

Peak = max over the phases of a step:
    forward    persistent + grads kept by DDP + autocast weight cache + saved
               activations (no loss yet) + bf16 logits
    backward   (start) persistent + grads kept by DDP + saved weights + all saved
               activations + loss buffers + FSDP gradient buffers
    recompute  (AC only, at each checkpointed block j) persistent + gradients written
               so far (blocks >= j, output projection) + what blocks < j saved + the
               logits the trainer holds + one recomputed block + two residual gradients
    step       persistent + all gradients (optimizer step)

With ``offload`` (FSDP2's ``CPUOffloadPolicy``) the parameters, gradients and optimizer state
live in host memory: the GPU holds only the unsharded bf16 weights, activations and buffers.

Checked on the CPU against torch.profiler's allocation timeline of a real step (equal
without AC, within a few % with AC; tests/doctor) and on GPUs against
``torch.cuda.max_memory_allocated`` (``train doctor --measure``, scripts/gpu/doctor.sh).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

from train.models.presets import ModelConfig
from train.models.registry import model_spec, param_count
from train.models.spec import MemoryTraits

GiB = 2**30
STRATEGIES = ("single", "ddp", "fsdp", "tp")
ESTIMATED_AC_MODES = ("none", "full", "selective")  # the parallel.ac modes this estimate models
# Headroom: the allocator may hand out this fraction of a GPU's memory; the rest is for
# the CUDA context, NCCL buffers and fragmentation (a policy, not a measurement).
USABLE_FRACTION = 0.90


def _traits(cfg: ModelConfig) -> tuple[list, MemoryTraits, str]:
    """(parameter shapes, memory traits, the blocks' name prefix) of ``cfg``'s family; a ValueError
    for a model whose spec gives no shapes (a user's builder: built, not described)."""
    spec = model_spec(cfg)
    if spec.param_shapes is None or spec.memory is None:
        raise ValueError(f"model family {spec.family}: no parameter shapes or memory traits to estimate from")
    return spec.param_shapes(cfg), spec.memory, f"{spec.blocks}."


def _tp_shape(name: str, shape: tuple[int, ...], tp: int, traits: MemoryTraits) -> tuple[int, ...]:
    """nn.Linear weights row-wise by tensor parallelism (``traits.rowwise``) are sharded along
    dim 1; every other matrix (linears, embedding, output projection) along dim 0."""
    if tp == 1 or len(shape) == 1:  # norms (and biases, approximately) are replicated
        return shape
    if name.endswith(traits.rowwise):
        return (shape[0], math.ceil(shape[1] / tp))
    return (math.ceil(shape[0] / tp), *shape[1:])


def _local_numel(name: str, shape: tuple[int, ...], tp: int, shard: int, traits: MemoryTraits) -> int:
    """Elements on one GPU: TP shard, then FSDP2's dim-0 shard (padded to ceil)."""
    s = _tp_shape(name, shape, tp, traits)
    return math.ceil(s[0] / shard) * math.prod(s[1:])


def _is_linear(name: str, traits: MemoryTraits) -> bool:
    return name.endswith("weight") and (any(part in name for part in traits.linear) or name == traits.output)



# ----------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Plan:
    """How the job is laid out: strategy over ``gpus`` GPUs, TP degree, AC mode."""

    strategy: str = "single"  # single | ddp | fsdp | tp (tp: FSDP2 over gpus/tp, TP inside)
    gpus: int = 1
    tp: int = 1
    ac: str = "none"  # none | full | selective
    ac_every: int = 2
    precision: str = "bf16"  # bf16 (autocast, fp32 master weights) | fp32
    fused_norm: bool = True  # CUDA: fused rms_norm saves input + rstd; CPU saves the output too
    loss_parallel: bool = False  # TP: logits stay sharded over the vocabulary (parallel.loss_parallel)
    norm_fp32: bool = True  # CUDA autocast runs rms_norm in fp32 (torch >= 2.12; see train.compat)
    kv_repeated: bool = False  # K/V repeated to the query heads (no GQA kernel: see parallel.attention.native_gqa_kernel)
    offload: bool = False  # FSDP2 CPU offload: fp32 params, gradients and optimizer state in host memory

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.ac not in ESTIMATED_AC_MODES:
            raise ValueError(f"ac must be one of {', '.join(ESTIMATED_AC_MODES)}, got {self.ac!r}")
        if self.precision not in ("bf16", "fp32"):
            raise ValueError(f"precision must be bf16 or fp32, got {self.precision!r}")
        if self.gpus < 1 or self.tp < 1 or self.gpus % self.tp:
            raise ValueError(f"gpus={self.gpus} must be a multiple of tp={self.tp}")
        if self.strategy != "tp" and self.tp != 1:
            raise ValueError("tp > 1 needs strategy='tp'")
        if self.strategy == "single" and self.gpus != 1:
            raise ValueError("strategy='single' means one GPU")
        if self.offload and self.strategy != "fsdp":
            raise ValueError("offload needs strategy='fsdp'")

    @property
    def shard(self) -> int:
        """FSDP2 shard degree (1 when parameters are replicated)."""
        if self.strategy == "fsdp":
            return self.gpus
        if self.strategy == "tp":
            return self.gpus // self.tp
        return 1

    @property
    def fsdp(self) -> bool:
        """Parameters go through ``fully_shard`` (TP runs under strategy=fsdp here)."""
        return self.strategy in ("fsdp", "tp")

    @property
    def residual_bytes(self) -> int:
        """The residual stream is fp32 (fp32 params under autocast) or bf16 (FSDP2 bf16 params)."""
        return 2 if (self.fsdp and self.precision == "bf16") else 4

    @property
    def norm_bytes(self) -> int:
        """dtype of the RMSNorm input kept for backward (and of its output)."""
        return 4 if (self.residual_bytes == 4 or self.norm_fp32) else 2

    @property
    def label(self) -> str:
        name = {"single": "1 GPU", "ddp": "DDP", "fsdp": "FSDP2", "tp": f"TP{self.tp}"}[self.strategy]
        if self.strategy == "tp" and self.shard > 1:
            name = f"FSDP2x{self.shard}+TP{self.tp}"
        return name + {"none": "", "full": " + AC", "selective": f" + AC/{self.ac_every}"}[self.ac]


@dataclass
class MemoryEstimate:
    """Bytes on one GPU. ``peak`` is the largest of ``phases``."""

    plan: Plan
    batch: int
    seq: int
    params: int
    buffers: int
    grads: int
    optimizer: int
    weights_forward: int  # bf16 compute copies / unsharded params alive at the end of forward
    weights_backward: int  # ... at the start of backward
    activations: int  # everything saved for backward, loss head included
    activation_per_block: int
    tokens: int  # int64 inputs + targets (part of activations)
    loss_buffers: int
    fsdp_buffers: int
    phases: dict[str, int] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "plan"}
        out.update(strategy=self.plan.strategy, label=self.plan.label, gpus=self.plan.gpus, tp=self.plan.tp,
                   shard=self.plan.shard, ac=self.plan.ac, precision=self.plan.precision,
                   peak=self.peak, peak_phase=self.peak_phase)
        return out


# ----------------------------------------------------------------------------- activations


def block_activation_bytes(cfg: ModelConfig, batch: int, seq: int, plan: Plan = Plan()) -> int:
    """Bytes one transformer block saves for backward (see the module docstring)."""
    t = plan.tp
    tokens = batch * seq
    d, f, h, hd, kv = cfg.dim, cfg.hidden_dim, cfg.n_heads, cfg.head_dim, cfg.kv_heads
    tr = _traits(cfg)[1]
    c = 2 if plan.precision == "bf16" else 4
    per_norm = plan.norm_bytes * d * (1 if plan.fused_norm else 2)  # fused: input; unfused: input + output
    casts = c != plan.norm_bytes  # autocast casts the fp32 norm output once per linear
    per_token = (
        2 * per_norm / t
        + 2 * 4 * tr.norm_stats / t  # rstd (LayerNorm: and the mean)
        + (tr.attn_inputs if casts else 1) * c * d  # input(s) of wq, wk, wv (full size under SP)
        + (tr.mlp_inputs if casts else 1) * c * d  # input(s) of w1, w3
        + 2 * c * (h + (h if plan.kv_repeated else kv)) * hd / t  # q, output at h heads; k, v at kv heads (enable_gqa)
        + tr.mlp_saved * c * f / t  # SwiGLU: w1 out, w3 out, silu, product
    )
    return int(round(tokens * per_token)) + 4 * batch * h * seq // t  # + logsumexp


def _vocab_shards(plan: Plan) -> int:
    """Logits are all-gathered to full size after a TP output projection unless loss_parallel."""
    return plan.tp if plan.loss_parallel else 1


def _head_bytes(cfg: ModelConfig, batch: int, seq: int, plan: Plan) -> tuple[int, int, int]:
    """(saved by the final norm + output projection, log_softmax output, token ids)."""
    t, tokens = plan.tp, batch * seq
    c = 2 if plan.precision == "bf16" else 4
    norm = plan.norm_bytes * cfg.dim * (1 if plan.fused_norm else 2) * tokens // t + 4 * tokens // t
    out_in = c * cfg.dim * tokens
    lsm = 4 * tokens * cfg.vocab_size // _vocab_shards(plan) + 4  # + nll_loss's total_weight scalar
    return norm + out_in, lsm, 16 * tokens


# ----------------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class _Sizes:
    """Parameter element counts on one GPU that the phases of a step need."""

    local: int  # all parameters, TP + FSDP sharded
    out: int  # output projection, TP + FSDP sharded
    norm: int  # final norm
    block: int  # one block, TP + FSDP sharded
    block_tp: int  # one block, TP sharded only (what FSDP2 unshards)
    block_lin: int  # the linears of one block, TP + FSDP sharded
    lin: int  # every linear, TP + FSDP sharded
    root_tp: int  # embedding + final norm + output projection, TP sharded only
    out_tp: int  # output projection, TP sharded only
    tensors: int  # parameter tensors (AdamW keeps a step counter for each)


def _sizes(cfg: ModelConfig, plan: Plan) -> _Sizes:
    t, n = plan.tp, plan.shard
    shapes, tr, blocks = _traits(cfg)
    local = {name: _local_numel(name, s, t, n, tr) for name, s in shapes}
    tp_only = {name: _local_numel(name, s, t, 1, tr) for name, s in shapes}
    block0 = [name for name, _ in shapes if name.startswith(f"{blocks}0.")]
    out, out_tp = (local[tr.output], tp_only[tr.output]) if tr.output else (0, 0)  # tied: the embedding's
    return _Sizes(
        local=sum(local.values()),
        out=out,
        norm=local[tr.norm],
        block=sum(local[x] for x in block0),
        block_tp=sum(tp_only[x] for x in block0),
        block_lin=sum(local[x] for x in block0 if _is_linear(x, tr)),
        lin=sum(v for name, v in local.items() if _is_linear(name, tr)),
        root_tp=tp_only[tr.embedding] + tp_only[tr.norm] + out_tp,
        out_tp=out_tp,
        tensors=len(shapes),
    )


@dataclass(frozen=True)
class _Activations:
    """Bytes of what forward saves and what the loss allocates."""

    total: int  # everything saved for backward, loss head included
    per_block: int  # one block that is not checkpointed
    block_input: int  # one checkpointed block (its input only)
    lsm: int  # log_softmax output
    tokens: int  # int64 inputs + targets
    logits: int  # the logits the trainer holds
    loss_buffers: int  # logits + nll_loss and log_softmax gradients
    grad_flow: int  # two residual-stream gradients in flight during backward


def _checkpointed(cfg: ModelConfig, plan: Plan) -> list[int]:
    """Indices of the blocks that activation checkpointing wraps."""
    return [j for j in range(cfg.n_layers)
            if plan.ac == "full" or (plan.ac == "selective" and j % plan.ac_every == 0)]


def _below(ckpt_blocks: list[int], j: int) -> int:
    """Checkpointed blocks under block ``j``."""
    return sum(1 for i in ckpt_blocks if i < j)


def _activations(cfg: ModelConfig, batch: int, seq: int, plan: Plan, n_ckpt: int) -> _Activations:
    t = plan.tp
    a_block = block_activation_bytes(cfg, batch, seq, plan)
    a_input = plan.residual_bytes * cfg.dim * batch * seq // t  # a checkpointed block keeps only its input
    head, lsm, tok = _head_bytes(cfg, batch, seq, plan)
    c = 2 if plan.precision == "bf16" else 4
    vs = _vocab_shards(plan)
    logits = c * batch * seq * cfg.vocab_size // vs
    return _Activations(
        total=n_ckpt * a_input + (cfg.n_layers - n_ckpt) * a_block + head + lsm + tok,
        per_block=a_block, block_input=a_input, lsm=lsm, tokens=tok, logits=logits,
        loss_buffers=logits + 2 * 4 * batch * seq * cfg.vocab_size // vs,
        grad_flow=2 * plan.residual_bytes * cfg.dim * batch * seq // t,
    )


def _weights(s: _Sizes, plan: Plan, ckpt_blocks: list[int]) -> tuple[int, int, Callable[[int], int], int]:
    """bf16 compute weights: (alive at the end of forward, at the start of backward, while
    recomputing checkpointed block j, FSDP2 gradient buffers in flight)."""
    bf16 = plan.precision == "bf16"
    if plan.fsdp and bf16:
        w = 2 * s.root_tp + 2 * 2 * s.block_tp
        return w, w, (lambda j: w), 2 * s.out_tp + 6 * s.block_tp
    if bf16:
        w_fwd = 2 * s.lin  # autocast cache
        w_bwd = 2 * (s.lin - len(ckpt_blocks) * s.block_lin)  # saved by the linears that are not checkpointed
        # blocks below j + the re-cast one
        return w_fwd, w_bwd, (lambda j: 2 * (j - _below(ckpt_blocks, j) + 1) * s.block_lin), 0
    return 0, 0, (lambda j: 0), 0


def _recompute(j: int, cfg: ModelConfig, s: _Sizes, act: _Activations, ckpt_blocks: list[int],
               grads_elsewhere: bool) -> int:
    """Backward at checkpointed block j (recomputing it), beyond persistent state and weights:
    blocks above j are done (their activations freed, their gradients written: not counted here
    where ``grads_elsewhere``, DDP's kept gradients or host-resident ones), the loss and head
    buffers are gone (the trainer still holds the logits), blocks below j keep what they saved,
    and two residual-stream gradients are in flight."""
    below = _below(ckpt_blocks, j)
    saved = (below + 1) * act.block_input + (j - below) * act.per_block + act.tokens
    written = 0 if grads_elsewhere else 4 * (s.out + s.norm + (cfg.n_layers - j) * s.block)  # incl. block j
    return saved + act.logits + act.per_block + act.grad_flow + written


def rope_bytes(cfg: ModelConfig, seq: int) -> int:
    """The RoPE cos/sin table, fp32, replicated: the trainer sizes it to ``train.seq_len`` (0: a
    family without one; a user's model: not known, 0)."""
    spec = model_spec(cfg)
    return 4 * seq * cfg.head_dim if spec.memory is not None and spec.memory.rope else 0


def floor_bytes(cfg: ModelConfig, batch: int, seq: int, shard: int, tp: int) -> dict[str, int]:
    """What one rank holds at the least under any setting (precision, AC, loss, compile): its
    parameters in fp32 (``shard`` ways), the RoPE table, and one micro-batch's residual stream
    once, in bf16 (split ``tp`` ways, as sequence parallelism would)."""
    return {
        "params": 4 * (param_count(cfg) or 0) // shard,  # a user's model: not known before it is built
        "rope": rope_bytes(cfg, seq),
        "hidden": 2 * batch * seq * cfg.dim // tp,
    }


def estimate(cfg: ModelConfig, batch: int, seq: int, plan: Plan = Plan()) -> MemoryEstimate:
    """Peak bytes on one GPU for one training step (steady state: optimizer states exist)."""
    if batch < 1 or seq < 1:
        raise ValueError("batch and seq must be >= 1")
    s = _sizes(cfg, plan)
    params = grads = 0 if plan.offload else 4 * s.local
    buffers = rope_bytes(cfg, seq)
    optimizer = 0 if plan.offload else 8 * s.local + 4 * s.tensors
    ckpt_blocks = _checkpointed(cfg, plan)
    act = _activations(cfg, batch, seq, plan, len(ckpt_blocks))
    w_fwd, w_bwd, w_rec, fsdp_buffers = _weights(s, plan, ckpt_blocks)

    grads_kept = grads if (plan.strategy == "ddp" and plan.gpus > 1) else 0
    persistent = params + buffers + optimizer
    phases = {
        "forward": persistent + grads_kept + w_fwd + (act.total - act.lsm) + act.logits,
        "backward": persistent + grads_kept + w_bwd + act.total + act.loss_buffers + fsdp_buffers,
        "step": persistent + grads,
    }
    if ckpt_blocks:
        phases["recompute"] = max(
            persistent + grads_kept + w_rec(j) + fsdp_buffers
            + _recompute(j, cfg, s, act, ckpt_blocks, bool(grads_kept) or plan.offload)
            for j in ckpt_blocks
        )
    return MemoryEstimate(
        plan=plan, batch=batch, seq=seq, params=params, buffers=buffers, grads=grads, optimizer=optimizer,
        weights_forward=w_fwd, weights_backward=w_bwd, activations=act.total, activation_per_block=act.per_block,
        tokens=act.tokens, loss_buffers=act.loss_buffers, fsdp_buffers=fsdp_buffers, phases=phases,
    )
