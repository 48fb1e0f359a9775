#!/usr/bin/env python3
"""The table of scripts/gpu/defaults_vs_titan.sh: ``python3 defaults_summary.py DIR``.

DIR holds, per point NAME, our ``NAME.metrics.jsonl`` (one row per step) and ``NAME.log``
(``train run``'s output, with the plan's line), and torchtitan's ``titan_NAME.json``. Ours is
the median tokens/s/GPU of the steps after the warm-up (as torchtitan's median step time), the
peak allocated and reserved memory and the allocator's cudaMalloc retries (rank 0). Writes
``DIR/defaults.json`` and prints the Markdown table. Standard library only.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

POINTS = {"1b": 4, "1b_fp8": 4, "8b": 3, "8b_fp8": 3}  # point -> warm-up steps (torchtitan's --warmup)


def ours(root: Path, name: str, warmup: int) -> dict | None:
    path = root / f"{name}.metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    timed = [r for r in rows if r.get("step", 0) > warmup]
    if not timed:
        return None
    log = root / f"{name}.log"
    plan = [ln.split("plan: ", 1)[1] for ln in (log.read_text(errors="replace").splitlines() if log.is_file() else [])
            if "plan: " in ln]
    return {
        "tokens_per_s_per_gpu": statistics.median(r["tokens_per_s_per_gpu"] for r in timed),
        "peak_mem_gib": max(r.get("peak_mem_gib", 0.0) for r in rows),
        "reserved_gib": max(r.get("reserved_gib", 0.0) for r in rows),
        "alloc_retries": max(r.get("alloc_retries", 0) for r in rows),
        "mfu": statistics.median(r["mfu"] for r in timed) if timed[0].get("mfu") is not None else None,
        "steps": len(rows), "plan": plan[0] if plan else None,
    }


def titan(root: Path, name: str) -> dict | None:
    try:
        data = json.loads((root / f"titan_{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return {k: data.get(k) for k in ("tokens_per_s_per_gpu", "peak_mem_gib", "peak_reserved_gib", "mfu", "device")}


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(root: Path) -> None:
    results = {name: {"ours": ours(root, name, w), "titan": titan(root, name)} for name, w in POINTS.items()}
    results = {k: v for k, v in results.items() if v["ours"] or v["titan"]}
    (root / "defaults.json").write_text(json.dumps(results, indent=1))
    print("| point | torchtitan tok/s/GPU | ours tok/s/GPU | ratio | peak GiB titan / ours | reserved GiB titan / ours "
          "| cudaMalloc retries (ours) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        o, t = r["ours"] or {}, r["titan"] or {}
        ratio = (o["tokens_per_s_per_gpu"] / t["tokens_per_s_per_gpu"]
                 if o.get("tokens_per_s_per_gpu") and t.get("tokens_per_s_per_gpu") else None)
        print(f"| {name} | {fmt(t.get('tokens_per_s_per_gpu'), ',.0f')} | {fmt(o.get('tokens_per_s_per_gpu'), ',.0f')} "
              f"| {fmt(ratio, '.3f')} | {fmt(t.get('peak_mem_gib'), '.2f')} / {fmt(o.get('peak_mem_gib'), '.2f')} "
              f"| {fmt(t.get('peak_reserved_gib'), '.2f')} / {fmt(o.get('reserved_gib'), '.2f')} "
              f"| {fmt(o.get('alloc_retries'), 'd')} |")
    print()
    for name, r in results.items():
        if r["ours"] and r["ours"]["plan"]:
            print(f"- {name}: {r['ours']['plan']}")
    devices = {r["titan"]["device"] for r in results.values() if r["titan"] and r["titan"].get("device")}
    if devices:
        print(f"\ndevice: {', '.join(sorted(devices))}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
