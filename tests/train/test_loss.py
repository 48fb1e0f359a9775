"""train.loss: the compiled and chunked cross-entropies give the eager reference's loss and
gradients (w.r.t. the hidden states, the output weight and, through the model, every
parameter and the inputs' embeddings); the trainer with each mode follows the same loss
and gradient-norm trajectory in one process, and over 2 gloo processes with FSDP2 and
DDP (gradient accumulation included); config validation; parallel.sdpa_backend and
grouped-query attention."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import train.loss as loss_mod
from testlib import NO_CXX, TRAJECTORY_STRATEGIES, assert_same_trajectory, cxx_compiler, rank0_result
from train.compat import mm_fp32_out
from train.config import load_config
from train.errors import ConfigError
from train.loss import IGNORE_INDEX, ChunkedLossHead, cross_entropy


@pytest.fixture(autouse=True)
def _aot_eager(monkeypatch):
    """Compiled paths traced by dynamo + AOTAutograd without C++ code generation (CPU
    inductor takes about a minute per graph on this machine); one test uses inductor."""
    monkeypatch.setattr(loss_mod, "COMPILE_BACKEND", "aot_eager")


def _data(tokens=(2, 37), dim=16, vocab=50, ignored=((0, 3), (1, 36)), seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*tokens, dim, generator=g, requires_grad=True)
    w = (torch.randn(vocab, dim, generator=g) * 0.3).requires_grad_()
    t = torch.randint(0, vocab, tokens, generator=g)
    for idx in ignored:
        t[idx] = IGNORE_INDEX
    return h, w, t


def _reference(h, w, t, scale=1.0):
    loss = F.cross_entropy((h @ w.t()).float().flatten(0, 1), t.flatten(0, 1))
    return (loss, *torch.autograd.grad(loss * scale, (h, w)))


@pytest.mark.parametrize("chunk", [1, 16, 74, 1000])  # 74 = every token in one chunk; 16: uneven last chunk
@pytest.mark.parametrize("compiled", [False, True])
def test_chunked_matches_eager_fp32(chunk, compiled):
    h, w, t = _data()
    ref_loss, ref_gh, ref_gw = _reference(h, w, t, scale=0.25)  # 0.25: gradient accumulation over 4 micro-steps
    loss = ChunkedLossHead(chunk, compiled=compiled)(h, w, t)
    gh, gw = torch.autograd.grad(loss * 0.25, (h, w))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gh, ref_gh, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(gw, ref_gw, rtol=1e-5, atol=1e-7)


def test_chunked_matches_eager_under_bf16_autocast():
    """fp32 hidden states and weight, bf16 autocast: the matmuls in bf16 as F.linear would."""
    h, w, t = _data(tokens=(4, 64), dim=32, vocab=300, ignored=())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(h, w)
        loss = ChunkedLossHead(48)(h, w, t)
    assert logits.dtype == torch.bfloat16
    ref = F.cross_entropy(logits.float().flatten(0, 1), t.flatten())
    ref_gh, ref_gw = torch.autograd.grad(ref, (h, w))
    gh, gw = torch.autograd.grad(loss, (h, w))
    assert gh.dtype == h.dtype and gw.dtype == w.dtype
    torch.testing.assert_close(loss, ref, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(gh, ref_gh, rtol=2e-2, atol=2e-4)
    torch.testing.assert_close(gw, ref_gw, rtol=2e-2, atol=2e-4)


def test_chunked_bf16_weight_keeps_dtypes():
    """FSDP2's bf16 unsharded weight: the gradients come back in the parameters' dtypes."""
    h, w, t = _data(ignored=())
    hb, wb = h.detach().bfloat16().requires_grad_(), w.detach().bfloat16().requires_grad_()
    loss = ChunkedLossHead(10)(hb, wb, t)
    gh, gw = torch.autograd.grad(loss, (hb, wb))
    assert (gh.dtype, gw.dtype, loss.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)
    ref_loss, ref_gh, ref_gw = _reference(hb.float(), wb.float(), t)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gh.float(), ref_gh, rtol=3e-2, atol=1e-3)
    torch.testing.assert_close(gw.float(), ref_gw, rtol=3e-2, atol=1e-3)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_cross_entropy_matches_eager(monkeypatch, backend):
    if backend == "inductor" and cxx_compiler() is None:
        pytest.skip(NO_CXX)
    monkeypatch.setattr(loss_mod, "COMPILE_BACKEND", backend)
    h, w, t = _data()
    logits = (h @ w.t()).bfloat16()
    ref = F.cross_entropy(logits.float().flatten(0, 1), t.flatten(0, 1))
    ref_g = torch.autograd.grad(ref, h)[0]
    logits = (h @ w.t()).bfloat16()
    loss = cross_entropy(logits, t, "compiled")
    g = torch.autograd.grad(loss, h)[0]
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g, ref_g, rtol=1e-2, atol=1e-4)  # the logits' gradient is bf16 on both sides


def test_model_forward_with_targets_returns_the_loss():
    """The head receives the final hidden states and the output weight; gradients reach
    every parameter (embedding included) as with the logits path."""
    from train.models.llama import Transformer

    job = load_config("tiny", ["model.dim=32", "model.n_layers=2", "model.vocab_size=64"])
    model = Transformer(job.model)
    model.init_weights(1)
    x = torch.randint(0, 64, (2, 12))
    y = torch.randint(0, 64, (2, 12))
    ref = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    with pytest.raises(RuntimeError, match="loss_head"):
        model(x, y)
    model.loss_head = ChunkedLossHead(7)
    loss = model(x, y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in Transformer(job.model).named_parameters()]
    assert "loss_head" not in "".join(model.state_dict())


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize(("override", "message"), [
    ("train.loss=fused", "train.loss: must be one of auto, eager, compiled, chunked"),
    ("train.loss_chunk_tokens=0", "train.loss_chunk_tokens: must be in"),
    ("parallel.sdpa_backend=fa3", "parallel.sdpa_backend: must be one of auto, flash, cudnn, efficient, math"),
])
def test_config_rejects_bad_values(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_chunked_refused_with_tensor_parallel():
    with pytest.raises(ConfigError, match="train.loss=chunked: not with tensor parallelism"):
        load_config(None, ["train.loss=chunked", "parallel.strategy=fsdp", "parallel.tp=2"])
    with pytest.raises(ConfigError, match="train.loss=compiled: not with parallel.loss_parallel"):
        load_config(None, ["train.loss=compiled", "parallel.strategy=fsdp", "parallel.tp=2",
                           "parallel.loss_parallel=true"])
    job = load_config(None, ["train.loss=chunked", "train.loss_chunk_tokens=512", "parallel.sdpa_backend=math"])
    assert (job.train.loss, job.train.loss_chunk_tokens, job.parallel.sdpa_backend) == ("chunked", 512, "math")
    assert load_config(None, []).train.loss == "auto" and load_config(None, []).parallel.sdpa_backend == "auto"


def test_auto_loss_is_eager_on_cpu():
    """train.loss=auto: compiled on CUDA (measured faster and leaner, docs/performance.md),
    eager on CPU, where it must not pay a compile; same number either way."""
    from train import loss as L

    logits, targets = torch.randn(3, 5, 11), torch.randint(0, 11, (3, 5))
    L._compiled.clear()
    got = L.cross_entropy(logits, targets, "auto")
    assert not L._compiled  # nothing was compiled on CPU
    torch.testing.assert_close(got, L.cross_entropy(logits, targets, "eager"))


def test_sdpa_backend_math_runs_on_cpu_and_cuda_only_ones_are_refused():
    from train.parallel.attention import sdpa_backend

    q = torch.randn(1, 2, 8, 16)
    ref = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    for name in ("auto", "math", "flash"):
        with sdpa_backend(name, torch.device("cpu")):
            torch.testing.assert_close(F.scaled_dot_product_attention(q, q, q, is_causal=True), ref)
    for name in ("cudnn", "efficient"):
        with pytest.raises(ConfigError, match=f"parallel.sdpa_backend={name}: needs a CUDA GPU"):
            sdpa_backend(name, torch.device("cpu"))
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()  # restored


def test_native_gqa_equals_repeated_kv_heads():
    """SDPA's enable_gqa (the model's attention wherever SDPA has a grouped-query kernel)
    computes what repeat_interleave of the KV heads does, forward and backward;
    attention_context sets it on every attention module, and ``parallel.sdpa_gqa`` is gone."""
    from train.models.llama import Attention, Transformer
    from train.parallel.attention import attention_context, native_gqa_kernel

    job = load_config("tiny", ["model.dim=64", "model.n_layers=2", "model.n_heads=8", "model.n_kv_heads=2",
                               "model.vocab_size=64"])
    model = Transformer(job.model)
    model.init_weights(2)
    x = torch.randint(0, 64, (2, 24))
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    for m in attns:
        m.native_gqa = False
    ref = model(x)
    ref_grads = torch.autograd.grad(ref.square().mean(), list(model.parameters()))
    with attention_context(job.parallel, torch.device("cpu"), model):
        assert len(attns) == 2 and all(m.native_gqa == native_gqa_kernel("cpu") for m in attns)
        for m in attns:
            m.native_gqa = True  # SDPA's enable_gqa (a CPU without a GQA kernel still computes it)
        out = model(x)
        grads = torch.autograd.grad(out.square().mean(), list(model.parameters()))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-7)
    with pytest.raises(ConfigError, match="parallel.sdpa_gqa: unknown key"):
        load_config(None, ["parallel.sdpa_gqa=native"])


# ----------------------------------------------------------------------------- trainer
BASE = [
    "model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.vocab_size=256",
    "train.seq_len=32", "train.batch_size=4", "train.steps=3", "train.device=cpu", "data.source=synthetic",
    "optim.lr=0.01", "optim.warmup_steps=0", "optim.grad_clip=0.5",
    "checkpoint.final=false", "checkpoint.resume=never", "metrics.progress=false",
]
MODES = {
    "eager": ["train.loss=eager"],
    "compiled": ["train.loss=compiled"],
    "chunked": ["train.loss=chunked", "train.loss_chunk_tokens=48"],  # 128 tokens per micro-step: 48+48+32
}


def _trajectories(rank, world, strategies, result_file):
    from train.distributed import DistInfo
    from train.trainer import Trainer

    loss_mod.COMPILE_BACKEND = "aot_eager"  # a spawned process: the fixture does not reach it
    backend = "gloo" if world > 1 else None
    info = DistInfo(rank, rank, world, torch.device("cpu"), backend)
    results = {}
    for strategy, extra in strategies.items():
        for mode, mode_args in MODES.items():
            job = load_config(None, BASE + extra + mode_args + ["parallel.sdpa_backend=math"])
            trainer = Trainer(job, info, Path(tempfile.mkdtemp()))
            results[(strategy, mode)] = [trainer.train_step()[:2] for _ in range(job.train.steps)]
            trainer.metrics.close()
            trainer.release()
    if rank == 0:
        torch.save(results, result_file)


def _check(results):
    for (strategy, mode), traj in results.items():
        assert_same_trajectory(traj, results[(strategy, "eager")], f"{strategy}/{mode}")
        assert traj[-1][0] < traj[0][0], f"{strategy}/{mode}: loss does not decrease: {traj}"


def test_trainer_modes_agree_in_one_process(tmp_path):
    _check(rank0_result(_trajectories, tmp_path, 1, {"single": []}))


def test_trainer_modes_agree_with_fsdp2_and_ddp_on_2_gloo_ranks(tmp_path):
    results = rank0_result(_trajectories, tmp_path, 2, TRAJECTORY_STRATEGIES)
    assert len(results) == len(TRAJECTORY_STRATEGIES) * len(MODES)
    _check(results)


def test_the_fp32_output_matmul_rule_matches_the_installed_torch():
    """train.compat's version rule for ``out_dtype`` matmuls (the chunked loss's fp32
    accumulation) agrees with the installed torch's operator table."""
    assert mm_fp32_out(torch.__version__) == hasattr(torch.ops.aten.addmm, "dtype_out")
    assert mm_fp32_out("2.10.0+cu128") and not mm_fp32_out("2.7.1+cu126")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["compiled", "chunked"])
