"""End-to-end runs of ``train run``: 2 real processes under torchrun (gloo)."""

import json

import torch

from testlib import SMALL_RUN, load_dcp, torchrun, train_cli
from train.metrics import read_metrics

SMALL = SMALL_RUN + ["--set", "optim.warmup_steps=2"]


def test_two_process_run_learns_and_writes_metrics(tmp_path):
    out = tmp_path / "run"
    res = torchrun(["run", "--steps", "30", "--out", str(out), *SMALL])
    assert res.returncode == 0, res.stderr[-3000:]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert {"step", "loss", "tokens_per_s", "mfu", "step_time_s"} <= rows[0].keys()
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert "=== summary ===" in res.stdout and "checkpoint" in res.stdout
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_00000030"
    manifest = json.loads((out / "checkpoints" / "step_00000030" / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and "extra_rank1.pt" in manifest["files"]


def test_resume_is_bitwise_identical(tmp_path, checkpoint_mode):
    straight, split = tmp_path / "straight", tmp_path / "split"
    # every=8: the straight run's step-8 checkpoint is (async:) written in the background
    # while steps 9+ run; the split run resumes from its final step-8 checkpoint.
    common = [*SMALL, "--set", "optim.decay_steps=16", "--set", "checkpoint.every=8", *checkpoint_mode]
    a = torchrun(["run", "--steps", "16", "--out", str(straight), *common])
    assert a.returncode == 0, a.stderr[-3000:]
    b1 = torchrun(["run", "--steps", "8", "--out", str(split), *common])
    assert b1.returncode == 0, b1.stderr[-3000:]
    b2 = torchrun(["run", "--steps", "16", "--out", str(split), "--resume", *common])
    assert b2.returncode == 0, b2.stderr[-3000:]
    assert "resumed from" in b2.stdout and "at step 8" in b2.stdout
    la = read_metrics(straight / "metrics.jsonl")
    lb = read_metrics(split / "metrics.jsonl")
    assert [r["step"] for r in lb] == list(range(1, 17))
    assert [r["loss"] for r in la] == [r["loss"] for r in lb]  # every step, bitwise
    pa = load_dcp(straight / "checkpoints" / "step_00000016", "model.")
    pb = load_dcp(split / "checkpoints" / "step_00000016", "model.")
    assert pa.keys() == pb.keys() and len(pa) > 5
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k


def test_single_process_without_torchrun(tmp_path):
    res = train_cli(["run", "--steps", "3", "--out", str(tmp_path / "one"), *SMALL])
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(read_metrics(tmp_path / "one" / "metrics.jsonl")) == 3


def test_nan_loss_stops_naming_the_step_and_keeps_last_checkpoint(tmp_path):
    out = tmp_path / "nan"
    res = train_cli(["run", "--steps", "40", "--out", str(out), "--checkpoint-every", "2", *SMALL,
                     "--set", "optim.lr=1e6", "--set", "optim.grad_clip=0", "--set", "optim.warmup_steps=0"])
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "non-finite loss/gradient at step" in err[0], res.stderr[-2000:]
    latest = (out / "checkpoints" / "latest").read_text().strip()
    params = load_dcp(out / "checkpoints" / latest, "model.")
    assert all(torch.isfinite(t).all() for t in params.values())


def test_a_resume_with_nothing_left_to_train_says_so(capsys, tmp_path):
    """A resumed run already at or past train.steps (a requeued finished job, or a smaller
    --steps): exit 0 with one line that says so, not a summary of NaN losses."""
    from train.cli import _print_summary
    from train.trainer import Summary

    _print_summary(Summary(start_step=40, final_step=40, checkpoint="r/checkpoints/step_00000040"), tmp_path, 10)
    out = capsys.readouterr().out.strip()
    assert out == ("nothing to train: the run is at step 40 and train.steps is 10; raise --steps to continue "
                   "(checkpoint r/checkpoints/step_00000040)")
    _print_summary(Summary(start_step=0, final_step=2, steps_run=2, first_loss=5.0, last_loss=4.0), tmp_path, 2)
    assert "=== summary ===" in capsys.readouterr().out
