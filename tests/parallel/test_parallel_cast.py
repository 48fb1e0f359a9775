"""``parallel.fsdp_one_rank=cast`` (train/parallel/cast.py): on one rank, FSDP2's mixed
precision by casting the parameters in the forward gives ``fully_shard``'s trajectory on a
one-rank gloo mesh bit for bit (bf16 on the CPU; with gradient accumulation and with
activation recompute), leaves fp32 parameters with their names and gradients, and is what a
one-rank ``strategy=fsdp`` job gets by default. Also ``parallel.ac_skip_last``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

from testlib import BASE, FSDP, assert_same_trajectory, spawn

BF16 = FSDP + ["train.precision=bf16", "train.steps=4"]
CASES = {
    "plain": [],
    "accum": ["train.batch_size=2", "train.global_batch_size=4"],
    "ac_full": ["parallel.ac=full", "parallel.ac_skip_last=1"],
    # compiled blocks (traced through dynamo and AOT autograd; aot_eager: no code generation)
    # with one block recomputed: the swapped parameters are graph inputs, autocast's casts in it
    "compiled_ac": ["parallel.compile=true", "parallel.compile_backend=aot_eager", "parallel.ac=full",
                    "parallel.ac_skip_last=1"],
}


def test_cast_parameters_swaps_for_the_forward_and_restores():
    from train.parallel.cast import cast_parameters

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16, bias=False))
    model[1].weight = model[0].weight  # tied: one cast, one gradient
    params = dict(model.named_parameters())
    tokens = torch.randint(0, 16, (4,))
    with cast_parameters(model, torch.bfloat16):
        inside = [p for _, p in model.named_parameters(remove_duplicate=False)]
        assert all(p.dtype == torch.bfloat16 and not isinstance(p, nn.Parameter) for p in inside)
        assert inside[0] is inside[1]
        out = model(tokens)
    assert dict(model.named_parameters()) == params  # the same Parameter objects, same names
    assert all(type(p) is nn.Parameter and p.dtype == torch.float32 for p in params.values())
    out.float().square().mean().backward()
    grad = params["0.weight"].grad
    assert grad is not None and grad.dtype == torch.float32

    ref = params["0.weight"].detach().bfloat16().requires_grad_()
    torch.nn.functional.linear(torch.nn.functional.embedding(tokens, ref), ref).float().square().mean().backward()
    torch.testing.assert_close(grad, ref.grad.float())


def test_cast_parameters_restores_after_an_error():
    from train.parallel.cast import cast_parameters

    model = nn.Linear(4, 4)
    weight = model.weight
    try:
        with cast_parameters(model, torch.bfloat16):
            raise RuntimeError("in the forward")
    except RuntimeError:
        pass
    assert model.weight is weight


def _runs(rank, world, result_file):
    from train.config import load_config
    from train.distributed import DistInfo
    from train.trainer import Trainer

    info = DistInfo(rank, rank, world, torch.device("cpu"), "gloo")
    out = {}
    for case, extra in CASES.items():
        for mode in ("cast", "shard"):
            job = load_config(None, BASE + BF16 + extra + [f"parallel.fsdp_one_rank={mode}"])
            trainer = Trainer(job, info, Path(tempfile.mkdtemp()))
            params = list(trainer.par.model.parameters())
            sharded = any(hasattr(p, "full_tensor") for p in params)
            traj = [trainer.train_step()[:2] for _ in range(job.train.steps)]
            full = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in params]
            out[(case, mode)] = (traj, full, sharded, {p.dtype for p in params})
            trainer.metrics.close()
            trainer.release()
    torch.save(out, result_file)


def test_one_rank_fsdp_cast_matches_fully_shard(tmp_path):
    result = tmp_path / "out.pt"
    spawn(_runs, 1, result)
    out = torch.load(result)
    for case in CASES:
        (cast_traj, cast_params, cast_sharded, cast_dtypes) = out[(case, "cast")]
        (ref_traj, ref_params, ref_sharded, _) = out[(case, "shard")]
        assert ref_sharded and not cast_sharded, case  # the default path really skips fully_shard
        assert cast_dtypes == {torch.float32}, case
        # the same bf16 operations in the same order: bit for bit on the CPU
        assert_same_trajectory(cast_traj, ref_traj, case, loss_rtol=0, norm_rtol=0)
        for q, p in zip(cast_params, ref_params):
            torch.testing.assert_close(q, p, rtol=0, atol=0)


def test_ac_skip_last_leaves_the_last_blocks_unwrapped():
    from train.config import load_config
    from train.models.llama import Transformer
    from train.parallel.ac import apply_ac

    job = load_config(None, BASE + ["model.n_layers=4", "parallel.ac=full", "parallel.ac_skip_last=3"])
    with torch.device("meta"):
        model = Transformer(job.model)
    assert apply_ac(model, job.parallel) == 1
    wrapped = ["checkpoint" in type(b).__name__.lower() for b in model.layers.values()]
    assert wrapped == [True, False, False, False]


def _backward_ops(mode: str) -> tuple[dict, float, list]:
    """How often backward runs ``mm`` and ``rsqrt`` (RMSNorm) for one block under
    ``parallel.ac=mode`` (recomputed forward ops included), the loss, and the gradients."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from train.config import load_config
    from train.models.llama import Transformer
    from train.parallel.ac import apply_ac

    job = load_config(None, BASE + ["model.n_layers=1", f"parallel.ac={mode}"])
    model = Transformer(job.model)
    model.init_weights(0)
    apply_ac(model, job.parallel)
    block = next(iter(model.layers.values()))
    counts = {"mm": 0, "rsqrt": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in counts:
                counts[name] += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    h = torch.randn(4, 32, job.model.dim, requires_grad=True)
    loss = block(h, model.rope).square().mean()
    with Count():
        loss.backward()
    return counts, loss.item(), [h.grad] + [p.grad for p in block.parameters()]


def test_pointwise_ac_recomputes_the_elementwise_ops_but_no_matmul():
    """``parallel.ac=pointwise`` keeps every matmul's output: backward runs the same matmuls
    as without AC (``op`` recomputes every second one, ``full`` all of them) but recomputes
    the norms; loss and gradients are the same."""
    ref_counts, ref_loss, ref_grads = _backward_ops("none")
    got = {mode: _backward_ops(mode) for mode in ("pointwise", "op", "full")}
    mm = {mode: r[0]["mm"] for mode, r in got.items()}
    assert mm["pointwise"] == ref_counts["mm"] < mm["op"] < mm["full"], (mm, ref_counts)
    assert got["pointwise"][0]["rsqrt"] > ref_counts["rsqrt"], (got["pointwise"][0], ref_counts)
    for mode, (_, loss, grads) in got.items():
        assert loss == ref_loss, mode
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-7, msg=lambda m: f"{mode}: {m}")


