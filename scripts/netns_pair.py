#!/usr/bin/env python3
"""Two network namespaces joined by one shaped veth, made with pyroute2 (no iproute2 needed).

Used by ``scripts/gpu/slowlink.sh`` on the GPU hosts (which have no ``ip``/``tc``) and
by ``tests/comm/test_netns_slowlink.py`` on CPU. Root only. ::

    python3 scripts/netns_pair.py up --prefix hpt --rate 10gbit --delay-us 50
    python3 scripts/netns_pair.py exec hpt1 -- torchrun ...      # run a command in a namespace
    python3 scripts/netns_pair.py shape --prefix hpt --rate 25gbit
    python3 scripts/netns_pair.py down --prefix hpt               # always safe to call

Layout: namespaces ``PREFIX0`` and ``PREFIX1``; in each, ``lo`` up and one end of a veth
pair named ``LINK`` (default ``hptlink``, the same name on both sides, so that one
``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` fits both ranks) with address
``SUBNET.1`` / ``SUBNET.2`` /24. Shaping is applied to the egress of *both* ends (so
both directions): a ``tbf`` qdisc at ``--rate`` (``--rate none``: unshaped), under a
``netem`` qdisc adding ``--delay-us`` one-way delay where the kernel has ``sch_netem``
(where it has not, the delay is left out and ``up`` says so in its JSON output). Rates
take tc's units (``10gbit``, ``25gbit``, ``800mbit``). Deleting the namespaces deletes
the veth with them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys

log = logging.getLogger("netns_pair")

_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def rate_bits(text: str) -> int:
    """``"10gbit"`` -> 10_000_000_000 (bits per second, decimal units as tc)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)bit\s*", text.lower())
    if not m:
        raise ValueError(f"--rate {text!r}: expected e.g. 10gbit, 25gbit, 800mbit or none")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _names(prefix: str) -> list[str]:
    if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", prefix):
        raise ValueError(f"--prefix {prefix!r}: 1-8 lower-case letters/digits, starting with a letter")
    return [f"{prefix}0", f"{prefix}1"]


def _shape(ns_name: str, link: str, rate: str | None, delay_us: float) -> dict:
    """(Re)build the egress qdiscs of ``link`` in namespace ``ns_name``."""
    from pyroute2 import NetNS
    from pyroute2.netlink.exceptions import NetlinkError

    applied = {"rate": rate or "none", "delay_us": 0.0}
    with NetNS(ns_name) as ns:
        idx = ns.link_lookup(ifname=link)[0]
        try:
            ns.tc("del", index=idx, root=True)  # the root qdisc, if one was set
        except NetlinkError:
            pass
        parent = None
        if delay_us > 0:
            try:
                ns.tc("add", "netem", idx, handle="1:", delay=int(delay_us), limit=100_000)
                applied["delay_us"] = float(delay_us)
                parent = "1:1"
            except NetlinkError as exc:  # no sch_netem in this kernel
                applied["delay_note"] = f"netem unavailable ({exc.args[-1]}): no delay added"
                log.warning("%s: %s", ns_name, applied["delay_note"])
        if rate:
            bits = rate_bits(rate)
            # burst: at least one timer tick's worth at HZ=250, so the bucket never caps the rate;
            # latency: the queue a sender may fill before drops (tc's "latency", here in us)
            burst = max(1 << 16, bits // 8 // 250)
            kw = {"rate": f"{bits}bit", "burst": burst, "latency": 20_000}
            if parent:
                try:
                    ns.tc("add", "tbf", idx, parent=parent, handle="10:", **kw)
                except NetlinkError as exc:  # keep the rate, which matters more than the delay
                    ns.tc("del", index=idx, root=True)
                    ns.tc("add", "tbf", idx, handle="1:", **kw)
                    applied["delay_us"] = 0.0
                    applied["delay_note"] = f"tbf under netem failed ({exc.args[-1]}): rate only, no delay"
                    log.warning("%s: %s", ns_name, applied["delay_note"])
            else:
                ns.tc("add", "tbf", idx, handle="1:", **kw)
    return applied


def up(prefix: str, link: str, subnet: str, rate: str | None, delay_us: float) -> dict:
    from pyroute2 import IPRoute, NetNS, netns

    names = _names(prefix)
    down(prefix)
    for n in names:
        netns.create(n)
    tmp = [f"{prefix}va", f"{prefix}vb"]
    try:
        with IPRoute() as ip:
            ip.link("add", ifname=tmp[0], kind="veth", peer={"ifname": tmp[1]})
            for n, t in zip(names, tmp):
                ip.link("set", index=ip.link_lookup(ifname=t)[0], net_ns_fd=n)
        result = {"namespaces": names, "link": link, "addresses": [], "shaping": []}
        for i, (n, t) in enumerate(zip(names, tmp)):
            addr = f"{subnet}.{i + 1}"
            with NetNS(n) as ns:
                idx = ns.link_lookup(ifname=t)[0]
                ns.link("set", index=idx, ifname=link)
                ns.addr("add", index=idx, address=addr, prefixlen=24)
                ns.link("set", index=idx, state="up")
                ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
            result["addresses"].append(addr)
            result["shaping"].append(_shape(n, link, rate, delay_us))
        return result
    except BaseException:
        down(prefix)
        raise


def shape(prefix: str, link: str, rate: str | None, delay_us: float) -> list[dict]:
    return [_shape(n, link, rate, delay_us) for n in _names(prefix)]


def down(prefix: str) -> list[str]:
    """Delete both namespaces (and the veth with them); returns what was removed."""
    from pyroute2 import IPRoute, netns

    removed = []
    present = set(netns.listnetns())
    for n in _names(prefix):
        if n in present:
            netns.remove(n)
            removed.append(n)
    with IPRoute() as ip:  # a veth left in the root namespace by an interrupted `up`
        for t in (f"{prefix}va", f"{prefix}vb"):
            found = ip.link_lookup(ifname=t)
            if found:
                ip.link("del", index=found[0])
    return removed


def exec_in(ns_name: str, argv: list[str]) -> None:
    from pyroute2 import netns

    if not argv:
        raise ValueError("exec: no command after --")
    netns.setns(ns_name)
    os.execvp(argv[0], argv)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="[netns_pair] %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("up", "shape", "down"):
        p = sub.add_parser(name)
        p.add_argument("--prefix", default="hpt")
        p.add_argument("--link", default="hptlink")
        if name != "down":
            p.add_argument("--rate", default="none", help="tc rate (10gbit, 25gbit) or none")
            p.add_argument("--delay-us", type=float, default=0.0)
        if name == "up":
            p.add_argument("--subnet", default="10.77.0", help="first three octets of the /24")
    p = sub.add_parser("exec")
    p.add_argument("namespace")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    try:
        from pyroute2.netlink.exceptions import NetlinkError
    except ImportError:
        print("netns_pair: error: pyroute2 is not installed (pip install pyroute2)", file=sys.stderr)
        return 2
    try:
        if args.cmd == "exec":
            cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
            exec_in(args.namespace, cmd)
        rate = None if getattr(args, "rate", "none") == "none" else args.rate
        if rate:
            rate_bits(rate)
        if args.cmd == "up":
            out = up(args.prefix, args.link, args.subnet, rate, args.delay_us)
        elif args.cmd == "shape":
            out = shape(args.prefix, args.link, rate, args.delay_us)
        else:
            out = down(args.prefix)
    except (ValueError, OSError, NetlinkError) as exc:
        print(f"netns_pair: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
