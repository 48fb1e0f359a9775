"""``train doctor`` names the host's CPU architecture in its driver/CUDA fit line, and notes when a
profile's nodes (gb200: Grace, arm64) have another one than this host. The host is simulated here
(``platform.machine``); scripts/arm64_test.sh runs the real doctor inside the arm64 image."""

from __future__ import annotations

import json
import platform

import pytest
from click.testing import CliRunner

from train.doctor import render, system
from train.doctor.cli import doctor
from train.doctor.cuda_compat import cpu_arch, fit


@pytest.mark.parametrize(("machine", "arch"), [("x86_64", "amd64"), ("aarch64", "arm64"), ("AMD64", "amd64"),
                                               ("arm64", "arm64"), ("riscv64", None), ("", None), (None, None)])
def test_cpu_arch_is_the_image_platform_name(machine, arch):
    assert cpu_arch(machine) == arch


@pytest.mark.parametrize(("driver", "cuda", "dc"), [
    ("570.124.06", "12.8.1.012", True), ("550.54.15", "13.1.0", True), ("575.57.08", "13.1.0", False),
    (None, "12.8", None), ("570.1", None, None), ("570.86.15", "14.0", None)])
@pytest.mark.parametrize(("machine", "suffix"), [("aarch64", " (CPU aarch64 = arm64)"),
                                                 ("x86_64", " (CPU x86_64 = amd64)"),
                                                 ("arm64", " (CPU arm64)"), ("riscv64", " (CPU riscv64)")])
def test_the_fit_line_ends_with_the_cpu(driver, cuda, dc, machine, suffix):
    plain = fit(driver, cuda, dc)
    named = fit(driver, cuda, dc, machine)
    assert named.ok is plain.ok and named.line == plain.line + suffix, named.line
    assert "\n" not in named.line and named.line.startswith("driver/CUDA: ")


def test_the_report_of_an_arm64_host(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    report = system.collect_system()
    assert report["cpu_arch"] == "arm64" and report["platform"].endswith(" aarch64")
    assert report["driver_cuda"]["line"].endswith("(CPU aarch64 = arm64)")
    report.update(ok=not report["problems"], exit_code=1 if report["problems"] else 0)
    text = render.render_text(report)
    assert report["driver_cuda"]["line"] in text.splitlines()


@pytest.mark.parametrize(("machine", "profile", "noted"), [
    ("aarch64", "gb200", False), ("x86_64", "gb200", True), ("x86_64", "h100", False), ("aarch64", "h100", True)])
def test_a_profile_of_another_cpu_is_noted(monkeypatch, machine, profile, noted):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    res = CliRunner().invoke(doctor, ["--json", "--profile", profile, "--preset", "tiny"])
    report = json.loads(res.stdout)
    want = {"gb200": "arm64", "h100": "amd64"}[profile]
    assert report["profile"]["cpu_arch"] == want
    notes = [n for n in report["notes"] if n.startswith(f"profile {profile} has {want} CPUs")]
    assert len(notes) == int(noted), report["notes"]
    if noted:
        assert f"linux/{want}" in notes[0] and f"this host is {cpu_arch(machine)}" in notes[0]
    text = CliRunner().invoke(doctor, ["--profile", profile, "--preset", "tiny"]).output
    assert f"NVLink yes, CPU {want}" in text