def test_attach_casts_norms_and_embeddings_and_leaves_linears_to_autocast():
    from train.config import load_config
    from train.models.llama import Transformer
    from train.parallel.bundle import Parallelized
    from train.parallel.cast import attach

    job = load_config(None, BASE)
    model = Transformer(job.model)
    model.init_weights(0)
    par = Parallelized(model=model, inner=model)
    attach(par, model, torch.bfloat16, recompute=False, autocast=True)
    seen = {}
    block = next(iter(model.layers.values()))
    for name, module in (("embedding", model.tok_embeddings), ("norm", block.attention_norm),
                         ("linear", block.attention.wq)):
        module.register_forward_pre_hook(lambda m, args, name=name: seen.__setitem__(name, m.weight.dtype))
    params = dict(model.named_parameters())
    tokens = torch.randint(0, job.model.vocab_size, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16), par.forward_context():
        out = model(tokens)
    assert seen == {"embedding": torch.bfloat16, "norm": torch.bfloat16, "linear": torch.float32}
    assert out.dtype == torch.bfloat16
    assert dict(model.named_parameters()) == params
    assert all(type(p) is nn.Parameter and p.dtype == torch.float32 for p in params.values())
    out.float().mean().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params.values())


@pytest.mark.parametrize("extra, applies", [
    ([], True),
    (["parallel.fsdp_one_rank=shard"], False),
    (["train.precision=fp32"], False),
    (["parallel.strategy=ddp"], False),
    (["fp8.backend=te"], False),
])
def test_which_one_rank_jobs_take_the_cast_path(extra, applies):
    from train.config import load_config
    from train.parallel import fsdp
    from train.parallel.cast import cast_applies
    from train.parallel.dims import ParallelDims

    job = load_config(None, BASE + BF16 + extra)
    dims = ParallelDims.resolve(job.parallel, 1, job.model)
    assert cast_applies(job, dims, fsdp.param_dtype(job.parallel, job.train.precision)) is applies
    assert not cast_applies(job, ParallelDims.resolve(job.parallel, 2, job.model),
                            fsdp.param_dtype(job.parallel, job.train.precision))
