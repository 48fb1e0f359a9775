#!/usr/bin/env python3
"""One command per GPU table that the docs publish: it runs the measurement, keeps every raw
file (JSON, logs) and writes the table as Markdown.

    python3 scripts/gpu/tables.py TABLE [--out DIR] [--budget-s S] [--dry-run]
    python3 scripts/gpu/tables.py TABLE --render DIR [DIR ...]     # the table from raw files

Tables (machine; the doc that shows the table):

  vs-titan    2 GPUs: the project against torchtitan at five points, both sides in the same call
              (docs/performance.md). torchtitan runs through .titan/titan_bench.py (set up as
              ../shared/tools/titan_bench.md says; carry `.titan` and `.whl` to the device).
              --skip-bf16/--skip-fp8: parallel.ac_skip_last at 8b (4 / 3 on 80 GB cards, 8 / 11
              on 141 GB cards).
  defaults    1-4 GPUs: the presets as a user runs them, `torchrun --nproc-per-node N -m train run --config P
              --set data.source=synthetic` (the automatic plan deciding the rest; FP8: fp8.backend=torchao)
              against torchtitan with compile on and the preset's batch and sequence length, both sides
              in the same call (docs/plan.md). torchtitan runs the preset's AC, or none where the plan
              leaves every block out of AC on this machine (its best at that shape; --dry-run, which
              asks no GPU, shows the preset's). --points: a comma
              list of 8b, 1b, 8b_fp8, 1b_fp8 (default 8b,1b); --gpus: a comma list of GPU counts
              (default 2). Where the machine has twice the GPUs of a point, the two sides run at the
              same time on separate GPUs, twice, swapping GPUs (each side measured on both); otherwise
              one after the other.
  mesh        4+ GPUs (--gpus N, default 4): 8b meshes over N GPUs, FSDP2 (DP N), HSDP (2 replicas x
              N/2 shards) and TP 2 x DP N/2, the same 16-sequence-per-4-GPU global batch, 100 steps on
              the embedded text, same seed: tokens/s/GPU, peak memory and the loss curve; then
              `train doctor --preset 8b --gpus N` (its recommendation) (docs/parallel.md).
  fp8         2 GPUs: 8b bf16 against FP8 tensorwise, 200 steps on the embedded text, one seed per
              call (--seed), then the FP8 bound of scripts/gpu/fp8_floor.py (docs/performance.md).
  levers      1-2 GPUs: each performance lever against the defaults at one point (--point
              1b | fsdp2 | 8b) (docs/performance.md).
  parallel    2 GPUs: strategies, FP8, memory (scripts/gpu/parallel.sh; docs/parallel.md).
  comm        2 GPUs: collective bandwidth, NCCL settings, compression (scripts/gpu/comm.sh;
              docs/communication.md).
  slowlink    2 GPUs, root: compression over a tc-shaped veth (scripts/gpu/slowlink.sh;
              docs/communication.md).
  doctor      2 GPUs: the memory estimate against measured peaks (scripts/gpu/doctor.sh; docs/doctor.md).
  checkpoint  2 GPUs: the training stall per save, sync against async (scripts/gpu/async_ckpt.sh;
              docs/checkpoints.md).
  fault       2 GPUs: kill, preemption and resume on NCCL (scripts/gpu/fault.sh; docs/fault-tolerance.md).
  demo        any GPUs: environment facts and `make demo` under NCCL (scripts/gpu/smoke.sh).

Results go to DIR/TABLE/ (DIR: --out, else $OUT, else runs/gpu-out): every run's JSON and log,
meta.json (commit, torch, GPUs), table.md. NVLink multicast stays off in every process started
here (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1). Each run
is bounded by what is left of --budget-s; a failed run is logged and the others go on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SHELL_TABLES = {"parallel": "parallel.sh", "comm": "comm.sh", "slowlink": "slowlink.sh", "doctor": "doctor.sh",
                "checkpoint": "async_ckpt.sh", "fault": "fault.sh", "demo": "smoke.sh"}
TABLES = ("vs-titan", "defaults", "mesh", "fp8", "levers", *SHELL_TABLES)

P1B = ["--preset", "1b", "--batch", "8", "--seq", "2048", "--compile", "on", "--ac", "none", "--steps", "15",
       "--warmup", "4"]
P8B = ["--preset", "8b", "--batch", "4", "--seq", "2048", "--compile", "on", "--ac", "full", "--steps", "10",
       "--warmup", "3"]


def sets(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


# Ours at each vs-titan point: the settings that the table names (docs/performance.md).
ONE_GPU = sets("parallel.recompute_param_casts=true", "train.loss=chunked", "train.loss_chunk_tokens=8192")
FSDP2_1B = sets("train.loss=chunked", "train.loss_chunk_tokens=8192", "parallel.reshard_after_forward=never",
                "parallel.fsdp_symm_mem=all", "parallel.activation_memory_budget=0.999",
                "parallel.activation_memory_budget_skip_last=10")
CHUNK_8B = sets("train.loss=chunked", "train.loss_chunk_tokens=2048")
POINTS = {  # name: label in the table
    "1b_bf16": "1b bf16, 1 GPU, compile, AC none, 8×2048",
    "1b_fp8": "1b FP8 tensorwise, 1 GPU",
    "1b_fsdp2": "1b bf16, FSDP2 over 2 GPUs",
    "8b_bf16": "8b bf16, FSDP2, 4×2048, torchtitan AC full",
    "8b_fp8": "8b FP8 tensorwise, FSDP2",
}
# defaults: point -> (preset, FP8 recipe or "none", timed steps, warm-up steps). Both sides run the
# preset's batch (4), sequence length (2048) and activation checkpointing (8b full, 1b none).
DEFAULT_POINTS = {"8b": ("8b", "none", 10, 3), "1b": ("1b", "none", 15, 4),
                  "8b_fp8": ("8b", "tensorwise", 10, 3), "1b_fp8": ("1b", "tensorwise", 15, 4)}
PRESET_SHAPE = {"8b": ("4", "2048", "full"), "1b": ("4", "2048", "none")}  # batch, seq, AC of train/configs/
# Ours: nothing but the data source, besides a metrics row per step (for the median step) and no
# end-of-run checkpoint (8b: 96 GB of disk writes, minutes, and two do not fit the disk).
RUN_SETS = sets("data.source=synthetic", "train.log_every=1", "checkpoint.final=false")
# levers: one `train bench step --plan` per point; each grid one lever against the first (the defaults)
def _grids(*sets_: list[str], **keys: str) -> dict:
    return {**keys, **({"set": list(sets_[0])} if sets_ else {})}


LEVERS = {
    "1b": (["--strategy", "fsdp", "--fp8", "none", *P1B], 1, [
        {}, _grids(["train.loss=eager"]), _grids(["train.loss=chunked", "train.loss_chunk_tokens=8192"]),
        _grids(["parallel.sdpa_backend=flash"]),
        _grids(["optim.clip_in_step=false"]), _grids(["parallel.fsdp_one_rank=shard"]),
        _grids(["parallel.recompute_param_casts=true"]), _grids(["parallel.activation_memory_budget=0.999"]),
        _grids(["parallel.compile_mode=max-autotune-no-cudagraphs"])]),
    "fsdp2": (["--strategy", "fsdp", "--fp8", "none", *P1B], 2, [
        {}, _grids(["parallel.fsdp_symm_mem=none"]), _grids(["parallel.fsdp_symm_mem=all"]),
        _grids(["parallel.reshard_after_forward=never"]),
        _grids(["parallel.reshard_after_forward=never", "parallel.activation_memory_budget=0.999",
                "parallel.activation_memory_budget_skip_last=10"]),
        _grids(["parallel.reshard_after_forward=never", "parallel.ac_skip_last=12"], ac="pointwise"),
        _grids(["parallel.fsdp_reduce_dtype=bf16"]), _grids(["parallel.fsdp_prefetch=0"])]),
    "8b": (["--strategy", "fsdp", *P8B, *CHUNK_8B], 2, [
        _grids(fp8="none"), _grids(["parallel.ac_skip_last=4"], fp8="none"), _grids(fp8="tensorwise"),
        _grids(["fp8.fsdp_float8_all_gather=false"], fp8="tensorwise"),
        _grids(["fp8.fsdp_float8_all_gather=false", "parallel.ac_skip_last=3"], fp8="tensorwise")]),
}


@dataclass
class Run:
    side: str  # ours | titan | script
    name: str
    gpus: str
    nproc: int
    args: list[str]
    limit: int


@dataclass
class Ctx:
    out: Path
    budget_s: float
    dry_run: bool
    start: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, msg: str) -> None:
        line = f"[tables {time.strftime('%H:%M:%S')}] {msg}"
        with self.lock:
            print(line, flush=True)
            if not self.dry_run:
                with open(self.out / "log.txt", "a") as f:
                    f.write(line + "\n")


def environment() -> dict[str, str]:
    """os.environ with multicast off, unbuffered Python, the repository (and torchao from the
    carried wheels in .whl/, when there) on PYTHONPATH."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **SAFETY_ENV)
    env.setdefault("OMP_NUM_THREADS", "8")
    path = [str(ROOT)]
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    if wheels:
        site = Path("/tmp/tables-site")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)], check=False)
        path.insert(0, str(site))
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def command(run: Run, out: Path) -> tuple[list[str], dict[str, str]]:
    trun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(run.nproc)]
    extra = {"CUDA_VISIBLE_DEVICES": run.gpus}
    if run.side == "titan":
        titan = ROOT / ".titan"
        extra["PYTHONPATH"] = str(titan / "torchtitan-src")
        return [*trun, str(titan / "titan_bench.py"), "--out", str(out / f"titan_{run.name}.json"), *run.args], extra
    if run.side == "script":
        return [sys.executable, *run.args], extra
    if run.side == "run":  # `train run` as a user types it (its log: NAME.log, its run directory: NAME/)
        extra["TORCHINDUCTOR_CACHE_DIR"] = f"/tmp/tables-inductor/{run.name}"
        return [*trun, "-m", "train", "run", "--out", str(out / run.name), *run.args], extra
    # a fresh Inductor cache per launch: cached graphs key on the traced graph, not on the SDPA flags
    extra["TORCHINDUCTOR_CACHE_DIR"] = f"/tmp/tables-inductor/{run.name}"
    return [*trun, "-m", "train", "bench", "step", "--device", "cuda", "--timeout-s", "300", "--out", str(out),
            "--name", run.name, *run.args], extra


