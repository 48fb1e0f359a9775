"""The measuring half of ``train bench comm`` (torch): each collective built for a size, timed
by ``train.bench.comm_timing.Timer``, the plain-loop reference and the P2P matrix. The command
line (``train.bench.comm``) imports it only when a sweep runs, so ``--help`` needs no torch.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from train.bench.bandwidth import algbw, busbw
from train.bench.comm_args import human, torch_dtype
from train.bench.comm_timing import COLUMN_DOC, Timer, timing_columns

__all__ = ["Timer", "p2p_time_column", "run_sweep", "sweep_columns", "timing_columns", "timing_meta"]


def p2p_time_column(cuda: bool) -> str:
    return "device_us" if cuda else "host_us"


def sweep_columns(cuda: bool, graph: bool) -> list[str]:
    return ["op", "dtype", "size", "count", "iters", *timing_columns(cuda, graph), "algbw_GBps", "busbw_GBps"]


def timing_meta(cuda: bool, graph: bool, prefix: str = "") -> dict:
    """What each timing column is (written above the table and into the JSON)."""
    meta = {f"{prefix}{c}": COLUMN_DOC[c] for c in timing_columns(cuda, graph)}
    meta["bandwidth_from"] = "device_us" if cuda else "host_us"
    return meta


def _op_callable(op: str, nbytes: int, dtype: torch.dtype, device, rank: int, world: int):
    """(fn, reported size in bytes, element count) or None when the size is too small."""
    elem = torch.empty((), dtype=dtype).element_size()
    count = nbytes // elem
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count -= count % world
    if count < (world if op in ("all_gather", "reduce_scatter", "all_to_all") else 1):
        return None
    size = count * elem

    def zeros(n):
        return torch.zeros(n, dtype=dtype, device=device)

    if op == "all_reduce":
        x = zeros(count)
        return (lambda: dist.all_reduce(x)), size, count
    if op == "broadcast":
        x = zeros(count)
        return (lambda: dist.broadcast(x, src=0)), size, count
    if op == "all_gather":
        inp, out = zeros(count // world), zeros(count)
        return (lambda: dist.all_gather_into_tensor(out, inp)), size, count
    if op == "reduce_scatter":
        inp, out = zeros(count), zeros(count // world)
        return (lambda: dist.reduce_scatter_tensor(out, inp)), size, count
    if op == "all_to_all":
        inp, out = zeros(count), zeros(count)
        return (lambda: dist.all_to_all_single(out, inp)), size, count
    if op == "send_recv":
        x, y = zeros(count), zeros(count)
        nxt, prv = (rank + 1) % world, (rank - 1) % world

        def ring():
            ops = [dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, y, prv)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        return ring, size, count
    raise ValueError(f"unknown op {op!r}")


def raw_allreduce_reference(device, dtype: torch.dtype, nbytes: int, warmup: int, iters: int) -> float:
    """Seconds per ``dist.all_reduce`` of ``nbytes``: a plain loop, timed as a whole."""
    x = torch.zeros(nbytes // torch.empty((), dtype=dtype).element_size(), dtype=dtype, device=device)
    for _ in range(warmup):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    Timer(device).max_over_ranks(0.0)  # start together
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = (time.perf_counter() - t0) / iters
    t = torch.tensor([elapsed], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def p2p_matrix(timer: Timer, nbytes: int, device, rank: int, world: int) -> list[dict]:
    """Unidirectional send->recv bandwidth for every ordered pair (src, dst)."""
    count = max(1, nbytes // 4)
    buf = torch.zeros(count, dtype=torch.float32, device=device)
    rows = []
    for src in range(world):
        for dst in range(world):
            if src == dst:
                continue
            if rank == src:
                def fn(dst=dst):
                    dist.send(buf, dst)
            elif rank == dst:
                def fn(src=src):
                    dist.recv(buf, src)
            else:
                def fn():
                    return None
            t = timer.measure(fn)
            rows.append({"src": src, "dst": dst, "bytes": count * 4, "iters": t.iters,
                         p2p_time_column(timer.cuda): t.seconds() * 1e6, "bw_GBps": algbw(count * 4, t.seconds())})
    return rows


def _measure_row(timer: Timer, op: str, dname: str, nbytes: int, info) -> dict | None:
    built = _op_callable(op, nbytes, torch_dtype(dname), info.device, info.rank, info.world_size)
    if built is None:
        return None
    fn, size, count = built
    row = {"op": op, "dtype": dname, "size": human(size), "bytes": size, "count": count}
    try:
        t = timer.measure(fn)
    except (RuntimeError, ValueError) as exc:  # e.g. a dtype the backend lacks
        row.update(error=" ".join(str(exc).split())[:160])
        return row
    row.update(iters=t.iters, batches=t.batches, **t.columns(), algbw_GBps=algbw(size, t.seconds()),
               busbw_GBps=busbw(op, size, t.seconds(), info.world_size))
    if not t.queued:
        row["queued"] = "no: the host issued slower than the GPU ran (device_us includes launch gaps)"
    if t.graph_error:
        row["error"] = t.graph_error
    return row


def _raw_reference(info, timer: Timer, rows: list[dict], dname: str) -> dict | None:
    largest = [r for r in rows if r["op"] == "all_reduce" and r["dtype"] == dname and "busbw_GBps" in r]
    if not largest:
        return None
    last = largest[-1]
    calls = last["iters"] * last["batches"]
    sec = raw_allreduce_reference(info.device, torch_dtype(dname), last["bytes"], max(1, min(timer.warmup, calls // 4)),
                                  calls)
    raw_bus = busbw("all_reduce", last["bytes"], sec, info.world_size)
    return {"dtype": dname, "bytes": last["bytes"], "calls": calls, "raw_time_us": sec * 1e6,
            "bench_busbw_GBps": last["busbw_GBps"], "raw_busbw_GBps": raw_bus,
            "diff_pct": 100.0 * (last["busbw_GBps"] / raw_bus - 1)}


def run_sweep(info, timer: Timer, op_list, dtype_list, sizes, p2p_bytes, raw):
    rows: list[dict] = []
    ref = None
    for op in op_list:
        for dname in dtype_list:
            for nbytes in sizes:
                row = _measure_row(timer, op, dname, nbytes, info)
                if row is not None:
                    rows.append(row)
        if op == "all_reduce" and raw:
            ref = _raw_reference(info, timer, rows, dtype_list[0])
    if info.device.type == "cuda":
        torch.cuda.empty_cache()
    p2p_timer = Timer(info.device, iters=timer.iters, warmup=timer.warmup, max_seconds=timer.max_seconds)
    p2p_rows = p2p_matrix(p2p_timer, p2p_bytes, info.device, info.rank, info.world_size) if p2p_bytes else []
    return rows, p2p_rows, ref
