"""``train bench comm`` and ``train bench compression`` end to end on CPU (gloo, 2 processes)."""

import json

import pytest

from testlib import torchrun
from train.bench.bandwidth import OPS, bus_factor
from train.config import load_config
from train.models.llama import Transformer, count_params


def test_bench_comm_gloo_writes_report(tmp_path):
    out = tmp_path / "bench"
    r = torchrun(["bench", "comm", "--backend", "gloo", "--min-bytes", "64", "--max-bytes", "64K", "--factor", "32",
                  "--warmup", "2", "--iters", "4", "--p2p-bytes", "16K", "--dtype", "float32,bfloat16",
                  "--out", str(out)], timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    for suffix in ("json", "md", "png"):
        assert (out / f"comm.{suffix}").stat().st_size > 0
        assert (out / f"comm_p2p.{suffix}").stat().st_size > 0
    data = json.loads((out / "comm.json").read_text())
    rows = [row for row in data["rows"] if "error" not in row]
    meta = data["meta"]
    assert meta["backend"] == "gloo" and meta["world_size"] == 2
    assert {row["op"] for row in rows} >= set(OPS)
    assert {row["bytes"] for row in rows if row["op"] == "all_reduce"} == {64, 2048, 65536}
    # CPU: the host cost per call is the only timing column, and the bandwidths come from it
    assert meta["bandwidth_from"] == "host_us" and "wall time of issuing" in meta["host_us"]
    assert "device_us" not in meta and "graph_us" not in meta
    for row in rows:
        assert "device_us" not in row and "graph_us" not in row
        assert row["host_us"] > 0 and 3 <= row["iters"] <= 4 and 1 <= row["batches"] <= 5
        op = row["op"]
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * bus_factor(op, 2))
        assert row["algbw_GBps"] == pytest.approx(row["bytes"] / (row["host_us"] * 1e-6) / 1e9)
    md = (out / "comm.md").read_text()
    assert "| host_us |" in md and "device_us" not in md and "- host_us: µs of the calling Python thread" in md
    ref = meta["raw_reference"]
    assert ref["bytes"] == 65536 and ref["raw_busbw_GBps"] > 0 and ref["calls"] >= 3
    p2p = json.loads((out / "comm_p2p.json").read_text())["rows"]
    assert {(row["src"], row["dst"]) for row in p2p} == {(0, 1), (1, 0)}
    assert all(row["host_us"] > 0 and row["bw_GBps"] > 0 for row in p2p)
    assert "busbw_GBps" in r.stdout and "raw loop" in r.stdout


def test_bench_comm_graph_needs_cuda(tmp_path):
    r = torchrun(["bench", "comm", "--backend", "gloo", "--graph", "--no-p2p", "--out", str(tmp_path / "bench")],
                 timeout=120)
    assert r.returncode != 0 and "exitcode: 2" in r.stderr
    assert "--graph: CUDA graphs need CUDA GPUs and the nccl backend" in r.stderr and "train/bench" not in r.stderr
    assert not (tmp_path / "bench").exists()


def test_bench_comm_needs_torchrun(tmp_path):
    from testlib import train_cli

    # --out in tmp_path: the default (runs/ under the working directory) need not be writable (the image's is not)
    r = train_cli(["bench", "comm", "--backend", "gloo", "--out", str(tmp_path / "bench")])
    assert r.returncode == 2 and "torchrun" in r.stderr


def test_bench_compression_gloo(tmp_path):
    out = tmp_path / "bench"
    overrides = ["model.dim=32", "model.n_layers=2", "model.n_heads=2", "model.vocab_size=64",
                 "data.source=synthetic"]
    args = ["bench", "compression", "--preset", "tiny", "--steps", "8", "--batch", "2", "--seq", "16",
            "--start-iter", "2", "--variants", "none,fp16,powersgd:2,topk:0.01,localsgd:2", "--out", str(out)]
    for o in overrides:
        args += ["--set", o]
    r = torchrun(args, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for suffix in ("json", "md", "png"):
        assert (out / f"compression.{suffix}").stat().st_size > 0
    rows = {row["variant"]: row for row in json.loads((out / "compression.json").read_text())["rows"]}
    assert list(rows) == ["none", "fp16", "powersgd r=2", "topk 1%", "localsgd 2"]
    assert not any("error" in row for row in rows.values()), rows
    job = load_config("tiny", overrides)
    grad_bytes = count_params(Transformer(job.model)) * 4
    assert rows["none"]["MB_per_step"] * 1e6 == pytest.approx(grad_bytes)
    assert rows["fp16"]["MB_per_step"] * 1e6 == pytest.approx(grad_bytes / 2)
    assert rows["powersgd r=2"]["MB_per_step"] < 0.5 * rows["none"]["MB_per_step"]
    assert rows["topk 1%"]["MB_per_step"] < 0.05 * rows["none"]["MB_per_step"]
    # LocalSGD(2): no gradient traffic, the parameters every other step
    assert rows["localsgd 2"]["MB_per_step"] * 1e6 == pytest.approx(grad_bytes / 2)
    for row in rows.values():
        assert row["step_ms"] > 0 and row["exposed_comm_ms"] >= 0 and row["loss"] > 0
        assert len(row["loss_curve"]) == 8
    assert rows["none"]["speedup"] == 1.0