def execute(ctx: Ctx, env: dict[str, str], run: Run) -> None:
    cmd, extra = command(run, ctx.out)
    tag = f"{run.side}:{run.name}"
    if ctx.dry_run:
        ctx.note(f"{tag} CUDA_VISIBLE_DEVICES={run.gpus} {' '.join(cmd)}")
        return
    left = ctx.budget_s - (time.monotonic() - ctx.start)
    if left < 30:
        ctx.note(f"{tag} skipped: --budget-s {ctx.budget_s:.0f} spent")
        return
    if run.side == "titan" and not (ROOT / ".titan" / "titan_bench.py").is_file():
        ctx.note(f"{tag} skipped: no .titan/titan_bench.py (carry .titan)")
        return
    full = dict(env, **extra)
    if "PYTHONPATH" in extra:
        full["PYTHONPATH"] = os.pathsep.join([extra["PYTHONPATH"], env["PYTHONPATH"]])
    log = ctx.out / f"{'titan_' if run.side == 'titan' else ''}{run.name}.log"
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, check=False, cwd=ROOT, env=full, stdout=f, stderr=subprocess.STDOUT,
                                timeout=min(run.limit, left)).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    ctx.note(f"{tag} {'done' if rc == 0 else f'failed ({rc}); see {log.name}'}")