def test_loss_modes_on_cuda_bf16_with_inductor(monkeypatch, mode):
    """On a GPU with Inductor (the per-chunk math compiled): bf16 hidden states and weight,
    as FSDP2 runs them; loss and gradients within bf16 tolerance of the eager reference."""
    monkeypatch.setattr(loss_mod, "COMPILE_BACKEND", "inductor")
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(4, 512, 256, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (torch.randn(8192, 256, device="cuda", generator=g) * 0.05).bfloat16().requires_grad_()
    t = torch.randint(0, 8192, (4, 512), device="cuda", generator=g)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = F.linear(h, w)
    ref = F.cross_entropy(logits.float().flatten(0, 1), t.flatten())
    ref_gh, ref_gw = torch.autograd.grad(ref, (h, w))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if mode == "chunked":
            loss = ChunkedLossHead(700)(h, w, t)  # 2048 tokens: two full chunks and an uneven one
        else:
            loss = cross_entropy(F.linear(h, w), t, "compiled")
    gh, gw = torch.autograd.grad(loss, (h, w))
    torch.testing.assert_close(loss, ref, rtol=1e-3, atol=1e-3)
    for got, want in ((gh, ref_gh), (gw, ref_gw)):
        assert got.dtype == torch.bfloat16
        err = (got.float() - want.float()).norm() / want.float().norm()
        assert err < 1e-2, f"relative gradient error {err:.2e}"  # bf16 rounds at 4e-3
