"""Every multi-node shell render advertises the node's own address on its route to the rendezvous
endpoint (torchrun --local-addr, GLOO_SOCKET_IFNAME), worked out when it runs; loopback only here,
two network namespaces in tests/cluster/test_node_addresses.py."""

from __future__ import annotations

import re
import subprocess

import pytest

from launch_testlib import render

ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def _function(backend: str) -> str:
    text = render([backend, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29400"])
    return re.search(r"(?ms)^launch_node_addr\(\) \{.*?^\}$", text).group(0)


def _run(backend: str, call: str, **env: str) -> subprocess.CompletedProcess:
    script = f"set -euo pipefail\n{_function(backend)}\n{call}\n"
    return subprocess.run(["bash", "-c", script], env={**ENV, **env}, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("backend", ["torchrun", "docker", "slurm"])
def test_every_multi_node_render_works_out_and_passes_the_address(backend):
    text = render([backend, "--nnodes", "2", "--rdzv-endpoint", "node0:29400", "--preflight"])
    assert "launch_node_addr" in text and '--local-addr "$launch_addr"' in text
    assert "GLOO_SOCKET_IFNAME=$launch_ifname" in text
    assert "launch_node_addr" not in render([backend])  # one node: nothing to advertise


@pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v ip"], capture_output=True).returncode != 0,
                    reason="needs iproute2 (ip)")
def test_the_address_is_the_routes_source():
    proc = _run("torchrun", 'launch_node_addr 127.0.0.1:29400; echo "$launch_addr $launch_ifname"')
    assert proc.returncode == 0 and proc.stdout.split() == ["127.0.0.1", "lo"], proc.stderr
    proc = _run("docker", 'launch_node_addr "[::1]:29400"; echo "$launch_addr"')
    assert proc.returncode == 0 and proc.stdout.strip() == "::1", proc.stderr


def test_the_user_override_stays_possible():
    proc = _run("slurm", 'launch_node_addr 127.0.0.1:29400; echo "$launch_addr $launch_ifname"',
                LAUNCH_NODE_ADDR="10.1.2.3", LAUNCH_NODE_IFNAME="eth9")
    assert proc.stdout.split() == ["10.1.2.3", "eth9"], proc.stderr


def test_an_unresolvable_endpoint_is_one_line_and_exit_2():
    proc = _run("torchrun", "launch_node_addr no-such-host.invalid:29400")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "cannot resolve the rendezvous host no-such-host.invalid" in proc.stderr