def lanes(ctx: Ctx, env: dict[str, str], *lane_runs: list[Run]) -> None:
    """Each lane's runs one after another; the lanes at the same time (on their own GPUs)."""
    threads = [threading.Thread(target=lambda rs=rs: [execute(ctx, env, r) for r in rs]) for rs in lane_runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def plan_vs_titan(a: argparse.Namespace) -> list[list[list[Run]]]:
    one = ["--strategy", "fsdp", *P1B, *ONE_GPU]
    c8 = ["--strategy", "fsdp", *P8B, *CHUNK_8B]
    return [
        [[Run("titan", "1b_bf16", "0", 1, [*P1B, "--fp8", "none"], 150),
          Run("titan", "1b_fp8", "0", 1, [*P1B, "--fp8", "tensorwise"], 150)],
         [Run("ours", "1b_bf16", "1", 1, [*one, "--fp8", "none"], 120),
          Run("ours", "1b_fp8", "1", 1, [*one, "--fp8", "tensorwise"], 120)]],
        [[Run("titan", "1b_fsdp2", "0,1", 2, [*P1B, "--fp8", "none"], 100),
          Run("ours", "1b_fsdp2", "0,1", 2, ["--strategy", "fsdp", "--fp8", "none", *P1B, *FSDP2_1B], 100),
          Run("titan", "8b_bf16", "0,1", 2, [*P8B, "--fp8", "none"], 120),
          Run("ours", "8b_bf16", "0,1", 2, [*c8, "--fp8", "none", *sets(f"parallel.ac_skip_last={a.skip_bf16}")], 110),
          Run("titan", "8b_fp8", "0,1", 2, [*P8B, "--fp8", "tensorwise"], 110),
          Run("ours", "8b_fp8", "0,1", 2, [*c8, "--fp8", "tensorwise", *sets(
              f"parallel.ac_skip_last={a.skip_fp8}", "fp8.fsdp_float8_all_gather=false")], 110)]],
    ]


def planned_ac(presets: list[str], counts: list[int]) -> dict[tuple[str, int], str]:
    """(preset, GPUs) -> the AC torchtitan runs: the preset's, or "none" where the automatic plan
    leaves every block out of AC on this machine's cards (``train doctor``'s plan, one process)."""
    probe = ("import json, sys, torch\n"
             "from train.doctor.memreport import plan_section\n"
             "from train.models.presets import MODEL_PRESETS\n"
             "total = torch.cuda.mem_get_info(0)[1]; cap = torch.cuda.get_device_capability(0)\n"
             "out = {}\n"
             "for arg in sys.argv[1:]:\n"
             "    preset, n, batch, seq = arg.split(':')\n"
             "    v = plan_section(preset, int(seq), int(batch), int(n), total, cap, torch.__version__)['values']\n"
             "    out[arg] = v.get('parallel.ac_skip_last', -1) >= MODEL_PRESETS[preset].n_layers\n"
             "print(json.dumps(out))\n")
    keys = {(p, n): f"{p}:{n}:{PRESET_SHAPE[p][0]}:{PRESET_SHAPE[p][1]}" for p in presets for n in counts}
    res = subprocess.run([sys.executable, "-c", probe, *keys.values()], check=False, cwd=ROOT, env=environment(),
                         capture_output=True, text=True)
    none = json.loads(res.stdout) if res.returncode == 0 else {}
    if res.returncode != 0:
        print(f"[tables] plan probe failed; torchtitan runs the presets' AC: {res.stderr[-300:]}", flush=True)
    return {pn: ("none" if none.get(key) else PRESET_SHAPE[pn[0]][2]) for pn, key in keys.items()}


def visible_gpus() -> int:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([d for d in env.split(",") if d.strip()])
    try:
        res = subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True, text=True)
    except OSError:  # no NVIDIA driver here (a --dry-run on a laptop)
        return 0
    return sum(1 for line in res.stdout.splitlines() if line.startswith("GPU")) if res.returncode == 0 else 0


