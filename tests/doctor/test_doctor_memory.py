"""The memory estimator against real tensors (CPU) and its own invariants.

Exactness: parameter / gradient / optimizer-state / buffer bytes equal those of a real
``Trainer`` after one step, and the activation bytes equal what autograd actually
saves for backward (every storage passed to a ``saved_tensors_hooks`` pack hook)."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from train.config import load_config
from train.distributed import DistInfo
from train.doctor.planning import candidate_plans, max_batch, recommend
from train.memory import (
    GiB,
    Plan,
    block_activation_bytes,
    estimate,
)
from train.models.llama import Transformer
from train.models.presets import MODEL_PRESETS
from train.models.shapes import param_count, param_shapes
from train.parallel.attention import native_gqa_kernel
from train.trainer import Trainer

# CPU runs below: K/V are repeated where this torch's CPU SDPA has no GQA kernel (torch < 2.10)
KV_REPEATED = not native_gqa_kernel("cpu")

SMALL = ["model.name=debug", "model.n_layers=2", "model.n_kv_heads=4", "data.source=synthetic",
         "metrics.progress=false"]


def _trainer(tmp: str, precision: str, overrides=(), seq=64, batch=2) -> Trainer:
    job = load_config(None, [*SMALL, f"train.precision={precision}", f"train.seq_len={seq}",
                             f"train.batch_size={batch}", *overrides])
    return Trainer(job, DistInfo(0, 0, 1, torch.device("cpu"), None), Path(tmp))


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("preset", ["tiny", "debug", "1b", "8b"])
def test_param_shapes_match_the_model(preset):
    with torch.device("meta"):
        model = Transformer(MODEL_PRESETS[preset])
    real = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert real == param_shapes(MODEL_PRESETS[preset])
    assert sum(p.numel() for p in model.parameters()) == param_count(MODEL_PRESETS[preset])


def test_params_grads_optimizer_bytes_are_exact():
    with tempfile.TemporaryDirectory() as tmp:
        tr = _trainer(tmp, "fp32")
        model, cfg = tr.par.model, tr.job.model
        est = estimate(cfg, 2, 64, Plan(precision="fp32", fused_norm=False))
        assert _nbytes(model.parameters()) == est.params
        assert _nbytes(model.buffers()) == est.buffers
        tr.train_step()  # creates AdamW's exp_avg / exp_avg_sq / step
        states = [v for s in tr.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        assert _nbytes(states) == est.optimizer
        x = torch.randint(0, cfg.vocab_size, (2, 64))
        F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        assert _nbytes(p.grad for p in model.parameters()) == est.grads


@pytest.mark.parametrize("precision, kv", [("bf16", "model.n_kv_heads=4"),  # GQA: K/V repeated to 16 heads
                                           ("fp32", "model.n_kv_heads=0")])  # MHA
def test_saved_activations_are_exact(precision, kv):
    """CPU autocast runs the same ops as the CUDA path except the fused RMSNorm kernel,
    hence ``fused_norm=False`` here. Integer tensors (token ids) are left out: the CPU
    loader shares one storage between inputs and targets."""
    with tempfile.TemporaryDirectory() as tmp:
        tr = _trainer(tmp, precision, [kv])
        owned = {t.untyped_storage().data_ptr() for t in [*tr.par.model.parameters(), *tr.par.model.buffers()]}
        saved: dict[int, int] = {}

        def pack(t):
            st = t.untyped_storage()
            if t.is_floating_point() and st.data_ptr() not in owned:
                saved[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            tr.train_step()
        est = estimate(tr.job.model, 2, 64, Plan(precision=precision, fused_norm=False, kv_repeated=KV_REPEATED))
        # bf16: the linears also save the bf16 weight copies autocast made
        assert sum(saved.values()) == est.activations - est.tokens + est.weights_backward


@pytest.mark.parametrize("ac, tolerance", [("none", 0.01), ("full", 0.08)])
def test_peak_matches_the_allocator_timeline_of_a_real_step(ac, tolerance):
    """The phase model against real allocations: torch.profiler's memory timeline of one
    CPU training step (bf16 autocast). Params, buffers and AdamW state exist before the
    step; gradients do not (zero_grad(set_to_none=True))."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    b, s = 4, 128
    with tempfile.TemporaryDirectory() as tmp:
        tr = _trainer(tmp, "bf16", [f"parallel.ac={ac}"], seq=s, batch=b)
        tr.train_step()  # optimizer state now exists
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            tr.train_step()
        live = peak = 0
        for _, action, _, size in prof._memory_profile().timeline:
            live += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
            peak = max(peak, live)
        before = _nbytes([*tr.par.model.parameters(), *tr.par.model.buffers()])
        before += _nbytes(v for st in tr.optimizer.state.values() for v in st.values() if torch.is_tensor(v))
        est = estimate(tr.job.model, b, s, Plan(ac=ac, fused_norm=False, kv_repeated=KV_REPEATED))
    measured = before + peak
    assert abs(est.peak - measured) <= tolerance * measured, (est.peak, measured, est.phases)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_fsdp_shards_params_grads_optimizer_by_n(n):
    cfg = MODEL_PRESETS["1b"]
    ddp, fsdp = estimate(cfg, 4, 2048, Plan("ddp", n)), estimate(cfg, 4, 2048, Plan("fsdp", n))
    steps = 4 * len(param_shapes(cfg))  # one fp32 step counter per parameter tensor, not sharded
    assert fsdp.params * n == ddp.params
    assert fsdp.grads * n == ddp.grads
    assert (fsdp.optimizer - steps) * n == ddp.optimizer - steps
    assert fsdp.activations == ddp.activations  # same micro-batch per GPU
    assert fsdp.peak < ddp.peak


