#!/usr/bin/env python3
"""nccl-tests beside ``train bench comm``: the side-by-side table of scripts/gpu/comm_vs_nccl_tests.sh.

    python3 nccl_tests_compare.py NCCL_TESTS_TXT COMM_JSON [LATENCY_JSON] --md OUT.md --json OUT.json

``NCCL_TESTS_TXT`` holds the output of several nccl-tests runs, each after a line
``### variant=NAME op=OP: COMMAND`` (variants: ``default`` = the pipelined loop,
``graph`` = ``-G``, ``blocking`` = ``-z 1``, ``threads`` = one thread per GPU, ``mpi_graph`` =
``-G`` with one process per GPU under mpirun; one variant may span several runs). ``COMM_JSON``
is a ``train bench comm`` report with ``device_us`` (and ``graph_us`` with ``--graph``).
Per operation and size the table pairs

* ``device_us`` with nccl-tests' default loop (both: back-to-back operations, time / count),
* ``graph_us`` with nccl-tests ``-G`` (both: the operations in a CUDA graph), also with its
  one-process-per-GPU run where there is one (as torchrun runs the bench),

and gives the busbw of each; the headline pairs time up to 4 MiB (``device_us`` against ``-G``)
and busbw above it (against the default loop). nccl-tests' in-place column for all_reduce (the bench reduces
in place), out-of-place for all_gather and reduce_scatter (as the bench). A pair agrees when
the bench's time is within ``--tolerance`` (10%) of nccl-tests'. With ``LATENCY_JSON`` (a
``train bench comm --impl nccl,symm_mem`` report) also: where symmetric memory is faster than
NCCL, per timing basis. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

OPS = ("all_reduce", "all_gather", "reduce_scatter")
_HEADER = re.compile(r"^### variant=(\w+) op=(\w+):")
_NUM = r"([0-9.eE+-]+|N/A)"
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\S+)\s+(-?\d+)\s+" + r"\s+".join([_NUM] * 8) + r"\s*$")
# (variant in the text, bench column it is compared with)
PAIRS = (("default", "device_us"), ("graph", "graph_us"))
# device_us queues its calls ahead of the GPU, so no launch gap is in it: nccl-tests -G (the calls
# replayed from a CUDA graph) is the other measurement without one.
GAPLESS = ("graph", "device_us")
# The headline basis: time for small messages (device_us against nccl-tests -G, both without
# launch gaps), bus bandwidth for large ones (the bench's busbw against nccl-tests' default loop,
# which is what cluster engineers read off it). Small is up to this many bytes.
SMALL_MAX = 4 << 20


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_nccl_tests(text: str) -> dict:
    """``{variant: {op: {bytes: {"oop_us", "oop_busbw", "ip_us", "ip_busbw"}}}}`` from the
    concatenated outputs (data lines of nccl-tests' table; comment lines start with '#')."""
    out: dict = {}
    section = None
    for line in text.splitlines():
        head = _HEADER.match(line)
        if head:
            section = out.setdefault(head.group(1), {}).setdefault(head.group(2), {})
            continue
        m = _ROW.match(line)
        if m is None or section is None:
            continue
        vals = [_float(v) for v in m.groups()[5:]]
        section[int(m.group(1))] = {"oop_us": vals[0], "oop_busbw": vals[2], "ip_us": vals[4], "ip_busbw": vals[6]}
    return out


def _nt(parsed: dict, variant: str, op: str, nbytes: int) -> tuple[float | None, float | None]:
    """(µs, busbw) of nccl-tests for the bench's kind of call: in place for all_reduce."""
    row = parsed.get(variant, {}).get(op, {}).get(nbytes)
    if not row:
        return None, None
    side = "ip" if op == "all_reduce" else "oop"
    return row[f"{side}_us"], row[f"{side}_busbw"]


def compare(parsed: dict, bench_rows: list[dict], tolerance: float = 0.10) -> list[dict]:
    """One row per (op, size) the bench measured that nccl-tests' default run has too."""
    rows = []
    for b in bench_rows:
        if b.get("op") not in OPS or b.get("dtype", "float32") != "float32" or b.get("device_us") is None:
            continue
        op, nbytes = b["op"], b["bytes"]
        if _nt(parsed, "default", op, nbytes)[0] is None:
            continue
        row = {"op": op, "size": b["size"], "bytes": nbytes, "bench_busbw": b.get("busbw_GBps"),
               "host_us": b.get("host_us")}
        for variant, column in PAIRS:
            nt_us, nt_bus = _nt(parsed, variant, op, nbytes)
            ours = b.get(column)
            row[f"nt_{variant}_us"], row[column] = nt_us, ours
            if variant == "default":
                row["nt_busbw"] = nt_bus
            if nt_us and ours is not None:
                row[f"{column}_ratio"] = ours / nt_us
                row[f"{column}_ok"] = abs(ours / nt_us - 1) <= tolerance
        nt_us = row.get("nt_graph_us")
        if nt_us and b.get("device_us") is not None:
            row["gapless_ratio"] = b["device_us"] / nt_us
            row["gapless_ok"] = abs(row["gapless_ratio"] - 1) <= tolerance
        if nbytes <= SMALL_MAX and "gapless_ratio" in row:
            row["basis"], row["basis_ratio"] = "time", row["gapless_ratio"]
        elif nbytes > SMALL_MAX and row.get("nt_busbw") and row.get("bench_busbw"):
            row["basis"], row["basis_ratio"] = "busbw", row["bench_busbw"] / row["nt_busbw"]
        if "basis" in row:
            row["basis_ok"] = abs(row["basis_ratio"] - 1) <= tolerance
        for variant in ("blocking", "threads", "mpi_graph"):
            row[f"nt_{variant}_us"] = _nt(parsed, variant, op, nbytes)[0]
        if row["nt_mpi_graph_us"] and b.get("graph_us") is not None:
            row["graph_mpi_ratio"] = b["graph_us"] / row["nt_mpi_graph_us"]
            row["graph_mpi_ok"] = abs(row["graph_mpi_ratio"] - 1) <= tolerance
        rows.append(row)
    return rows


def _verdict(label: str, rows: list[dict], key: str, tolerance: float, basis: bool = False) -> str:
    """``- LABEL: k of n sizes within 10%[: outside at ...]`` over the rows judged on ``KEY_ok``
    (``KEY_ratio`` is the ratio; ``basis``: each ratio named by its basis)."""
    judged = [r for r in rows if f"{key}_ok" in r]
    bad = [r for r in judged if not r[f"{key}_ok"]]
    tail = "" if not bad else ": outside at " + ", ".join(
        f"{r['op']} {r['size']} ({r['basis'] + ' ' if basis else ''}{r[f'{key}_ratio']:.2f}x)" for r in bad)
    return f"- {label}: {len(judged) - len(bad)} of {len(judged)} sizes within {tolerance:.0%}{tail}"


def verdicts(rows: list[dict], tolerance: float = 0.10) -> list[str]:
    def measured(key: str) -> bool:
        return any(f"{key}_ok" in r for r in rows)

    lines = []
    for variant, column in PAIRS:
        label = f"{column} vs nccl-tests {variant}"
        lines.append(_verdict(label, rows, column, tolerance) if measured(column) else f"- {label}: not measured")
    if measured("graph_mpi"):
        lines.append(_verdict("graph_us vs nccl-tests -G one process per GPU (mpirun)", rows, "graph_mpi", tolerance))
    lines.append(_verdict("device_us vs nccl-tests -G (both without launch gaps)", rows, "gapless", tolerance))
    lines.append(_verdict(f"time up to {SMALL_MAX >> 20}M (device_us vs nccl-tests -G), busbw above (vs nccl-tests' "
                          "default loop)", rows, "basis", tolerance, basis=True))
    return lines


def _cell(v, fmt: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return format(v, fmt)


def table(rows: list[dict]) -> list[str]:
    head = ("| op | size | nccl-tests µs | device_us | ratio | within | nccl-tests -G µs | graph_us | ratio | within "
            "| nccl-tests -G mpirun µs | nccl-tests busbw | bench busbw | nccl-tests -z 1 µs | nccl-tests -t 2 µs "
            "| host_us |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        out.append("| " + " | ".join([
            r["op"], r["size"], _cell(r.get("nt_default_us")), _cell(r.get("device_us")),
            _cell(r.get("device_us_ratio"), ".2f"), _cell(r.get("device_us_ok")),
            _cell(r.get("nt_graph_us")), _cell(r.get("graph_us")), _cell(r.get("graph_us_ratio"), ".2f"),
            _cell(r.get("graph_us_ok")), _cell(r.get("nt_mpi_graph_us")), _cell(r.get("nt_busbw"), ".2f"),
            _cell(r.get("bench_busbw"), ".2f"),
            _cell(r.get("nt_blocking_us")), _cell(r.get("nt_threads_us")), _cell(r.get("host_us"))]) + " |")
    return out


