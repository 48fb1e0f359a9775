"""The runtime contract: what a committed manifest's pod would run actually trains.

For every TrainJob and PyTorchJob under k8s/ (each equal to its fresh render, see
test_launch_k8s.py), this builds each pod's container the way its operator does
(k8s_operators.py: Trainer v2.3.0's JobSet builder and Torch plugin; training-operator
v1.9.0's setPodEnv / master / elastic env generators, with their source lines), then runs
the container's command line - ``torchrun`` plus the manifest's args - with the manifest's
environment plus the operator-injected ``PET_*`` variables, one process per "node" on this
machine (gloo, CPU). Multi-node manifests run as 2 nodes, single-node ones as 1 node with 2
processes.

What is changed to run on a 2-core CPU machine, and nothing else:

* the cluster DNS names of the rendezvous host (``<job>-node-0-0.<job>``,
  ``<job>-master-0``, ``<job>-worker-0``) become 127.0.0.1 and its port a free local port;
* ``PET_NPROC_PER_NODE`` (8 or 4 GPUs) becomes 1 per node (2 for a single node), and
  ``OMP_NUM_THREADS`` 1;
* ``--config tiny --steps 2 --out <tmp>`` is appended to the args (the training CLI takes
  the last value of a repeated option), so the 1b/8b presets become the tiny one.

Manifests whose pods run the same command lines with the same environment, but for the
fabric's variables (NCCL and its plugins, which gloo ignores) and ``--out``, run once
(:func:`_signature`; a test checks which manifests share one). All runs start together (each
mostly waits on torch imports and, for the elastic job, on the c10d rendezvous' 30 s last call).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from k8s_operators import pytorchjob_injected_env, trainer_jobset, trainer_pod_env
from launch_testlib import REPO
from testlib import free_port

pytestmark = pytest.mark.timeout(600)

COMMITTED = sorted((REPO / "k8s").glob("*.yaml"))
CPU_ARGS = ["--config", "tiny", "--steps", "2"]
RUN_TIMEOUT_S = 300


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _runtimes() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for p in COMMITTED for d in _docs(p) if d["kind"] == "ClusterTrainingRuntime"}


def _kubelet_expand(value: str) -> str:
    """$$ -> $ (the manifests have no $(VAR) references to other variables)."""
    assert not re.search(r"(?<!\$)\$\([A-Za-z_]", value.replace("$$", "")), value
    return value.replace("$$", "$")


def _static_env(container: dict) -> dict[str, str]:
    return {e["name"]: _kubelet_expand(e["value"]) for e in container.get("env", []) if "value" in e}


def _pods(path: Path) -> list[tuple[str, dict, dict[str, str]]]:
    """(pod name, container, environment as the kubelet would start it) for every pod to run."""
    docs = _docs(path)
    pods = []
    for doc in docs:
        if doc["kind"] == "TrainJob":
            ref = doc["spec"]["runtimeRef"]
            runtime = next((d for d in docs if d["kind"] == ref["kind"]), None) or _runtimes()[ref["name"]]
            jobset = trainer_jobset(doc, runtime)
            (rjob,) = jobset["spec"]["replicatedJobs"]
            (container,) = [c for c in rjob["template"]["spec"]["template"]["spec"]["containers"] if c["name"] == "node"]
            for index in range(rjob["template"]["spec"]["parallelism"]):
                env = {**_static_env(container), **trainer_pod_env(container, index)}
                pods.append((f"{doc['metadata']['name']}-node-0-{index}", container, env))
        elif doc["kind"] == "PyTorchJob":
            for role, replica in doc["spec"]["pytorchReplicaSpecs"].items():
                (container,) = [c for c in replica["template"]["spec"]["containers"] if c["name"] == "pytorch"]
                for index in range(replica["replicas"]):
                    env = {**_static_env(container), **pytorchjob_injected_env(doc, role, index)}
                    pods.append((f"{doc['metadata']['name']}-{role.lower()}-{index}", container, env))
    return pods


def _cpu_contract(pods, port: int, out: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """The pods to start on this machine: 2 nodes (or 1 node x 2 processes)."""
    multi = len(pods) > 1
    runs = []
    for name, container, env in pods[: 2 if multi else 1]:
        env = dict(env)
        for key in ("PET_MASTER_ADDR", "MASTER_ADDR"):
            if key in env:
                env[key] = "127.0.0.1"
        for key in ("PET_MASTER_PORT", "MASTER_PORT"):
            if key in env:
                env[key] = str(port)
        if "PET_RDZV_ENDPOINT" in env:
            env["PET_RDZV_ENDPOINT"] = f"127.0.0.1:{port}"
        env["PET_NPROC_PER_NODE"] = "1" if multi else "2"
        env["OMP_NUM_THREADS"] = "1"
        argv = [*container["command"], *[_kubelet_expand(a) for a in container["args"]], *CPU_ARGS, "--out", str(out)]
        runs.append((name, argv, env))
    return runs


def _manifests_with_jobs() -> list[Path]:
    return [p for p in COMMITTED if {d["kind"] for d in _docs(p)} & {"TrainJob", "PyTorchJob"}]


def test_operator_environment_matches_the_operators_contract():
    """What torchrun will read, per API (the values a pod gets before any CPU substitution)."""
    for path in _manifests_with_jobs():
        pods = _pods(path)
        first = pods[0][2]
        assert first["PET_NPROC_PER_NODE"] in ("8", "4")
        kind = {d["kind"] for d in _docs(path)}
        if "TrainJob" in kind:
            job = next(d for d in _docs(path) if d["kind"] == "TrainJob")["metadata"]["name"]
            assert first["PET_MASTER_ADDR"] == f"{job}-node-0-0.{job}" and first["PET_MASTER_PORT"] == "29500"
            assert [p[2]["PET_NODE_RANK"] for p in pods] == [str(i) for i in range(len(pods))]
            assert {p[2]["PET_NNODES"] for p in pods} == {str(len(pods))}
        elif "PET_RDZV_ENDPOINT" in first:  # elastic PyTorchJob
            assert first["PET_NNODES"] == "1:4" and first["PET_RDZV_BACKEND"] == "c10d"
            assert first["PET_RDZV_ENDPOINT"].endswith("-worker-0:29400") and "PET_NODE_RANK" not in first
        else:
            assert [p[2]["PET_NODE_RANK"] for p in pods] == [str(i) for i in range(len(pods))]
            assert first["PET_MASTER_PORT"] == "29400" and first["PET_MASTER_ADDR"].endswith("-master-0")


# Variables that only the GPU fabric reads (NCCL and its network plugins): gloo on CPU ignores them.
FABRIC_ONLY = ("NCCL_", "TORCH_NCCL_", "UCX_", "FI_", "CUDA_")


def _signature(runs) -> tuple:
    """What the CPU run of a manifest depends on: each pod's command line without the manifest's
    own ``--out`` (the appended one wins) and its environment without the substituted
    rendezvous address and the fabric-only variables. Two manifests with one signature run the
    same processes with the same inputs, so one run stands for both."""
    def argv_key(argv):
        out, skip = [], False
        for a in argv[: -len(CPU_ARGS) - 2]:
            if skip:
                skip = False
            elif a == "--out":
                skip = True
            else:
                out.append(a)
        return tuple(out)

    def env_key(env):
        return tuple(sorted((k, v) for k, v in env.items()
                            if not k.startswith(FABRIC_ONLY)
                            and k not in ("PET_MASTER_ADDR", "MASTER_ADDR", "PET_MASTER_PORT", "MASTER_PORT",
                                          "PET_RDZV_ENDPOINT")))
    return tuple((argv_key(argv), env_key(env)) for _, argv, env in runs)


def test_manifests_of_one_signature_differ_only_in_the_fabric_and_output(tmp_path):
    """The dedup below is sound: manifests share a signature only where their pods' command
    lines and environments differ in nothing but the fabric's variables and ``--out``."""
    by_sig = {}
    for path in _manifests_with_jobs():
        by_sig.setdefault(_signature(_cpu_contract(_pods(path), 1, tmp_path)), []).append(path.name)
    assert 3 <= len(by_sig) < len(_manifests_with_jobs()), by_sig
    kinds = {next(d["kind"] for d in _docs(REPO / "k8s" / names[0]) if d["kind"] in ("TrainJob", "PyTorchJob"))
             for names in by_sig.values()}
    assert kinds == {"TrainJob", "PyTorchJob"}


