"""The table of one-gpu/run.sh: DIR WHICH -> markdown (exit status, plan, speed and memory of each preset)."""

import json
import re
import statistics
import sys
from pathlib import Path


def main(out: Path, which: str) -> None:
    log = (out / f"log_{which}.txt").read_text()
    print("| preset | exit | tok/s (median, steps 3-8) | step ms | peak GiB | reserved GiB | cudaMalloc retries | plan |")
    print("|---|---|---|---|---|---|---|---|")
    for block in log.split("== train run --config ")[1:]:
        preset = block.split()[0]
        rc = re.search(r"^rc=(\d+)", block, re.M)
        plan = re.search(r"^plan: [^:]*: (.*)$", block, re.M) or re.search(r"^(error: .*)$", block, re.M)
        rows = []
        metrics = out / f"run_{preset}_{which}" / "metrics.jsonl"
        if metrics.is_file():
            rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        timed = [r for r in rows if r.get("step", 0) >= 3]
        if timed:
            tok = f"{statistics.median(r['tokens_per_s'] for r in timed):,.0f}"
            ms = f"{1000 * statistics.median(r['step_time_s'] for r in timed):,.0f}"
            mem = [f"{max(r[k] for r in rows):.2f}" for k in ("peak_mem_gib", "reserved_gib")]
            retries = str(max(r.get("alloc_retries", 0) for r in rows))
        else:
            tok = ms = retries = "-"
            mem = ["-", "-"]
        text = plan.group(1) if plan else "-"
        print(f"| {preset} | {rc.group(1) if rc else '?'} | {tok} | {ms} | {mem[0]} | {mem[1]} | {retries} | {text} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
