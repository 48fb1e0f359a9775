"""CLI behaviour: errors, warnings, output files, start-up cost, profiles listing, `launch run`."""

from __future__ import annotations

import os
import re
import stat
import subprocess

import pytest

from launch_testlib import PY, REPO, read_record, render, run_cli, run_inproc, write_stubs

pytestmark = pytest.mark.timeout(120)


# --------------------------------------------------------------------------- start-up


def test_help_imports_no_torch_and_is_cheap():
    proc = subprocess.run(
        [PY, "-X", "importtime", "-m", "launch", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout
    modules = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert not [m for m in modules if m == "torch" or m.startswith("torch.")], "launch --help imported torch"
    assert not [m for m in modules if m.split(".")[0] in ("jinja2", "yaml", "jsonschema")], "heavy import at start-up"


def test_help_cpu_time_under_300ms():
    # CPU time (user+sys) of the whole `python -m launch --help` process, best of 3: unlike
    # wall time it does not depend on how busy the (shared, 2-core) test machine is.
    best = min(_cpu_seconds([PY, "-m", "launch", "--help"]) for _ in range(3))
    assert best < 0.3, f"launch --help used {best:.3f} s of CPU"


def _cpu_seconds(cmd) -> float:
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    return usage.ru_utime + usage.ru_stime


def test_rendering_never_imports_torch_or_train():
    # the run-time side of tests/test_architecture.py's static rule (no `import torch/train` in launch/)
    code = (
        "import sys; from launch.cli import main; "
        "rc = main(['k8s','--profile','h100','--nnodes','2','--fabric','infiniband']); "
        "rc |= main(['slurm','--profile','b200']); "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'train'], 'train imported'; sys.exit(rc)"
    )
    proc = subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- errors


ERRORS = [
    (["torchrun", "--profile", "h300"], r"unknown profile 'h300' \(known: .*h100.*rtx-pro-6000"),
    (["torchrun", "--fabric", "myrinet"], r"unknown fabric 'myrinet' \(known: .*infiniband"),
    (["torchrun", "--nnodes", "0"], r"--nnodes '0'"),
    (["torchrun", "--nnodes", "4:2"], r"MIN \(4\) is greater than MAX \(2\)"),
    (["torchrun", "--nnodes", "two"], r"expected N or MIN:MAX"),
    (["torchrun", "--env", "NOEQUALS"], r"--env 'NOEQUALS': expected NAME=VALUE"),
    (["torchrun", "--env", "1BAD=x"], r"not a valid environment variable name"),
    (["torchrun", "--nproc-per-node", "0"], r"--nproc-per-node': must be at least 1"),
    (["k8s", "--name", "Bad_Name"], r"DNS-1035"),
    (["k8s", "--name", "a" * 64], r"DNS-1035"),
    (["torchrun", "--profile", "rtx-pro-6000", "--fabric", "nvlink"], r"needs NVLink"),
    (["torchrun", "--nnodes", "2", "--fabric", "nvlink", "--profile", "h100"], r"single-node"),
    (["torchrun", "--nnodes", "2", "--fabric", "roce"], r"needs NCCL_IB_HCA.*--ib-hca"),
    (["k8s", "--nnodes", "2", "--fabric", "efa"], r"--rdma-resource vpc.amazonaws.com/efa=COUNT"),
    (["torchrun", "--rdzv-endpoint", "a b:1"], r"HOST\[:PORT\]"),
    (["torchrun", "--mount", "relative:/x"], r"absolute path"),
    (["torchrun", "--mount", "/a,b:/x"], r"not allowed"),
    (["slurm", "--partition", "gpu\n#SBATCH --x"], r"--partition"),
    (["torchrun", "--nccl-debug", "LOUD"], r"--nccl-debug"),
    (["torchrun", "--env", "NCCL_NVLS_ENABLE=1"], r"never enables NVLink SHARP"),
    (["torchrun", "--env", "NCCL_TIMEOUT=1800"], r"NCCL_TIMEOUT is not an NCCL variable"),
    (["torchrun", "--bogus-option"], r"No such option"),
    (["run", "--nnodes", "2", "--dry-run"], r"single-node"),
    (["k8s", "--queue", "bad queue"], r"--queue"),
    (["k8s", "--env-secret", "TOKEN=oops"], r"NAME=SECRET:KEY"),
]


@pytest.mark.parametrize("argv,pattern", ERRORS, ids=[" ".join(a)[:40] for a, _ in ERRORS])
def test_user_errors_are_one_line_exit_2(argv, pattern):
    rc, out, err = run_inproc(argv)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("launch: error: ")
    assert re.search(pattern, lines[0]), lines[0]


def test_errors_in_a_real_process_have_no_traceback():
    proc = run_cli(["torchrun", "--profile", "nope"])
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_nproc_above_profile_gpus_warns_and_succeeds():
    rc, out, err = run_inproc(["torchrun", "--profile", "h100", "--nproc-per-node", "16"])
    assert rc == 0
    assert "--nproc-per-node 16" in out
    assert err.startswith("launch: warning: --nproc-per-node 16 exceeds the 8 GPUs per node")


def test_no_subcommand_prints_help():
    rc, out, _ = run_inproc([])
    assert rc == 0 and "Usage:" in out


# --------------------------------------------------------------------------- output files


def test_output_to_directory_is_refused_and_nothing_changes(tmp_path):
    (tmp_path / "keep").write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    rc, _, err = run_inproc(["torchrun", "-o", str(tmp_path)])
    assert rc == 2 and "is a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_output_missing_parent_is_refused(tmp_path):
    rc, _, err = run_inproc(["torchrun", "-o", str(tmp_path / "nope" / "x.sh")])
    assert rc == 2 and "does not exist" in err


@pytest.mark.parametrize(
    "backend,executable", [("torchrun", True), ("docker", True), ("slurm", True), ("k8s", False), ("env", False)]
)
def test_output_file_mode_and_content(tmp_path, backend, executable):
    target = tmp_path / "out"
    rc, out, _ = run_inproc([backend, "--profile", "h100", "-o", str(target)])
    assert rc == 0 and out == ""
    mode = target.stat().st_mode
    assert bool(mode & stat.S_IXUSR) is executable
    assert target.read_text() == render([backend, "--profile", "h100"])
    assert [p.name for p in tmp_path.iterdir()] == ["out"], "temporary file left behind"


def test_existing_output_untouched_when_render_fails(tmp_path):
    target = tmp_path / "job.sh"
    target.write_text("previous content\n")
    rc, _, _ = run_inproc(["torchrun", "--nnodes", "0", "-o", str(target)])
    assert rc == 2
    assert target.read_text() == "previous content\n"
    assert [p.name for p in tmp_path.iterdir()] == ["job.sh"]


def test_existing_output_replaced_atomically(tmp_path):
    target = tmp_path / "job.sh"
    target.write_text("# Generated by: launch torchrun\nold\n")
    inode_before = target.stat().st_ino
    assert run_inproc(["torchrun", "-o", str(target)])[0] == 0
    assert target.read_text().startswith("#!/usr/bin/env bash")
    assert target.stat().st_ino != inode_before, "file was rewritten in place, not renamed over"


def test_output_path_is_not_echoed_in_header(tmp_path):
    rc, _, _ = run_inproc(["torchrun", "--profile", "h100", "-o", str(tmp_path / "a.sh")])
    assert rc == 0
    assert str(tmp_path) not in (tmp_path / "a.sh").read_text()


# --------------------------------------------------------------------------- profiles


def test_profiles_lists_every_profile_and_fabric():
    rc, out, _ = run_inproc(["profiles"])
    assert rc == 0
    for name in ("h100", "h200", "b200", "gb200", "rtx-pro-6000", "generic"):
        assert re.search(rf"^  {re.escape(name)}\s+\S", out, re.M), name
    for name in ("nvlink", "pcie", "infiniband", "roce", "ethernet", "efa"):
        assert re.search(rf"^  {name}\s+\S", out, re.M), name


USER_PROFILE = """\
description: Lab box with 2 L40S, PCIe only
gpu: {model: L40S, arch: sm_89, gpus_per_node: 2}
cpu_arch: amd64
interconnect: {summary: PCIe Gen4, nvlink: false, nvswitch: false, multi_node_nvlink: false}
fp8: [e4m3, e5m2]
image_target: hopper
default_fabric: {single_node: pcie, multi_node: ethernet}
env:
  OMP_NUM_THREADS: {value: "6", why: "six cores per GPU on this lab box"}
"""


def test_user_profile_directory(tmp_path):
    (tmp_path / "lab-l40s.yaml").write_text(USER_PROFILE)
    env = {"LAUNCH_PROFILE_PATH": str(tmp_path)}
    rc, out, err = run_inproc(["env", "--profile", "lab-l40s"], env=env)
    assert rc == 0, err
    assert "export OMP_NUM_THREADS=6" in out
    assert "# OMP_NUM_THREADS: six cores per GPU on this lab box" in out
    rc, out, _ = run_inproc(["profiles"], env=env)
    assert "lab-l40s" in out


def test_profile_given_as_file(tmp_path):
    path = tmp_path / "box.yaml"
    path.write_text(USER_PROFILE)
    assert "--nproc-per-node 2" in render(["torchrun", "--profile", str(path)])


def test_invalid_user_profile_is_one_line_error(tmp_path):
    (tmp_path / "broken.yaml").write_text(USER_PROFILE.replace("fp8: [e4m3, e5m2]\n", ""))
    rc, _, err = run_inproc(["torchrun", "--profile", "broken"], env={"LAUNCH_PROFILE_PATH": str(tmp_path)})
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "fp8" in err


def test_user_profile_cannot_turn_on_nvls(tmp_path):
    text = USER_PROFILE + '  NCCL_NVLS_ENABLE: {value: "1", why: "someone read a blog post"}\n'
    (tmp_path / "nvls.yaml").write_text(text)
    rc, _, err = run_inproc(["torchrun", "--profile", "nvls"], env={"LAUNCH_PROFILE_PATH": str(tmp_path)})
    assert rc == 2 and "never enables NVLink SHARP" in err


# --------------------------------------------------------------------------- launch run


def test_run_dry_run_prints_and_executes_nothing(tmp_path):
    bindir, record = tmp_path / "bin", tmp_path / "record.json"
    write_stubs(bindir, record)
    proc = run_cli(
        ["run", "--profile", "h100", "--dry-run", "--", "--steps", "1"],
        env={"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/usr/bin/env bash")
    assert "dry run" in proc.stderr
    assert not record.exists()


def test_run_executes_torchrun_locally(tmp_path):
    bindir, record = tmp_path / "bin", tmp_path / "record.json"
    write_stubs(bindir, record)
    proc = run_cli(
        ["run", "--profile", "rtx-pro-6000", "--", "--steps", "1", "--set", "a=$(b)"],
        env={"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"},
    )
    assert proc.returncode == 0, proc.stderr
    got = read_record(record)
    assert got["argv"] == ["--standalone", "--nnodes", "1", "--nproc-per-node", "4",
                           "-m", "train", "run", "--steps", "1", "--set", "a=$(b)"]
    assert got["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
