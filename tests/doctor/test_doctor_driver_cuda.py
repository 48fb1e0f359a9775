"""`train doctor`'s driver/CUDA line (train/doctor/cuda_compat.py + train/doctor/cuda_driver.yaml),
with simulated driver and CUDA versions; the real check runs on the GPU machines."""

from __future__ import annotations

import pytest

from train.doctor import cuda_compat
from train.doctor.cuda_compat import fit, image_cuda, is_datacenter


@pytest.mark.parametrize("driver,cuda,dc,ok,words", [
    ("570.124.06", "12.8.1.012", True, True, "fit - driver 570.124.06 runs CUDA 12.8.1.012"),  # 25.03 on R570
    ("580.65.06", "13.0", None, True, "fit"),                      # CUDA 13 base on R580
    ("575.57.08", "13.1.0", False, False, "NO - driver 575.57.08 is older than 580"),  # workstation, no compat
    ("535.161.08", "12.8", True, True, "fit - driver 535.161.08 runs CUDA 12.8"),    # 12.x minor-version compat
    ("550.54.15", "13.1.0", True, True, "forward compatibility"),  # data center GPU, R550 + cuda-compat
    ("550.54.15", "13.1.0", None, True, "if this is a data center GPU"),
    ("550.54.15", "13.1.0", False, False, "data center GPUs only"),
    ("560.35.03", "13.0", True, False, "older than 580"),          # R560 is not forward-compatible
    ("520.61.05", "12.8", True, False, "older than 525"),
    (None, "12.8", None, None, "no NVIDIA driver"),
    ("570.1", None, None, None, "CPU-only"),
    ("570.86.15", "14.0", None, None, "no rule for CUDA 14.x"),
])
def test_fit_simulated(driver, cuda, dc, ok, words):
    result = fit(driver, cuda, dc)
    assert result.ok is ok and words in result.line, result.line
    assert "\n" not in result.line and result.line.startswith("driver/CUDA: ")


def test_rules_are_the_data_file():
    rules = cuda_compat.rules()
    assert rules["floor"] == {12: (525,), 13: (580,)}
    assert (535, (535, 86)) in rules["forward"]
    assert "docs.nvidia.com" in cuda_compat.DATA.read_text()


def test_image_cuda_prefers_ngc_env(monkeypatch):
    monkeypatch.setenv("CUDA_VERSION", "12.8.1.012")
    assert image_cuda("12.8") == "12.8.1.012"
    monkeypatch.delenv("CUDA_VERSION")
    assert image_cuda("12.8") == "12.8" and image_cuda(None) is None


def test_datacenter_guess():
    assert is_datacenter("NVIDIA H200") and is_datacenter("NVIDIA GB200")
    assert is_datacenter("NVIDIA GeForce RTX 5090") is False
    assert is_datacenter("NVIDIA RTX PRO 6000 Blackwell Server Edition") is None


def test_doctor_prints_the_line(monkeypatch):
    """Through the real report: a simulated driver (nvidia-smi) and the NGC CUDA_VERSION."""
    from train.doctor import probes, render, system

    monkeypatch.setattr(probes, "smi_gpus", lambda: [{"index": 0, "uuid": "GPU-x", "name": "NVIDIA H200",
                                                      "driver": "550.54.15"}])
    monkeypatch.setenv("CUDA_VERSION", "13.1.0.036")
    report = system.collect_system()
    assert report["driver_cuda"]["ok"] is True
    report.update(ok=not report["problems"], exit_code=0)  # what the CLI adds before printing
    text = render.render_text(report)
    assert "driver/CUDA: fit through forward compatibility - driver 550.54.15 < 580" in text
    monkeypatch.setattr(probes, "smi_gpus", lambda: [{"index": 0, "uuid": "GPU-x", "name": "NVIDIA GeForce RTX 5090",
                                                      "driver": "570.86.10"}])
    report = system.collect_system()
    assert report["driver_cuda"]["ok"] is False
    assert any("older than 580" in p for p in report["problems"])