def test_each_manifest_command_trains_on_two_cpu_process_groups(tmp_path):
    """One run per distinct signature (:func:`_signature`), which covers every manifest."""
    base_env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    started = time.monotonic()
    jobs = {}
    covered = {}
    for path in _manifests_with_jobs():
        out = tmp_path / path.stem
        runs = _cpu_contract(_pods(path), free_port(), out)
        sig = _signature(runs)
        if sig in covered:
            covered[sig].append(path.name)
            continue
        covered[sig] = [path.name]
        procs = []
        for name, argv, env in runs:
            log = (tmp_path / f"{name}.log").open("w")
            procs.append((name, subprocess.Popen(argv, env={**base_env, **env}, cwd=tmp_path, stdout=log,
                                                 stderr=subprocess.STDOUT, start_new_session=True), log))
        jobs[path.name] = (out, procs, runs)
    failures = []
    try:
        for manifest, (out, procs, runs) in jobs.items():
            for name, proc, log in procs:
                try:
                    rc = proc.wait(timeout=max(1, RUN_TIMEOUT_S - (time.monotonic() - started)))
                except subprocess.TimeoutExpired:
                    rc = "timeout"
                log.close()
                text = (tmp_path / f"{name}.log").read_text()
                if rc != 0:
                    failures.append(f"{manifest} pod {name}: exit {rc}: {shlex.join(runs[0][1])}\n{text[-2000:]}")
            metrics = out / "metrics.jsonl"
            if not failures and (not metrics.is_file() or '"step": 2' not in metrics.read_text().splitlines()[-1]):
                failures.append(f"{manifest}: no step 2 in {metrics}")
            rank0 = (tmp_path / f"{procs[0][0]}.log").read_text()
            if "2 rank(s), backend gloo" not in rank0:
                failures.append(f"{manifest}: not a 2-rank gloo run:\n{rank0[-1500:]}")
    finally:
        for _, procs, _ in jobs.values():
            for _, proc, log in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                    proc.wait()
                log.close()
    elapsed = time.monotonic() - started
    print(f"{len(jobs)} runs for {sum(map(len, covered.values()))} manifests ({list(covered.values())}), "
          f"{sum(len(p) for _, p, _ in jobs.values())} torchrun processes, {elapsed:.1f} s")
    assert not failures, "\n\n".join(failures)
    assert sum(map(len, covered.values())) == len(_manifests_with_jobs()) >= 8 and len(jobs) >= 3
