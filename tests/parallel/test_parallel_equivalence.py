"""Every strategy trains the same model the same way: on a fixed seed, FSDP2, HSDP,
TP (with and without sequence parallel, with loss parallel), FSDP + TP, gradient
accumulation and the activation-checkpointing modes give DDP's loss and clipped
gradient-norm trajectory (fp32 on CPU, gloo, real processes). Also: sharded/TP
initialisation equals the single-process one, and the data-parallel rank/size that the
loader shards by."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from testlib import FSDP, full_state, load_job, spawn

# name -> (overrides, expected (dp_world, tp)) for 2 ranks. The global batch is 8
# sequences everywhere (TP: one data-parallel group of 8).
TWO_RANKS = {
    "ddp": ([], (2, 1)),
    "fsdp": (FSDP, (2, 1)),
    "fsdp_accum": (FSDP + ["train.batch_size=2", "train.global_batch_size=8"], (2, 1)),
    "fsdp_reshard_never_prefetch2": (FSDP + ["parallel.reshard_after_forward=never", "parallel.fsdp_prefetch=2"],
                                     (2, 1)),
    # gloo: symmetric-memory buffers do not apply, FSDP2 keeps its collectives (one warning)
    "fsdp_symm_mem_fallback": (FSDP + ["parallel.fsdp_symm_mem=all"], (2, 1)),
    "hsdp_2x1": (FSDP + ["parallel.dp_replicate=2", "parallel.dp_shard=1"], (2, 1)),
    "tp_sp": (FSDP + ["parallel.tp=2", "train.batch_size=8"], (1, 2)),
    "tp_no_sp": (FSDP + ["parallel.tp=2", "parallel.sequence_parallel=false", "train.batch_size=8"], (1, 2)),
    "tp_loss_parallel": (FSDP + ["parallel.tp=2", "parallel.loss_parallel=true", "train.batch_size=8"], (1, 2)),
    "fsdp_ac_full": (FSDP + ["parallel.ac=full"], (2, 1)),
    "fsdp_ac_selective": (FSDP + ["parallel.ac=selective", "parallel.ac_every=2"], (2, 1)),
    "fsdp_ac_op": (FSDP + ["parallel.ac=op"], (2, 1)),
    "fsdp_ac_full_skip_last": (FSDP + ["parallel.ac=full", "parallel.ac_skip_last=1"], (2, 1)),
    "fsdp_ac_pointwise_skip_last": (FSDP + ["parallel.ac=pointwise", "parallel.ac_skip_last=1"], (2, 1)),
    "ddp_ac_full": (["parallel.ac=full"], (2, 1)),
}

# 4 ranks: real HSDP (2 replicas x 2 shards) and 2-D FSDP + TP; global batch 8.
FOUR_RANKS = {
    "ddp": (["train.batch_size=2"], (4, 1)),
    "hsdp_2x2": (FSDP + ["parallel.dp_replicate=2", "parallel.dp_shard=2", "train.batch_size=2"], (4, 1)),
    "fsdp_tp_2x2": (FSDP + ["parallel.dp_replicate=1", "parallel.dp_shard=2", "parallel.tp=2",
                            "train.batch_size=4"], (2, 2)),
}


def reference_init() -> dict[str, torch.Tensor]:
    """Parameters of the unsharded model initialised in one process."""
    from train.models.llama import Transformer

    job = load_job([])
    with torch.device("meta"):
        model = Transformer(job.model)
    model.to_empty(device="cpu")
    model.init_weights(job.train.seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _run_configs(rank, world, configs, result_file):
    from train.distributed import DistInfo
    from train.trainer import Trainer

    ref = reference_init()
    info = DistInfo(rank, rank, world, torch.device("cpu"), "gloo")
    results = {}
    for name, (extra, (dp_world, tp)) in configs.items():
        job = load_job(extra)
        trainer = Trainer(job, info, Path(tempfile.mkdtemp()))
        par = trainer.par
        assert (par.dp_world, getattr(par.mesh, "tp", 1)) == (dp_world, tp), name
        assert par.dp_rank == rank // tp, (name, par.dp_rank)
        init = full_state(par.model)
        assert init.keys() == ref.keys(), name
        for key, value in ref.items():
            torch.testing.assert_close(init[key], value, rtol=0, atol=0, msg=lambda m: f"{name} init {key}: {m}")
        results[name] = [trainer.train_step()[:2] for _ in range(job.train.steps)]
        if name.startswith(("fsdp_ac_full", "hsdp")):
            _check_host_grad_norm(trainer)
        trainer.metrics.close()
    if rank == 0:
        torch.save(results, result_file)


def _check_host_grad_norm(trainer) -> None:
    """The CPU-offload gradient norm (local squares all-reduced per sharded mesh dim)
    equals DTensor's, and clipping with it scales to the requested norm."""
    from train.parallel.fsdp import clip_host_sharded_grads_

    trainer.forward_backward()
    params = list(trainer.par.model.parameters())
    ref = float(torch.nn.utils.get_total_norm([p.grad for p in params]).full_tensor())
    mine = float(clip_host_sharded_grads_(params, 0.0))
    assert abs(mine - ref) <= 1e-5 * ref, (mine, ref)
    clip_host_sharded_grads_(params, 0.5 * ref)
    clipped = float(torch.nn.utils.get_total_norm([p.grad for p in params]).full_tensor())
    assert abs(clipped - 0.5 * ref) <= 1e-4 * ref, (clipped, ref)
    trainer.optimizer.zero_grad(set_to_none=True)


def _check_against_ddp(results: dict) -> None:
    ddp = results["ddp"]
    for name, traj in results.items():
        for step, ((loss, norm), (ref_loss, ref_norm)) in enumerate(zip(traj, ddp)):
            assert abs(loss - ref_loss) <= 2e-5 * abs(ref_loss), f"{name} step {step + 1}: loss {loss} vs ddp {ref_loss}"
            assert abs(norm - ref_norm) <= 2e-5 * abs(ref_norm), f"{name} step {step + 1}: grad norm {norm} vs ddp {ref_norm}"
    losses = [loss for loss, _ in ddp]
    assert losses[-1] < losses[0], f"loss does not decrease: {losses}"


def test_strategies_and_ac_match_ddp_on_2_ranks(tmp_path):
    out = tmp_path / "results.pt"
    spawn(_run_configs, 2, TWO_RANKS, out)
    results = torch.load(out)
    assert set(results) == set(TWO_RANKS)
    _check_against_ddp(results)


def test_hsdp_and_fsdp_tp_match_ddp_on_4_ranks(tmp_path):
    out = tmp_path / "results.pt"
    spawn(_run_configs, 4, FOUR_RANKS, out)
    _check_against_ddp(torch.load(out))
