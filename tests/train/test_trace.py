"""``metrics.trace_steps``: a real torch.profiler trace of 2 steps from 2 gloo ranks."""

from __future__ import annotations

import json

from testlib import SMALL_RUN, torchrun, train_cli
from train.trace import exposed_communication

SMALL = SMALL_RUN + ["--set", "metrics.progress=false"]


def test_two_step_trace_per_rank_is_valid_json_with_step_and_phase_names(tmp_path):
    out = tmp_path / "run"
    res = torchrun(["run", "--steps", "3", "--out", str(out), "--checkpoint-every", "2", *SMALL,
                    "--set", "metrics.trace_steps=1:2"])
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        trace = json.loads((out / "traces" / f"rank{rank}.json").read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"train_step#1", "train_step#2", "forward", "backward", "optimizer", "checkpoint"} <= names
        assert "train_step#3" not in names  # the window is steps 1..2 only
        assert any(str(n).startswith("c10d::") for n in names)  # the gloo collectives are in it
    log = res.stdout + res.stderr
    for rank in (0, 1):
        assert f"[trace rank {rank}] steps 1-2: trace written to" in log
        assert f"[trace rank {rank}] communication:" in log
    assert "top ops by self cpu time total" in log


def test_bad_trace_window_is_a_config_error(tmp_path):
    res = train_cli(["run", "--out", str(tmp_path / "x"), "--set", "metrics.trace_steps=5:2"])
    assert res.returncode == 2 and "metrics.trace_steps: needs 1 <= A <= B" in res.stderr


def test_exposed_communication_counts_only_nccl_time_outside_compute(tmp_path):
    """The interval arithmetic on a GPU-shaped trace: compute 0-10 and 20-30 us, NCCL 5-25 us
    (exposed 10-20: 10 us) and 40-45 us (all exposed: 5 us)."""
    ev = [{"ph": "X", "cat": "kernel", "name": n, "ts": s, "dur": d} for n, s, d in
          [("gemm", 0, 10), ("gemm", 20, 10), ("ncclDevKernel_AllReduce", 5, 20), ("ncclKernel_x", 40, 5)]]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    got = exposed_communication(path)
    assert got["device"] == "gpu" and abs(got["comm_ms"] - 0.025) < 1e-9 and abs(got["exposed_ms"] - 0.015) < 1e-9
