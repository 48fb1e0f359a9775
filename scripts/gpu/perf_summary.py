#!/usr/bin/env python3
"""Markdown summary of a scripts/gpu/perf.sh run: ``python3 perf_summary.py DIR``.

DIR holds ``train bench step`` reports (``NAME.json`` with ``rows``), torchtitan results
(``titan_NAME.json``, written by titan_bench.py --out) and ``train bench comm --impl``
latency reports (``latency*.json``). Printed: every bench-step row (the lever runs), the
side-by-side table (``titan_NAME.json`` next to ``NAME.json``'s first row: ratio of
tokens/s/GPU and the two peak memories) and the all-reduce latency table. Standard
library only (runs before or without the project's dependencies).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"- {path.name}: unreadable ({exc})")
        return None


def step_rows(d: Path) -> list[tuple[str, dict]]:
    out = []
    for p in sorted(d.glob("*.json")):
        if p.name.startswith(("titan_", "latency", "results")):
            continue
        data = _load(p)
        if isinstance(data, dict) and isinstance(data.get("rows"), list):
            out += [(p.stem, r) for r in data["rows"] if isinstance(r, dict)]
    return out


def lever_table(rows: list[tuple[str, dict]]) -> list[str]:
    lines = [("| run | preset | strategy | gpus | fp8 | ac | batch x seq | overrides | status | step ms | tok/s/GPU"
             " | MFU | peak GiB | final loss |"), "|" + "---|" * 14]
    for name, r in rows:
        lines.append(
            f"| {name} | {r.get('preset')} | {r.get('strategy')} | {r.get('gpus')} | {r.get('fp8')} | {r.get('ac')} | "
            f"{r.get('batch')}x{r.get('seq')} | {r.get('overrides') or '-'} | {r.get('status')} | "
            f"{_num(r.get('step_ms'), '.1f')} | {_num(r.get('tokens_per_s_per_gpu'), ',.0f')} | "
            f"{_num(r.get('mfu'), '.3f')} | {_num(r.get('peak_mem_gib'), '.1f')} | {_num(r.get('final_loss'), '.4f')} |")
    return lines


def side_by_side(d: Path) -> list[str]:
    lines = [("| point | torchtitan tok/s/GPU | ours tok/s/GPU | ratio | MFU titan / ours | peak GiB titan / ours"
             " | ours overrides |"), "|---|---|---|---|---|---|---|"]
    for p in sorted(d.glob("titan_*.json")):
        titan = _load(p)
        ours_path = d / (p.name[len("titan_"):])
        ours = _load(ours_path) if ours_path.is_file() else None
        row = (ours or {}).get("rows", [{}])[0] if isinstance(ours, dict) else {}
        t_tps = titan.get("tokens_per_s_per_gpu") if isinstance(titan, dict) else None
        o_tps = row.get("tokens_per_s_per_gpu") if row.get("status") == "ok" else None
        ratio = o_tps / t_tps if t_tps and o_tps else None
        t = titan if isinstance(titan, dict) else {}
        lines.append(
            f"| {ours_path.stem} | {_num(t_tps, ',.0f')} | {_num(o_tps, ',.0f')} "
            f"{'' if o_tps else '(' + str(row.get('status', 'missing')) + ')'} | {_num(ratio, '.3f')} | "
            f"{_num(t.get('mfu'), '.3f')} / {_num(row.get('mfu'), '.3f')} | "
            f"{_num(t.get('peak_mem_gib'), '.1f')} / {_num(row.get('peak_mem_gib'), '.1f')} | "
            f"{row.get('overrides') or '-'} |")
    return lines if len(lines) > 2 else []


def latency_table(d: Path) -> list[str]:
    lines = []
    for p in sorted(d.glob("latency*.json")):
        data = _load(p)
        if not isinstance(data, dict):
            continue
        impls = (data.get("meta") or {}).get("impls", [])
        lines += [f"### {p.stem}", "", "| size | " + " | ".join(f"{k} device us" for k in impls) + " | best | error |",
                  "|---|" + "---|" * (len(impls) + 2)]
        for r in data.get("rows", []):
            cells = [_num(r.get(f"{k}_device_us", r.get(f"{k}_us")), ".1f") for k in impls]
            lines.append(f"| {r.get('size')} | " + " | ".join(cells) + f" | {r.get('best')} | {r.get('error', '')} |")
        lines.append("")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[1]).is_dir():
        print("usage: perf_summary.py DIR", file=sys.stderr)
        return 2
    d = Path(argv[1])
    print(f"# perf summary: {d}\n")
    sbs = side_by_side(d)
    if sbs:
        print("## torchtitan vs ours (same call)\n")
        print("\n".join(sbs) + "\n")
    rows = step_rows(d)
    if rows:
        print("## train bench step rows\n")
        print("\n".join(lever_table(rows)) + "\n")
    lat = latency_table(d)
    if lat:
        print("## all-reduce latency\n")
        print("\n".join(lat))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
