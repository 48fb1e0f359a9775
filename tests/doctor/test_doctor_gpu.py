"""``train doctor`` on CUDA GPUs: the memory estimate against torch.cuda.max_memory_allocated
of real training steps, and the GPU side of the report."""

from __future__ import annotations

import json

import pytest

from testlib import train_cli


@pytest.mark.gpu
@pytest.mark.parametrize("preset, seq, batch", [("debug", 512, 8), ("1b", 2048, 2)])
@pytest.mark.parametrize("ac", ["none", "full"])
def test_estimate_is_within_25_percent_of_measured_peak(preset, seq, batch, ac):
    from train.doctor.memreport import measure_step_peak

    r = measure_step_peak(preset, seq, batch, ac)
    assert r["measured_bytes"] > 0
    assert abs(r["error"]) <= 0.25, r


@pytest.mark.gpu
def test_doctor_reports_gpus_and_nccl_self_test():
    res = train_cli(["doctor", "--json", "--check-nccl", "--preset", "debug"], timeout=240)
    report = json.loads(res.stdout)
    assert res.returncode == report["exit_code"], res.stderr[-2000:]
    assert report["exit_code"] == 0, report["problems"]
    assert report["gpus"] and report["versions"]["nccl"] and report["nccl"]["selftest"] == "ok"
    for g in report["gpus"]:
        major = int(g["capability"].split(".")[0])
        assert bool(g["fp8"]) == (g["capability"] in ("8.9",) or major >= 9)
        assert g["memory_bytes"] > 0
    n = len(report["gpus"])
    assert len(report["peer_access"]) == n and all(len(row) == n for row in report["peer_access"])
    rec = report["memory"]["recommendation"]
    assert rec["strategy"] is not None and rec["batch_per_gpu"] >= 1
