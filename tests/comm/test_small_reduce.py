"""Small-message all-reduce latency: ``train bench comm --impl`` gives a latency table with
gloo (nccl column) and refuses symm_mem without CUDA; on 2 GPUs (gpu, multigpu) the
symmetric-memory kernels' table has no errors. The trainer's per-step agreement is the
process group's all-reduce (``comm.small_reduce`` is gone)."""

from __future__ import annotations

import json

import pytest

from testlib import torchrun, train_cli
from train.config import load_config
from train.errors import ConfigError


def test_small_reduce_key_removed():
    """The per-step agreement runs on the process group's all-reduce: the symmetric-memory
    variant measured no faster in the step (docs/plan.md) and its key is gone."""
    with pytest.raises(ConfigError, match="comm.small_reduce: unknown key"):
        load_config(None, ["comm.small_reduce=nccl"])


def test_bench_comm_impl_latency_table_on_gloo(tmp_path):
    r = torchrun(["bench", "comm", "--backend", "gloo", "--impl", "nccl", "--min-bytes", "4K", "--max-bytes", "16K",
                  "--warmup", "2", "--iters", "3", "--out", str(tmp_path)], timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "latency.json").read_text())
    assert data["meta"]["impls"] == ["nccl"] and data["meta"]["backend"] == "gloo"
    assert [row["bytes"] for row in data["rows"]] == [4096, 8192, 16384]
    assert all(row["nccl_host_us"] > 0 and row["best"] == "nccl" and "error" not in row for row in data["rows"])
    assert not [key for row in data["rows"] for key in row if "device" in key or "graph" in key]  # CPU: host only
    assert "nccl_host_us" in r.stdout and "best" in r.stdout and "nccl_device_us" not in r.stdout


def test_bench_comm_impl_usage_error_under_torchrun(tmp_path):
    r = torchrun(["bench", "comm", "--backend", "gloo", "--out", str(tmp_path), "--impl", "symm_mem"], timeout=120)
    assert r.returncode != 0 and "exitcode: 2" in r.stderr  # each rank: one line, exit 2 (torchrun reports it)
    assert "--impl symm_mem: needs CUDA GPUs and the nccl backend" in r.stderr, r.stderr[-2000:]
    assert "train/bench" not in r.stderr and not list(tmp_path.iterdir())


@pytest.mark.parametrize(("args", "message"), [
    (["--impl", "nvls"], "--impl: unknown 'nvls' (valid: nccl, symm_mem)"),
    (["--impl", "nccl", "--recommend"], "--recommend needs all_reduce in --ops (and no --impl)"),
])
def test_bench_comm_impl_usage_errors(tmp_path, args, message):
    """Refused before any process group exists: one process shows it (the torchrun case above
    shows each rank doing the same)."""
    r = train_cli(["bench", "comm", "--backend", "gloo", "--out", str(tmp_path), *args], timeout=120)
    errors = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(errors) == 1 and message in errors[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not list(tmp_path.iterdir())


@pytest.mark.gpu
@pytest.mark.multigpu
def test_bench_comm_latency_nccl_vs_symm_mem(tmp_path):
    r = torchrun(["bench", "comm", "--impl", "nccl,symm_mem", "--min-bytes", "4K", "--max-bytes", "64K",
                  "--factor", "4", "--graph", "--out", str(tmp_path)],
                 extra_env={"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "latency.json").read_text())
    assert data["meta"]["impls"] == ["nccl", "one_shot", "two_shot"]
    assert not [row for row in data["rows"] if "error" in row], data["rows"]
    for row in data["rows"]:
        for k in ("nccl", "one_shot", "two_shot"):
            assert row[f"{k}_device_us"] > 0 and row[f"{k}_graph_us"] > 0 and row[f"{k}_host_us"] > 0
        assert row["best"] in data["meta"]["impls"] and row["best_graph"] in data["meta"]["impls"]
