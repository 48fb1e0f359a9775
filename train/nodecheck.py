"""``train preflight``: a short check of every node before a multi-node job trains.

(Not to be confused with ``train/preflight.py``, which checks a *config* before a run.)

Run by torchrun across the same nodes as the training, one rendezvous
(``launch ... --preflight`` renders it in front of the training torchrun)::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0:29401 \\
        -m train preflight --expect-busbw 40 --min-fraction 0.5

1. **Facts** (``train doctor``'s system check, :func:`train.doctor.system.collect_system`): on one
   process per node, gathered to rank 0 with the hostname. A node whose check finds a
   problem (CUDA present but unusable, NCCL missing, ...) is *broken*.
2. **Per-node links**: one process per node (its local rank 0) sends ``--bytes`` to its
   ring neighbours, both ways round the ring (for 2 nodes: both directions), one pair at
   a time, and each receiver times its receive: the bandwidth of every ordered pair
   src -> dst that the ring covers. A node is *slow* when its best outgoing or its best
   incoming pair is below the threshold (all its links are slow, not one partner's). With
   two nodes every pair involves both: the sender of a slow direction is named (rate
   limits act on egress); when both directions are slow, both nodes are named.
3. **All-reduce** across every process, timed as ``train bench comm`` times it
   (``train.bench.comm_timing``: calls back to back between CUDA events on GPUs, the wall
   time per call on CPU), busbw as nccl-tests (``train.bench.bandwidth``): the number a
   declared ``busbw_GBps`` taken from ``train bench comm`` is compared with.

Threshold: ``--min-fraction`` x ``--expect-busbw`` (the busbw the fabric YAML declares,
``core/fabrics/*.yaml: busbw_GBps``); with no declared value, ``--min-fraction`` x the
median of the measured pairs (a node much slower than the others). Rank 0 prints a table
and one verdict line naming the hostnames of slow or broken nodes; ``--json`` writes
the report.

Exit codes (every rank exits with the same one): 0 all nodes pass; 2 usage; 3 a node
is slow (below the fraction) or the all-reduce is; 4 a node is broken. Under torchrun
any non-zero worker exit makes torchrun exit 1, and the rendered job scripts stop there
with exit code 3 before training starts.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import click

from core.errors import InputError
from core.runlayout import check_not_in_run
from core.safety import atomic_write, check_output_target, excerpt_path
from train.config import MAX_TIMEOUT_S

EXIT_OK, EXIT_SLOW, EXIT_BROKEN = 0, 3, 4


def _facts(local_rank: int) -> dict:
    facts = {"host": socket.gethostname(), "node_rank": int(os.environ.get("GROUP_RANK", "-1")),
             "local_rank": local_rank, "problems": []}
    if local_rank == 0:
        from train.doctor.system import collect_system

        t0 = time.perf_counter()
        report = collect_system(check_nccl=False)
        facts.update(torch=report["versions"]["torch"], nccl=report["versions"].get("nccl"),
                     gpus=[g["name"] for g in report["gpus"]], problems=list(report["problems"]),
                     warnings=list(report["warnings"]), doctor_s=round(time.perf_counter() - t0, 2))
    return facts


def _transfer(dist, src: int, dst: int, me: int, buf, recv, iters: int, device, group) -> float | None:
    """``src`` sends ``buf`` to ``dst`` while every other leader waits; the receiver's median
    seconds per transfer (None on the other ranks). One pair at a time: two transfers at once
    would share a slow egress with the other's TCP acknowledgements and blur which end is slow."""
    import torch

    times = []
    for i in range(iters + 1):  # the first moves 64 KiB: connection set-up, not timed
        dist.barrier(group=group)
        data = (buf if i else buf[:16384]) if me == src else (recv if i else recv[:16384])
        t0 = time.perf_counter()
        if me == src:
            dist.send(data, dst)
        elif me == dst:
            dist.recv(data, src)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) if me == dst else None


