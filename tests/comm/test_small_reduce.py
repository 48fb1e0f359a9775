"""comm.small_reduce: the per-step small all-reduce through NCCL or symmetric memory.

On CPU (2 gloo processes) symm_mem falls back to the process group's all-reduce with a
logged warning and gives the same sums; the config key is validated; ``train bench comm
--impl`` gives a latency table with gloo (nccl column) and refuses symm_mem without CUDA.
On 2 GPUs (gpu, multigpu): the one-shot kernel is really used and sums as NCCL does, and
the latency table has no errors."""

from __future__ import annotations

import json
import logging
import sys
import textwrap

import pytest
import torch

from testlib import free_port, gloo_runs, run, spawn, torchrun
from train.config import load_config
from train.errors import ConfigError


def test_config_small_reduce():
    assert load_config(None, []).comm.small_reduce == "nccl"
    assert load_config(None, ["comm.small_reduce=symm_mem"]).comm.small_reduce == "symm_mem"
    with pytest.raises(ConfigError, match="comm.small_reduce: must be nccl or symm_mem, got 'nvls'"):
        load_config(None, ["comm.small_reduce=nvls"])


def _gloo_worker(rank, world, result_file):
    from train.comm.small_reduce import SmallReduce, small_all_reduce

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("train.comm.small_reduce").addHandler(handler)
    vec = torch.tensor([1.5 * (rank + 1), float(rank), 0.0, 1.0])
    sums = {}
    for impl in ("nccl", "symm_mem"):
        for _ in range(2):  # the second call reuses the cached reducer
            sums.setdefault(impl, []).append(small_all_reduce(vec.clone(), impl).tolist())
    reducer = SmallReduce("symm_mem", 4, torch.float32, torch.device("cpu"))
    if rank == 0:
        torch.save({"sums": sums, "impl": reducer.impl, "warnings": [r.getMessage() for r in records]}, result_file)


def test_symm_mem_falls_back_to_the_process_group_on_gloo(tmp_path):
    out = tmp_path / "r.pt"
    spawn(_gloo_worker, 2, out)
    r = torch.load(out)
    want = [1.5 + 3.0, 1.0, 0.0, 2.0]
    assert r["sums"]["nccl"] == [want, want] and r["sums"]["symm_mem"] == [want, want]
    assert r["impl"] == "nccl"
    assert any("symmetric memory unavailable (needs CUDA tensors); using NCCL" in w for w in r["warnings"]), r
    assert len([w for w in r["warnings"] if "unavailable" in w]) == 2  # once per reducer, not per call


def _trainer_worker(rank, world, result_file):
    base = ["model.dim=32", "model.n_layers=2", "model.n_heads=2", "model.vocab_size=64", "train.seq_len=16",
            "train.batch_size=2", "train.device=cpu", "data.source=synthetic", "checkpoint.final=false",
            "checkpoint.resume=never", "metrics.progress=false"]
    jobs = {impl: load_config(None, [*base, f"comm.small_reduce={impl}"]) for impl in ("nccl", "symm_mem")}
    gloo_runs(rank, world, jobs, lambda trainer: [trainer.train_step() for _ in range(3)], result_file)


def test_trainer_agreement_with_symm_mem_setting_on_gloo(tmp_path):
    """The trainer's per-step agreement (mean loss, NaN, stop) is the same with either setting."""
    out = tmp_path / "r.pt"
    spawn(_trainer_worker, 2, out)
    r = torch.load(out)
    assert r["symm_mem"] == r["nccl"] and len(r["nccl"]) == 3


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


@pytest.mark.parametrize(("args", "message"), [
    (["--impl", "symm_mem"], "--impl symm_mem: needs CUDA GPUs and the nccl backend"),
    (["--impl", "nvls"], "--impl: unknown 'nvls' (valid: nccl, symm_mem)"),
    (["--impl", "nccl", "--recommend"], "--recommend needs all_reduce in --ops (and no --impl)"),
])
def test_bench_comm_impl_usage_errors(tmp_path, args, message):
    r = torchrun(["bench", "comm", "--backend", "gloo", "--out", str(tmp_path), *args], timeout=120)
    assert r.returncode != 0 and "exitcode: 2" in r.stderr  # each rank: one line, exit 2 (torchrun reports it)
    assert message in r.stderr and "train/bench" not in r.stderr, r.stderr[-2000:]
    assert not list(tmp_path.iterdir())


_GPU_SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    sys.path.insert(0, os.getcwd())
    from train.comm.small_reduce import SmallReduce
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    dev = torch.device("cuda", rank)
    reducer = SmallReduce("symm_mem", 4, torch.float32, dev)
    assert reducer.impl == "symm_mem", reducer.impl
    for step in range(50):
        vec = torch.tensor([0.1 * step + rank, float(rank), 1.0, float("nan") if step == 7 else 0.0], device=dev)
        ref = vec.clone()
        dist.all_reduce(ref)
        got = reducer(vec)
        assert torch.equal(got[:3], ref[:3]) and (got[3].isnan() == ref[3].isnan()), (step, got, ref)
    dist.destroy_process_group()
    print("OK", rank)
""")


@pytest.mark.gpu
@pytest.mark.multigpu
def test_symm_mem_one_shot_matches_nccl_on_2_gpus(tmp_path):
    script = tmp_path / "symm.py"
    script.write_text(_GPU_SCRIPT)
    env = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0", "CUDA_VISIBLE_DEVICES": "0,1"}
    r = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(script)], env, timeout=240)
    assert r.returncode == 0 and "OK 0" in r.stdout, r.stderr[-3000:]


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
