"""GPU time by kernel category for any training program, ours or torchtitan's, unmodified.

    torchrun --standalone --nproc-per-node 1 scripts/gpu/kernel_profile.py --out DIR --name NAME \
        [--skip 8] [--active 3] -- -m train bench step --device cuda ...
    torchrun ... scripts/gpu/kernel_profile.py --out DIR --name NAME -- .titan/titan_bench.py --preset 1b ...

The program runs in this process (``runpy``) under ``torch.profiler``; a global optimizer
step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) advances the
profiler's schedule once per training step, so the window is ``--active`` whole steps after
``--skip`` steps (compile, autotuning and allocator warm-up stay outside). Each rank writes
``DIR/NAME.rank{R}.json``: per step, the wall time of the window, the time some kernel or
copy was running (busy), the GPU idle time by what the training thread was doing meanwhile,
and the kernel time per category (GEMM, attention, NCCL, optimizer, Triton (Inductor's fused
kernels), copy/cast/elementwise, other), plus the top kernels. Rank 0 also
prints it as a table. The Chrome trace itself is deleted (hundreds of MB).

With ``--memory`` it records the CUDA caching allocator's history (Python stacks) through
step SKIP+1 instead, and reports that step's peak: bytes allocated before the step
(parameters, optimizer state) and, for what was allocated in the step and is live at the
peak, where (the innermost frame outside torch, and the innermost frame).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import sys
import tempfile
from pathlib import Path

from train.trace import union

CATEGORIES = (  # first match wins
    ("nccl", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"cudnn|flash|fmha|attention|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|matmul|splitk|s16816|sm90_", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor_apply|_foreach|FusedOptimizer", re.I)),
    ("triton", re.compile(r"^triton_", re.I)),
    ("copy_cast_elementwise", re.compile(r"copy|cast|elementwise|vectorized|unrolled|reduce_kernel|fill|Cat|index",
                                         re.I)),
)


def category(name: str) -> str:
    for cat, pattern in CATEGORIES:
        if pattern.search(name):
            return cat
    return "other"


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_CATS = ("cpu_op", "user_annotation", "python_function")


def _gaps(merged: list[tuple[float, float]], min_us: float) -> list[tuple[float, float]]:
    """The holes between the intervals of a ``union`` that last at least ``min_us``."""
    return [(a[1], b[0]) for a, b in zip(merged, merged[1:]) if b[0] - a[1] >= min_us]


def idle_causes(events: list[dict], busy: list[tuple[float, float]], steps: int, top: int = 15,
                min_us: float = 20.0) -> list[dict]:
    """GPU idle gaps (>= ``min_us``) by what the training thread was doing meanwhile: the chain of
    CPU ranges (record_function phases, ops) open at the gap's midpoint, outermost first."""
    marks = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not marks:
        return []
    tid = marks[0].get("tid")
    cpu = sorted((e for e in events if e.get("cat") in CPU_CATS and e.get("tid") == tid
                  and not str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    totals: dict[str, list] = {}
    for gs, ge in _gaps(busy, min_us):
        mid = (gs + ge) / 2
        chain = [e["name"] for e in cpu if e["ts"] <= mid <= e["ts"] + e["dur"]]
        key = " > ".join(chain[:2] + (["..."] if len(chain) > 3 else []) + chain[2:][-1:]) or "(no CPU range)"
        slot = totals.setdefault(key[:200], [0.0, 0])
        slot[0] += ge - gs
        slot[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"cpu": k, "idle_ms_per_step": t / 1e3 / steps, "gaps_per_step": n / steps} for k, (t, n) in ranked]


def breakdown(trace: dict, steps: int, top: int = 25) -> dict:
    """Per-step kernel times (ms) from a torch.profiler Chrome trace of ``steps`` steps."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    kernels = [e for e in gpu if e.get("cat") == "kernel"]
    marks = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not kernels:
        return {"error": "no CUDA kernels in the window"}
    start = min(e["ts"] for e in gpu)
    end = max(e["ts"] + e["dur"] for e in gpu)
    by_cat: dict[str, float] = {}
    by_name: dict[str, list] = {}
    for e in kernels:
        c = category(e["name"])
        by_cat[c] = by_cat.get(c, 0.0) + e["dur"]
        slot = by_name.setdefault(e["name"], [0.0, 0, c])
        slot[0] += e["dur"]
        slot[1] += 1
    for e in gpu:
        if e.get("cat") != "kernel":
            by_cat["memcpy_memset"] = by_cat.get("memcpy_memset", 0.0) + e["dur"]
    busy_spans = union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    busy = sum(e - s for s, e in busy_spans)
    per = 1e3 * steps
    return {
        "steps": steps,
        "profiler_steps_marked": len(marks),
        "window_ms_per_step": (end - start) / per,
        "busy_ms_per_step": busy / per,
        "kernel_ms_per_step": sum(by_cat.values()) / per,
        "idle_ms_per_step": (end - start - busy) / per,
        "idle_causes": idle_causes(events, busy_spans, steps),
        "category_ms_per_step": {k: v / per for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:160], "category": c, "ms_per_step": t / per, "calls_per_step": k / steps}
                        for n, (t, k, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]],
    }


def table(name: str, b: dict) -> str:
    if "error" in b:
        return f"{name}: {b['error']}"
    lines = [f"## {name}: {b['steps']} steps; per step: window {b['window_ms_per_step']:.2f} ms, "
             f"GPU busy {b['busy_ms_per_step']:.2f} ms, idle {b['idle_ms_per_step']:.2f} ms, "
             f"kernels {b['kernel_ms_per_step']:.2f} ms",
             "| category | ms/step | share of busy |", "|---|---|---|"]
    for cat, ms in b["category_ms_per_step"].items():
        lines.append(f"| {cat} | {ms:.2f} | {100 * ms / b['busy_ms_per_step']:.1f}% |")
    lines += ["", "| kernel | category | ms/step | calls/step |", "|---|---|---|---|"]
    for k in b["top_kernels"]:
        lines.append(f"| `{k['name'][:90]}` | {k['category']} | {k['ms_per_step']:.2f} | {k['calls_per_step']:.0f} |")
    lines += ["", "| GPU idle while the training thread was in | ms/step | gaps/step |", "|---|---|---|"]
    for c in b["idle_causes"]:
        lines.append(f"| `{c['cpu'][:150]}` | {c['idle_ms_per_step']:.2f} | {c['gaps_per_step']:.1f} |")
    return "\n".join(lines)


def write_report(out: Path, name: str, rank: int, data: dict, render) -> None:
    """``NAME.rank{R}.json`` on every rank; on rank 0 also ``NAME.md`` (``render(name, data)``), printed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.rank{rank}.json").write_text(json.dumps(data, indent=1))
    if rank == 0:
        text = render(name, data)
        (out / f"{name}.md").write_text(text + "\n")
        print(text, flush=True)


class _PerStep:
    """Called once per training step by a global optimizer step post-hook. An optimizer
    container (torchtitan's) and its members may both fire: the first object seen counts."""

    def __init__(self, out: Path, name: str):
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.out, self.name = out, name
        self.rank = int(os.environ.get("RANK", "0"))
        self.owner, self.done = None, False
        register_optimizer_step_post_hook(self._hook)

    def _hook(self, optimizer, *_args, **_kwargs) -> None:
        import torch

        if self.owner is None:
            self.owner = id(optimizer)
        if id(optimizer) != self.owner or self.done or (self.needs_cuda and not torch.cuda.is_available()):
            return
        # a step's kernels run inside its window: the GPU may still be on this step's
        # backward when the optimizer returns (torchtitan's loop does not wait there)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.step()


class StepProfiler(_PerStep):
    """torch.profiler over ``active`` optimizer steps after ``skip``."""

    needs_cuda = False  # on the CPU the window still closes (and says there were no kernels)

    def __init__(self, out: Path, name: str, skip: int, active: int):
        import torch

        self.active = active
        sched = torch.profiler.schedule(skip_first=skip, wait=0, warmup=1, active=active, repeat=1)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        self.prof = torch.profiler.profile(activities=acts, schedule=sched, on_trace_ready=self._ready)
        self.prof.start()
        super().__init__(out, name)

    def step(self) -> None:
        self.prof.step()

    def _ready(self, prof) -> None:
        self.done = True
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            b = breakdown(json.loads(path.read_text()), self.active)
        write_report(self.out, self.name, self.rank, b, table)

    def stop(self) -> None:
        if not self.done:
            self.prof.stop()
            if not self.done and self.rank == 0:
                print(f"kernel_profile {self.name}: the program ended before the window closed", flush=True)


def _is_torch(filename: str) -> bool:
    return ("/torch/" in filename and "/torchtitan/" not in filename) or filename.startswith("<") \
        or filename.endswith(("runpy.py", "kernel_profile.py"))


def site(frames: list[dict]) -> str:
    """Where an allocation comes from: the innermost frame outside torch (our code, torchtitan's,
    or an Inductor-generated module), and the innermost frame of all (frames: innermost first)."""
    if not frames:
        return "(no Python frame)"
    first = frames[0]
    own = next((f for f in frames if not _is_torch(f.get("filename", ""))), None)
    inner = f"{Path(first.get('filename', '?')).name}:{first.get('name', '?')}"
    if own is None or own is first:
        return inner if own is None else f"{Path(own['filename']).name}:{own.get('line')} {own.get('name')}"
    return f"{Path(own['filename']).name}:{own.get('line')} {own.get('name')} <- {inner}"


def peak_composition(events: list[dict], base: int, top: int = 20) -> dict:
    """Replays one step's allocator trace (``device_traces`` of ``torch.cuda.memory._snapshot``)
    from ``base`` bytes allocated at its start; returns the peak and what is live there."""
    def replay(stop: int | None):
        live, cur, peak, at = {}, base, base, -1
        for i, ev in enumerate(events):
            if stop is not None and i > stop:
                break
            act = ev.get("action")
            if act == "alloc":
                live[ev["addr"]] = (ev["size"], site(ev.get("frames", [])))
                cur += ev["size"]
            elif act == "free_completed":
                cur -= live.pop(ev["addr"], (ev["size"], None))[0]
            if cur > peak:
                peak, at = cur, i
        return live, cur, peak, at

    _, _, peak, at = replay(None)
    live, cur, _, _ = replay(at) if at >= 0 else ({}, base, base, -1)
    rows: dict[str, list] = {}
    for size, where in live.values():
        slot = rows.setdefault(where, [0, 0])
        slot[0] += size
        slot[1] += 1
    in_step = sum(v[0] for v in rows.values())
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]
    gib = 2 ** 30
    return {"peak_gib": peak / gib, "before_step_gib": (cur - in_step) / gib, "in_step_gib": in_step / gib,
            "peak_event": at, "events": len(events),
            "live_at_peak": [{"site": k[:220], "gib": v[0] / gib, "blocks": v[1]} for k, v in ranked]}


