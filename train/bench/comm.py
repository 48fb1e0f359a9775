"""``train bench comm``: an nccl-tests-style sweep of collectives through torch.distributed.

Run under torchrun (one process per GPU, or CPU processes with ``--backend gloo``)::

    torchrun --nproc-per-node 2 -m train bench comm --max-bytes 1G
    torchrun --nproc-per-node 2 -m train bench comm --ops all_reduce,all_gather,reduce_scatter --min-bytes 8K --graph
    torchrun --nproc-per-node 2 -m train bench comm --emulate-link ethernet --ops all_reduce

For every operation, dtype and message size (``--min-bytes`` .. ``--max-bytes``, times
``--factor``), the columns of ``train.bench.comm_timing``: ``device_us`` (``--iters`` calls
back to back between one pair of CUDA events, as nccl-tests times them), ``graph_us``
(with ``--graph``: the same calls in one CUDA graph, as nccl-tests ``-G``) and ``host_us``
(what one call costs the Python thread; on CPU the only column). algbw and busbw as
nccl-tests defines them (``train.bench.bandwidth``), from ``device_us`` on CUDA and
``host_us`` on CPU. Slow sizes get fewer batches and calls (``--max-seconds`` per size,
at least 3 calls), sized by the slowest rank's second call (the first sets up lazily) so
that all ranks run the same collectives.

Also: a P2P bandwidth matrix (send/recv between each ordered pair of ranks, the others
idle) and a reference: all_reduce at the largest size timed by a plain loop over
``dist.all_reduce`` and one synchronize (no events, no per-batch bookkeeping) to check that
the bench's machinery does not distort the number.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from core.safety import parse_json
from train.bench.bandwidth import OPS
from train.bench.comm_args import DTYPES, check_args, human, torch_dtype


@click.command("comm")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True,
              help="nccl on GPUs (auto when CUDA is present), gloo on CPU tensors.")
@click.option("--ops", default=",".join(OPS), show_default=True, help="Comma-separated collectives.")
@click.option("--dtype", "dtypes", default="float32", show_default=True,
              help=f"Comma-separated dtypes ({', '.join(DTYPES)}).")
@click.option("--min-bytes", default=None, help="Smallest message [default: 8; with --impl 4K].")
@click.option("--max-bytes", default=None, help="Largest message [default: 1G; with --impl 4M].")
@click.option("--factor", type=int, default=2, show_default=True, help="Size multiplier between steps.")
@click.option("--warmup", type=int, default=5, show_default=True, help="Untimed calls before each size.")
@click.option("--iters", type=int, default=20, show_default=True,
              help="Calls per timed batch (nccl-tests -n); 5 batches per size.")
@click.option("--max-seconds", type=float, default=2.0, show_default=True,
              help="Time cap per (op, dtype, size): fewer batches and calls (>= 3) for slow sizes.")
@click.option("--graph", is_flag=True,
              help="Also time each batch captured in one CUDA graph (graph_us, as nccl-tests -G; CUDA only).")
@click.option("--p2p/--no-p2p", default=True, show_default=True, help="P2P bandwidth matrix over all pairs.")
@click.option("--p2p-bytes", default="256M", show_default=True, help="Message size of the P2P matrix.")
@click.option("--raw/--no-raw", default=True, show_default=True,
              help="Plain-loop dist.all_reduce reference at the largest size.")
@click.option("--emulate-link", type=click.Choice(["nvlink", "pcie", "ethernet"]), default=None,
              help="Set NCCL_P2P_DISABLE / NCCL_SHM_DISABLE before init (docs/communication.md).")
@click.option("--impl", "impl", default=None,
              help="Small-message all-reduce latency instead of the sweep: comma list of nccl, symm_mem "
                   "(symmetric-memory one-shot and two-shot kernels; CUDA only), timed as the sweep. "
                   "See train/bench/latency.py.")
@click.option("--out", "out_dir", default="runs/bench", show_default=True, type=click.Path(path_type=Path),
              help="Directory of the report (NAME.json, .md, .png).")
@click.option("--name", default=None, help="Report name (default: comm, comm_<link>, or latency with --impl).")
@click.option("--recommend", is_flag=True,
              help="From the all_reduce busbw at the largest size: none, LocalSGD or PowerSGD (train/bench/advice.py).")
@click.option("--apply", "apply_path", type=click.Path(path_type=Path), default=None,
              help="Write the recommended comm.* keys into this YAML config (implies --recommend).")
@click.option("--tflops", type=float, default=None,
              help="Achieved TFLOP/s per GPU for the recommendation (default: 40% of 989, H100/H200 bf16).")
@click.option("--tokens-per-gpu", type=int, default=None, help="Tokens per GPU per step (default 8192).")
def comm_cmd(backend, ops, dtypes, min_bytes, max_bytes, factor, warmup, iters, max_seconds, graph, p2p, p2p_bytes,
             raw, emulate_link, impl, out_dir, name, recommend, apply_path, tflops, tokens_per_gpu) -> None:
    """Collective bandwidth sweep (nccl-tests style) + P2P matrix, or (--impl) small-message
    all-reduce latency of NCCL vs symmetric memory. Run under torchrun."""
    from train.console import fail

    if name is None:  # --name '' is refused by check_report, not replaced
        name = "latency" if impl else "comm" + (f"_{emulate_link}" if emulate_link else "")
    try:
        args = check_args(backend, ops, dtypes, min_bytes, max_bytes, factor, warmup, iters, max_seconds,
                           p2p_bytes if p2p else None, impl, out_dir, name, recommend, apply_path, tflops,
                           tokens_per_gpu, graph)
    except ValueError as exc:
        fail(str(exc), 2)
    from train.bench.report import claim_report

    claim_report(out_dir, name)
    info = _init(args["backend"], emulate_link)
    meta = {"command": " ".join(["train", *sys.argv[1:]]), "backend": args["backend"], "world_size": info.world_size}
    from train.bench.comm_sweep import Timer, run_sweep

    timer = Timer(info.device, iters=iters, warmup=warmup, max_seconds=max_seconds, graph=graph)
    if args["impls"]:
        _latency(info, args, timer, out_dir, name, meta)
        return
    from train import distributed as tdist

    with tdist.group_teardown():
        rows, p2p_rows, ref = run_sweep(info, timer, args["ops"], args["dtypes"], args["sizes"],
                                   args["p2p_bytes"] if p2p else 0, raw)
    if info.is_main:
        from train.bench.comm_sweep import timing_meta

        meta.update(timing_meta(timer.cuda, timer.graph))
        _write_sweep(rows, p2p_rows, ref, meta, timer, emulate_link, out_dir, name)
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


def _latency(info, args, timer, out_dir, name, meta) -> None:
    from train import distributed as tdist
    from train.bench.comm_sweep import timing_columns, timing_meta
    from train.bench.latency import latency_rows, write_latency
    from train.bench.report import environment_meta

    with tdist.group_teardown():
        rows = latency_rows(info, args["impls"], args["sizes"], torch_dtype(args["dtypes"][0]), timer.measure, human)
    if info.is_main:
        meta = {**environment_meta(), **meta, **timing_meta(timer.cuda, timer.graph, "IMPL_")}
        write_latency(rows, args["impls"], args["dtypes"][0], out_dir, name, meta,
                      timing_columns(timer.cuda, timer.graph))


def _write_sweep(rows, p2p_rows, ref, meta, timer, emulate_link, out_dir, name) -> None:
    from train.bench.comm_charts import chart_p2p, chart_sweep
    from train.bench.comm_sweep import p2p_time_column, sweep_columns
    from train.bench.links import nccl_environment
    from train.bench.report import environment_meta, write_report

    meta = {**environment_meta(), **meta, "emulate_link": emulate_link or "none",
            "nccl_env": nccl_environment() or "defaults"}
    if ref:
        meta["raw_reference"] = ref
    extra = [c for c in ("queued", "error") if any(c in r for r in rows)]
    table = write_report(out_dir, name, rows, sweep_columns(timer.cuda, timer.graph) + extra, meta, chart=chart_sweep)
    click.echo(table)
    if p2p_rows:
        click.echo("")
        p2p_cols = ["src", "dst", "bytes", "iters", p2p_time_column(timer.cuda), "bw_GBps"]
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


