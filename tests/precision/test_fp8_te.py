"""Transformer Engine FP8 (``fp8.backend=te``). These tests skip where TE is not installed
(with that reason); on the GPU machines they run after ``scripts/gpu/te.sh install``
(docs/results/h200x2-te/pytest.log)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from testlib import BASE, FP8_SMALL, GPU_RUN, assert_learns, train_cli

needs_te = pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None,
    reason="Transformer Engine is not installed (needs CUDA: pip install 'transformer-engine[pytorch]>=2.9' "
           "or an NGC container); on the GPU machines: scripts/gpu/te.sh",
)


@needs_te
def test_block_linears_become_te_linear_on_meta_with_unchanged_names():
    import transformer_engine.pytorch as te

    from train.config import load_config
    from train.models.llama import Output, Transformer
    from train.parallel.dims import ParallelDims
    from train.precision.fp8 import apply_float8

    job = load_config(None, BASE + FP8_SMALL + ["fp8.backend=te"])
    with torch.device("meta"):
        plain = Transformer(job.model)
        model = apply_float8(Transformer(job.model), job.fp8, torch.device("cpu"), ParallelDims.from_job(job, 1))
    swapped = sorted(n for n, m in model.named_modules() if isinstance(m, te.Linear))
    assert len(swapped) == 10, swapped  # wq, wo, w1, w2, w3 in 2 blocks; wk/wv (32 -> 8) stay
    assert type(model.output) is Output  # the output projection stays in high precision
    assert not [(n, p.device) for n, p in model.named_parameters() if p.device.type != "meta"]
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]


@needs_te
def test_forward_context_is_te_autocast_with_the_recipe():
    from transformer_engine.common import recipe

    from train.precision.fp8_te import forward_context, make_recipe

    assert isinstance(make_recipe("current"), recipe.Float8CurrentScaling)
    assert isinstance(make_recipe("delayed"), recipe.DelayedScaling)
    assert isinstance(make_recipe("mxfp8"), recipe.MXFP8BlockScaling)
    assert callable(forward_context("current"))


@pytest.mark.gpu
@needs_te
@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_gpu_te_fp8_trains(tmp_path, recipe):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs sm_89+")
    res = train_cli(GPU_RUN + ["--out", str(tmp_path / "run"), "--set", "fp8.backend=te",
                               "--set", f"fp8.recipe={recipe}"])
    assert_learns(res, tmp_path / "run")


@pytest.mark.gpu
@pytest.mark.multigpu
@needs_te
def test_gpu_te_fsdp2_shards_te_weights_checkpoints_and_resumes(tmp_path):
    """FSDP2 over TE layers on 2 GPUs: the start-up line counts the te.Linear layers with
    sharded (DTensor) weights; a TE checkpoint is resumed and training goes on from its step."""
    if torch.cuda.device_count() < 2 or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs 2 GPUs of sm_89+")
    from testlib import run_losses, torchrun  # noqa: I001

    out = tmp_path / "run"
    common = ["--out", str(out), "--set", "fp8.backend=te", "--set", "parallel.strategy=fsdp",
              "--set", "checkpoint.every=10"]
    first = torchrun(GPU_RUN + common + ["--set", "checkpoint.final=true"], nproc=2)
    assert_learns(first, out)
    assert "fp8 te current:" in first.stderr + first.stdout and "with sharded weights (DTensor)" in first.stderr + first.stdout
    again = torchrun([a if a != "30" else "40" for a in GPU_RUN] + common + ["--resume"], nproc=2)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr + again.stdout, (again.stderr + again.stdout)[-3000:]
    losses = run_losses(out)
    assert losses and all(x == x for x in losses), losses
