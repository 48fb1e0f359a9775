"""optim.clip_in_step: the gradient clip applied inside torch's fused AdamW kernel (its
``grad_scale``) gives the step of clip_grad_norm_ + AdamW: one tensor, and the trainer's loss,
gradient-norm and parameter trajectories in one process and over 2 gloo ranks with FSDP2
(DTensor gradients) and DDP, gradient accumulation included."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from testlib import BASE, TRAJECTORY_STRATEGIES, assert_same_trajectory, rank0_result
from train.optim import clip_divisor


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(n, m, generator=g)) for n, m in ((7, 5), (3, 11), (13, 1))]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g) * 3
    return ps


def _clone(ps):
    out = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    for q, p in zip(out, ps):
        q.grad = p.grad.clone()
    return out


def test_grad_scale_equals_clip_then_step():
    for max_norm in (0.5, 1e6):  # clipping active, and a no-op (divisor exactly 1)
        ref, new = _params(), None
        new = _clone(ref)
        opt_ref = torch.optim.AdamW(ref, lr=0.1, weight_decay=0.1, fused=True)
        opt_new = torch.optim.AdamW(new, lr=0.1, weight_decay=0.1, fused=True)
        for _ in range(3):
            norm_ref = torch.nn.utils.clip_grad_norm_(ref, max_norm, foreach=True)
            opt_ref.step()
            norm = torch.nn.utils.get_total_norm([p.grad for p in new], foreach=True)
            assert torch.equal(norm, norm_ref)
            opt_new.grad_scale = clip_divisor(norm, max_norm)
            opt_new.step()
            del opt_new.grad_scale
            for q, p in zip(new, ref):
                torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
                g = torch.randn(p.shape)
                p.grad, q.grad = g.clone(), g.clone()
        if max_norm > 1e5:
            assert all(torch.equal(q, p) for q, p in zip(new, ref))


def _trajectories(rank, world, strategies, result_file):
    from train.config import load_config
    from train.distributed import DistInfo
    from train.trainer import Trainer

    info = DistInfo(rank, rank, world, torch.device("cpu"), "gloo" if world > 1 else None)
    results = {}
    for strategy, extra in strategies.items():
        for fold in ("false", "true"):
            job = load_config(None, BASE + extra + [f"optim.clip_in_step={fold}", "train.steps=4"])
            trainer = Trainer(job, info, Path(tempfile.mkdtemp()))
            assert trainer.clip_in_step is (fold == "true")
            traj = [trainer.train_step()[:2] for _ in range(job.train.steps)]
            params = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
                      for p in trainer.par.model.parameters()]
            results[(strategy, fold)] = (traj, params)
            trainer.metrics.close()
            trainer.release()
    if rank == 0:
        torch.save(results, result_file)


def _check(results):
    for strategy in {s for s, _ in results}:
        (ref, ref_params), (new, new_params) = results[(strategy, "false")], results[(strategy, "true")]
        assert ref[0][1] > 0.5, f"{strategy}: clipping not active (norm {ref[0][1]})"
        assert_same_trajectory(new, ref, strategy, norm_rtol=1e-5)
        for q, p in zip(new_params, ref_params):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


def test_trainer_clip_in_step_in_one_process(tmp_path):
    _check(rank0_result(_trajectories, tmp_path, 1, {"single": []}))


def test_trainer_clip_in_step_with_fsdp2_and_ddp_on_2_gloo_ranks(tmp_path):
    results = rank0_result(_trajectories, tmp_path, 2, TRAJECTORY_STRATEGIES)
    assert len(results) == 2 * len(TRAJECTORY_STRATEGIES)
    _check(results)
