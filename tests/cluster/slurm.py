"""A real Slurm (Debian slurm-wlm 22.05) on the emulated cluster: munged + slurmctld on node0,
one slurmd per node, configuration generated under the cluster's workdir.

    slurm = Slurm(cluster, cpus=2, memory_mb=4000)   # starts munged, slurmctld, slurmd x N
    jobid = slurm.sbatch(script, env=..., cwd=...)    # sbatch on node0 (the login node)
    slurm.job(jobid)          # dict of `scontrol show job` fields (JobState, Restarts, ExitCode, ...)
    slurm.wait_state(jobid, {"COMPLETED"}, timeout=300)
    slurm.scontrol("requeue", jobid); slurm.scancel("--signal=TERM", jobid)
    slurm.stop()              # daemons are also killed with the node namespaces at cluster teardown

The configuration needs no cgroups (this sandbox has none to delegate): proctrack/linuxproc
(every descendant of a step is signalled), task/affinity (tasks bound to their allocated
CPUs), select/cons_tres with CR_Core_Memory (--cpus-per-task and --mem are allocated and
checked against each node's CPUs and RealMemory). Partition ``batch`` (default,
PriorityTier 1, PreemptMode REQUEUE, GraceTime 60 s) can be preempted by partition ``urgent``
(PriorityTier 2) through preempt/partition_prio.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from cluster.harness import Cluster, kill_tree

SLURM_PACKAGES = ("slurmctld", "slurmd", "sbatch", "munged", "mungekey")


def slurm_missing() -> str | None:
    missing = [tool for tool in SLURM_PACKAGES if shutil.which(tool) is None]
    if missing:
        return f"Slurm/munge not installed ({', '.join(missing)} missing): run `bash scripts/cluster_deps.sh` as root"
    return None


class Slurm:
    def __init__(self, cluster: Cluster, cpus: int = 2, memory_mb: int = 4000, grace_time_s: int = 60,
                 kill_wait_s: int = 10, cred_expire_s: int = 10):
        reason = slurm_missing()
        if reason:
            raise RuntimeError(reason)
        self.cluster = cluster
        self.dir = cluster.workdir / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.log_dir = self.dir / "log"
        self.procs: list[subprocess.Popen] = []
        for sub in ("state", "log", "munge", "spool"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir / "munge", 0o700)
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self._write_conf(cpus, memory_mb, grace_time_s, kill_wait_s, cred_expire_s)
        self.env = {"SLURM_CONF": str(self.conf)}
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _write_conf(self, cpus: int, memory_mb: int, grace_time_s: int, kill_wait_s: int, cred_expire_s: int) -> None:
        c, d = self.cluster, self.dir
        head = c.nodes[0]
        names = ",".join(n.name for n in c.nodes)
        lines = [
            f"ClusterName={c.tag.lower()}",
            f"SlurmctldHost={head.name}({head.ip})",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire (default 120 s) is also how long Slurm holds a requeued job before it
            # may start again (a start before that is refused: "Job credential revoked").
            f"AuthInfo=socket={self.munge_socket},cred_expire={cred_expire_s}",
            "SlurmctldPort=6817", "SlurmdPort=6818",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}", f"SlurmdLogFile={self.log_dir / 'slurmd-%n.log'}",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/affinity",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
            "SchedulerType=sched/backfill", "MpiDefault=none", "SwitchType=switch/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "ReturnToService=2", f"KillWait={kill_wait_s}", "MinJobAge=600",
            "InactiveLimit=0", "Waittime=0", "MessageTimeout=10", "SlurmdTimeout=60", "JobRequeue=1",
            "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE",
            f"PlugStackConfig={d / 'plugstack.conf'}",
        ]
        for n in c.nodes:
            lines.append(f"NodeName={n.name} NodeAddr={n.ip} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN")
        lines.append(f"PartitionName=batch Nodes={names} Default=YES MaxTime=INFINITE State=UP "
                     f"PriorityTier=1 PreemptMode=REQUEUE GraceTime={grace_time_s}")
        lines.append(f"PartitionName=urgent Nodes={names} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF")
        (d / "plugstack.conf").write_text("")
        self.conf.write_text("\n".join(lines) + "\n")

    def _daemon(self, node, argv: list[str], name: str) -> subprocess.Popen:
        out = open(self.log_dir / f"{name}.stdout", "w")  # noqa: SIM115 - closed with the process
        # slurmd 22.05 initialises its cgroup plugin even with proctrack/linuxproc + task/affinity:
        # it needs a mounted cgroup tree to start, nothing more (no job is put in a cgroup).
        proc = node.popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, host_cgroups=True)
        out.close()
        self.procs.append(proc)
        return proc

    def _start(self) -> None:
        head = self.cluster.nodes[0]
        m = self.dir / "munge"
        subprocess.run(["mungekey", "--create", "--force", f"--keyfile={m / 'munge.key'}"], check=True,
                       capture_output=True, timeout=30)
        os.chmod(m / "munge.key", 0o600)
        self._daemon(head, ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                            f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                            f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"], "munged")
        self._wait(lambda: self.munge_socket.exists(), 20, "munged socket")
        self._daemon(head, ["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        for node in self.cluster.nodes:
            (self.dir / "spool" / node.name).mkdir(exist_ok=True)
            self._daemon(node, ["slurmd", "-D", "-f", str(self.conf), "-N", node.name], f"slurmd-{node.name}")
        self._wait(self._all_idle, 60, "every node IDLE in sinfo")

    def _all_idle(self) -> bool:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[-1] if proc.args else 'daemon'} exited {proc.returncode}: "
                                   + self.logs(tail=3000))
        out = self.client(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return len(states) == len(self.cluster.nodes) and all(s == "idle" for s in states.values())

    @staticmethod
    def _wait(predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm: timed out waiting for {what}")
            time.sleep(0.5)

    def logs(self, tail: int = 4000) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("*")):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name}\n{text[-tail:]}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ clients (run on node0)

    def client(self, argv: list[str], check: bool = True, env: dict | None = None, cwd=None,
               timeout: float = 30) -> subprocess.CompletedProcess:
        proc = self.cluster.nodes[0].run(argv, timeout=timeout, env={**self.env, **(env or {})}, cwd=cwd)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, script: Path, *args: str, env: dict | None = None, cwd=None) -> str:
        out = self.client(["sbatch", "--parsable", *args, str(script)], env=env, cwd=cwd).stdout.strip()
        return out.split(";")[0]

    def scontrol(self, *args: str) -> str:
        return self.client(["scontrol", *args]).stdout

    def scancel(self, *args: str) -> None:
        self.client(["scancel", *args])

    def job(self, jobid: str) -> dict[str, str]:
        out = self.client(["scontrol", "-o", "show", "job", jobid]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_state(self, jobid: str, states: set[str], timeout: float, fail_states=("FAILED", "CANCELLED",
                   "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(jobid)
            state = info.get("JobState", "")
            if state in states:
                return info
            if state in fail_states and state not in states:
                raise AssertionError(f"job {jobid} ended {state} (ExitCode {info.get('ExitCode')}): {info}")
            if time.monotonic() > deadline:
                raise AssertionError(f"job {jobid} still {state} after {timeout:.0f}s (waiting for {states})")
            time.sleep(1)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            kill_tree(proc, 15)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_tree(proc, 9)
                proc.wait(timeout=10)
        self.procs.clear()
