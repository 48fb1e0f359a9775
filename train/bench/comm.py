"""``train bench comm``: an nccl-tests-style sweep of collectives through torch.distributed.

Run under torchrun (one process per GPU, or CPU processes with ``--backend gloo``)::

    torchrun --nproc-per-node 2 -m train bench comm --max-bytes 1G
    torchrun --nproc-per-node 2 -m train bench comm --emulate-link ethernet --ops all_reduce

For every operation, dtype and message size (``--min-bytes`` .. ``--max-bytes``, times
``--factor``): warm-up, then timed iterations; the time of an iteration is measured
with CUDA events around the call on the current stream (``perf_counter`` on CPU), the
median is taken per rank and the slowest rank's median is reported, with algbw and
busbw as nccl-tests defines them (``train.bench.bandwidth``). Slow sizes get fewer
iterations (``--max-seconds`` per size, at least 3), sized by the slowest rank's
second call (the first sets up lazily) so that all ranks run the same collectives.

Also: a P2P bandwidth matrix (send/recv between each ordered pair of ranks, the others
idle) and a reference: all_reduce at the largest size timed by a plain loop over
``dist.all_reduce`` (no events, no per-iteration bookkeeping) to check that the bench's
machinery does not distort the number.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from core.safety import parse_json
from train.bench.bandwidth import OPS, algbw, busbw
from train.bench.comm_args import DTYPES, check_args, human, torch_dtype

if TYPE_CHECKING:
    import torch


class _Clock:
    """Per-iteration timing on the device; slowest-rank reductions."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)

    def max_over_ranks(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def wall(self, fn) -> float:
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0

    def per_iteration(self, fn, n: int) -> list[float]:
        import torch

        if not self.cuda:
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return out
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        self.sync()
        return [s.elapsed_time(e) / 1e3 for s, e in pairs]


def measure(clock: _Clock, fn, warmup: int, iters: int, max_seconds: float) -> tuple[float, int]:
    """(slowest rank's median seconds per call, iterations timed)."""
    fn()  # first call: lazy setup (e.g. NCCL's P2P connections), not timed
    est = clock.max_over_ranks(clock.wall(fn))  # second: the estimate that sizes the rest
    n_warm = max(0, min(warmup - 2, int(0.2 * max_seconds / max(est, 1e-9))))
    n_iter = max(3, min(iters, int(0.8 * max_seconds / max(est, 1e-9))))
    for _ in range(n_warm):
        fn()
    clock.sync()
    times = clock.per_iteration(fn, n_iter)
    return clock.max_over_ranks(statistics.median(times)), n_iter


def _op_callable(op: str, nbytes: int, dtype: torch.dtype, device, rank: int, world: int):
    """(fn, reported size in bytes, element count) or None when the size is too small."""
    import torch
    import torch.distributed as dist

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
    import torch
    import torch.distributed as dist

    x = torch.zeros(nbytes // torch.empty((), dtype=dtype).element_size(), dtype=dtype, device=device)
    for _ in range(warmup):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    _Clock(device).max_over_ranks(0.0)  # start together
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = (time.perf_counter() - t0) / iters
    t = torch.tensor([elapsed], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def p2p_matrix(clock: _Clock, nbytes: int, device, rank: int, world: int, warmup: int, iters: int,
               max_seconds: float) -> list[dict]:
    """Unidirectional send->recv bandwidth for every ordered pair (src, dst)."""
    import torch
    import torch.distributed as dist

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
            sec, n = measure(clock, fn, warmup, iters, max_seconds)
            rows.append({"src": src, "dst": dst, "bytes": count * 4, "iters": n, "time_us": sec * 1e6,
                         "bw_GBps": algbw(count * 4, sec)})
    return rows


SWEEP_COLUMNS = ["op", "dtype", "size", "count", "iters", "time_us", "algbw_GBps", "busbw_GBps"]


@click.command("comm")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True,
              help="nccl on GPUs (auto when CUDA is present), gloo on CPU tensors.")
@click.option("--ops", default=",".join(OPS), show_default=True, help="Comma-separated collectives.")
@click.option("--dtype", "dtypes", default="float32", show_default=True,
              help=f"Comma-separated dtypes ({', '.join(DTYPES)}).")
@click.option("--min-bytes", default=None, help="Smallest message [default: 8; with --impl 4K].")
@click.option("--max-bytes", default=None, help="Largest message [default: 1G; with --impl 4M].")
@click.option("--factor", type=int, default=2, show_default=True, help="Size multiplier between steps.")
@click.option("--warmup", type=int, default=5, show_default=True, help="Untimed iterations per size first.")
@click.option("--iters", type=int, default=20, show_default=True,
              help="Timed iterations per size (fewer when --max-seconds runs out).")
@click.option("--max-seconds", type=float, default=2.0, show_default=True,
              help="Time cap per (op, dtype, size): fewer iterations (>= 3) for slow sizes.")
@click.option("--p2p/--no-p2p", default=True, show_default=True, help="P2P bandwidth matrix over all pairs.")
@click.option("--p2p-bytes", default="256M", show_default=True, help="Message size of the P2P matrix (K/M/G suffixes).")
@click.option("--raw/--no-raw", default=True, show_default=True,
              help="Plain-loop dist.all_reduce reference at the largest size.")
@click.option("--emulate-link", type=click.Choice(["nvlink", "pcie", "ethernet"]), default=None,
              help="Set NCCL_P2P_DISABLE / NCCL_SHM_DISABLE before init (docs/communication.md).")
@click.option("--impl", "impl", default=None,
              help="Small-message all-reduce latency instead of the sweep: comma list of nccl, symm_mem "
                   "(symmetric-memory one-shot and two-shot kernels; CUDA only). See train/bench/latency.py.")
@click.option("--out", "out_dir", default="runs/bench", show_default=True, type=click.Path(path_type=Path),
              help="Directory of the report (NAME.json/.md/.png).")
@click.option("--name", default=None, help="Report name (default: comm, comm_<link>, or latency with --impl).")
@click.option("--recommend", is_flag=True,
              help="From the all_reduce busbw at the largest size: none, LocalSGD or PowerSGD (train/bench/advice.py).")
@click.option("--apply", "apply_path", type=click.Path(path_type=Path), default=None,
              help="Write the recommended comm.* keys into this YAML config (implies --recommend).")
@click.option("--tflops", type=float, default=None,
              help="Achieved TFLOP/s per GPU for the recommendation (default: 40% of 989, H100/H200 bf16).")
@click.option("--tokens-per-gpu", type=int, default=None, help="Tokens per GPU per step (default 8192).")
def comm_cmd(backend, ops, dtypes, min_bytes, max_bytes, factor, warmup, iters, max_seconds, p2p, p2p_bytes,
             raw, emulate_link, impl, out_dir, name, recommend, apply_path, tflops, tokens_per_gpu) -> None:
    """Collective bandwidth sweep (nccl-tests style) + P2P matrix, or (--impl) small-message
    all-reduce latency of NCCL vs symmetric memory. Run under torchrun."""
    from train.console import fail

    if name is None:  # --name '' is refused by check_report, not replaced
        name = "latency" if impl else "comm" + (f"_{emulate_link}" if emulate_link else "")
    try:
        args = check_args(backend, ops, dtypes, min_bytes, max_bytes, factor, warmup, iters, max_seconds,
                           p2p_bytes if p2p else None, impl, out_dir, name, recommend, apply_path, tflops,
                           tokens_per_gpu)
    except ValueError as exc:
        fail(str(exc), 2)
    from train.bench.report import claim_report

    claim_report(out_dir, name)
    info = _init(args["backend"], emulate_link)
    meta = {"command": " ".join(["train", *sys.argv[1:]]), "backend": args["backend"], "world_size": info.world_size}
    if args["impls"]:
        _latency(info, args, warmup, iters, max_seconds, out_dir, name, meta)
        return
    from train import distributed as tdist

    with tdist.group_teardown():
        rows, p2p_rows, ref = _run(info, args["ops"], args["dtypes"], args["sizes"], warmup, iters, max_seconds,
                                   args["p2p_bytes"] if p2p else 0, raw)
    if info.is_main:
        _write_sweep(rows, p2p_rows, ref, meta, emulate_link, out_dir, name)
        if args["recommend"]:
            _recommend(rows, info.world_size, tflops, tokens_per_gpu, apply_path, out_dir / f"{name}.json")


def _init(backend: str, emulate_link):
    from train import distributed as tdist
    from train.bench.links import emulate_link as apply_link
    from train.console import fail

    try:
        apply_link(emulate_link)
        return tdist.init_distributed("cuda" if backend == "nccl" else "cpu", timeout_s=900)
    except (RuntimeError, ValueError) as exc:
        fail(str(exc), 1)


def _latency(info, args, warmup, iters, max_seconds, out_dir, name, meta) -> None:
    from train import distributed as tdist
    from train.bench.latency import latency_rows, write_latency
    from train.bench.report import environment_meta

    clock = _Clock(info.device)
    with tdist.group_teardown():
        rows = latency_rows(info, args["impls"], args["sizes"], torch_dtype(args["dtypes"][0]),
                            lambda fn: measure(clock, fn, warmup, iters, max_seconds)[0], human)
    if info.is_main:
        meta = {**environment_meta(), **meta, "timing": "median of per-iteration CUDA events, slowest rank"}
        write_latency(rows, args["impls"], args["dtypes"][0], out_dir, name, meta)


def _write_sweep(rows, p2p_rows, ref, meta, emulate_link, out_dir, name) -> None:
    from train.bench.comm_charts import chart_p2p, chart_sweep
    from train.bench.links import nccl_environment
    from train.bench.report import environment_meta, write_report

    meta = {**environment_meta(), **meta, "emulate_link": emulate_link or "none",
            "nccl_env": nccl_environment() or "defaults",
            "timing": "median of per-iteration CUDA events (perf_counter on CPU), slowest rank"}
    if ref:
        meta["raw_reference"] = ref
    table = write_report(out_dir, name, rows, SWEEP_COLUMNS + ["error"] * any("error" in r for r in rows),
                         meta, chart=chart_sweep)
    click.echo(table)
    if p2p_rows:
        click.echo("")
        p2p_cols = ["src", "dst", "bytes", "iters", "time_us", "bw_GBps"]
        click.echo(write_report(out_dir, f"{name}_p2p", p2p_rows, p2p_cols, meta,
                                chart=chart_p2p))
    if ref:
        click.echo(f"\nall_reduce {ref['dtype']} {human(ref['bytes'])}: "
                   f"bench busbw {ref['bench_busbw_GBps']:.2f} GB/s, raw loop {ref['raw_busbw_GBps']:.2f} GB/s "
                   f"({ref['diff_pct']:+.2f}%)")
    click.echo(f"wrote {out_dir / name}.json/.md/.png")


def _recommend(rows, world, tflops, tokens, apply_path, json_path) -> None:
    """Print (and with --apply, write) the choice of train.bench.advice for the measured link."""
    import json

    from train.bench import advice
    from train.console import fail
    from train.errors import ConfigError

    ar = [r for r in rows if r["op"] == "all_reduce" and r.get("busbw_GBps")]
    if not ar:
        fail("--recommend: no all_reduce was measured", 1)
    last = ar[-1]
    kw = {"tflops": tflops or advice.REF_TFLOPS, "tokens": tokens or advice.REF_TOKENS}
    adv = advice.recommend(last["busbw_GBps"], world, **kw)
    click.echo(f"\n{adv.line()}  [all_reduce {last['size']} {last['dtype']}]")
    click.echo(advice.table_markdown(world, **kw))
    data = parse_json(json_path.read_text())
    data["recommendation"] = {"hook": adv.hook, "overrides": adv.overrides, "rho": adv.rho,
                              "busbw_GBps": adv.busbw_GBps, "size": last["size"], "reason": adv.reason,
                              **adv.inputs}
    json_path.write_text(json.dumps(data, indent=2))
    if apply_path is not None:
        try:
            kept = advice.apply_to_config(apply_path, adv)
        except (ConfigError, OSError) as exc:
            fail(str(exc), 2)
        click.echo(f"applied: {apply_path} now has {' '.join(adv.overrides)}"
                   + (f" (its previous version, comments included, is kept as {kept})" if kept else ""))


def _run(info, op_list, dtype_list, sizes, warmup, iters, max_seconds, p2p_bytes, raw):
    import torch

    clock = _Clock(info.device)
    world, rank = info.world_size, info.rank
    rows: list[dict] = []
    ref = None
    for op in op_list:
        for dname in dtype_list:
            dtype = torch_dtype(dname)
            for nbytes in sizes:
                built = _op_callable(op, nbytes, dtype, info.device, rank, world)
                if built is None:
                    continue
                fn, size, count = built
                row = {"op": op, "dtype": dname, "size": human(size), "bytes": size, "count": count}
                try:
                    sec, n = measure(clock, fn, warmup, iters, max_seconds)
                    row.update(iters=n, time_us=sec * 1e6, algbw_GBps=algbw(size, sec),
                               busbw_GBps=busbw(op, size, sec, world))
                except (RuntimeError, ValueError) as exc:  # e.g. a dtype the backend lacks
                    row.update(error=" ".join(str(exc).split())[:160])
                rows.append(row)
                del fn
        if op == "all_reduce" and raw:
            largest = [r for r in rows if r["op"] == "all_reduce" and r["dtype"] == dtype_list[0] and "busbw_GBps" in r]
            if largest:
                last = largest[-1]
                sec = raw_allreduce_reference(info.device, torch_dtype(dtype_list[0]), last["bytes"],
                                              max(1, min(warmup, last["iters"] // 4)), last["iters"])
                raw_bus = busbw("all_reduce", last["bytes"], sec, world)
                rows.append({"op": "all_reduce (raw loop)", "dtype": dtype_list[0], "size": last["size"],
                             "bytes": last["bytes"], "count": last["count"], "iters": last["iters"],
                             "time_us": sec * 1e6, "algbw_GBps": algbw(last["bytes"], sec), "busbw_GBps": raw_bus})
                ref = {"dtype": dtype_list[0], "bytes": last["bytes"], "bench_busbw_GBps": last["busbw_GBps"],
                       "raw_busbw_GBps": raw_bus, "diff_pct": 100.0 * (last["busbw_GBps"] / raw_bus - 1)}
    if info.device.type == "cuda":
        torch.cuda.empty_cache()
    p2p_rows = p2p_matrix(clock, p2p_bytes, info.device, rank, world, warmup, iters, max_seconds) if p2p_bytes else []
    return rows, p2p_rows, ref
