"""Failure classes a fuzzing review found in the rendered scripts, each run for real (bash against
the recording stand-ins of launch_testlib): run-time values in bash arithmetic, the docker
script's chown, `launch run` with long arguments, warnings that print more than one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from launch_testlib import (
    PY,
    REPO,
    SHELLCHECK,
    read_record,
    render,
    run_cli,
    stub_env,
    write_address_stubs,
    write_stubs,
)

pytestmark = pytest.mark.timeout(180)

MULTI = ["--nnodes", "2", "--fabric", "ethernet", "--preflight"]
EVIL = "h:BASH_VERSINFO[$(touch {canary})0]"


@pytest.fixture
def stubs(tmp_path):
    bindir, record = tmp_path / "bin", tmp_path / "record.json"
    write_stubs(bindir, record)
    env = stub_env(bindir, tmp_path)
    env.update(LAUNCH_ENGINE="docker", LAUNCH_ROOTLESS="1", LAUNCH_GPUS="none")
    return tmp_path, record, env


def _run(tmp: Path, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    script = tmp / "job.sh"
    script.write_text(render(argv))
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


# --------------------------------------------------------------------------- 1: arithmetic on run-time values


@pytest.mark.parametrize("backend", ["torchrun", "docker"])
@pytest.mark.parametrize("endpoint", [EVIL, "h:1)+$(touch {canary}", "h:99999", "h:0", "a b:1", "h:1\nx"])
def test_a_hostile_rendezvous_endpoint_stops_the_script_before_any_arithmetic(stubs, backend, endpoint):
    tmp, record, env = stubs
    canary = tmp / "PWNED"
    extra = ["--checkpoint-dir", str(tmp / "ckpt")] if backend == "docker" else []
    proc = _run(tmp, [backend, *MULTI, *extra], {**env, "LAUNCH_RDZV_ENDPOINT": endpoint.format(canary=canary)})
    assert proc.returncode == 2, proc.stderr
    assert not canary.exists() and not record.exists()
    (line,) = [ln for ln in proc.stderr.splitlines() if "rendezvous endpoint" in ln]
    assert "expected HOST:PORT" in line


@pytest.mark.parametrize("endpoint, expect, given", [("head:31000", "head:31001", "head:31000"),
                                                     ("[fd00::1]:029", "[fd00::1]:30", "[fd00::1]:29"),
                                                     ("10.0.0.1", "10.0.0.1:29401", "10.0.0.1:29400")])
def test_good_endpoints_give_the_preflight_port_plus_one(tmp_path, endpoint, expect, given):
    """The preflight meets one port above the training's; an endpoint without a port is torchrun's
    default port, 29400, written out (the script's own address lookup reads HOST:PORT)."""
    bindir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bindir.mkdir()
    write_address_stubs(bindir)
    (bindir / "torchrun").write_text(f"#!{PY}\nimport json, sys\nopen({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    (bindir / "torchrun").chmod(0o755)
    env = {**stub_env(bindir, tmp_path), "LAUNCH_RDZV_ENDPOINT": endpoint}
    proc = _run(tmp_path, ["torchrun", *MULTI], env)
    assert proc.returncode == 0, proc.stderr
    pre, train = [json.loads(line) for line in log.read_text().splitlines()]
    assert pre[pre.index("--rdzv-endpoint") + 1] == expect
    assert train[train.index("--rdzv-endpoint") + 1] == given


def test_the_preflight_endpoint_at_the_top_port_is_refused(stubs):
    tmp, _, env = stubs
    proc = _run(tmp, ["torchrun", *MULTI], {**env, "LAUNCH_RDZV_ENDPOINT": "head:65535"})
    assert proc.returncode == 2 and "outside 1..65535" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name, value", [("SLURM_RESTART_COUNT", EVIL), ("SLURM_RESTART_COUNT", "1+1"),
                                         ("SLURM_JOB_ID", "1/../../x"), ("SLURM_JOB_ID", "$(touch {canary})")])
def test_slurm_numbers_are_digits_before_arithmetic(stubs, name, value):
    tmp, record, env = stubs
    canary = tmp / "PWNED"
    proc = _run(tmp, ["slurm", *MULTI], {**env, name: value.format(canary=canary)})
    assert proc.returncode == 2, proc.stderr
    assert not canary.exists() and not record.exists()
    assert len([ln for ln in proc.stderr.splitlines() if "expected whole numbers" in ln]) == 1


