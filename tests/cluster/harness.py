"""Emulated multi-node cluster on one Linux machine (root only), for deployment tests.

Each "node" is a network namespace with its own hostname (``node0``, ``node1``, ...), one
interface ``eth0`` (a veth whose peer sits on a bridge private to the cluster, addresses
10.77.K.10+i/24) and its own ``/etc/hosts`` naming every node (``ip netns exec`` bind-mounts
``/etc/netns/<netns>/hosts``). The bridge has no address on the host: traffic stays between
the namespaces the cluster made. The filesystem is shared, so the venv and worktree are the
same paths on every node.

API (import as ``from cluster.harness import ...`` inside tests; ``tests/`` is on sys.path)::

    skip_reason() -> str | None            # why a cluster cannot be built here (not root, no `ip`)
    with Cluster(2) as c:                  # or the pytest fixtures `cluster` / `cluster3` (conftest.py)
        n0 = c.nodes[0]                    # Node(name='node0', ip='10.77.K.10', netns='tcl<pid>x<K>-node0')
        c.node("node1")                    # look a node up by name
        p = n0.popen(["hostname"], env={"X": "1"}, cwd="/tmp", stdout=subprocess.PIPE, text=True)
        #   -> subprocess.Popen running on the node (its netns + hostname), in a new session;
        #      env is merged onto os.environ (clean_env=True: use env as is); other Popen kwargs pass through
        n0.run(["ip", "-br", "addr"], timeout=10)   # -> CompletedProcess (capture_output, text)
        n0.pids()                          # every pid on the node
        n0.kill_all(signal.SIGKILL)        # "crash" the node: every process in its namespace
        kill_tree(p, signal.SIGKILL)       # one process, its session and all its descendants
        c.shape(n0, rate="10gbit")         # tbf on both ends of n0's link (its egress and ingress)
        c.shape(n0, rate="10gbit", delay="50us")    # + netem delay: only where the kernel has netem
        c.unshape(n0); c.qdiscs(n0)        # remove / show the qdiscs
        netem_reason()                     # None, or why netem delays cannot be used here
        c.hosts_file, c.workdir            # the generated hosts file; a scratch dir removed at teardown
        c.command(n0, [...])               # the argv that runs a command on n0 (for your own Popen)
    # leaving the block (or teardown()) kills every process on the nodes and removes
    # namespaces, veths, the bridge, /etc/netns/<netns> and the workdir.

Teardown runs on normal exit, on exceptions, at interpreter exit (atexit) and on SIGTERM/SIGHUP
(handler tears down, then re-raises); Ctrl-C is a KeyboardInterrupt, so ``with`` blocks and
fixture finalizers run. Every name starts with ``tcl<pid>x<K>``; a new Cluster first removes
leftovers whose creating pid is dead (a crashed run), never those of a live process, so several
test runs can build clusters at the same time. Daemons started on nodes (slurmd, munged, ...)
live in the node namespaces and die with them.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "tcl"
_NAME = re.compile(rf"^{PREFIX}(\d+)x(\d+)")
_counter = itertools.count(1)
_live: list["Cluster"] = []
_lock = threading.Lock()
_handlers_installed = False


def skip_reason() -> str | None:
    """One line saying why no cluster can be made here, or None."""
    if os.geteuid() != 0:
        return "emulated cluster needs root (network namespaces, veths, bridge)"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"emulated cluster needs `{tool}` (apt-get install iproute2 util-linux)"
    return None


def netem_reason() -> str | None:
    """Why ``shape(delay=...)`` cannot work here (e.g. a kernel built without sch_netem), or None."""
    config = Path("/proc/config.gz")
    if config.exists():
        import gzip

        text = gzip.decompress(config.read_bytes()).decode(errors="replace")
        if "CONFIG_NET_SCH_NETEM=y" not in text and "CONFIG_NET_SCH_NETEM=m" not in text:
            return "this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM not set): rate shaping (tbf) only"
    return None


def _cgroup_v1() -> list[str]:
    """Mount options of the host's cgroup v1 hierarchies (``cpu``, ``memory``, ``none,name=systemd`` ...)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "cgroup":
            opts = [o for o in fields[3].split(",") if o not in ("rw", "ro", "relatime", "nosuid", "nodev", "noexec")]
            found.append(",".join(o if not o.startswith("name=") else o for o in opts) or "none")
    return found or ["none,name=systemd"]


def _sh(*argv: str, check: bool = True, netns: str | None = None) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", netns] if netns else []) + list(argv)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_pids(netns: str) -> list[int]:
    proc = _sh("ip", "netns", "pids", netns, check=False)
    return [int(x) for x in proc.stdout.split() if x.isdigit() and int(x) != os.getpid()]


def _kill_netns(netns: str, grace_s: float = 2.0) -> None:
    """TERM every process of the namespace, then KILL what is left."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = _netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _netns_pids(netns):
            time.sleep(0.1)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen | int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to a process, every descendant and its session's process group."""
    pid = proc if isinstance(proc, int) else proc.pid
    victims = [pid, *_descendants(pid)]
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for victim in victims:
        try:
            os.kill(victim, sig)
        except ProcessLookupError:
            pass


