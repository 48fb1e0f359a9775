"""The harness itself: hostnames, names, addresses, isolation, kill, shaping, teardown."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from cluster.harness import Cluster, kill_tree, leftovers, skip_reason

pytestmark = pytest.mark.cluster


def test_nodes_have_hostnames_addresses_and_resolve_each_other(cluster):
    n0, n1 = cluster.nodes
    for node in (n0, n1):
        assert node.run(["hostname"], check=True).stdout.strip() == node.name
        addr = node.run(["ip", "-o", "-4", "addr", "show", "dev", "eth0"], check=True).stdout
        assert f"{node.ip}/24" in addr
    probe = "import socket,sys; print(socket.gethostbyname(sys.argv[1]), socket.gethostname())"
    out = n0.run([sys.executable, "-c", probe, "node1"], check=True).stdout.split()
    assert out == [n1.ip, "node0"]
    # A TCP round trip node1 -> node0 by name.
    server = n0.popen([sys.executable, "-c",
                       "import socket; s=socket.create_server(('0.0.0.0', 29555)); c,_=s.accept(); "
                       "c.sendall(socket.gethostname().encode())"], stdout=subprocess.PIPE, text=True)
    try:
        client = ("import socket,time\nfor _ in range(50):\n try:\n  c=socket.create_connection(('node0', 29555));"
                  " break\n except OSError: time.sleep(0.1)\nprint(c.recv(100).decode())")
        assert n1.run([sys.executable, "-c", client], timeout=30, check=True).stdout.strip() == "node0"
    finally:
        kill_tree(server)
        server.wait(timeout=10)
    # The host itself has no route into the cluster: nothing of it leaks out.
    assert n0.ip not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout


def test_kill_all_crashes_the_node_but_not_its_neighbour(cluster):
    n0, n1 = cluster.nodes
    sleepers = [node.popen(["sh", "-c", "sleep 300 & sleep 300 & wait"]) for node in (n0, n1)]
    time.sleep(0.5)
    assert len(n0.pids()) >= 3
    n0.kill_all(signal.SIGKILL)
    assert sleepers[0].wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while n0.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert n0.pids() == []
    assert sleepers[1].poll() is None and len(n1.pids()) >= 3
    kill_tree(sleepers[1])
    sleepers[1].wait(timeout=10)


def test_shape_installs_tbf_and_slows_the_link(cluster):
    n0, n1 = cluster.nodes
    cluster.shape(n1, rate="40mbit")
    assert "tbf" in cluster.qdiscs(n1)
    sink = n0.popen([sys.executable, "-c", "import socket; s=socket.create_server(('0.0.0.0', 29556)); "
                     "c,_=s.accept()\nwhile c.recv(1 << 16): pass\nc.sendall(b'k')"])
    send = ("import socket,time,sys\nfor _ in range(50):\n try: c=socket.create_connection(('node0', 29556)); break\n"
            " except OSError: time.sleep(0.1)\nt=time.perf_counter(); c.sendall(bytes(4 << 20)); c.shutdown(1);"
            " c.recv(1); print(time.perf_counter()-t)")
    try:
        seconds = float(n1.run([sys.executable, "-c", send], timeout=60, check=True).stdout)
    finally:
        kill_tree(sink)
        sink.wait(timeout=10)
    mbit = 4 * 8 * 1.048576 / seconds
    assert 25 < mbit < 45, f"{mbit:.1f} Mbit/s through a 40mbit tbf"
    cluster.unshape(n1)
    assert "tbf" not in cluster.qdiscs(n1)


def test_teardown_leaves_nothing_and_crashed_runs_are_cleaned():
    if skip_reason():
        pytest.skip(skip_reason())
    with Cluster(2) as c:
        tag = c.tag
        c.nodes[0].popen(["sleep", "300"])
    left = {k: [n for n in v if n.startswith(tag)] for k, v in leftovers().items()}
    assert left == {"netns": [], "links": [], "etc": [], "workdirs": []}
    # A crashed run: a child process builds a cluster and is SIGKILLed before teardown.
    code = ("import sys, time; sys.path.insert(0, 'tests'); from cluster.harness import Cluster\n"
            "c = Cluster(2); c.nodes[1].popen(['sleep', '300']); print(c.tag, flush=True); time.sleep(300)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    crashed = child.stdout.readline().strip()
    child.kill()
    child.wait(timeout=10)
    assert any(n.startswith(crashed) for n in leftovers()["netns"])
    with Cluster(1):  # a new cluster removes the dead run's leftovers first
        pass
    assert not any(n.startswith(crashed) for names in leftovers().values() for n in names)