def plan_defaults(a: argparse.Namespace) -> list[list[list[Run]]]:
    """One step per (GPU count, point): where twice the GPUs are visible, lanes of N GPUs run
    torchtitan and ours at the same time and then swapped; otherwise torchtitan, then ours."""
    points = a.points.split(",")
    counts = [int(n) for n in a.gpus.split(",")]
    visible = a.visible if a.visible is not None else visible_gpus()
    acs = (planned_ac(sorted({DEFAULT_POINTS[p][0] for p in points}), counts) if not a.dry_run
           else {(DEFAULT_POINTS[p][0], n): PRESET_SHAPE[DEFAULT_POINTS[p][0]][2] for p in points for n in counts})
    steps_out = []
    for n in counts:
        pairs = max(1, min(visible // n, 4)) if visible >= 2 * n else 1
        for point in points:
            preset, fp8, steps, warmup = DEFAULT_POINTS[point]
            batch, seq, _ = PRESET_SHAPE[preset]
            limit = (170 if preset == "8b" else 130) + 10 * n

            def titan(gpus: str, tag: str) -> Run:
                return Run("titan", f"{point}_g{n}{tag}", gpus, n, [
                    "--preset", preset, "--batch", batch, "--seq", seq, "--compile", "on", "--ac", acs[(preset, n)],
                    "--fp8", fp8, "--steps", str(steps), "--warmup", str(warmup)], limit)

            def ours(gpus: str, tag: str) -> Run:
                fp8_set = sets("fp8.backend=torchao") if fp8 != "none" else []
                return Run("run", f"run_{point}_g{n}{tag}", gpus, n, [
                    "--config", preset, "--steps", str(steps + warmup), *RUN_SETS, *fp8_set], limit)

            if pairs == 1:
                gpus = ",".join(map(str, range(n)))
                steps_out.append([[titan(gpus, ""), ours(gpus, "")]])
                continue
            lanes_ = []
            for i in range(pairs):
                gpus = ",".join(map(str, range(i * n, (i + 1) * n)))
                first, second = (titan, ours) if i % 2 == 0 else (ours, titan)
                lanes_.append([first(gpus, f"_l{i}"), second(gpus, f"_l{i}")])
            steps_out.append(lanes_)
    return steps_out


def plan_mesh(a: argparse.Namespace) -> list[list[list[Run]]]:
    """8b meshes over N GPUs, one ``train bench step --plan`` (the points one after another)."""
    n = int(a.gpus.split(",")[0])
    common = {"preset": "8b", "compile": "on", "ac": "full", "seq": 2048, "steps": 100, "warmup": 0,
              "data": "embedded", "set": ["optim.warmup_steps=10", "train.log_every=10"]}
    grids = [dict(common, strategy="fsdp,hsdp", batch=4), dict(common, strategy="fsdp_tp", batch=8)]
    plan = a.table_dir / f"mesh_8b_g{n}.yaml"
    if not a.dry_run:  # JSON is YAML: one flow mapping per grid
        plan.write_text("".join(f"- {json.dumps(g)}\n" for g in grids))
    gpus = ",".join(map(str, range(n)))
    return [[[Run("ours", f"mesh_8b_g{n}", gpus, n, ["--plan", str(plan)], 540)]],
            [[Run("script", f"doctor_8b_g{n}", gpus, 1, ["-m", "train", "doctor", "--preset", "8b", "--gpus", str(n),
                                                         "--json"], 90)]]]


def _plan_lines(log: Path) -> list[str]:
    """The automatic plan's start-up lines in a run's log (the text after ``plan: ``)."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [ln.split("plan: ", 1)[1] for ln in text.splitlines() if "plan: " in ln]


def render_mesh(dirs: list[Path]) -> str:
    lines = ["| mesh | GPUs | batch/rank | tok/s/GPU | MFU | peak GiB | first loss | final loss | final vs first row |",
             "|---|---|---|---|---|---|---|---|---|"]
    recs = []
    for d in dirs:
        for p in sorted(d.glob("mesh_*.json")):
            rows = json.loads(p.read_text())["rows"]
            base = next((r for r in rows if r.get("status") == "ok"), None)
            for r in rows:
                if r.get("status") != "ok" or base is None:
                    lines.append(f"| {r.get('mesh') or r.get('strategy')} | {r.get('gpus')} | {r.get('batch')} | "
                                 f"{r.get('status')} | | | | | |")
                    continue
                mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
                peak = f"{r['peak_mem_gib']:.2f}" if r.get("peak_mem_gib") is not None else "-"
                lines.append(f"| {r.get('mesh') or r.get('strategy')} | {r.get('gpus')} | {r.get('batch')} | "
                             f"{r['tokens_per_s_per_gpu']:,.0f} | {mfu} | {peak} | {r['first_loss']:.4f} | "
                             f"{r['final_loss']:.4f} | {100 * (r['final_loss'] / base['final_loss'] - 1):+.2f}% |")
        for p in sorted(d.glob("mesh_*.log")):
            recs += [f"- plan: {line}" for line in _plan_lines(p)]
        for p in sorted(d.glob("doctor_*.log")):
            try:
                text = p.read_text()
                rec = json.loads(text[text.index("{"):])["memory"]["recommendation"]
                recs.append(f"- `train doctor` ({p.stem}) recommends {rec.get('label')}, batch {rec.get('batch_per_gpu')} "
                            f"per GPU: {rec.get('reason')}")
            except (ValueError, KeyError) as exc:
                recs.append(f"- `train doctor` ({p.stem}): unreadable ({exc})")
    return "\n".join(lines + ([""] + recs if recs else [])) + "\n"


def plan_fp8(a: argparse.Namespace) -> list[list[list[Run]]]:
    loss = Run("ours", f"fp8loss_seed{a.seed}", "0,1", 2, [
        "--strategy", "fsdp", "--fp8", "none,tensorwise", "--preset", "8b", "--batch", "4", "--seq", "2048",
        "--compile", "on", "--ac", "full", "--steps", "195", "--warmup", "5", "--data", "embedded",
        *sets(f"train.seed={a.seed}")], 480)
    floor = Run("script", "fp8_floor", "0", 1, [str(ROOT / "scripts/gpu/fp8_floor.py"), "--preset", "8b",
                                                "--tokens", "8192", "--recompute", "32"], 90)
    return [[[loss]], [[floor]]]


def plan_levers(a: argparse.Namespace) -> list[list[list[Run]]]:
    base, nproc, grids = LEVERS[a.point]
    plan = a.table_dir / f"levers_{a.point}.yaml"
    if not a.dry_run:  # JSON is YAML: one flow mapping per grid
        plan.write_text("".join(f"- {json.dumps(g)}\n" for g in grids))
    gpus = "0" if nproc == 1 else "0,1"
    return [[[Run("ours", f"levers_{a.point}", gpus, nproc, [*base, "--plan", str(plan)], 560)]]]


def fp8_floor_after_loss(ctx: Ctx, runs: list[list[list[Run]]]) -> None:
    """The bound uses the bf16 step just measured (the loss run's first row)."""
    for step in runs:
        for lane in step:
            for r in lane:
                if r.name == "fp8_floor":
                    bf16 = _bf16_step_ms(ctx.out)
                    r.args += [*(["--bf16-step-ms", f"{bf16:.1f}"] if bf16 else []), "--out",
                               str(ctx.out / "fp8_floor.json")]


def _bf16_step_ms(d: Path) -> float | None:
    for p in sorted(d.glob("fp8loss*.json")):
        for row in json.loads(p.read_text()).get("rows", []):
            if row.get("fp8") == "none" and row.get("status") == "ok":
                return float(row["step_ms"])
    return None


def meta(env: dict[str, str]) -> dict:
    probe = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'gpus': torch.cuda.device_count(), "
             "'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))")
    info = subprocess.run([sys.executable, "-c", probe], check=False, env=env, capture_output=True, text=True)
    git = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=ROOT, capture_output=True, text=True)
    out = json.loads(info.stdout) if info.returncode == 0 else {"torch": None, "error": info.stderr[-300:]}
    out.update(commit=git.stdout.strip() or "unknown", date=time.strftime("%Y-%m-%d"), argv=sys.argv[1:])
    return out


def measure(a: argparse.Namespace) -> int:
    if not a.dry_run:
        a.table_dir.mkdir(parents=True, exist_ok=True)
    env = environment() if not a.dry_run else dict(os.environ)  # a dry run installs nothing
    if a.table in SHELL_TABLES:
        script = ROOT / "scripts" / "gpu" / SHELL_TABLES[a.table]
        if a.dry_run:
            print(f"OUT={a.out} bash {script.relative_to(ROOT)}")
            return 0
        (a.table_dir / "meta.json").write_text(json.dumps(meta(env), indent=1) + "\n")
        return subprocess.run(["bash", str(script)], check=False, cwd=ROOT, env=dict(env, OUT=str(a.out))).returncode
    ctx = Ctx(a.table_dir, a.budget_s, a.dry_run)
    if not a.dry_run:
        (a.table_dir / "meta.json").write_text(json.dumps(meta(env), indent=1) + "\n")
    steps = {"vs-titan": plan_vs_titan, "defaults": plan_defaults, "mesh": plan_mesh, "fp8": plan_fp8,
             "levers": plan_levers}[a.table](a)
    for step in steps:
        if a.table == "fp8":
            fp8_floor_after_loss(ctx, [step])
        lanes(ctx, env, *step)
    if not a.dry_run:
        table = render(a.table, [a.table_dir])
        (a.table_dir / "table.md").write_text(table)
        print(table)
    return 0


# ---------------------------------------------------------------------------------- tables


def _ours(d: Path, name: str) -> dict | None:
    p = d / f"{name}.json"
    rows = json.loads(p.read_text())["rows"] if p.is_file() else []
    return rows[0] if rows and rows[0].get("status") == "ok" else None


def _titan(d: Path, name: str) -> dict | None:
    p = d / f"titan_{name}.json"
    return json.loads(p.read_text()) if p.is_file() else None


def _join(values: list[str]) -> str:
    return "; ".join(values) if values else "-"


def _mem(titan: float, ours: float) -> str:
    """Two decimals, or six where two would show equal numbers (8b: both at the same peak)."""
    digits = 2 if f"{titan:.2f}" != f"{ours:.2f}" else 6
    return f"{titan:.{digits}f} / {ours:.{digits}f}"


def render_vs_titan(dirs: list[Path]) -> str:
    lines = ["| point | torchtitan tok/s/GPU | ours | ratio | peak GiB torchtitan / ours |", "|---|---|---|---|---|"]
    for name, label in POINTS.items():
        titan, ours, ratio, mem = [], [], [], []
        for d in dirs:
            t, o = _titan(d, name), _ours(d, name)
            titan += [f"{t['tokens_per_s_per_gpu']:,.0f}"] if t else []
            ours += [f"{o['tokens_per_s_per_gpu']:,.0f}"] if o else []
            if t and o:
                ratio.append(f"{o['tokens_per_s_per_gpu'] / t['tokens_per_s_per_gpu']:.3f}")
                mem.append(_mem(t["peak_mem_gib"], o["peak_mem_gib"]))
        mem = sorted(set(mem))
        lines.append(f"| {label} | {_join(titan)} | {_join(ours)} | {_join(ratio)} | {_join(mem)} |")
    return "\n".join(lines) + "\n"


def _run(d: Path, name: str) -> dict | None:
    """``train run``'s rows of one run (``run_NAME``): the median tokens/s/GPU of the steps after the
    warm-up (as torchtitan's median step), the peaks, the cudaMalloc retries (rank 0) and the plan's line."""
    import statistics

    p = d / f"run_{name}" / "metrics.jsonl"
    rows = [json.loads(line) for line in (p.read_text().splitlines() if p.is_file() else []) if line.strip()]
    timed = [r for r in rows if r.get("step", 0) > DEFAULT_POINTS[name.split("_g")[0]][3]]
    if not timed:
        return None
    plan = _plan_lines(d / f"run_{name}.log")
    return {"tokens_per_s_per_gpu": statistics.median(r["tokens_per_s_per_gpu"] for r in timed),
            "peak_mem_gib": max(r["peak_mem_gib"] for r in rows),
            "reserved_gib": max(r.get("reserved_gib", 0.0) for r in rows),
            "alloc_retries": max(r.get("alloc_retries", 0) for r in rows), "plan": plan[0] if plan else "-"}


_RUN_NAME = re.compile(r"^(?P<point>[0-9a-z]+(?:_fp8)?)(?:_g(?P<gpus>\d+))?(?:_l\d+)?$")


def _defaults_names(d: Path) -> list[str]:
    """The runs of the defaults table in DIR, as POINT_gN (older files: POINT, on 2 GPUs); a run
    of another name (a lever tried beside the table) is not a row."""
    names = set()
    for p in list(d.glob("titan_*.json")) + [q.parent for q in d.glob("run_*/metrics.jsonl")]:
        stem = p.stem.removeprefix("titan_") if p.suffix == ".json" else p.name.removeprefix("run_")
        m = _RUN_NAME.match(stem)
        if m and m["point"] in DEFAULT_POINTS:
            names.add(f"{m['point']}_g{m['gpus'] or 2}")
    order = {p: i for i, p in enumerate(DEFAULT_POINTS)}
    return sorted(names, key=lambda n: (int(n.split("_g")[1]), order[n.split("_g")[0]]))


def _samples(d: Path, base: str) -> tuple[list[dict], list[dict]]:
    """torchtitan's and ours' results of POINT_gN in DIR: every lane's (older files: no _gN)."""
    old = base.removesuffix("_g2") if base.endswith("_g2") else None
    titan_names = [n for n in (p.stem.removeprefix("titan_") for p in d.glob(f"titan_{base}*.json"))
                   if _RUN_NAME.match(n)]
    ours_names = [n for n in (p.name.removeprefix("run_") for p in d.glob(f"run_{base}*") if p.is_dir())
                  if _RUN_NAME.match(n)]
    if old and not titan_names and not ours_names:
        titan_names, ours_names = [old], [old]
    t = [x for x in (_titan(d, n) for n in sorted(titan_names)) if x]
    o = [x for x in (_run(d, n) for n in sorted(ours_names)) if x]
    return t, o


def render_defaults(dirs: list[Path]) -> str:
    import statistics

    lines = ["| point | GPUs | torchtitan tok/s/GPU (AC) | ours | ratio | peak GiB torchtitan / ours "
             "| reserved GiB torchtitan / ours | cudaMalloc retries (ours) |", "|---|---|---|---|---|---|---|---|"]
    plans = []
    for d in dirs:
        for base in _defaults_names(d):
            t, o = _samples(d, base)
            if not (t or o):
                continue
            point, n = base.split("_g")
            tv = [x["tokens_per_s_per_gpu"] for x in t]
            ov = [x["tokens_per_s_per_gpu"] for x in o]
            ac = sorted({x.get("ac", "?") for x in t})
            tt = (" / ".join(f"{v:,.0f}" for v in tv) + f" ({', '.join(map(str, ac))})") if t else "-"
            ot = " / ".join(f"{v:,.0f}" for v in ov) if o else "-"
            ratio = f"{statistics.median(ov) / statistics.median(tv):.3f}" if t and o else "-"
            tpk = max(x["peak_mem_gib"] for x in t) if t else 0.0
            opk = max(x["peak_mem_gib"] for x in o) if o else 0.0
            peak = _mem(tpk, opk) if t and o else "-"
            tres = max((x.get("peak_reserved_gib") or 0.0) for x in t) if t else 0.0
            reserved = _mem(tres, max(x["reserved_gib"] for x in o)) if t and o else "-"
            retries = max(x["alloc_retries"] for x in o) if o else "-"
            lines.append(f"| {point} | {n} | {tt} | {ot} | {ratio} | {peak} | {reserved} | {retries} |")
            plans += [f"- {point}, {n} GPUs: {o[0]['plan']}"] if o else []
    notes = ["", "Ratio: median of ours over median of torchtitan's (each lane's run listed); peaks: the highest."]
    return "\n".join(lines + notes + [""] + plans) + "\n"


def render_fp8(dirs: list[Path]) -> str:
    lines = ["| 8b FSDP2, 2 GPUs, AC full, 4×2048, 200 steps | bf16 | FP8 tensorwise | FP8 / bf16 |",
             "|---|---|---|---|"]
    bounds = []
    for d in dirs:
        for p in sorted(d.glob("fp8loss*.json")):
            data = json.loads(p.read_text())
            rows = {r["fp8"]: r for r in data["rows"] if r.get("status") == "ok"}
            b, f = rows.get("none"), rows.get("tensorwise")
            if not (b and f):
                continue
            seed = _seed(data)
            lines.append(f"| tok/s/GPU, seed {seed} | {b['tokens_per_s_per_gpu']:,.0f} | "
                         f"{f['tokens_per_s_per_gpu']:,.0f} | {f['tokens_per_s_per_gpu'] / b['tokens_per_s_per_gpu']:.3f}× |")
            lines.append(f"| loss at step 200, seed {seed} | {b['final_loss']:.4f} | {f['final_loss']:.4f} | "
                         f"{100 * (f['final_loss'] / b['final_loss'] - 1):+.2f}% |")
        for p in sorted(d.glob("fp8_floor*.json")):
            bound = json.loads(p.read_text()).get("bound", {}).get("amax_fused")
            if bound:
                bounds.append(f"{bound['fp8_over_bf16_at_most']:.3f}× (bf16 step {bound['bf16_step_ms']:.1f} ms, "
                              f"FP8 step ≥ {bound['fp8_step_ms_at_least']:.1f} ms)")
    if bounds:
        lines.append(f"| bound (`fp8_floor.py`, every amax fused) | | | ≤ {_join(bounds)} |")
    return "\n".join(lines) + "\n"


def _seed(data: dict) -> str:
    argv = data.get("meta", {}).get("command", "")
    for tok in argv.split():
        if tok.startswith("train.seed="):
            return tok.split("=", 1)[1]
    return "1234"  # the config's default train.seed


def render_levers(dirs: list[Path]) -> str:
    lines = ["| run | overrides | tok/s/GPU | vs first row | peak GiB | vs first row |", "|---|---|---|---|---|---|"]
    for d in dirs:
        for p in sorted(d.glob("levers_*.json")):
            rows = json.loads(p.read_text())["rows"]
            base = next((r for r in rows if r.get("status") == "ok"), None)
            for r in rows:
                if r.get("status") != "ok" or base is None:
                    lines.append(f"| {p.stem} | {r.get('overrides') or '(defaults)'} | {r.get('status')} | | | |")
                    continue
                tps, mem = r["tokens_per_s_per_gpu"], r["peak_mem_gib"]
                lines.append(f"| {p.stem} | {r.get('overrides') or '(defaults)'} | {tps:,.0f} | "
                             f"{100 * (tps / base['tokens_per_s_per_gpu'] - 1):+.1f}% | {mem:.2f} | "
                             f"{mem - base['peak_mem_gib']:+.2f} |")
    return "\n".join(lines) + "\n"


def render(table: str, dirs: list[Path]) -> str:
    renderers = {"vs-titan": render_vs_titan, "defaults": render_defaults, "mesh": render_mesh, "fp8": render_fp8,
                 "levers": render_levers}
    return renderers[table](dirs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", choices=TABLES)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/gpu-out")))
    ap.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget of all runs (default 570)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--render", type=Path, nargs="+", metavar="DIR", help="print the table from raw files in DIR")
    ap.add_argument("--skip-bf16", type=int, default=4, help="vs-titan: 8b bf16 parallel.ac_skip_last")
    ap.add_argument("--skip-fp8", type=int, default=3, help="vs-titan: 8b FP8 parallel.ac_skip_last")
    ap.add_argument("--seed", type=int, default=1234, help="fp8: train.seed of the 200-step runs")
    ap.add_argument("--point", choices=sorted(LEVERS), default="1b", help="levers: the point measured")
    ap.add_argument("--points", default="8b,1b", help="defaults: comma list of " + ", ".join(DEFAULT_POINTS))
    ap.add_argument("--gpus", default=None,
                    help="defaults: comma list of GPU counts per point (default 2); mesh: the GPUs (default 4)")
    ap.add_argument("--visible", type=int, default=None, help=argparse.SUPPRESS)  # --dry-run: the machine's GPUs
    a = ap.parse_args(argv)
    a.gpus = a.gpus or ("4" if a.table == "mesh" else "2")
    if not all(g.isdigit() and 0 < int(g) <= 64 for g in a.gpus.split(",")):
        print(f"tables.py: --gpus: {a.gpus!r} is not a comma list of GPU counts (1..64)", file=sys.stderr)
        return 2
    bad = [p for p in a.points.split(",") if p not in DEFAULT_POINTS]
    if bad:
        print(f"tables.py: --points: unknown point {bad[0]!r} (valid: {', '.join(DEFAULT_POINTS)})", file=sys.stderr)
        return 2
    if a.render and a.table in SHELL_TABLES:
        print(f"tables.py: --render: {a.table} writes its own summary.md (scripts/gpu/{SHELL_TABLES[a.table]})",
              file=sys.stderr)
        return 2
    if a.render:
        missing = [str(d) for d in a.render if not d.is_dir()]
        if missing:
            print(f"tables.py: --render: no such directory: {missing[0]}", file=sys.stderr)
            return 2
        print(render(a.table, a.render), end="")
        return 0
    a.table_dir = a.out / a.table
    return measure(a)


if __name__ == "__main__":
    sys.exit(main())