@pytest.mark.parametrize("ac", ["none", "full"])
def test_offload_leaves_only_weights_activations_and_buffers_on_the_gpu(ac):
    """FSDP2's CPU offload: the fp32 parameters, gradients and optimizer state are host memory;
    every other term is the same as without it."""
    cfg = MODEL_PRESETS["8b"]
    on, off = (estimate(cfg, 4, 2048, Plan("fsdp", 1, ac=ac, offload=o)) for o in (True, False))
    assert on.params == on.grads == on.optimizer == 0
    assert (on.activations, on.weights_forward, on.fsdp_buffers) == (off.activations, off.weights_forward, off.fsdp_buffers)
    assert on.phases["step"] == on.buffers
    assert off.peak - on.peak >= off.params + off.optimizer  # the gradients too, at least where they peak
    with pytest.raises(ValueError, match="offload"):
        Plan("ddp", 2, offload=True)


def test_activation_checkpointing_lowers_activations_and_peak():
    for preset in ("debug", "1b", "8b"):
        cfg = MODEL_PRESETS[preset]
        for plan in (Plan(), Plan("ddp", 8), Plan("fsdp", 8), Plan("tp", 8, tp=8)):
            none = estimate(cfg, 2, 2048, plan)
            full = estimate(cfg, 2, 2048, dataclasses.replace(plan, ac="full"))
            sel = estimate(cfg, 2, 2048, dataclasses.replace(plan, ac="selective", ac_every=2))
            assert full.activations < sel.activations < none.activations, (preset, plan)
            assert full.peak < none.peak, (preset, plan)
    # full AC keeps one fp32 block input per layer instead of the block's activations
    cfg = MODEL_PRESETS["1b"]
    none, full = estimate(cfg, 2, 2048, Plan()), estimate(cfg, 2, 2048, Plan(ac="full"))
    assert none.activations - full.activations == cfg.n_layers * (none.activation_per_block - 4 * cfg.dim * 2 * 2048)


def test_block_activation_formula_is_22d_plus_4g_plus_8f_bytes_per_token():
    """bf16 on CUDA without TP: T (22 d + 4 g + 8 f) + 8 T (rstd) + 4 b h s (logsumexp),
    g = KV width (K/V stay at their own heads under SDPA's enable_gqa)."""
    cfg = MODEL_PRESETS["1b"]
    b, s = 2, 1024
    T = b * s
    g = cfg.kv_heads * cfg.head_dim
    expected = T * (22 * cfg.dim + 4 * g + 8 * cfg.hidden_dim) + 8 * T + 4 * b * cfg.n_heads * s
    assert block_activation_bytes(cfg, b, s) == expected
    tp = block_activation_bytes(cfg, b, s, Plan("tp", 4, tp=4))
    assert tp < block_activation_bytes(cfg, b, s) / 2  # mostly sharded; linear inputs stay full


def test_rms_norm_autocast_policy_only_matters_with_bf16_params():
    """torch <= 2.11 autocast leaves rms_norm alone: with FSDP2's bf16 residual stream the
    norm saves a bf16 input and q/k/v (w1/w3) share one input: T (16 d + 8 f) bytes."""
    cfg, b, s = MODEL_PRESETS["1b"], 2, 1024
    T = b * s
    old = block_activation_bytes(cfg, b, s, Plan("fsdp", 8, norm_fp32=False))
    g = cfg.kv_heads * cfg.head_dim  # K/V width (enable_gqa: not repeated)
    assert old == T * (12 * cfg.dim + 4 * g + 8 * cfg.hidden_dim) + 8 * T + 4 * b * cfg.n_heads * s
    assert block_activation_bytes(cfg, b, s, Plan("fsdp", 8)) == block_activation_bytes(cfg, b, s)
    for strategy in ("single", "ddp"):  # fp32 residual stream: the norm runs in fp32 either way
        n = 1 if strategy == "single" else 8
        assert (estimate(cfg, b, s, Plan(strategy, n, norm_fp32=False)).peak
                == estimate(cfg, b, s, Plan(strategy, n)).peak)


def test_max_batch_is_the_largest_that_fits():
    cfg = MODEL_PRESETS["1b"]
    for plan in candidate_plans(cfg, 8):
        budget = 40 * GiB
        mb = max_batch(cfg, 2048, plan, budget)
        assert mb >= 1
        assert estimate(cfg, mb, 2048, plan).peak <= budget < estimate(cfg, mb + 1, 2048, plan).peak


def test_recommendation_prefers_ddp_then_sharding_then_ac():
    h100 = 80 * GiB
    rec = recommend(MODEL_PRESETS["1b"], 2048, 4, 8, h100)
    assert rec.plan == Plan("ddp", 8) and rec.batch >= 4 and rec.batch == 1 << int(math.log2(rec.max_batch))
    rec = recommend(MODEL_PRESETS["8b"], 8192, 1, 8, h100)  # DDP and FSDP2 without AC do not fit
    assert rec.plan == Plan("fsdp", 8, ac="full")
    rec = recommend(MODEL_PRESETS["8b"], 8192, 1, 1, 24 * GiB)
    assert rec.plan is None and "does not fit" in rec.reason
    assert recommend(MODEL_PRESETS["1b"], 2048, 4, 8, None).plan is None