def symm_mem_wins(latency_rows: list[dict]) -> list[str]:
    """Per timing basis: the sizes where the faster symmetric-memory kernel beats NCCL, and by how much."""
    lines = []
    for basis in ("device_us", "graph_us", "host_us"):
        wins, losses = [], []
        for r in latency_rows:
            nccl = r.get(f"nccl_{basis}")
            symm = {k: r[f"{k}_{basis}"] for k in ("one_shot", "two_shot") if r.get(f"{k}_{basis}") is not None}
            if nccl is None or not symm:
                continue
            kind = min(symm, key=symm.get)
            entry = f"{r['size']} ({kind} {symm[kind]:.1f} vs NCCL {nccl:.1f} µs, {100 * (1 - symm[kind] / nccl):+.0f}%)"
            (wins if symm[kind] < nccl else losses).append(entry)
        if wins or losses:
            lines.append(f"- {basis}: symmetric memory faster at " + (", ".join(wins) or "no size")
                         + "; NCCL faster or equal at " + (", ".join(losses) or "no size"))
    return lines


def latency_table(latency_rows: list[dict], parsed: dict) -> list[str]:
    kinds = ("nccl", "one_shot", "two_shot")
    bases = [b for b in ("device_us", "graph_us", "host_us") if any(f"nccl_{b}" in r for r in latency_rows)]
    cols = [f"{k}_{b}" for b in bases for k in kinds]
    out = ["| size | " + " | ".join(cols) + " | nccl-tests µs | nccl-tests -G µs |",
           "|" + "---|" * (len(cols) + 3)]
    for r in latency_rows:
        nt = _nt(parsed, "default", "all_reduce", r["bytes"])[0]
        ntg = _nt(parsed, "graph", "all_reduce", r["bytes"])[0]
        out.append(f"| {r['size']} | " + " | ".join(_cell(r.get(c)) for c in cols) + f" | {_cell(nt)} | {_cell(ntg)} |")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nccl_tests")
    ap.add_argument("comm_json")
    ap.add_argument("latency_json", nargs="?")
    ap.add_argument("--md", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--tolerance", type=float, default=0.10)
    args = ap.parse_args(argv[1:])
    parsed = parse_nccl_tests(Path(args.nccl_tests).read_text(errors="replace"))
    bench = json.loads(Path(args.comm_json).read_text())
    rows = compare(parsed, bench["rows"], args.tolerance)
    md = ["## all_reduce, all_gather, reduce_scatter: nccl-tests beside train bench comm (float32)", "",
          *verdicts(rows, args.tolerance), "", *table(rows), ""]
    latency = []
    if args.latency_json and Path(args.latency_json).is_file():
        latency = json.loads(Path(args.latency_json).read_text())["rows"]
        md += ["## sum all-reduce: NCCL against symmetric memory (multicast off)", "", *symm_mem_wins(latency), "",
               *latency_table(latency, parsed), ""]
    Path(args.md).write_text("\n".join(md))
    Path(args.json).write_text(json.dumps({"rows": rows, "verdicts": verdicts(rows, args.tolerance),
                                           "symm_mem": symm_mem_wins(latency), "nccl_tests": parsed}, indent=1))
    print("\n".join(md))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