def _rate_bits(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected e.g. 10gbit, 500mbit")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    return float(m.group(1)) * scale * (8 if m.group(3) == "bps" else 1)


@dataclass
class Node:
    cluster: "Cluster" = field(repr=False)
    index: int
    name: str
    ip: str
    netns: str
    host_veth: str

    def command(self, argv: list[str]) -> list[str]:
        return self.cluster.command(self, argv)

    def popen(self, argv: list[str], env: dict | None = None, cwd: str | os.PathLike | None = None,
              clean_env: bool = False, host_cgroups: bool = False, **kwargs) -> subprocess.Popen:
        """Start ``argv`` on this node in a new session (kill it with ``kill_tree``). ``host_cgroups``:
        see the host's /sys/fs/cgroup (``ip netns exec`` mounts a fresh /sys without it; slurmd needs it)."""
        full_env = dict(env or {}) if clean_env else {**os.environ, **(env or {})}
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self.cluster.command(self, argv, host_cgroups), env=full_env, cwd=cwd, **kwargs)

    def run(self, argv: list[str], timeout: float = 60, env: dict | None = None,
            cwd: str | os.PathLike | None = None, check: bool = False) -> subprocess.CompletedProcess:
        proc = self.popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            out, err = proc.communicate()
            raise
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(argv)} exited {proc.returncode}: {err.strip()}")
        return result

    def pids(self) -> list[int]:
        return _netns_pids(self.netns)

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        """Every process on the node (a node crash when sig is SIGKILL)."""
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


