"""torchao FP8: which layers become ``Float8Linear`` (the output projection and layers
with dims not multiple of 16, times the TP degree, stay ``nn.Linear``); FSDP2 + tensorwise
all-gathers float8 weights and precomputes their scales after each optimizer step.

CPU tests use torchao's emulation (``Float8LinearConfig.emulate``: float8 rounding,
high-precision matmuls) since CPUs have no FP8 matmul; they skip where torchao is not
installed. The GPU tests train with real FP8 matmuls."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from testlib import BASE, FP8_SMALL, FSDP, GPU_RUN, assert_learns, spawn, torchrun, train_cli

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="torchao is not installed (pip install 'torchao>=0.17')")
BLOCK_LINEARS = ["attention.wq", "attention.wo", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]


def _meta_model(extra):
    from train.config import load_config
    from train.models.llama import Transformer

    job = load_config(None, BASE + FP8_SMALL + ["fp8.backend=torchao"] + list(extra))
    with torch.device("meta"):
        return job, Transformer(job.model)


@needs_torchao
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_block_linears_become_float8_output_and_odd_dims_stay(recipe):
    from torchao.float8.float8_linear import Float8Linear

    from train.models.llama import Output
    from train.parallel.dims import ParallelDims
    from train.precision.fp8 import apply_float8

    job, model = _meta_model([f"fp8.recipe={recipe}"])
    model = apply_float8(model, job.fp8, torch.device("cpu"), ParallelDims.from_job(job, 1))
    converted = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
    assert converted == sorted(f"layers.{i}.{name}" for i in range(2) for name in BLOCK_LINEARS)
    assert type(model.output) is Output  # the output projection stays in high precision
    assert type(model.layers["0"].attention.wk) is nn.Linear  # 32 -> 8
    assert all(m.config.enable_fsdp_float8_all_gather is False for n, m in model.named_modules()
               if isinstance(m, Float8Linear)), "no FSDP here: no float8 all-gather"


@needs_torchao
def test_mxfp8_wraps_block_weights_and_survives_materialization():
    from train.parallel.dims import ParallelDims
    from train.precision.fp8 import apply_float8, torch_supports_torchao_mxfp8

    if not torch_supports_torchao_mxfp8():
        pytest.skip(f"torchao MXFP8 training needs a newer torch than {torch.__version__}")
    from torchao.prototype.moe_training.tensor import MXFP8TrainingWeightWrapperTensor

    job, model = _meta_model(["fp8.recipe=mxfp8", "model.dim=64", "model.n_kv_heads=2"])  # wk: 64 -> 32
    model = apply_float8(model, job.fp8, torch.device("cpu"), ParallelDims.from_job(job, 1))
    model.to_empty(device="cpu")
    model.init_weights(0)
    wrapped = sorted(n for n, p in model.named_parameters() if isinstance(p.data, MXFP8TrainingWeightWrapperTensor))
    assert wrapped == sorted(f"layers.{i}.{name}.weight" for i in range(2)
                             for name in BLOCK_LINEARS + ["attention.wk", "attention.wv"])
    assert not isinstance(model.output.weight.data, MXFP8TrainingWeightWrapperTensor)


@needs_torchao
def test_tp_degree_tightens_the_filter():
    from train.precision.fp8_torchao import module_filter

    keep = module_filter(16, tp=2)
    assert keep(nn.Linear(32, 32), "layers.0.attention.wq")
    assert not keep(nn.Linear(32, 16), "layers.0.attention.wk")  # 8 per TP shard
    assert not keep(nn.Linear(64, 64), "output")


def _fsdp_float8_worker(rank, world, recipe, result_file):
    import torch.nn.functional as F
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    from train.distributed import DistInfo
    from train.optim import build_optimizer
    from train.parallel import parallelize
    from train.parallel.dims import ParallelDims
    from train.precision.fp8 import apply_float8

    job, model = _meta_model(FSDP + [f"fp8.recipe={recipe}", "optim.grad_clip=0", "optim.lr=0.02"])
    info = DistInfo(rank, rank, world, torch.device("cpu"), "gloo")
    model = apply_float8(model, job.fp8, info.device, ParallelDims.from_job(job, world), emulate=True)

    def materialize(m):
        m.to_empty(device="cpu")
        m.init_weights(job.train.seed)

    par = parallelize(model, job, info, materialize)
    float8 = [m for m in par.inner.modules() if isinstance(m, Float8Linear)]
    f8_all_gather = [isinstance(m.weight.to_local(), WeightWithDynamicFloat8CastTensor) for m in float8]
    opt = build_optimizer(par.model, job.optim, info.device)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (8, 33), generator=g)[rank * 4:(rank + 1) * 4]
    losses = []
    for _ in range(6):  # memorise 4 sequences: the loss must fall fast
        loss = F.cross_entropy(par.model(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        for hook in par.after_optimizer_step:
            hook()
        losses.append(loss.item())
    if rank == 0:
        torch.save({"n_float8": len(float8), "all_gather": f8_all_gather, "hooks": len(par.after_optimizer_step),
                    "losses": losses}, result_file)


@needs_torchao
@pytest.mark.parametrize("recipe,all_gather", [("tensorwise", True), ("rowwise", False)])
def test_fsdp_float8_all_gather_and_scale_precompute(tmp_path, recipe, all_gather):
    out = tmp_path / "fp8.pt"
    spawn(_fsdp_float8_worker, 2, recipe, out)
    res = torch.load(out)
    assert res["n_float8"] == 10
    assert res["all_gather"] == [all_gather] * 10
    assert res["hooks"] == (1 if all_gather else 0)
    losses = res["losses"]
    assert all(x == x for x in losses) and losses[-1] < 0.7 * losses[0], losses


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@needs_torchao
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_gpu_torchao_fp8_trains_and_layers_are_float8(tmp_path, recipe):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip(f"FP8 needs sm_89+, this GPU is sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    from torchao.float8.float8_linear import Float8Linear

    from train.config import load_config
    from train.distributed import DistInfo
    from train.models.llama import Output
    from train.trainer import Trainer

    job = load_config("debug", ["fp8.backend=torchao", f"fp8.recipe={recipe}", "train.steps=2",
                                "data.source=synthetic", "checkpoint.final=false", "metrics.progress=false"])
    trainer = Trainer(job, DistInfo(0, 0, 1, torch.device("cuda", 0), None), tmp_path / "types")
    try:
        kinds = {type(m) for n, m in trainer.par.model.named_modules() if n.startswith("layers.") and
                 isinstance(m, nn.Linear)}
        assert kinds == {Float8Linear}, kinds
        output = trainer.par.model.output  # the output projection stays in high precision
        assert isinstance(output, Output) and not isinstance(output, Float8Linear), type(output)
        trainer.train_step()
    finally:
        trainer.metrics.close()

    res = train_cli(GPU_RUN + ["--out", str(tmp_path / "run"), "--set", "fp8.backend=torchao",
                               "--set", f"fp8.recipe={recipe}"])
    assert_learns(res, tmp_path / "run")


@pytest.mark.gpu
@pytest.mark.multigpu
@needs_torchao
def test_gpu_fsdp_float8_all_gather_trains_on_2_gpus(tmp_path):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs sm_89+")
    res = torchrun(GPU_RUN + ["--out", str(tmp_path / "run"), "--set", "fp8.backend=torchao",
                              "--set", "parallel.strategy=fsdp"], nproc=2)
    assert_learns(res, tmp_path / "run")
