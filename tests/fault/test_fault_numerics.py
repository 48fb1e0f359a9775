"""NaN/Inf made for real (absurd learning rate / weight decay) and an unwritable
output directory: the job stops with one line naming the step, never writes a
checkpoint holding NaN/Inf, and keeps the last good one loadable."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from testlib import SMALL_RUN, load_dcp, one_error_line, train_cli
from train.checkpoint import verify

SMALL = SMALL_RUN + ["--set", "metrics.progress=false"]
# the optimizer step queued before the host reads the agreement, the fused AdamW kernel
# skipping a non-finite update itself (found_inf; the default, as on CUDA), or applied
# after the host read it (torch's foreach AdamW: optim.clip_in_step=false on the CPU)
STEP_PATHS = {"device": [], "host": ["--set", "optim.clip_in_step=false"]}


@pytest.mark.parametrize("path", sorted(STEP_PATHS))
def test_nan_skip_is_bounded_then_stops_naming_the_step(tmp_path, path):
    out = tmp_path / "run"
    res = train_cli(["run", "--steps", "40", "--out", str(out), "--checkpoint-every", "1", *SMALL, *STEP_PATHS[path],
                     "--set", "optim.lr=1e6", "--set", "optim.grad_clip=0", "--set", "optim.warmup_steps=0",
                     "--set", "train.nan_policy=skip", "--set", "train.max_nan_skips=2"])
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    skipped = [ln for ln in res.stdout.splitlines() if "update skipped" in ln]
    assert len(skipped) == 2 and "(1/2)" in skipped[0] and "(2/2)" in skipped[1], res.stdout[-3000:]
    first_bad = int(skipped[0].split("at step ")[1].split()[0])
    err = one_error_line(res.stderr)
    assert f"non-finite loss/gradient at step {first_bad + 2} " in err and "stopping" in err
    latest = (out / "checkpoints" / "latest").read_text().strip()
    assert f"last good checkpoint: {out / 'checkpoints' / latest}" in err
    for ckpt in (out / "checkpoints").glob("step_*"):  # every checkpoint kept is complete and finite
        assert verify(ckpt) is None
        assert all(torch.isfinite(t).all() for t in load_dcp(ckpt).values()), ckpt


@pytest.mark.parametrize("path", sorted(STEP_PATHS))
def test_parameters_blown_up_by_the_update_are_never_checkpointed(tmp_path, path):
    # weight decay 1e30 x lr 1e10 multiplies the weights by -1e40 (= -inf in fp32) in the
    # first update, while that step's loss and gradients were still finite.
    out = tmp_path / "run"
    res = train_cli(["run", "--steps", "5", "--out", str(out), "--checkpoint-every", "1", *SMALL, *STEP_PATHS[path],
                     "--set", "optim.lr=1e10", "--set", "optim.weight_decay=1e30", "--set", "optim.warmup_steps=0"])
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "step      1/5 loss" in res.stdout  # the step itself looked fine
    err = one_error_line(res.stderr)
    assert "parameters are NaN/Inf after step 1; checkpoint not written" in err
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


def test_unwritable_out_dir_is_a_usage_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = False
    if os.geteuid() == 0:  # root ignores permission bits: use a read-only filesystem instead
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True)
        if res.returncode != 0:
            pytest.skip(f"running as root and cannot mount a read-only tmpfs: {res.stderr.decode().strip()}")
        mounted = True
    else:
        ro.chmod(0o555)
    try:
        res = train_cli(["run", "--steps", "2", "--out", str(ro / "run"), *SMALL])
        assert res.returncode == 2, res.stderr[-2000:]
        assert f"--out '{ro / 'run'}': '{ro}' is not writable" in one_error_line(res.stderr)
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], capture_output=True)
        else:
            ro.chmod(0o755)


def test_flight_recorder_settings(tmp_path, monkeypatch):
    """--flight-recorder N -> TORCH_FR_BUFFER_SIZE; the trainer then asks NCCL to dump on
    timeout into OUT/flight_recorder unless the user chose a dump path."""
    from train.distributed import flight_recorder_env

    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                 "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert flight_recorder_env(tmp_path / "fr") == {} and not (tmp_path / "fr").exists()
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    applied = flight_recorder_env(tmp_path / "fr")
    prefix = str(tmp_path / "fr" / "nccl_trace_rank_")
    assert applied == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": prefix,
                       "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == prefix and (tmp_path / "fr").is_dir()
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", "/shared/fr_")  # the user's choice wins
    monkeypatch.delenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    monkeypatch.delenv("TORCH_NCCL_DUMP_ON_TIMEOUT")
    assert flight_recorder_env(tmp_path / "other") == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == "/shared/fr_"


def test_restart_hazard_of_the_shared_rendezvous_store(monkeypatch):
    from train.distributed import shared_store_hazard

    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in shared_store_hazard()
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")  # no restarts, no stale keys
    assert shared_store_hazard() is None
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # what =1 makes torchrun export
    assert shared_store_hazard() is None


def test_torchrun_kill_timeout_as_seen_by_a_worker(monkeypatch):
    import inspect

    from torch.distributed.launcher.api import LaunchConfig

    from train.preemption import torchrun_kill_after_s

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert torchrun_kill_after_s() is None  # not under torchrun
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "20")
    configurable = "shutdown_timeout" in inspect.signature(LaunchConfig).parameters
    assert torchrun_kill_after_s() == (20 if configurable else 30)  # torch 2.11 has no such setting
    # the scripts launch renders start torchrun with --signals-to-handle without SIGTERM: it
    # neither forwards a SIGTERM nor SIGKILLs the workers after one
    monkeypatch.delenv("TORCHELASTIC_SIGNALS_TO_HANDLE", raising=False)
    monkeypatch.setenv("PET_SIGNALS_TO_HANDLE", "SIGHUP,SIGQUIT")
    assert torchrun_kill_after_s() is None
    monkeypatch.setenv("PET_SIGNALS_TO_HANDLE", "SIGHUP, SIGTERM")
    assert torchrun_kill_after_s() == (20 if configurable else 30)
    # what torchrun exports to its workers is what it handles (its command line wins over PET_)
    monkeypatch.setenv("PET_SIGNALS_TO_HANDLE", "SIGHUP")
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT")
    assert torchrun_kill_after_s() == (20 if configurable else 30)
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGHUP,SIGQUIT")
    assert torchrun_kill_after_s() is None


def test_torchrun_kill_warning_only_for_a_chosen_grace(monkeypatch, caplog):
    """The default train.shutdown_grace_s says nothing at every start; a grace the user set beyond
    what torchrun allows is named."""
    import signal

    from train import preemption as pre

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("PET_SIGNALS_TO_HANDLE", raising=False)
    monkeypatch.delenv("TORCHELASTIC_SIGNALS_TO_HANDLE", raising=False)
    monkeypatch.setattr(pre, "torchrun_kill_after_s", lambda: 30)
    saved = {s: signal.getsignal(s) for s in pre.PREEMPT_SIGNALS}
    try:
        with caplog.at_level("WARNING", logger="train.preemption"):
            pre.Preemption(120, chosen=False).install()
            assert "SIGKILLs" not in caplog.text
            pre.Preemption(120, chosen=True).install()
            assert "train.shutdown_grace_s=120s" in caplog.text
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
