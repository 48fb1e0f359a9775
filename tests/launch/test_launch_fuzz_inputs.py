"""Failure classes a fuzzing review found in input checking: every bad input is one line naming the
culprit, exit status 2, no traceback, and nothing on disk replaced."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from launch_testlib import REPO, render, run_cli, run_inproc

pytestmark = pytest.mark.timeout(180)

H100 = REPO / "core" / "profiles" / "h100.yaml"
INFINIBAND = REPO / "core" / "fabrics" / "infiniband.yaml"


def _refused(argv: list[str], culprit: str, env: dict | None = None) -> str:
    rc, out, err = run_inproc(argv, env)
    assert rc == 2, (argv, err)
    assert not out and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert culprit in err, err
    return err


def _yaml_with(tmp_path: Path, source: Path, edit) -> Path:
    data = yaml.safe_load(source.read_text())
    edit(data)
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


# --------------------------------------------------------------------------- 2: names ending in "\n"


@pytest.mark.parametrize("key", ["env", "compute_domain_env"])
def test_profile_env_names_with_a_final_newline_are_refused(tmp_path, key):
    path = _yaml_with(tmp_path, H100, lambda d: d.setdefault(key, {}).update(
        {"OMP_NUM_THREADS\n": {"value": "1", "why": "a name with a newline at the end"}}))
    _refused(["env", "--profile", str(path)], "OMP_NUM_THREADS")


def test_check_safe_rechecks_every_name():
    from core.errors import SpecError
    from launch.envplan import EnvVar, check_safe

    for name in ("GOOD\n", "A B", "LAUNCH_X", "BASH_ENV", ""):
        with pytest.raises(SpecError):
            check_safe([EnvVar(name, "1", "why")])


def test_fabric_files_may_set_network_plugin_variables_and_env_flags_may_not(tmp_path):
    """A site fabric carries its NCCL net plugin's variables, which NCCL's documentation does not list
    (e.g. GCP's NCCL_FASTRAK_*): the file renders; the same name from --env still needs the flag."""
    fabric = _yaml_with(tmp_path, REPO / "core" / "fabrics" / "ethernet.yaml", lambda d: d["env"].update(
        {"NCCL_FASTRAK_IFNAME": {"value": "eth1,eth2", "why": "the TCPXO plugin's data NICs"}}))
    text = render(["torchrun", "--nnodes", "2", "--fabric", str(fabric)])
    assert "NCCL_FASTRAK_IFNAME" in text
    _refused(["torchrun", "--nnodes", "2", "--env", "NCCL_FASTRAK_IFNAME=eth1"], "NCCL_FASTRAK_IFNAME")
    render(["torchrun", "--nnodes", "2", "--env", "NCCL_FASTRAK_IFNAME=eth1", "--allow-undocumented-nccl"])


def test_every_schema_pattern_is_anchored_at_the_very_end():
    from core.schema import FABRIC_SCHEMA, PROFILE_SCHEMA

    def patterns(node):
        if isinstance(node, dict):
            yield from ([node["pattern"]] if isinstance(node.get("pattern"), str) else [])
            for value in node.values():
                yield from patterns(value)
        elif isinstance(node, list):
            for value in node:
                yield from patterns(value)

    found = [*patterns(PROFILE_SCHEMA), *patterns(FABRIC_SCHEMA)]
    assert found and all(p.startswith("^") and p.endswith(r"\Z") for p in found), found
    assert "uniqueItems" not in repr(PROFILE_SCHEMA) + repr(FABRIC_SCHEMA)  # quadratic on maps (class 10)


# --------------------------------------------------------------------------- 3: -o never replaces an input


def _output_cases(tmp: Path):
    script, topo, venv = tmp / "mytrain.py", tmp / "topo.xml", tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    for path in (script, topo, venv / "bin" / "torchrun", tmp / "lib.so"):
        path.write_text("precious\n")
    return [
        (["torchrun", "--entrypoint", f"python {script}"], script),
        (["torchrun", "--entrypoint", f"python -m x --cfg={script}"], script),
        (["torchrun", "--env", f"NCCL_TOPO_FILE={topo}"], topo),
        (["torchrun", "--env", f"LD_PRELOAD=/nonexistent:{tmp / 'lib.so'}"], tmp / "lib.so"),
        (["torchrun", "--venv", str(venv)], venv / "bin" / "torchrun"),
        (["slurm", "--venv", str(venv)], venv / "bin" / "new.sbatch"),
        (["torchrun", "--", "--config", str(script)], script),
    ]


def test_output_never_replaces_an_input(tmp_path):
    for argv, target in _output_cases(tmp_path):
        before = target.read_text() if target.exists() else None
        _refused([argv[0], "-o", str(target), *argv[1:]], "-o")
        assert (target.read_text() if target.exists() else None) == before, argv


def test_output_never_goes_inside_the_launch_or_core_package():
    from core.catalog import PACKAGE_DIR as CORE_DIR  # the packages in use: the repository's, or an image's
    from launch.cli import LAUNCH_DIR

    profile, new = CORE_DIR / "profiles" / "h100.yaml", LAUNCH_DIR / "templates" / "new.sh"
    before = profile.read_bytes()
    _refused(["torchrun", "-o", str(profile)], "the core package")
    _refused(["torchrun", "-o", str(new)], "the launch package")
    assert profile.read_bytes() == before and not new.exists()


# --------------------------------------------------------------------------- 4: no torchrun option in the program


@pytest.mark.parametrize("entrypoint", [
    "python -m --nproc-per-node=64 train run", "python --rdzv-endpoint=evil:1/x.py real.py",
    "python3 -m -x", "python -m ''", "python3 -m --standalone x", "python -m -- x",
])
def test_entrypoint_cannot_smuggle_torchrun_options(entrypoint):
    _refused(["torchrun", "--entrypoint", entrypoint], "--entrypoint")


@pytest.mark.parametrize("entrypoint, program", [("python -m train run", ["-m", "train", "run"]),
                                                 ("python x.py --a", ["x.py", "--a"]),
                                                 ("python -u x.py", ["--no-python", "python", "-u", "x.py"]),
                                                 # an interpreter by its path runs as it is, not torchrun's
                                                 ("/opt/venv/bin/python -m train run",
                                                  ["--no-python", "/opt/venv/bin/python", "-m", "train", "run"])])
def test_programs_still_render(entrypoint, program):
    from launch.entrypoint import parse_entrypoint, program_args

    assert program_args(parse_entrypoint(entrypoint)) == program
    render(["torchrun", "--entrypoint", entrypoint])


# --------------------------------------------------------------------------- 5: a resource key twice


@pytest.mark.parametrize("argv", [["k8s", "--api", "pytorchjob"], ["k8s"], ["k8s-runtime"]])
def test_rdma_resource_cannot_repeat_the_gpu_resource(argv):
    _refused([*argv, "--rdma-resource", "nvidia.com/gpu=1"], "--rdma-resource")


def test_fabric_rdma_resource_cannot_repeat_the_gpu_resource(tmp_path):
    path = _yaml_with(tmp_path, INFINIBAND, lambda d: d["k8s"]["rdma_resource"].update(name="nvidia.com/gpu"))
    _refused(["k8s", "--api", "pytorchjob", "--nnodes", "2", "--fabric", str(path)], "k8s.rdma_resource.name")


# --------------------------------------------------------------------------- 6: Slurm --signal


@pytest.mark.parametrize("extra, culprit", [(["--grace-period", "65536"], "at most 65535"),
                                            (["--time", "5", "--grace-period", "600"], "not shorter than --time 5"),
                                            (["--time", "5"], "e.g. --grace-period 60"),  # the default 300 s
                                            (["--time", "0:30", "--grace-period", "30"], "give a longer --time"),
                                            (["--time", "1:00", "--grace-period", "60"], "(60 s)"),
                                            (["--time", "0-0:10", "--grace-period", "600"], "(600 s)")])
def test_slurm_grace_period_fits_signal_and_time_limit(extra, culprit):
    _refused(["slurm", *extra], culprit)


@pytest.mark.parametrize("value, seconds", [("90", 5400), ("5:30", 330), ("01:02:03", 3723), ("2-3", 183600),
                                            ("2-3:04", 183840), ("2-3:04:05", 183845), ("UNLIMITED", None),
                                            ("infinite", None), ("0", None)])
def test_slurm_time_limit_formats(value, seconds):
    from launch.backends.slurm import time_limit_s

    assert time_limit_s(value) == seconds
    text = render(["slurm", "--time", value, "--grace-period", "65535" if seconds is None else "30"])
    assert f"#SBATCH --time={value}" in text


# --------------------------------------------------------------------------- 7: integers are integers


@pytest.mark.parametrize("source, edit, key", [
    (H100, lambda d: d["gpu"].update(gpus_per_node=8.0), "gpu/gpus_per_node"),
    (H100, lambda d: d.update(cpus_per_node=112.0), "cpus_per_node"),
    (H100, lambda d: d["gpu"].update(memory_gb=True), "gpu/memory_gb"),
    (INFINIBAND, lambda d: d["k8s"]["rdma_resource"].update(count=1.0), "k8s/rdma_resource/count"),
])
def test_whole_number_floats_are_no_integers(tmp_path, source, edit, key):
    path = _yaml_with(tmp_path, source, edit)
    option = "--profile" if source == H100 else "--fabric"
    err = _refused(["slurm", "--nnodes", "2", option, str(path)], key)
    assert str(path) in err and "not of type 'integer'" in err


# --------------------------------------------------------------------------- 9: names the runtime owns


@pytest.mark.parametrize("argv, name", [
    (["slurm"], "SLURM_JOB_ID"), (["slurm"], "SLURM_JOB_NUM_NODES"), (["slurm"], "SRUN_CPUS_PER_TASK"),
    (["k8s", "--api", "pytorchjob"], "PET_NNODES"), (["k8s", "--api", "pytorchjob"], "MASTER_ADDR"),
    (["k8s", "--api", "pytorchjob"], "PET_RDZV_ENDPOINT"), (["k8s", "--api", "pytorchjob"], "RANK"),
    (["k8s"], "PET_NNODES"), (["k8s"], "JOB_COMPLETION_INDEX"), (["k8s-runtime"], "PET_MASTER_PORT"),
    (["torchrun"], "RANK"), (["torchrun"], "LOCAL_WORLD_SIZE"), (["docker"], "TORCHELASTIC_RUN_ID"),
    (["env"], "MASTER_PORT"), (["run", "--dry-run"], "WORLD_SIZE"), (["slurm"], "GROUP_RANK"),
])
def test_names_the_backend_runtime_owns_are_refused(argv, name):
    _refused([*argv, "--env", f"{name}=1"], f"--env {name}")


def test_owned_names_apply_to_secrets_and_only_to_their_backend():
    _refused(["k8s", "--api", "pytorchjob", "--env-secret", "MASTER_ADDR=s:k"], "--env-secret MASTER_ADDR")
    for argv in (["torchrun"], ["docker"], ["k8s"]):
        render([*argv, "--env", "SLURM_CONF=/etc/x", "--env", "TMPDIR=/scratch"])  # Slurm's names: Slurm only
    # the user's on every backend: node-local scratch, unbuffered output (the operator sets 1 as well)
    render(["slurm", "--env", "TMPDIR=/local/scratch"])
    render(["k8s", "--api", "pytorchjob", "--env", "PYTHONUNBUFFERED=1"])


# --------------------------------------------------------------------------- 10: validation stays linear


def test_a_hostile_profile_list_validates_quickly(tmp_path):
    path = _yaml_with(tmp_path, H100, lambda d: d.update(fp8=[{"a": i} for i in range(6000)]))
    start = time.perf_counter()
    _refused(["env", "--profile", str(path)], "fp8")
    assert time.perf_counter() - start < 5


def test_repeated_enum_items_and_huge_files_are_refused(tmp_path):
    path = _yaml_with(tmp_path, H100, lambda d: d.update(fp8=["e4m3", "e4m3"]))
    _refused(["env", "--profile", str(path)], "listed twice")
    big = tmp_path / "big.yaml"
    big.write_text(H100.read_text() + "#" * (1 << 20) + "\n")
    _refused(["env", "--profile", str(big)], "more than the 1048576 allowed")


# --------------------------------------------------------------------------- 13: manifest size


@pytest.mark.parametrize("argv", [["k8s", "--api", "pytorchjob"], ["k8s"]])
def test_k8s_objects_stay_under_etcds_limit(tmp_path, argv):
    out = tmp_path / "job.yaml"
    out.write_text("# Generated by: launch k8s\nkept\n")  # an earlier render: -o may replace it
    env = [f"--env=V{i}={'x' * 100_000}" for i in range(12)]
    proc = run_cli([*argv, "--nnodes", "2", "--fabric", "infiniband", *env, "-o", str(out)])
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "bytes; Kubernetes keeps objects of at most 1.5 MiB" in proc.stderr
    assert out.read_text() == "# Generated by: launch k8s\nkept\n"
