"""Helpers shared by the cluster tests: render with `launch`, run on nodes, read results."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)


def job_env(**extra: str) -> dict[str, str]:
    """What a user's shell on a node has: the project's venv on PATH and the worktree importable."""
    env = {
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
    }
    env.update(extra)
    return env


def render(sub: str, options: list[str], train: list[str], out: Path) -> Path:
    """`launch SUB OPTIONS -o OUT -- TRAIN`, exactly as a user runs it; returns OUT."""
    cmd = [sys.executable, "-m", "launch", sub, *options, "-o", str(out), "--", *train]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **job_env()}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"{' '.join(cmd)} -> {proc.returncode}: {proc.stderr}"
    return out


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def world_sizes(log: str) -> list[int]:
    return [int(m) for m in re.findall(r"\| (\d+) rank\(s\), backend", log)]


def checkpoints(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    return sorted(int(p.name.split("_")[1]) for p in root.glob("step_*") if (p / "manifest.json").exists()) \
        if root.exists() else []


def wait_for(predicate, timeout: float, what: str, procs=(), interval: float = 0.5):
    """Poll ``predicate`` until truthy; fail early (with the reason) if one of ``procs`` exited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"waiting for {what}: process exited {proc.returncode} first")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def load_checkpoint_check(run_dir: Path, step: int, train_args: list[str] = ()) -> str:
    """The final checkpoint loads: one plain process resumes from it (DCP reshards to world size 1)
    and has nothing left to train. Returns its output."""
    cmd = [sys.executable, "-m", "train", "run", "--config", "tiny", *train_args, "--steps", str(step),
           "--out", str(run_dir), "--resume"]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **job_env(OMP_NUM_THREADS="1")},
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"at step {step}" in proc.stdout and "resumed from" in proc.stdout, proc.stdout[-2000:]
    return proc.stdout
