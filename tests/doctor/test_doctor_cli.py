"""``train doctor`` on this machine: report, JSON, usage errors, topology parsing."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from testlib import ROOT, train_cli
from train.doctor.cli import doctor
from train.doctor.libraries import check_torchao
from train.doctor.probes import _physical_indices, parse_topology

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only report")

TOPO_NVLINK = """\
\t\x1b[4mGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tNV18\tPXB\t0-47,96-143\t0\t\tN/A
GPU1\tNV18\t X \tSYS\t0-47,96-143\t0\t\tN/A
NIC0\tPXB\tSYS\t X \t\t\t\t

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
"""


@CPU_ONLY
def test_doctor_json_through_the_real_entry_point():
    res = train_cli(["doctor", "--json", "--preset", "debug"])
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    assert {"schema", "versions", "gpus", "peer_access", "topology", "nccl", "libraries", "memory",
            "problems", "warnings", "notes", "ok", "exit_code"} <= report.keys()
    assert report["ok"] and report["exit_code"] == 0 and report["gpus"] == []
    assert report["versions"]["torch"] == torch.__version__
    mem = report["memory"]
    assert mem["preset"] == "debug" and (mem["seq"], mem["batch"]) == (512, 8)  # from train/configs/debug.yaml
    labels = [r["label"] for r in mem["estimates"]]
    assert labels[:4] == ["DDP", "FSDP2", "DDP + AC", "FSDP2 + AC"]
    assert {"params", "grads", "optimizer", "activations", "peak", "phases"} <= mem["estimates"][0].keys()
    assert mem["recommendation"]["strategy"] is None  # no GPU, no profile: memory unknown


@CPU_ONLY
def test_doctor_reports_cpu_only_machine_and_exits_0():
    res = CliRunner().invoke(doctor, ["--preset", "debug"])
    assert res.exit_code == 0, res.output
    assert "GPUs      none visible" in res.output
    assert "CPU-only machine" in res.output and "result: OK (exit 0)" in res.output
    assert "Memory per GPU: preset debug" in res.output


def test_doctor_profile_gives_a_recommendation():
    res = CliRunner().invoke(doctor, ["--json", "--profile", "h100", "--preset", "8b", "--seq", "8192", "--batch", "2"])
    report = json.loads(res.stdout)
    mem = report["memory"]
    assert mem["gpus"] == 8 and mem["gpu_memory_gib"] == 80.0 and mem["source"].startswith("profile h100")
    assert mem["recommendation"]["label"] == "FSDP2 + AC" and mem["recommendation"]["batch_per_gpu"] >= 1
    assert report["profile"]["arch"] == "sm_90"


def test_unknown_profile_is_one_line_exit_2_listing_valid_ones():
    res = CliRunner().invoke(doctor, ["--profile", "a100"])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --profile 'a100': unknown profile (valid: ")
    for name in ("b200", "gb200", "h100", "h200", "rtx-pro-6000"):
        assert name in lines[0]


def test_usage_errors_exit_2():
    res = CliRunner().invoke(doctor, ["--preset", "70b"])
    assert res.exit_code == 2 and "error: --preset '70b': unknown preset" in res.stderr
    res = CliRunner().invoke(doctor, ["--preset", "debug", "--seq", "4096"])
    assert res.exit_code == 2 and "longer than model.max_seq_len=2048" in res.stderr


def test_parse_topology_reads_gpu_links_and_ignores_nics():
    links = parse_topology(TOPO_NVLINK)
    assert links == {(0, 0): "X", (0, 1): "NV18", (1, 0): "NV18", (1, 1): "X"}
    pcie = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPIX\t0-15\nGPU1\tPIX\t X \t0-15\n"
    assert parse_topology(pcie)[(0, 1)] == "PIX"
    assert parse_topology("") == {}


def test_physical_indices_follow_uuids(monkeypatch):
    smi = [{"index": 0, "uuid": "GPU-aaaa"}, {"index": 1, "uuid": "GPU-bbbb"}]
    assert _physical_indices(["bbbb"], smi) == [1]  # CUDA_VISIBLE_DEVICES=1 remaps torch's 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert _physical_indices([None, None], smi) == [1, 0]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _physical_indices([None, None], smi) == [0, 1]


def test_doctor_module_import_does_not_import_torch():
    code = "import sys, train.doctor.cli, train.memory; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(importlib.util.find_spec("torchao") is not None, reason="torchao is installed here")
def test_torchao_absent_is_reported_not_installed():
    assert check_torchao()["installed"] is False


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="needs torchao")
def test_torchao_skipped_cpp_extensions_are_detected():
    code = "from train.doctor.libraries import check_torchao; import json; print(json.dumps(check_torchao()))"
    env_out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                             env={**__import__("os").environ, "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"})
    info = json.loads(env_out.stdout.strip().splitlines()[-1])
    assert info["installed"] and info["cpp_extensions"] == "not loaded"
    assert "Skipping import of cpp extensions" in info["detail"]
