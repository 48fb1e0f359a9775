"""The rendered `launch slurm` script (bare-metal/venv variant) under a real Slurm 22.05 on the
emulated 2-node cluster: sbatch, resources as rendered, preemption/requeue/resume, logs.

Slurm holds a requeued job for the credential lifetime (AuthInfo cred_expire, default 120 s)
before it may start again; the test cluster sets cred_expire=10 to keep the suite short.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import yaml
from cluster.jobs import REPO, job_env, load_checkpoint_check, metrics, render, wait_for, world_sizes

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

VENV = str(Path(sys.executable).parent.parent)
SMALL = ["--set", "train.log_every=1", "--set", "train.batch_size=8", "--set", "train.seq_len=64"]


def node_profile(workdir: Path) -> Path:
    """A profile describing the emulated node (2 CPUs, 2 processes), as a user writes one for a site."""
    data = yaml.safe_load((REPO / "core" / "profiles" / "generic.yaml").read_text())
    data["description"] = "emulated cluster node: 2 CPU cores, 2 training processes"
    data["gpu"]["gpus_per_node"] = 2
    data["cpus_per_node"] = 2
    path = workdir / "emulated.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def render_job(slurm, name: str, steps: int, options: list[str] = (), train: list[str] = ()) -> tuple[Path, Path]:
    workdir = slurm.cluster.workdir
    run_dir = workdir / f"run-{name}"
    script = render("slurm", ["--profile", str(node_profile(workdir)), "--nnodes", "2", "--name", name,
                              "--gpu-gres", "none", "--venv", VENV, "--env", "OMP_NUM_THREADS=1", *options],
                    ["--config", "tiny", "--steps", str(steps), *SMALL, *train, "--out", str(run_dir), "--resume"],
                    workdir / f"{name}.sbatch")
    return script, run_dir


def submit(slurm, script: Path, env: dict | None = None) -> str:
    return slurm.sbatch(script, env=job_env(**(env or {})), cwd=str(slurm.cluster.workdir))


def log_of(slurm, name: str, jobid: str) -> str:
    path = slurm.cluster.workdir / f"{name}-{jobid}.out"
    return path.read_text(errors="replace") if path.exists() else ""


# torchrun's exit barrier races with the agent that hosts the rendezvous store: when that agent
# (node 0's) passes the barrier and exits first, another agent still waiting for the barrier's
# answer loses the connection and torch logs the error with a C++ and a Python traceback, then
# exits 0 like the others ("Error waiting on exit barrier"). Seen here on clean stops and on
# the final completion when the machine is loaded (3 of 5 attempts in one run beside other
# work); the job's result is unchanged (docs/fault-tolerance.md). Only those lines are left out.
_EXIT_BARRIER_RACE = re.compile(
    r"^(\[W\S* \S* TCPStore\.cpp:\d+\] \[c10d\] (recvValueWithTimeout|sendBytes) failed on .*"
    r"|Exception raised from (recvBytes|sendBytes) at .*|frame #\d+: .*|<omitting python frames>"
    r"|E\S* \S* \d+ \S*torch/distributed/elastic/agent/server/api\.py:\d+\] .*"
    r"|W\S* \S* \d+ \S*dynamic_rendezvous\.py:\d+\] The node '\S+' has failed to shutdown the rendezvous .*)$")


def without_exit_barrier_race(log: str) -> str:
    """``log`` without torch's messages of the exit-barrier race above; any other agent
    error stays (and an agent error block must be that one: it starts with its message)."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if "elastic/agent/server/api.py" in line and line.startswith("E") and (
                i == 0 or "elastic/agent/server/api.py" not in lines[i - 1]):
            assert "Error waiting on exit barrier" in line, line
    return "\n".join(line for line in lines if not _EXIT_BARRIER_RACE.match(line))