class Cluster:
    """``n`` nodes on one bridge; see the module docstring."""

    def __init__(self, n: int = 2, subnet_octet: int | None = None, hosts: str = "all"):
        """``hosts`` (each node's /etc/hosts): all nodes; ``own`` itself only; ``debian`` itself as 127.0.1.1."""
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        cleanup_leftovers()
        self.key = next(_counter)
        self.tag = f"{PREFIX}{os.getpid()}x{self.key}"
        self.bridge = f"{self.tag}br"
        if len(self.bridge) > 15:
            raise RuntimeError(f"interface name {self.bridge!r} too long")
        octet = subnet_octet if subnet_octet is not None else self.key % 250
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-", dir="/tmp"))
        self.hosts_file = self.workdir / "hosts"
        self.nodes = [
            Node(self, i, f"node{i}", f"10.77.{octet}.{10 + i}", f"{self.tag}-node{i}", f"{self.tag}h{i}")
            for i in range(n)
        ]
        self.hosts_mode, self._torn_down = hosts, False
        with _lock:
            _live.append(self)
        _install_handlers()
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise

    # ------------------------------------------------------------------ build / teardown

    def _build(self) -> None:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{node.ip} {node.name}" for node in self.nodes]
        self.hosts_file.write_text("\n".join(lines) + "\n")
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "link", "set", self.bridge, "up")
        for node in self.nodes:
            _sh("ip", "netns", "add", node.netns)
            etc = Path("/etc/netns") / node.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(self._hosts_of(node))
            (etc / "hostname").write_text(node.name + "\n")
            peer = f"{self.tag}n{node.index}"
            _sh("ip", "link", "add", node.host_veth, "type", "veth", "peer", "name", peer)
            _sh("ip", "link", "set", peer, "netns", node.netns)
            _sh("ip", "link", "set", node.host_veth, "master", self.bridge)
            _sh("ip", "link", "set", node.host_veth, "up")
            _sh("ip", "link", "set", peer, "name", "eth0", netns=node.netns)
            _sh("ip", "addr", "add", f"{node.ip}/24", "dev", "eth0", netns=node.netns)
            _sh("ip", "link", "set", "eth0", "up", netns=node.netns)
            _sh("ip", "link", "set", "lo", "up", netns=node.netns)
        self._wait_links()

    def _hosts_of(self, node: "Node") -> str:
        base = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"  # + cloud VM / Debian node
        if self.hosts_mode == "own":
            return base + f"{node.ip} {node.name}\n"
        if self.hosts_mode == "debian":
            return base + f"127.0.1.1 {node.name}\n" + "".join(
                f"{n.ip} {n.name}\n" for n in self.nodes if n is not node)
        return self.hosts_file.read_text()

    def _wait_links(self, timeout: float = 10.0) -> None:
        """Each node reaches every other by address over TCP (bridge ports take a moment)."""
        if len(self.nodes) < 2:
            return
        probe = ("import socket,sys\n"
                 "s=socket.socket(); s.settimeout(1)\n"
                 "try:\n s.connect((sys.argv[1], 9)); sys.exit(0)\n"
                 "except ConnectionRefusedError: sys.exit(0)\n"
                 "except OSError: sys.exit(1)\n")
        deadline = time.monotonic() + timeout
        for a in self.nodes:
            for b in self.nodes:
                if a is b:
                    continue
                while True:
                    if a.run(["python3", "-c", probe, b.ip], timeout=10).returncode == 0:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{a.name} cannot reach {b.name} ({b.ip}) over the bridge")
                    time.sleep(0.2)

    def teardown(self) -> None:
        if self._torn_down:
            return
        self._torn_down = True
        for node in self.nodes:
            _kill_netns(node.netns)
        for node in self.nodes:
            _sh("ip", "link", "del", node.host_veth, check=False)
            _sh("ip", "netns", "del", node.netns, check=False)
            shutil.rmtree(Path("/etc/netns") / node.netns, ignore_errors=True)
        _sh("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)
        with _lock:
            if self in _live:
                _live.remove(self)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    # ------------------------------------------------------------------ running things

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def command(self, node: Node, argv: list[str], host_cgroups: bool = False) -> list[str]:
        """argv running ``argv`` on ``node``: its netns, /etc/hosts and a UTS namespace named after it."""
        setup = 'hostname "$0"'
        if host_cgroups:  # the host's cgroup v1 hierarchies, mounted again under the fresh /sys
            setup += (" && mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup && for c in " + " ".join(_cgroup_v1())
                      + '; do mkdir -p "/sys/fs/cgroup/${c#name=}" && mount -t cgroup -o "$c" cgroup '
                      '"/sys/fs/cgroup/${c#name=}"; done')
        return ["ip", "netns", "exec", node.netns, "unshare", "--uts", "--",
                "sh", "-c", setup + ' && exec "$@"', node.name, *map(str, argv)]

    # ------------------------------------------------------------------ link shaping

    def shape(self, node: Node, rate: str | None = None, delay: str | None = None,
              burst: str | None = None, both: bool = True) -> None:
        """Shape ``node``'s link: tbf ``rate`` and/or netem ``delay`` (e.g. "10gbit", "50us") on the
        node's eth0 (egress) and, with ``both``, on the bridge side (the node's ingress)."""
        if not rate and not delay:
            raise ValueError("shape: give rate and/or delay")
        if delay and netem_reason():
            raise RuntimeError(netem_reason())
        if burst is None and rate:
            burst = str(max(256 * 1024, int(_rate_bits(rate) / 8 / 1000)))  # >= 1 ms of line rate
        self.unshape(node)
        for netns, dev in self._link_ends(node, both):
            tc = ["tc", "qdisc", "add", "dev", dev]
            if delay:
                _sh(*tc, "root", "handle", "1:", "netem", "delay", delay, "limit", "100000", netns=netns)
            if rate:
                parent = ["parent", "1:1"] if delay else ["root"]
                _sh(*tc, *parent, "handle", "10:", "tbf", "rate", rate, "burst", burst, "latency", "100ms",
                    netns=netns)

    def unshape(self, node: Node) -> None:
        for netns, dev in self._link_ends(node, True):
            _sh("tc", "qdisc", "del", "dev", dev, "root", check=False, netns=netns)

    def qdiscs(self, node: Node) -> str:
        return "".join(_sh("tc", "qdisc", "show", "dev", dev, netns=ns).stdout for ns, dev in self._link_ends(node, True))

    def _link_ends(self, node: Node, both: bool) -> list[tuple[str | None, str]]:
        ends: list[tuple[str | None, str]] = [(node.netns, "eth0")]
        if both:
            ends.append((None, node.host_veth))
        return ends


# ---------------------------------------------------------------------- crash safety


def teardown_all() -> None:
    with _lock:
        live = list(_live)
    for cluster in live:
        try:
            cluster.teardown()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _on_signal(signum, frame):
    teardown_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(teardown_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)


def leftovers() -> dict[str, list[str]]:
    """Names this harness created that still exist: netns, links, /etc/netns dirs, workdirs."""
    found: dict[str, list[str]] = {"netns": [], "links": [], "etc": [], "workdirs": []}
    out = _sh("ip", "netns", "list", check=False).stdout
    found["netns"] = [line.split()[0] for line in out.splitlines() if line and _NAME.match(line)]
    out = _sh("ip", "-o", "link", "show", check=False).stdout
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if _NAME.match(name):
            found["links"].append(name)
    if Path("/etc/netns").is_dir():
        found["etc"] = [p.name for p in Path("/etc/netns").iterdir() if _NAME.match(p.name)]
    found["workdirs"] = [p.name for p in Path("/tmp").iterdir() if _NAME.match(p.name)]
    return found


def cleanup_leftovers(include_live: bool = False) -> list[str]:
    """Remove what a crashed run left (its creating pid is gone); returns what was removed."""
    removed = []
    for kind, names in leftovers().items():
        for name in names:
            pid = int(_NAME.match(name).group(1))
            if pid == os.getpid() or (_alive(pid) and not include_live):
                continue
            if kind == "netns":
                _kill_netns(name, grace_s=0.5)
                _sh("ip", "netns", "del", name, check=False)
            elif kind == "links":
                _sh("ip", "link", "del", name, check=False)
            elif kind == "etc":
                shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
            else:
                shutil.rmtree(Path("/tmp") / name, ignore_errors=True)
            removed.append(f"{kind}:{name}")
    return removed
