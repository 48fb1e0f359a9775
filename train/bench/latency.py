"""``train bench comm --impl nccl,symm_mem``: small-message all-reduce latency.

For every size (default 4 KiB .. 4 MiB, times ``--factor``): the sum all-reduce of that
many bytes through

* ``nccl``: ``dist.all_reduce`` on the process group (gloo on CPU);
* ``one_shot``: ``torch.ops.symm_mem.one_shot_all_reduce`` on a symmetric buffer (one
  kernel; every rank reads all peers' buffers over NVLink and reduces);
* ``two_shot``: ``torch.ops.symm_mem.two_shot_all_reduce_`` in place (reduce-scatter then
  all-gather through peer pointers);

``symm_mem`` in ``--impl`` means both symmetric-memory kernels. Multicast (NVLS, the
``multimem_*`` kernels) is never used; ``TORCH_SYMM_MEM_DISABLE_MULTICAST`` is set to 1
unless the environment sets it. Each implementation's first call is checked: the result
must equal the sum over ranks of ``rank + 1``. Every implementation is timed as the
bandwidth sweep times a collective (``train.bench.comm_timing``): ``IMPL_device_us`` (calls
back to back between one pair of CUDA events), ``IMPL_graph_us`` (with ``--graph``: the
calls in one CUDA graph) and ``IMPL_host_us`` (the Python thread's cost per call; on CPU
the only column). Output: a table (size, those columns per implementation, the fastest by
device time, and with ``--graph`` by graph time) and JSON.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

IMPL_CHOICES = ("nccl", "symm_mem")
COLUMN_IMPLS = {"nccl": ("nccl",), "symm_mem": ("one_shot", "two_shot")}


def parse_impls(text: str) -> list[str]:
    from train.bench.report import choice_list

    return list(dict.fromkeys(choice_list(text, "--impl", IMPL_CHOICES, "valid")))


def rendezvous_buffer(numel: int, dtype: torch.dtype, device: torch.device, group=None) -> tuple[torch.Tensor, str]:
    """A symmetric buffer of ``numel`` elements on every rank of ``group`` (a collective):
    (buffer, group name for the ``torch.ops.symm_mem`` kernels). Multicast stays off."""
    import os
    import warnings

    import torch.distributed._symmetric_memory as symm_mem

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    group = group or dist.group.WORLD
    name = group.group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:  # needed up to torch 2.8 or so, deprecated (a no-op) since
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(name)
    buf = symm_mem.empty(numel, dtype=dtype, device=device)
    symm_mem.rendezvous(buf, group)
    return buf, name


def columns(impls: list[str]) -> list[str]:
    return [c for impl in impls for c in COLUMN_IMPLS[impl]]


def _callables(kind: str, count: int, dtype, device):
    """(fn, check) for one implementation; ``check()`` runs one reduction of rank + 1."""
    rank = dist.get_rank()
    if kind == "nccl":
        x = torch.zeros(count, dtype=dtype, device=device)

        def check():
            y = torch.full((count,), rank + 1, dtype=dtype, device=device)
            dist.all_reduce(y)
            return y
        return (lambda: dist.all_reduce(x)), check
    buf, name = rendezvous_buffer(count, dtype, device)
    ops = torch.ops.symm_mem

    def check():
        buf.fill_(rank + 1)
        dist.barrier()
        out = ops.one_shot_all_reduce(buf, "sum", name) if kind == "one_shot" else ops.two_shot_all_reduce_(buf, "sum", name)
        torch.cuda.synchronize(device)
        dist.barrier()
        result = out.clone()
        buf.zero_()
        dist.barrier()
        return result

    if kind == "one_shot":
        return (lambda: ops.one_shot_all_reduce(buf, "sum", name)), check
    return (lambda: ops.two_shot_all_reduce_(buf, "sum", name)), check  # zeros stay zeros


def latency_rows(info, impls: list[str], sizes: list[int], dtype, time_fn, size_label) -> list[dict]:
    """One row per size: the timing columns of every implementation (``time_fn(fn)`` -> a
    ``train.bench.comm_timing.Timing``) and the fastest one."""
    world = info.world_size
    expected = world * (world + 1) / 2
    elem = torch.empty((), dtype=dtype).element_size()
    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // elem)
        row: dict = {"size": size_label(count * elem), "bytes": count * elem}
        for kind in columns(impls):
            try:
                fn, check = _callables(kind, count, dtype, info.device)
                got = check()
                if not bool((got == expected).all()):
                    raise RuntimeError(f"wrong sum: got {got.flatten()[0].item()}, want {expected}")
                timing = time_fn(fn)
                row.update(timing.columns(f"{kind}_"))
                if not timing.queued:
                    row["note"] = f"{kind}: host issued slower than the GPU ran (device_us includes launch gaps)"
                if timing.graph_error:
                    row.setdefault("error", f"{kind}: {timing.graph_error}")
            except (RuntimeError, ValueError, TypeError) as exc:
                row.setdefault("error", f"{kind}: {' '.join(str(exc).split())[:150]}")
        basis = "device_us" if info.device.type == "cuda" else "host_us"
        row["best"] = _fastest(row, columns(impls), basis)
        if any(f"{k}_graph_us" in row for k in columns(impls)):
            row["best_graph"] = _fastest(row, columns(impls), "graph_us")
        rows.append(row)
    return rows


def _fastest(row: dict, kinds: list[str], column: str) -> str:
    timed = {k: row[f"{k}_{column}"] for k in kinds if row.get(f"{k}_{column}") is not None}
    return min(timed, key=timed.get) if timed else "-"


def write_latency(rows: list[dict], impls: list[str], dtype_name: str, out_dir, name: str, meta: dict,
                  timing_columns: list[str]) -> None:
    """The table: per timing column (device, graph, host), one column per implementation."""
    import click

    from train.bench.report import write_report

    cols = ["size", *(f"{k}_{t}" for t in timing_columns for k in columns(impls)), "best"]
    cols += [c for c in ("best_graph", "note", "error") if any(c in r for r in rows)]
    meta = {**meta, "impls": columns(impls), "dtype": dtype_name,
            "multicast": "disabled (TORCH_SYMM_MEM_DISABLE_MULTICAST=1; no multimem kernels)"}
    click.echo(write_report(out_dir, name, rows, cols, meta))
    click.echo(f"wrote {out_dir / name}.json/.md")