def worker_affinity(node) -> dict[int, str]:
    """Cpus_allowed_list of every training worker on the node: the `train run` processes that
    torchrun started (its children; helpers they fork later are not sampled)."""
    procs = {}
    for pid in node.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        procs[pid] = (cmdline, status)
    torchruns = {pid for pid, (cmdline, _) in procs.items()
                 if any(arg.endswith(b"torchrun") for arg in cmdline[:2]) or b"torch.distributed.run" in cmdline}
    found = {}
    for pid, (cmdline, status) in procs.items():
        parent = int(re.search(r"PPid:\s*(\d+)", status).group(1))
        if parent in torchruns and b"-m" in cmdline and b"train" in cmdline and b"run" in cmdline:
            found[pid] = re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)
    return found


def affinity_samples(nodes, timeout: float = 240) -> dict[str, dict[int, set[str]]]:
    """Every worker's CPU lists seen, sampled every 0.1 s until no worker is left on any node."""
    seen: dict[str, dict[int, set[str]]] = {}
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        now = {n.name: worker_affinity(n) for n in nodes}
        if not any(now.values()):
            break
        for node, procs in now.items():
            for pid, cpus in procs.items():
                seen.setdefault(node, {}).setdefault(pid, set()).add(cpus)
        time.sleep(0.1)
    return seen


@pytest.mark.parametrize("resources", ["profile", "node"])
def test_slurm_job_trains_to_completion_with_rendered_resources(slurm, resources):
    """profile: --cpus-per-task from the profile; node (the default): whole nodes (--exclusive),
    srun's tasks get every CPU of the allocation. Either way each worker holds both CPUs."""
    name = f"complete-{resources}"
    script, run_dir = render_job(slurm, name, 16, ["--memory", "1500Mi", "--node-resources", resources])
    text = script.read_text()
    assert "#SBATCH --mem=1500M" in text and "--gpus" not in text
    assert ("#SBATCH --cpus-per-task=2" in text) == (resources == "profile")
    assert ("#SBATCH --exclusive" in text) == (resources == "node")
    jobid = submit(slurm, script)
    try:
        wait_for(lambda: all(len(worker_affinity(n)) >= 2 for n in slurm.cluster.nodes) or None,
                 240, "2 training processes on each node")
        affinity = affinity_samples(slurm.cluster.nodes)
        info = slurm.wait_state(jobid, {"COMPLETED"}, timeout=300)
    except AssertionError:
        print(log_of(slurm, name, jobid)[-5000:])
        raise
    log = log_of(slurm, name, jobid)
    # --cpus-per-task from the profile (2) and --mem as rendered, allocated by cons_tres ...
    assert info["MinMemoryNode"] == "1500M" and info["ExitCode"] == "0:0", info
    assert info["MinCPUsNode"] == "2" or resources == "node", info
    # ... and task/affinity binds every worker to the task's 2 CPUs (not one core for all). In some
    # runs of the whole cluster suite on the 2-core CI VM a worker was seen with one CPU for a
    # moment (cause not found); each worker must hold both CPUs, sampled over its life.
    assert sorted(affinity) == ["node0", "node1"], affinity
    for node, procs in affinity.items():
        assert len(procs) >= 2 and all("0-1" in cpus for cpus in procs.values()), (node, procs)
    assert "launch: job " + jobid + " (" + name + ") attempt 1 on node[0-1]" in log
    assert world_sizes(log) == [4], log[-3000:]
    rows = metrics(run_dir)
    assert rows[-1]["step"] == 16 and rows[-1]["loss"] < rows[0]["loss"] - 0.3