def measure(info, nbytes: int, iters: int) -> dict:
    import torch
    import torch.distributed as dist

    from train import distributed as tdist
    from train.bench.bandwidth import busbw
    from train.bench.comm_timing import Timer

    facts = _facts(info.local_rank)
    all_facts: list = [None] * info.world_size
    dist.all_gather_object(all_facts, facts)
    leaders = [r for r, f in enumerate(all_facts) if f["local_rank"] == 0]
    count = max(1, nbytes // 4)
    pairs: dict[tuple[int, int], float] = {}  # (src leader, dst leader) -> seconds
    if len(leaders) >= 2:
        group = dist.new_group(leaders)  # every rank calls new_group
        if info.rank in leaders:
            buf = torch.ones(count, dtype=torch.float32, device=info.device)
            recv = torch.empty_like(buf)
            m = len(leaders)
            steps = [1] if m == 2 else [1, -1]  # ring neighbours both ways (2 nodes: both directions)
            for step in steps:
                for k in range(m):
                    src, dst = leaders[k], leaders[(k + step) % m]
                    t = _transfer(dist, src, dst, info.rank, buf, recv, iters, info.device, group)
                    if t is not None:
                        pairs[(src, dst)] = t
        tdist.barrier(info)
    gathered: list = [None] * info.world_size
    dist.all_gather_object(gathered, pairs)
    pair_s = {k: v for d in gathered for k, v in d.items()}

    x = torch.zeros(count, dtype=torch.float32, device=info.device)
    dist.all_reduce(x[:16384])
    tdist.barrier(info)
    timer = Timer(info.device, iters=iters, warmup=1, max_seconds=2.0, batches=3)
    ar = timer.measure(lambda: dist.all_reduce(x), set_up=False)  # set up by the slice above
    return {
        "facts": all_facts,
        "leaders": leaders,
        "bytes": count * 4,
        "pairs": [{"src": s, "dst": d, "src_host": all_facts[s]["host"], "dst_host": all_facts[d]["host"],
                   "seconds": v, "GBps": count * 4 / v / 1e9} for (s, d), v in sorted(pair_s.items())],
        "all_reduce": {"seconds": ar.seconds(), "timing": "device_us" if timer.cuda else "host_us",
                       "busbw_GBps": busbw("all_reduce", count * 4, ar.seconds(), info.world_size)},
    }


def verdict(result: dict, expect_busbw: float | None, fraction: float) -> dict:
    """Which nodes are broken or slow, and why (pure function of ``measure``'s result)."""
    facts, pairs = result["facts"], result["pairs"]
    leaders = result["leaders"]
    host = {r: facts[r]["host"] for r in leaders}
    broken = {host[r]: facts[r]["problems"] for r in leaders if facts[r]["problems"]}
    bws = [p["GBps"] for p in pairs]
    if expect_busbw:
        threshold, basis = fraction * expect_busbw, f"{fraction:g} x {expect_busbw:g} GB/s declared"
    elif bws:
        threshold, basis = fraction * statistics.median(bws), f"{fraction:g} x the median pair {statistics.median(bws):.3g} GB/s"
    else:
        threshold, basis = 0.0, "one node: no links to compare"
    slow: dict[str, str] = {}
    if len(leaders) == 2:
        bad = [p for p in pairs if p["GBps"] < threshold]
        for p in bad:  # one slow direction: its sender (rate limits act on egress)
            slow[p["src_host"]] = f"sends to {p['dst_host']} at {p['GBps']:.3g} GB/s"
        if len(bad) == 2:  # both ways slow: two nodes cannot tell which end it is
            slow = {f"{bad[0]['src_host']} or {bad[0]['dst_host']}":
                    "the link between them is slow both ways (" +
                    ", ".join(f"{p['src_host']} -> {p['dst_host']} {p['GBps']:.3g} GB/s" for p in bad) + ")"}
    else:
        for r in leaders:
            out = [p for p in pairs if p["src"] == r]
            inn = [p for p in pairs if p["dst"] == r]
            if out and max(p["GBps"] for p in out) < threshold:
                slow[host[r]] = "sends at " + ", ".join(f"{p['GBps']:.3g} GB/s to {p['dst_host']}" for p in out)
            elif inn and max(p["GBps"] for p in inn) < threshold:
                slow[host[r]] = "receives at " + ", ".join(f"{p['GBps']:.3g} GB/s from {p['src_host']}" for p in inn)
    ar = result["all_reduce"]["busbw_GBps"]
    ar_slow = bool(expect_busbw) and ar < fraction * expect_busbw
    if broken:
        code = EXIT_BROKEN
    elif slow or ar_slow:
        code = EXIT_SLOW
    else:
        code = EXIT_OK
    parts = [f"{h}: {'; '.join(v)}" for h, v in broken.items()]
    parts += [f"{h} {why} (threshold {threshold:.3g} GB/s = {basis})" for h, why in slow.items()]
    if ar_slow and not slow:
        parts.append(f"all_reduce busbw {ar:.3g} GB/s is below {fraction:g} x {expect_busbw:g} GB/s declared "
                     "(no single node stands out: the fabric itself is slow)")
    if code == EXIT_OK:
        line = (f"preflight: PASS: {len(leaders)} node(s), all_reduce busbw {ar:.3g} GB/s, slowest pair "
                f"{min(bws):.3g} GB/s (threshold {threshold:.3g} GB/s = {basis})" if bws else
                f"preflight: PASS: {len(leaders)} node(s), all_reduce busbw {ar:.3g} GB/s")
    else:
        kind = "broken" if code == EXIT_BROKEN else "slow"
        names = ", ".join(list(broken) + list(slow)) or "the fabric"
        line = f"preflight: FAIL ({kind} node: {names}): " + " | ".join(parts)
    return {"code": code, "line": line, "broken": broken, "slow": slow, "threshold_GBps": threshold,
            "basis": basis, "all_reduce_busbw_GBps": ar}


def _table(result: dict) -> str:
    lines = ["| node | host | torch | GPUs | problems |", "|---|---|---|---|---|"]
    for r in result["leaders"]:
        f = result["facts"][r]
        lines.append(f"| {f['node_rank']} | {f['host']} | {f.get('torch', '')} | {len(f.get('gpus', []))} | "
                     f"{'; '.join(f['problems']) or '-'} |")
    lines += ["", "| src -> dst | GB/s | ms |", "|---|---|---|"]
    for p in result["pairs"]:
        lines.append(f"| {p['src_host']} -> {p['dst_host']} | {p['GBps']:.3g} | {p['seconds'] * 1e3:.1f} |")
    return "\n".join(lines)


def _report(result: dict, v: dict, elapsed: float, json_path) -> None:
    click.echo(_table(result))
    click.echo(f"preflight took {elapsed:.1f} s (after process start)")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(json_path, json.dumps({**result, "verdict": v, "seconds": elapsed}, indent=1), what="--json")
    click.echo(v["line"], err=v["code"] != EXIT_OK)
    sys.stdout.flush()
    sys.stderr.flush()


@click.command("preflight")
@click.option("--expect-busbw", type=float, default=None,
              help="All-reduce busbw (GB/s) the fabric should give (launch passes the fabric YAML's busbw_GBps).")
@click.option("--min-fraction", type=float, default=0.5, show_default=True,
              help="A node below this fraction of the expected (or median) bandwidth fails the check.")
@click.option("--bytes", "nbytes", default="16M", show_default=True, help="Message size per transfer.")
@click.option("--iters", type=click.IntRange(1, 10_000), default=2, show_default=True,
              help="Timed transfers per measurement.")
@click.option("--timeout", "timeout_s", type=click.IntRange(1, MAX_TIMEOUT_S), default=120, show_default=True,
              help="Seconds any collective may take before the check fails.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Write the full report (facts, pairs, all-reduce, verdict) here (rank 0).")
def preflight_cmd(expect_busbw, min_fraction, nbytes, iters, timeout_s, json_path) -> None:
    """Check every node (facts, per-node link bandwidth, all-reduce) before training. Run under torchrun."""
    from train.bench.comm_args import parse_size
    from train.console import fail

    try:
        size = parse_size(nbytes)
    except ValueError as exc:
        fail(f"--bytes: {exc}", 2)
    if not 0 < min_fraction <= 1:
        fail(f"--min-fraction {min_fraction}: must be in (0, 1]", 2)
    if expect_busbw is not None and expect_busbw <= 0:
        fail(f"--expect-busbw {expect_busbw}: must be > 0", 2)
    if iters < 1 or timeout_s < 1 or size < 4:
        fail("--iters and --timeout must be >= 1, --bytes >= 4", 2)
    if json_path is not None:
        try:  # a directory, FIFO, device, symlink, missing or system directory, a name too long: now, not after
            check_output_target(json_path, "--json")  # the measurement
            check_not_in_run(f"--json {excerpt_path(json_path)}", json_path)
        except InputError as exc:
            fail(str(exc), 2)

    from train import distributed as tdist
    from train import preflight
    from train.doctor.probes import smi_gpus

    try:  # RANK, WORLD_SIZE, MASTER_ADDR... as train run checks them: a user error, not a broken node
        preflight.check_launcher_env()
    except InputError as exc:
        fail(str(exc), 2)
    t0 = time.perf_counter()
    import torch

    if smi_gpus() and not torch.cuda.is_available():  # would join with gloo while the others use NCCL
        fail(f"preflight: FAIL (broken node: {socket.gethostname()}): nvidia-smi lists GPUs but torch cannot use "
             "CUDA (run `train doctor` there)", EXIT_BROKEN)
    try:
        info = tdist.init_distributed("auto", timeout_s)
    except (RuntimeError, ValueError) as exc:
        fail(f"preflight: FAIL (broken node: {socket.gethostname()}): process group: {exc}", EXIT_BROKEN)
    if info.backend is None:
        fail("train preflight checks several processes: run it under torchrun", 2)
    import torch.distributed as dist

    with tdist.group_teardown():
        try:
            result = measure(info, size, iters)
            v = None
            if info.is_main:  # report first: once the verdict is out, the other nodes exit and a
                # launcher (srun --kill-on-bad-exit, torchrun) may stop this process at once
                v = verdict(result, expect_busbw, min_fraction)
                _report(result, v, time.perf_counter() - t0, json_path)
            box = [v]
            dist.broadcast_object_list(box, src=0)
            v = box[0]
        except Exception as exc:  # noqa: BLE001 - a dead peer or timeout: this node names itself
            fail(f"preflight: FAIL (broken node: {socket.gethostname()} or a peer): {type(exc).__name__}: "
                 f"{' '.join(str(exc).split())[:300]}", EXIT_BROKEN)
    sys.exit(v["code"])
