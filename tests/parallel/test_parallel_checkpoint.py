"""FSDP2 checkpoints reshard: saved by 2 FSDP ranks (with activation checkpointing
wrappers in the module tree) they load into one plain process without them, and a
checkpoint of one plain process loads into 2 FSDP ranks. Model parameters and AdamW
state arrive unchanged, and training continues from the saved step."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import torch

from dist_utils import spawn
from test_parallel_equivalence import FSDP, full_state, load_job

STEPS = ["train.steps=2"]


def _full_optim(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {fqn: {k: v.detach().clone() for k, v in st.items() if torch.is_tensor(v) and v.ndim > 0}
            for fqn, st in osd["state"].items()}


def _train_and_save(trainer, out: Path, rank: int) -> None:
    for _ in range(2):
        trainer.train_step()
        trainer.step += 1
    trainer.save_checkpoint()
    model_sd, optim_sd = full_state(trainer.par.model), _full_optim(trainer.par.model, trainer.optimizer)
    if rank == 0:
        torch.save({"model": model_sd, "optim": optim_sd}, out / "expected.pt")


def _resume_and_compare(trainer, out: Path) -> None:
    assert trainer.step == 2, trainer.step
    expected = torch.load(out / "expected.pt")
    model_sd, optim_sd = full_state(trainer.par.model), _full_optim(trainer.par.model, trainer.optimizer)
    assert model_sd.keys() == expected["model"].keys()
    for k, v in expected["model"].items():
        torch.testing.assert_close(model_sd[k], v, rtol=0, atol=0, msg=lambda m: f"param {k}: {m}")
    assert optim_sd.keys() == expected["optim"].keys()
    for fqn, state in expected["optim"].items():
        for k, v in state.items():
            torch.testing.assert_close(optim_sd[fqn][k], v, rtol=0, atol=0, msg=lambda m: f"optim {fqn}.{k}: {m}")
    loss, _, _ = trainer.train_step()  # and it trains on
    assert loss == loss


def _fsdp_worker(rank, world, out, resume):
    from train.dist import DistInfo
    from train.trainer import Trainer

    job = load_job(FSDP + STEPS + ([] if resume else ["parallel.ac=full"]))
    trainer = Trainer(job, DistInfo(rank, rank, world, torch.device("cpu"), "gloo"), out, resume=resume)
    if resume:
        _resume_and_compare(trainer, out)
    else:
        assert any("_checkpoint_wrapped_module" in n for n, _ in trainer.par.model.named_parameters())
        _train_and_save(trainer, out, rank)
    trainer.metrics.close()


def _single_worker(out, resume):
    """One process, no process group: the plain model (``parallelize`` wraps nothing)."""
    import os

    os.environ["OMP_NUM_THREADS"] = "1"
    from train.dist import DistInfo
    from train.trainer import Trainer

    trainer = Trainer(load_job(STEPS), DistInfo(0, 0, 1, torch.device("cpu"), None), out, resume=resume)
    assert trainer.par.model is trainer.par.inner
    if resume:
        _resume_and_compare(trainer, out)
    else:
        _train_and_save(trainer, out, 0)
    trainer.metrics.close()


def _single(out: Path, resume: bool) -> None:
    proc = mp.get_context("spawn").Process(target=_single_worker, args=(out, resume))
    proc.start()
    proc.join(240)
    assert proc.exitcode == 0, f"single-process {'resume' if resume else 'save'} failed (exit {proc.exitcode})"


def test_fsdp_checkpoint_from_2_ranks_loads_on_1_plain_rank(tmp_path):
    spawn(_fsdp_worker, 2, tmp_path, False)
    _single(tmp_path, True)


def test_plain_checkpoint_from_1_rank_loads_on_2_fsdp_ranks(tmp_path):
    _single(tmp_path, False)
    spawn(_fsdp_worker, 2, tmp_path, True)