def test_slurm_binding_follows_rendered_cpus(slurm):
    """--cpus 1: each task (torchrun and its workers) is bound to a single CPU, as rendered."""
    workdir = slurm.cluster.workdir
    probe = workdir / "affinity.py"
    probe.write_text("import os, pathlib, socket, sys\npathlib.Path(sys.argv[1], 'affinity-' + os.environ['RANK'])"
                     ".write_text(f\"{socket.gethostname()} {sorted(os.sched_getaffinity(0))}\")\n")
    script = render("slurm", ["--profile", str(node_profile(workdir)), "--nnodes", "2", "--name", "bind",
                              "--gpu-gres", "none", "--venv", VENV, "--cpus", "1", "--entrypoint", f"python {probe}"],
                    [str(workdir)], workdir / "bind.sbatch")
    jobid = submit(slurm, script)
    slurm.wait_state(jobid, {"COMPLETED"}, timeout=180)
    seen = sorted((workdir / f"affinity-{rank}").read_text() for rank in range(4))
    assert [s.split()[0] for s in seen] == ["node0", "node0", "node1", "node1"], seen
    assert all(len(s.split(" ", 1)[1].strip("[]").split(",")) == 1 for s in seen), seen


def test_slurm_rejects_what_the_cluster_cannot_give_and_missing_torchrun(slurm):
    workdir = slurm.cluster.workdir
    # --mem is a real request: more than a node's RealMemory (4000 MB) is refused at submit.
    script, _ = render_job(slurm, "bigmem", 4, ["--memory", "8Gi"])
    proc = slurm.client(["sbatch", str(script)], check=False, env=job_env(), cwd=str(workdir))
    assert proc.returncode != 0 and "Memory" in proc.stderr, proc.stderr
    # GPUs requested by default; this CPU-only cluster refuses them (hence --gpu-gres none above).
    gpus = render("slurm", ["--profile", str(node_profile(workdir)), "--nnodes", "2", "--name", "gpus"], [],
                  workdir / "gpus.sbatch")
    proc = slurm.client(["sbatch", str(gpus)], check=False, env=job_env(), cwd=str(workdir))
    assert proc.returncode != 0 and "gres" in proc.stderr.lower(), proc.stderr
    # No --venv and no torchrun on PATH: the job fails at once with one line, exit 2.
    script = render("slurm", ["--profile", str(node_profile(workdir)), "--nnodes", "2", "--name", "nopath",
                              "--gpu-gres", "none"], [], workdir / "nopath.sbatch")
    jobid = slurm.sbatch(script, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, cwd=str(workdir))
    info = slurm.wait_state(jobid, {"FAILED"}, timeout=60)
    assert info["ExitCode"] == "2:0", info
    lines = [ln for ln in log_of(slurm, "nopath", jobid).splitlines() if not ln.startswith("launch: job ")]
    assert lines == ["launch: torchrun not found on PATH on node0: activate the training environment before "
                     "sbatch or render with --venv DIR"], lines


def _release_requeued(slurm, jobid: str, restarts: int, timeout: float = 120) -> dict:
    """Wait until the job was requeued `restarts` times and runs again (after cred_expire)."""
    return wait_for(lambda: (lambda i: i if int(i["Restarts"]) >= restarts and i["JobState"] == "RUNNING" else None)(
        slurm.job(jobid)), timeout, f"job {jobid} requeued ({restarts}) and running again")


def _progress(slurm, jobid, run_dir, name, beyond: int, timeout: float = 240) -> int:
    def check():
        info = slurm.job(jobid)
        if info["JobState"] not in ("RUNNING", "PENDING", "REQUEUED", "CONFIGURING"):
            raise AssertionError(f"job ended {info['JobState']} ({info}) before step {beyond}:\n" + slurm.logs(2000) + "\n"
                                 + log_of(slurm, name, jobid)[-4000:])
        rows = metrics(run_dir)
        return rows[-1]["step"] if rows and rows[-1]["step"] >= beyond else None
    return wait_for(check, timeout, f"training past step {beyond}")


