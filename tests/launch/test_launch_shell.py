"""Rendered shell: syntax, shellcheck, `set -euo pipefail` first, and hostile values that
reach the training process byte-for-byte without ever executing (stub torchrun/srun/docker)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launch_testlib import (
    SHELL_BACKENDS,
    SHELLCHECK,
    backend_argv,
    hostile_values,
    job_shapes,
    read_record,
    render,
    run_inproc,
    stub_env,
    write_stubs,
)

pytestmark = pytest.mark.timeout(180)

EXTRA = ["--nccl-debug", "WARN", "--flight-recorder", "--mount", "/data:/data:ro", "--env", "X=a b"]


@pytest.fixture(scope="module")
def rendered_scripts(tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("scripts")
    paths = []
    for shape_id, options in job_shapes():
        for backend in (*SHELL_BACKENDS, "env"):
            for variant, extra in (("plain", []), ("extra", EXTRA)):
                path = out / f"{backend}-{shape_id}-{variant}.sh"
                path.write_text(render(backend_argv(backend, [*options, *extra])))
                paths.append(path)
    return paths


def test_bash_syntax(rendered_scripts):
    for path in rendered_scripts:
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"


def test_shellcheck_clean(rendered_scripts):
    # Every profile x shape x backend with the extra options (a superset of the plain script's
    # constructs), plus the plain single-node scripts; split over two shellcheck processes.
    chosen = [p for p in rendered_scripts if p.stem.endswith("-extra") or "-1node-" in p.name]
    halves = [chosen[0::2], chosen[1::2]]
    procs = [
        subprocess.Popen([SHELLCHECK, "--shell=bash", "--severity=style", *map(str, half)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for half in halves
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=170)
        assert proc.returncode == 0, output[:4000]


def test_scripts_start_with_strict_mode(rendered_scripts):
    for path in rendered_scripts:
        if path.name.startswith("env-"):
            continue  # sourced into the user's shell: must not flip its options
        lines = path.read_text().splitlines()
        assert lines[0] == "#!/usr/bin/env bash"
        first_code = next(line for line in lines[1:] if line.strip() and not line.startswith("#"))
        assert first_code == "set -euo pipefail", path.name


def test_env_file_sources_cleanly(tmp_path):
    path = tmp_path / "env.sh"
    path.write_text(render(["env", "--profile", "gb200", "--env", "WEIRD=$(echo no) `x` 'q'"]))
    proc = subprocess.run(
        ["bash", "-c", 'source "$1" && printf %s "$WEIRD|$OMP_NUM_THREADS"', "x", str(path)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "$(echo no) `x` 'q'|16"


# --------------------------------------------------------------------------- hostile values


@pytest.fixture
def sandbox(tmp_path):
    bindir, record = tmp_path / "bin", tmp_path / "record.json"
    write_stubs(bindir, record)
    canary = tmp_path / "CANARY"
    return tmp_path, record, canary, stub_env(bindir, tmp_path, SLURM_CPUS_PER_TASK="112")


def _hostile_job(canary: Path, multi_node: bool, ckpt_root: str = "") -> tuple[list[str], list[str], dict[str, str]]:
    """ckpt_root: where the checkpoint directory lies (the docker script creates it)."""
    values = hostile_values(canary)
    env_pairs = {f"HOSTILE_{i}": v for i, v in enumerate(values)}
    options = ["--profile", "h100", "--entrypoint", f"python -m train run '{values[4]}'"]
    options += ["--checkpoint-dir", f"{ckpt_root}/ck pt/$(touch {canary})/`id`'q\"", "--name", "hostile"]
    if multi_node:
        options += ["--nnodes", "2", "--fabric", "infiniband", "--rdzv-endpoint", "node-a:29400"]
    for name, value in env_pairs.items():
        options += ["--env", f"{name}={value}"]
    return options, values, env_pairs


def _run(script: str, workdir: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    path = workdir / "job.sh"
    path.write_text(script)
    path.chmod(0o755)
    lint = subprocess.run([SHELLCHECK, "--shell=bash", "--severity=style", str(path)], capture_output=True, text=True,
                          timeout=120)  # the hostile values too (a trailing backslash: SC1003)
    assert lint.returncode == 0, lint.stdout[:3000]
    return subprocess.run(
        ["bash", str(path), *args], cwd=workdir, env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )


def _check(record: Path, canary: Path, values: list[str], env_pairs: dict, extra: list[str], ckpt_root: str = ""):
    got = read_record(record)
    expected_tail = ["-m", "train", "run", values[4], *values, *extra]
    assert got["argv"][-len(expected_tail):] == expected_tail
    for name, value in env_pairs.items():
        assert got["env"][name] == value, name
    assert got["env"]["TORCH_FR_DUMP_TEMP_FILE"].startswith(f"{ckpt_root}/ck pt/$(touch {canary})/`id`'q\"")
    assert not canary.exists(), "a hostile value was executed"
    return got


@pytest.mark.parametrize("multi_node", [False, True], ids=["1node", "2node"])
def test_hostile_values_torchrun(sandbox, multi_node):
    workdir, record, canary, env = sandbox
    options, values, env_pairs = _hostile_job(canary, multi_node)
    script = render(["torchrun", *options, "--flight-recorder", "--", *values])
    proc = _run(script, workdir, env, "--set", "late=$(touch " + str(canary) + ")")
    assert proc.returncode == 0, proc.stderr
    got = _check(record, canary, values, env_pairs, ["--set", f"late=$(touch {canary})"])
    if multi_node:
        assert got["argv"][:8] == ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                   "node-a:29400", "--rdzv-id", "hostile"]


def test_hostile_values_docker(sandbox):
    workdir, record, canary, env = sandbox
    root = str(workdir / "host")
    options, values, env_pairs = _hostile_job(canary, multi_node=True, ckpt_root=root)
    image = "registry.example:5000/team/img:tag@sha256:" + "ab" * 32  # hostile images are refused
    assert run_inproc(["docker", "--image", f"img:tag; touch {canary}"])[0] == 2
    script = render(["docker", *options, "--flight-recorder", "--image", image,
                     "--mount", "/data dir/$(x):/data", "--", *values])
    flags = "--label=a=$(id)`id` --label=b=*"
    proc = _run(script, workdir, {**env, "LAUNCH_ENGINE_FLAGS": flags})
    assert proc.returncode == 0, proc.stderr
    _check(record, canary, values, env_pairs, [], ckpt_root=root)
    docker = read_record(record, ".docker")
    assert docker["image"] == image
    assert "--volume=/data dir/$(x):/data" in docker["opts"]
    assert "--network=host" in docker["opts"] and "--device=/dev/infiniband" in docker["opts"]
    assert {"--gpus=all", "--ipc=host", "--ulimit=memlock=-1", "--ulimit=stack=67108864", "--name=hostile",
            "--stop-timeout=300"} <= set(docker["opts"])
    assert docker["opts"][-2:] == flags.split()  # split on blanks, no expansion, no globbing
    ckpt = f"{root}/ck pt/$(touch {canary})/`id`'q\""
    assert os.path.isdir(ckpt), "the script creates the host checkpoint directory"


@pytest.mark.parametrize("pyxis", [False, True], ids=["bare", "pyxis"])
def test_hostile_values_slurm(sandbox, pyxis):
    workdir, record, canary, env = sandbox
    options, values, env_pairs = _hostile_job(canary, multi_node=True)
    image = "nvcr.io#nvidia/pytorch:25.01-py3"  # enroot syntax; hostile images are refused
    assert run_inproc(["slurm", "--pyxis", "--image", f"nvcr.io/x:1 $(touch {canary})"])[0] == 2
    extra = ["--pyxis", "--image", image] if pyxis else []
    script = render(["slurm", *options, *extra, "--flight-recorder", "--partition", "gpu", "--", *values])
    proc = _run(script, workdir, env)
    assert proc.returncode == 0, proc.stderr
    got = _check(record, canary, values, env_pairs, [])
    argv = got["argv"]
    # this node's address towards node-a, and that it hosts the store (stubs: node-a is here)
    assert argv[:4] == ["--local-addr", "127.0.0.1", "--rdzv-conf", "is_host=true"], argv
    assert argv[4:12] == ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node-a:29400",
                          "--rdzv-id", "4242"], argv
    srun = read_record(record, ".srun")
    assert srun[:4] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if pyxis:
        assert f"--container-image={image}" in srun


def test_multi_node_script_without_endpoint_needs_runtime_value(sandbox):
    workdir, record, _, env = sandbox
    script = render(["torchrun", "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband"])
    proc = _run(script, workdir, env)
    assert proc.returncode == 2 and "LAUNCH_RDZV_ENDPOINT" in proc.stderr
    proc = _run(script, workdir, {**env, "LAUNCH_RDZV_ENDPOINT": "head:1234"})
    assert proc.returncode == 0, proc.stderr
    assert "head:1234" in read_record(record)["argv"]


def test_slurm_directives(tmp_path):
    text = render(["slurm", "--profile", "b200", "--nnodes", "2:4", "--fabric", "infiniband", "--cpus", "96",
                   "--partition", "gpu", "--account", "proj", "--time", "1-00:00:00", "--name", "b200-el"])
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=b200-el", "#SBATCH --nodes=2-4", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=96", "#SBATCH --exclusive", "#SBATCH --gpus-per-node=8", "#SBATCH --mem=0",
        "#SBATCH --signal=TERM@300", "#SBATCH --requeue",
        "#SBATCH --open-mode=append", "#SBATCH --output=%x-%j.out", "#SBATCH --partition=gpu",
        "#SBATCH --account=proj", "#SBATCH --time=1-00:00:00",
    ]
    assert run_inproc(["slurm", "--cpus", "500m"])[0] == 2
