"""The demo's training job on real GPUs: NCCL + bf16 picked automatically."""

import pytest

from testlib import torchrun
from train.metrics import read_metrics


@pytest.mark.gpu
@pytest.mark.multigpu
def test_demo_trains_with_nccl_and_bf16_on_two_gpus(tmp_path):
    out = tmp_path / "demo"
    res = torchrun(["run", "--config", "tiny", "--steps", "60", "--out", str(out), "--set", "train.log_every=1"], nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "backend nccl, device cuda | precision bf16" in res.stdout
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0
    assert rows[-1]["peak_mem_gib"] > 0


@pytest.mark.gpu
def test_single_gpu_bf16_run(tmp_path):
    out = tmp_path / "one"
    res = torchrun(["run", "--config", "debug", "--steps", "20", "--out", str(out), "--set", "train.log_every=1"], nproc=1)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "precision bf16" in res.stdout
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[-1]["loss"] < rows[0]["loss"] and rows[-1]["mfu"] is not None