def test_slurm_attempt_number_and_preflight_port(stubs):
    tmp, _, env = stubs
    proc = _run(tmp, ["slurm", *MULTI], {**env, "SLURM_RESTART_COUNT": "08"})  # 08: decimal, not octal
    assert proc.returncode == 0, proc.stderr
    assert "attempt 9 on" in proc.stdout


@pytest.mark.parametrize("name, value", [("PET_RDZV_ENDPOINT", EVIL), ("PET_MASTER_PORT", "BASH_VERSINFO[$(touch {canary})0]")])
def test_k8s_preflight_checks_the_operators_values(tmp_path, name, value):
    doc = yaml.safe_load(render(["k8s", "--api", "pytorchjob", *MULTI]))
    container = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    script = container["command"][2].replace("$$", "$")
    canary = tmp_path / "PWNED"
    env = {"PATH": os.environ["PATH"], name: value.format(canary=canary)}
    proc = subprocess.run(["bash", "-c", script, "launch-preflight"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and not canary.exists(), proc.stderr
    assert proc.stderr.count("\n") == 1 and f"launch: {name}=" in proc.stderr


# Every name inside $(( )) / (( )) in a template is the script's own, set from digits it checked
# (or from /proc and ulimit): a new run-time value in arithmetic must be checked and listed here.
ARITHMETIC_NAMES = {
    "SECONDS", "preflight_start", "preflight_port", "restart_count", "BASH_REMATCH", "launch_status", "again",
    "hard_nproc", "pid_max", "capeff", "ign", "cgt", "limited", "created", "EUID", "port",
    # slurm.sbatch.j2: SLURM_CPUS_* digits-checked into task_cpus/count; _node_addr.j2: LAUNCH_RDZV_WAIT_S
    # digits-checked into wait_s, deadline = SECONDS + wait_s
    "task_cpus", "count", "wait_s", "deadline",
}


def test_templates_do_arithmetic_only_on_checked_values():
    texts = [p.read_text() for p in (REPO / "launch" / "templates").glob("*.j2")]
    doc = yaml.safe_load(render(["k8s", "--api", "pytorchjob", *MULTI]))  # the pods' preflight script
    texts.append(doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"][2])
    found = set()
    for text in texts:
        for expr in re.findall(r"\(\((.*?)\)\)", text):
            expr = re.sub(r"\b(0x|16#|10#)", " ", expr)
            found |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expr))
    assert found - {"if"} <= ARITHMETIC_NAMES, found - ARITHMETIC_NAMES


def test_rendered_scripts_stay_shellcheck_clean(tmp_path):
    for backend in ("torchrun", "docker", "slurm"):
        path = tmp_path / f"{backend}.sh"
        path.write_text(render([backend, *MULTI]))
        proc = subprocess.run([SHELLCHECK, "--shell=bash", "--severity=style", str(path)], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout


# --------------------------------------------------------------------------- 8: the docker script's chown


@pytest.mark.parametrize("path", ["/var/empty/sshd", "/var/tmp", "/var/lib", "/var/lib/x", "/var/log", "/var/spool/cron",
                                  "/var/cache/x", "/var/mail", "/root/.ssh", "/home/u/.ssh/x", "/home/u/.gnupg"])
def test_system_trees_are_no_checkpoint_directory(path):
    proc = run_cli(["docker", "--checkpoint-dir", path])
    assert proc.returncode == 2 and "--checkpoint-dir" in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and not proc.stdout


def test_user_places_stay_allowed():
    for path in ("/var/tmp/ckpt", "/root/ckpt", "/home/u/ckpt", "/checkpoints", "/home/u/.cache/ckpt"):
        render(["docker", "--checkpoint-dir", path])
    render(["docker", "--mount", "/home/u/.cache/huggingface:/data/hf:ro"])  # a cache may be mounted
    render(["docker", "--mount", "/var/lib/datasets:/data:ro"])  # system data may be read


@pytest.mark.parametrize("mount", ["/var/lib/datasets:/data", "/var/lib/datasets:/data:rw", "/root/.ssh:/keys:ro"])
def test_system_data_is_never_mounted_read_write_and_credentials_never(mount):
    proc = run_cli(["docker", "--mount", mount])
    assert proc.returncode == 2 and "--mount" in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_docker_chowns_only_a_directory_it_created(stubs):
    tmp, record, env = stubs
    env = {**env, "LAUNCH_ROOTLESS": "0"}
    old = tmp / "old"
    old.mkdir()  # empty and root-owned, there before the script
    proc = _run(tmp, ["docker", "--cpu", "--checkpoint-dir", str(old)], env)
    assert proc.returncode == 0, proc.stderr
    assert (old.stat().st_uid, old.stat().st_gid) == (0, 0)
    assert "--user=0:0" in read_record(record, ".docker")["opts"]
    new = tmp / "a" / "new"
    proc = _run(tmp, ["docker", "--cpu", "--checkpoint-dir", str(new)], env)
    assert proc.returncode == 0, proc.stderr
    assert new.stat().st_uid == 1000 and (tmp / "a").stat().st_uid == 0  # only the directory itself


# --------------------------------------------------------------------------- 12: launch run, long arguments


def test_run_passes_a_script_over_128k_not_on_stdin(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "torchrun.json"
    bindir.mkdir()
    write_address_stubs(bindir)
    (bindir / "torchrun").write_text(f"#!{PY}\n" + textwrap.dedent(f"""
        import json, os, sys
        fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
        with open({str(log)!r}, "w") as fh:
            json.dump({{"argv": sys.argv[1:], "stdin": sys.stdin.read(), "fds": fds}}, fh)
    """))
    (bindir / "torchrun").chmod(0o755)
    big = "x" * 120_000  # under MAX_ARG_STRLEN itself; the script holding it is not
    proc = run_cli(["run", "--nproc-per-node", "1", "--", "--note", big], input="from-stdin",
                   env={"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr[-500:]
    got = json.loads(log.read_text())
    assert got["argv"][-2:] == ["--note", big]
    assert got["stdin"] == ""  # bash gives a background torchrun /dev/null; never the script
    assert got["fds"] == [0, 1, 2, 3]  # 3: listdir's own; the script's file is not passed on


# --------------------------------------------------------------------------- 11: warnings are one line


@pytest.mark.parametrize("out", ["/x\nlaunch: all checks passed", "/x\x1b[2J\rlaunch: ok", "/x\u2028forged"])
def test_warnings_are_one_printable_line(out):
    proc = run_cli(["docker", "--", "--out", out])
    assert proc.returncode == 0, proc.stderr
    warnings = proc.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("launch: warning: docker: --out"), proc.stderr
    assert "\x1b" not in proc.stderr and "\r" not in proc.stderr and "\u2028" not in proc.stderr


@pytest.mark.parametrize("node_addr, endpoint", [("fd00::1", "[fd00::1]:29400"), ("10.1.2.3", "10.1.2.3:29400")])
def test_slurm_takes_an_ipv6_node_addr(stubs, node_addr, endpoint):
    """Slurm with IPv6 node addresses (CommunicationParameters=EnableIPv6): the first node's
    NodeAddr becomes a bracketed rendezvous endpoint, as torchrun and the script's check read it."""
    tmp, record, env = stubs
    (tmp / "bin" / "scontrol").write_text(f"""#!{PY}
import sys
if sys.argv[1:3] == ["show", "hostnames"]:
    print("node-a"); print("node-b")
else:
    print("NodeName=node-a Arch=x86_64 NodeAddr={node_addr} NodeHostName=node-a State=ALLOCATED")
""")
    env = {**env, "LAUNCH_NODE_ADDR": "10.9.9.9", "LAUNCH_RDZV_WAIT_S": "0"}
    proc = _run(tmp, ["slurm", "--nnodes", "2", "--fabric", "ethernet"], env)
    assert "expected HOST:PORT" not in proc.stderr, proc.stderr
    text = (tmp / "job.sh").read_text()
    assert "rdzv_host=\"[$rdzv_host]\"" in text
    argv = read_record(record)["argv"] if record.exists() else []
    assert argv and argv[argv.index("--rdzv-endpoint") + 1] == endpoint, proc.stderr