def test_slurm_preemption_requeues_and_resumes_to_completion(slurm, tmp_path):
    """Every way a job is told to stop for now ends in a requeue that resumes, never FAILED:
    scancel --signal=TERM (what --signal=TERM@grace sends), a SIGTERM to the batch shell
    (scancel -b; --signal=B:TERM), scancel --full, and partition preemption with
    PreemptMode=REQUEUE + GraceTime. Then the job finishes: COMPLETED, every attempt in one log."""
    name, steps = "preempt", 40
    script, run_dir = render_job(slurm, name, steps, ["--grace-period", "30"], ["--checkpoint-every", "2"])
    jobid = submit(slurm, script)
    hog = slurm.cluster.workdir / "urgent.sh"
    hog.write_text("#!/bin/bash\nsleep 2\n")
    stops = []
    ways = ["scancel --signal=TERM", "scancel -b --signal=TERM", "scancel --full --signal=TERM", "preemption"]
    try:
        for restarts, way in enumerate(ways, start=1):
            done = metrics(run_dir)[-1]["step"] if metrics(run_dir) else 0
            at = _progress(slurm, jobid, run_dir, name, done + 2)
            if way == "preemption":
                slurm.sbatch(hog, "--partition=urgent", "--nodes=2", "--exclusive", "--output=/dev/null",
                             cwd=str(slurm.cluster.workdir))
            else:
                slurm.scancel(*way.split()[1:], jobid)
            _release_requeued(slurm, jobid, restarts)
            stops.append((way, at))
        info = slurm.wait_state(jobid, {"COMPLETED"}, timeout=300)
    finally:
        log = log_of(slurm, name, jobid)
        (tmp_path / "job.log").write_text(log)
        print(f"the whole job log: {tmp_path / 'job.log'}\n{log[-6000:]}")
    assert info["Restarts"] == str(len(ways)) and info["ExitCode"] == "0:0", info
    # One log for the job: every attempt's header line is kept (--open-mode=append).
    attempts = re.findall(rf"launch: job {jobid} \(preempt\) attempt (\d+) on", log)
    assert attempts == [str(i) for i in range(1, len(ways) + 2)], attempts
    clean = log.count("stopped: the training processes checkpointed and exited")
    assert clean >= len(ways) - 1, stops  # scancel --full: srun SIGKILLs its tasks (see docs)
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", log)]
    assert len(resumed) == len(ways) and resumed == sorted(resumed) and resumed[0] > 0, resumed
    ours = without_exit_barrier_race(log)
    assert "SignalException" not in ours and "Traceback" not in ours, ours[-4000:]
    rows = metrics(run_dir)
    assert rows[-1]["step"] == steps
    load_checkpoint_check(run_dir, steps, SMALL)


def test_slurm_time_limit_signal_requeues_and_plain_scancel_stops(slurm):
    """--time 2 min with --grace-period 30: the script's own --signal=TERM@30 arrives before the
    limit (slurmctld checks every 30 s and sends it up to one check early: 60-90 s into each
    attempt); the job checkpoints, requeues itself and the next attempt resumes. A plain scancel
    then ends it for good (CANCELLED, no requeue)."""
    name = "timelimit"
    script, run_dir = render_job(slurm, name, 10_000, ["--time", "00:02:00", "--grace-period", "30"],
                                 ["--checkpoint-every", "5"])
    assert "#SBATCH --signal=TERM@30" in script.read_text()
    jobid = submit(slurm, script)
    try:
        _release_requeued(slurm, jobid, 1, timeout=200)
        wait_for(lambda: "resumed from" in log_of(slurm, name, jobid), 180, "attempt 2 resuming")
        slurm.scancel(jobid)
        slurm.wait_state(jobid, {"CANCELLED"}, timeout=120)
        time.sleep(15)  # longer than cred_expire: a requeue would show by now
        info = slurm.job(jobid)
    finally:
        log = log_of(slurm, name, jobid)
        print(log[-5000:])
    assert info["Restarts"] == "1" and info["JobState"] == "CANCELLED", info
    assert "stopped: the training processes checkpointed and exited" in log
    assert re.search(r"resumed from \S+ at step [1-9]", log)
    tail = log.split("resumed from")[-1]
    if "stopped:" in tail:  # attempt 2's tasks stopped within KillWait: the script saw the cancel
        assert re.search(r"launch: not requeued \(job state (CANCELLED|COMPLETING)", tail), tail
