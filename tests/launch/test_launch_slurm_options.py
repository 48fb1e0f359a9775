"""Slurm resources (--cpus-per-task, --mem, GPU GRES), requeue/log directives and the interpreter
(--venv) as rendered; the real-Slurm behaviour is in tests/cluster/test_slurm.py."""

from __future__ import annotations

import subprocess

import pytest

from launch.backends.slurm import slurm_memory
from launch_testlib import render, run_inproc


def _directives(argv):
    return [line.split(" ", 1)[1] for line in render(argv).splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize("profile", ["h100", "gb200", "generic"])
def test_whole_nodes_by_default_schedule_on_any_node(profile):
    d = _directives(["slurm", "--profile", profile])
    assert "--exclusive" in d and "--mem=0" in d and not any(x.startswith("--cpus-per-task") for x in d)
    assert "--cpus-per-task=7" in _directives(["slurm", "--profile", profile, "--cpus", "7"])


@pytest.mark.parametrize("profile,cpus", [("h100", "112"), ("gb200", "144"), ("generic", "32")])
def test_cpus_per_task_from_the_profile_on_request(profile, cpus):
    d = _directives(["slurm", "--profile", profile, "--node-resources", "profile"])
    assert f"--cpus-per-task={cpus}" in d and "--exclusive" not in d and not any(x.startswith("--mem") for x in d)
    assert "--exclusive" in _directives(["slurm", "--profile", profile, "--node-resources", "profile", "--exclusive"])


def test_the_task_cpus_come_from_the_allocation(tmp_path):
    """Whole nodes: srun's --cpus-per-task is the fewest CPUs a node of the allocation has."""
    text = render(["slurm", "--nnodes", "2"])
    start = text.index("task_cpus=")
    block = text[start:text.index("# One task per node", start)]
    for env, want in (({"SLURM_CPUS_ON_NODE": "112", "SLURM_JOB_CPUS_PER_NODE": "112(x2)"}, "112"),
                      ({"SLURM_CPUS_ON_NODE": "112", "SLURM_JOB_CPUS_PER_NODE": "112,96"}, "96"),
                      ({"SLURM_CPUS_PER_TASK": "8", "SLURM_JOB_CPUS_PER_NODE": "112,96"}, "8"),
                      ({"SLURM_CPUS_ON_NODE": "$(reboot)", "SLURM_JOB_CPUS_PER_NODE": "x(y)"}, "1")):
        proc = subprocess.run(["bash", "-c", f"set -euo pipefail\n{block}\necho $task_cpus"],
                              env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=30)
        assert proc.stdout.strip() == want, (env, proc.stderr)


@pytest.mark.parametrize("quantity,mem", [("512Gi", "512G"), ("512G", "512G"), ("1500Mi", "1500M"), ("2Ti", "2T"),
                                          ("64G", "64G"), ("1.5Gi", "1536M"), ("1.5Ti", "1536G"), ("1000", "1M"),
                                          ("64k", "64K"), ("0", "0")])
def test_memory_renders_mem_in_the_users_unit(quantity, mem):
    assert slurm_memory(quantity) == mem
    assert f"--mem={mem}" in _directives(["slurm", "--memory", quantity])


def test_memory_zero_is_slurms_only_and_milli_memory_is_refused():
    assert not any(d.startswith("--mem") for d in _directives(["slurm", "--node-resources", "profile"]))
    rc, _, err = run_inproc(["slurm", "--memory", "500m"])
    assert rc == 2 and "--memory '500m'" in err
    rc, _, err = run_inproc(["k8s", "--memory", "0"])
    assert rc == 2 and "--memory 0 is Slurm's" in err


def test_requeue_has_a_switch():
    text = render(["slurm", "--no-requeue"])
    assert "#SBATCH --no-requeue" in text and 'scontrol requeue "$SLURM_JOB_ID"' not in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in render(["slurm"])


def test_gpu_request_follows_gpu_gres():
    assert "--gpus-per-node=8" in _directives(["slurm", "--profile", "h100"])
    typed = _directives(["slurm", "--profile", "h100", "--gpu-gres", "gpu:h100"])
    assert "--gres=gpu:h100:8" in typed and not any(d.startswith("--gpus") for d in typed)
    cpu_only = _directives(["slurm", "--gpu-gres", "none"])
    assert not any(d.startswith(("--gpus", "--gres")) for d in cpu_only)
    rc, _, err = run_inproc(["slurm", "--gpu-gres", "gpu;rm"])
    assert rc == 2 and "--gpu-gres" in err


def test_requeue_and_per_job_append_log():
    d = _directives(["slurm"])
    assert {"--requeue", "--open-mode=append", "--output=%x-%j.out", "--signal=TERM@300"} <= set(d)
    assert "--requeue" in render(["slurm", "--help"])


def test_venv_is_rendered_and_checked(tmp_path):
    for sub in ("slurm", "torchrun"):
        text = render([sub, "--venv", "/opt/my env"])
        assert "export PATH='/opt/my env/bin':\"$PATH\"" in text
        assert "# Interpreter: torchrun and python from the virtual environment /opt/my env (--venv)" in text
        assert "# Interpreter: torchrun from PATH at run time" in render([sub])
    assert "torchrun inside the container image" in render(["slurm", "--pyxis"])
    for bad, why in (("relative/venv", "absolute"), ("/a:b", "absolute"), ("/x\ny", "control character")):
        rc, _, err = run_inproc(["torchrun", "--venv", bad])
        assert rc == 2 and "--venv" in err and why in err, err
    rc, _, err = run_inproc(["slurm", "--pyxis", "--venv", "/opt/v"])
    assert rc == 2 and "--venv and --pyxis" in err


def test_missing_torchrun_is_one_line_and_exit_2(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(render(["torchrun", "--venv", str(tmp_path / "no-venv")]))
    proc = subprocess.run(["bash", str(script)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "launch: torchrun not found on PATH on "
        f"{subprocess.run(['hostname'], capture_output=True, text=True).stdout.strip()}: activate the training "
        "environment or render with --venv DIR"]
