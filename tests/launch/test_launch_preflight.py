"""`launch ... --preflight`: every backend runs `train preflight` first and stops (exit 3) when it
fails; declared busbw per fabric; bad values are one-line usage errors.

(The real thing, on network namespaces with a throttled node: tests/cluster/test_preflight.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest
import yaml

from launch_testlib import PY, SHELLCHECK, fabrics, render, run_cli, write_address_stubs

pytestmark = pytest.mark.timeout(120)

MULTI = ["--nnodes", "2", "--fabric", "ethernet", "--rdzv-endpoint", "node0:29400"]


def test_every_fabric_declares_a_busbw_with_its_reason():
    from core import catalog

    for name in fabrics():
        fab = catalog.load_fabric(name)
        assert fab.busbw_GBps and fab.busbw_GBps > 0, name
        assert len(fab.busbw_why) > 30, name


@pytest.mark.parametrize("backend", ["torchrun", "docker", "slurm"])
@pytest.mark.parametrize("nodes", [MULTI, []], ids=["2nodes", "1node"])
def test_shell_backends_run_the_preflight_before_training(backend, nodes, tmp_path):
    text = render([backend, *nodes, "--preflight", "--", "--config", "tiny"])
    plain = render([backend, *nodes, "--", "--config", "tiny"])
    assert "preflight" not in plain  # off by default
    assert text.index("preflight_cmd=(") < text.rindex("\"${train_cmd[@]}\"")  # before the training runs
    assert "  -m train\n  preflight\n  --min-fraction 0.5\n" in text
    expect = "1" if nodes else None
    if expect:
        assert "--expect-busbw 1\n" in text and '--rdzv-endpoint "$preflight_endpoint"' in text
    path = tmp_path / "job.sh"
    path.write_text(text)
    for cmd in (["bash", "-n", str(path)], [SHELLCHECK, "--shell=bash", "--severity=style", str(path)]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def _stub_torchrun(bindir, log):
    bindir.mkdir()
    write_address_stubs(bindir)
    stub = bindir / "torchrun"
    stub.write_text(f"#!{PY}\n" + textwrap.dedent(f"""
        import json, os, sys
        with open({str(log)!r}, "a") as fh:
            fh.write(json.dumps(sys.argv[1:]) + "\\n")
        sys.exit(int(os.environ.get("STUB_PREFLIGHT_RC", "0")) if "preflight" in sys.argv else 0)
    """))
    stub.chmod(0o755)


@pytest.mark.parametrize("preflight_rc, expect_rc, calls", [(0, 0, 2), (1, 3, 1)])
def test_a_failed_preflight_stops_the_job_with_exit_3(tmp_path, preflight_rc, expect_rc, calls):
    log = tmp_path / "calls.jsonl"
    _stub_torchrun(tmp_path / "bin", log)
    script = tmp_path / "job.sh"
    script.write_text(render(["torchrun", *MULTI, "--preflight", "--preflight-min-fraction", "0.25",
                              "--preflight-busbw", "12.5", "--", "--config", "tiny"]))
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "STUB_PREFLIGHT_RC": str(preflight_rc),
           "LAUNCH_RDZV_ENDPOINT": "127.0.0.1:31000"}  # loopback: this node is the host
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == expect_rc, proc.stderr
    argvs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(argvs) == calls
    pre = argvs[0]
    assert pre[pre.index("--rdzv-endpoint") + 1] == "127.0.0.1:31001"  # the training's host, port + 1
    assert pre[pre.index("--rdzv-id") + 1] == "train-preflight"
    assert pre[-7:] == ["-m", "train", "preflight", "--min-fraction", "0.25", "--expect-busbw", "12.5"]
    if calls == 2:
        assert argvs[1][argvs[1].index("--rdzv-endpoint") + 1] == "127.0.0.1:31000"
        assert argvs[1][-4:] == ["run", "--config", "tiny"] or "run" in argvs[1]
        assert "launch: preflight passed in" in proc.stderr
    else:
        assert "launch: preflight failed (see above): not starting training" in proc.stderr


def test_k8s_pods_run_the_preflight_then_exec_training(tmp_path):
    text = render(["k8s", "--api", "pytorchjob", "--nnodes", "2", "--fabric", "infiniband", "--preflight", "--", "--config", "tiny"])
    doc = yaml.safe_load(text)
    for spec in doc["spec"]["pytorchReplicaSpecs"].values():
        c = spec["template"]["spec"]["containers"][0]
        assert c["command"][:2] == ["bash", "-c"] and c["command"][3] == "launch-preflight"
        script = c["command"][2].replace("$$", "$")  # Kubernetes turns $$ into $
        assert "-m train preflight --min-fraction 0.5 --expect-busbw 40" in script
        assert script.endswith('exec torchrun "$@"') and c["args"][:3] == ["-m", "train", "run"]
        path = tmp_path / "pod.sh"
        path.write_text("#!/usr/bin/env bash\n" + script + "\n")
        proc = subprocess.run([SHELLCHECK, "--shell=bash", str(path)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout
    plain = yaml.safe_load(render(["k8s", "--api", "pytorchjob", "--nnodes", "2", "--fabric", "infiniband", "--", "--config", "tiny"]))
    assert all(s["template"]["spec"]["containers"][0]["command"] == ["torchrun"]
               for s in plain["spec"]["pytorchReplicaSpecs"].values())


def test_trainjob_refuses_preflight_for_now():
    proc = run_cli(["k8s", "--nnodes", "2", "--fabric", "infiniband", "--preflight", "--", "--config", "tiny"])
    assert proc.returncode == 2 and "--api pytorchjob" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, culprit", [
    (["--preflight", "--preflight-min-fraction", "0"], "--preflight-min-fraction"),
    (["--preflight", "--preflight-min-fraction", "1.5"], "--preflight-min-fraction"),
    (["--preflight", "--preflight-busbw", "0"], "--preflight-busbw"),
    (["--preflight", "--preflight-busbw", "fast"], "--preflight-busbw"),
    (["--preflight-busbw", "5"], "need --preflight"),
])
def test_bad_preflight_values_are_usage_errors(args, culprit, tmp_path):
    out = tmp_path / "job.sh"
    proc = run_cli(["torchrun", *MULTI, *args, "-o", str(out), "--", "--config", "tiny"])
    assert proc.returncode == 2, proc.stderr
    assert culprit in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()