def memory_table(name: str, m: dict) -> str:
    lines = [f"## {name}: peak {m['peak_gib']:.2f} GiB (torch max_memory_allocated {m.get('max_allocated_gib', 0):.2f}): "
             f"{m['before_step_gib']:.2f} GiB allocated before the step (parameters, optimizer state, ...) + "
             f"{m['in_step_gib']:.2f} GiB allocated in it",
             "| live at the peak, allocated at | GiB | blocks |", "|---|---|---|"]
    lines += [f"| `{r['site'][:160]}` | {r['gib']:.3f} | {r['blocks']} |" for r in m["live_at_peak"]]
    return "\n".join(lines)


class MemoryPeak(_PerStep):
    """Records the allocator's history through optimizer step ``skip`` + 1 and reports the
    peak of that step: what was live there and where it was allocated."""

    needs_cuda = True

    def __init__(self, out: Path, name: str, skip: int, active: int):
        self.skip, self.count, self.base = skip, 0, 0
        super().__init__(out, name)

    def step(self) -> None:
        import torch

        self.count += 1
        if self.count == self.skip:
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                     max_entries=2_000_000)
        elif self.count == self.skip + 1:
            self.done = True
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            traces = snap.get("device_traces", [])
            dev = torch.cuda.current_device()
            m = peak_composition(traces[dev] if dev < len(traces) else [], self.base)
            m["max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
            write_report(self.out, self.name, self.rank, m, memory_table)

    def stop(self) -> None:
        if not self.done and self.rank == 0:
            print(f"kernel_profile --memory {self.name}: no CUDA, or the program ended before step {self.skip + 1}",
                  flush=True)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("kernel_profile: usage: kernel_profile.py --out DIR --name NAME [--skip N] [--active N] "
              "-- (-m MODULE | SCRIPT) ARGS...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="kernel_profile.py")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--skip", type=int, default=8, help="optimizer steps before the profiler's warm-up step")
    p.add_argument("--active", type=int, default=3, help="optimizer steps recorded")
    p.add_argument("--memory", action="store_true",
                   help="instead of kernel times: the allocator's peak in step SKIP+1 and what is live there")
    args = p.parse_args(argv[:cut])
    target = argv[cut + 1:]
    if not target or (target[0] == "-m" and len(target) < 2):
        print("kernel_profile: nothing to run after --", file=sys.stderr)
        return 2
    prof = (MemoryPeak if args.memory else StepProfiler)(args.out, args.name, args.skip, args.active)
    code = 0
    try:
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(target)
            sys.path.insert(0, str(Path(target[0]).resolve().parent))
            runpy.run_path(target[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        prof.stop()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
