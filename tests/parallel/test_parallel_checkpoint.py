"""FSDP2 checkpoints reshard: saved by 2 FSDP ranks (with activation checkpointing
wrappers in the module tree) they load into one plain process without them, and a
checkpoint of one plain process loads into 2 FSDP ranks. Model parameters and AdamW
state arrive unchanged, and training continues from the saved step."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import torch

from testlib import FSDP, full_state, gloo_trainer, load_job, spawn

STEPS = ["train.steps=6"]


def _full_optim(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {fqn: {k: v.detach().clone() for k, v in st.items() if torch.is_tensor(v) and v.ndim > 0}
            for fqn, st in osd["state"].items()}


def _train_and_save(trainer, out: Path, rank: int) -> None:
    for _ in range(2):
        trainer.train_step()
    trainer.save_checkpoint()
    model_sd, optim_sd = full_state(trainer.par.model), _full_optim(trainer.par.model, trainer.optimizer)
    if rank == 0:
        torch.save({"model": model_sd, "optim": optim_sd}, out / "expected.pt")


def _resume_and_compare(trainer, out: Path, step: int) -> None:
    assert trainer.step == step, (trainer.step, step)
    expected = torch.load(out / "expected.pt")
    model_sd, optim_sd = full_state(trainer.par.model), _full_optim(trainer.par.model, trainer.optimizer)
    assert model_sd.keys() == expected["model"].keys()
    for k, v in expected["model"].items():
        torch.testing.assert_close(model_sd[k], v, rtol=0, atol=0, msg=lambda m: f"param {k}: {m}")
    assert optim_sd.keys() == expected["optim"].keys()
    for fqn, state in expected["optim"].items():
        for k, v in state.items():
            torch.testing.assert_close(optim_sd[fqn][k], v, rtol=0, atol=0, msg=lambda m: f"optim {fqn}.{k}: {m}")


def _fsdp_worker(rank, world, out, resume_at):
    """2 FSDP ranks. ``resume_at=None``: train 2 steps with activation checkpointing and
    save; else resume (no AC), compare with what the saver recorded."""
    job = load_job(FSDP + STEPS + ([] if resume_at else ["parallel.ac=full"]))
    trainer = gloo_trainer(job, rank, world, out, resume=bool(resume_at))
    if resume_at:
        _resume_and_compare(trainer, out, resume_at)
        loss, _, _ = trainer.train_step()  # and it trains on
        assert loss == loss
    else:
        assert any("_checkpoint_wrapped_module" in n for n, _ in trainer.par.model.named_parameters())
        _train_and_save(trainer, out, rank)
    trainer.metrics.close()


def _single_worker(out):
    """One process, no process group, plain model: resume the FSDP checkpoint, check it,
    train 2 more steps and save for the way back."""
    import os

    os.environ["OMP_NUM_THREADS"] = "1"
    from train.distributed import DistInfo
    from train.trainer import Trainer

    job = load_job(["train.steps=4"])
    trainer = Trainer(job, DistInfo(0, 0, 1, torch.device("cpu"), None), out, resume=True)
    assert trainer.par.model is trainer.par.inner
    _resume_and_compare(trainer, out, 2)
    _train_and_save(trainer, out, 0)
    trainer.metrics.close()


def test_fsdp_checkpoints_reshard_2_ranks_to_1_plain_rank_and_back(tmp_path):
    spawn(_fsdp_worker, 2, tmp_path, None)  # FSDP x 2 (+AC) saves step 2
    proc = mp.get_context("spawn").Process(target=_single_worker, args=(tmp_path,))
    proc.start()
    proc.join(240)
    assert proc.exitcode == 0, f"single-process resume/save failed (exit {proc.exitcode})"
    spawn(_fsdp_worker, 2, tmp_path, 4)  # FSDP x 2 (no AC) resumes the plain step-4 checkpoint
