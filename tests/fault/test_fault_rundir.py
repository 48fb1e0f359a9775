"""The run directory with real ``train run`` processes: two concurrent runs into one
``--out`` (the second is refused naming the first), Ctrl-C (SIGINT) handled like SIGTERM
(step, checkpoint, exit 0, no traceback), a partial metrics line repaired on resume,
provenance (config changes refused unless allowed, history in config.yaml, --overwrite
moves the earlier run aside)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--set", "model.dim=64", "--set", "model.n_layers=2", "--set", "train.seq_len=32",
        "--set", "train.batch_size=4", "--set", "metrics.progress=false", "--set", "data.source=synthetic",
        "--set", "train.log_every=1"]

pytestmark = pytest.mark.timeout(300)


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                 "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    return env


def _train(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "train", "run", *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_concurrent_runs_sigint_and_resume(tmp_path):
    out = tmp_path / "run"
    first = _train("--out", str(out), "--steps", "100000", "--checkpoint-every", "1000", *TINY)
    try:
        _wait_for(lambda: len(_rows(out)) >= 2 or first.poll() is not None, 240, "the first run's steps")
        assert first.poll() is None, first.communicate()
        holder = json.loads((out / ".train.lock").read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()

        # a second run into the same directory, while the first trains: refused, names the holder
        second = _train("--out", str(out), "--steps", "5", *TINY)
        _, err = second.communicate(timeout=240)
        assert second.returncode == 2, err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and "in use by another run" in lines[0] and f"pid {first.pid} on " in lines[0], err
        assert first.poll() is None, "the first run must go on"

        # Ctrl-C: finish the step, checkpoint, exit 0, no traceback
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-3000:]
    assert "SIGINT received" in err and "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert not (out / ".train.lock").exists(), "the lock is released at the end of the run"
    latest = (out / "checkpoints" / "latest").read_text().strip()
    stopped = int(latest.split("_")[1])
    assert stopped == _rows(out)[-1]["step"]

    # a partial last line (a kill or a full disk mid-write) and a changed learning rate
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 99999, "loss": 1.2')
    refused = _train("--out", str(out), "--resume", "--steps", str(stopped + 2), *TINY, "--set", "optim.lr=1e-3")
    _, err = refused.communicate(timeout=240)
    assert refused.returncode == 2 and "optim.lr" in err and "--allow-config-change" in err, err
    resumed = _train("--out", str(out), "--resume", "--allow-config-change", "--steps", str(stopped + 2), *TINY,
                     "--set", "optim.lr=1e-3")
    _, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err[-3000:]
    steps = [row["step"] for row in _rows(out)]  # every line parses again
    assert steps == list(range(1, stopped + 3)), steps
    history = [ln for ln in (out / "config.yaml").read_text().splitlines() if ln.startswith("# - ")]
    assert "fresh start" in history[0] and "resume with changes: optim.lr" in history[-1], history

    # a fresh run over it: refused, then --overwrite moves the earlier run aside (never deletes)
    fresh = _train("--out", str(out), "--steps", "2", *TINY)
    _, err = fresh.communicate(timeout=240)
    assert fresh.returncode == 2 and "holds an earlier run" in err, err
    fresh = _train("--out", str(out), "--steps", "2", "--overwrite", *TINY)
    _, err = fresh.communicate(timeout=240)
    assert fresh.returncode == 0, err[-3000:]
    aside = [p for p in out.iterdir() if p.name.startswith("replaced-")]
    assert len(aside) == 1 and (aside[0] / "checkpoints" / "latest").read_text().strip() == f"step_{stopped + 2:08d}"
    assert [row["step"] for row in _rows(out)] == [1, 2]


def test_stale_lock_rules(tmp_path, request):
    """Stale only when provably dead: same host and the pid gone (or reused), or a restart
    of the same torchrun job; a live pid or another host is honoured."""
    from train.errors import ConfigError
    from train.rundir import LOCK_NAME, RunLock

    host = socket.gethostname()
    dead = subprocess.Popen(["true"])
    dead.wait()
    # a process of ours that lives through the test (pytest's parent is pid 0 when pytest is a container's pid 1)
    live = subprocess.Popen(["sleep", "300"])
    request.addfinalizer(lambda: (live.kill(), live.wait()))
    cases = [
        ({"host": host, "pid": dead.pid}, True),
        ({"host": host, "pid": live.pid}, False),  # alive
        ({"host": "node-elsewhere", "pid": dead.pid}, False),
        ({"host": "node-elsewhere", "pid": 1, "run_id": "job-7"}, True),  # TORCHELASTIC_RUN_ID=job-7 below
        ({"host": host, "pid": live.pid, "start": "0"}, True),  # same pid, another process start: reused
    ]
    os.environ["TORCHELASTIC_RUN_ID"] = "job-7"
    try:
        os.environ["TORCHELASTIC_RUN_ID"] = "none"  # torchrun's default --rdzv-id: not an identity
        (tmp_path / LOCK_NAME).write_text(json.dumps({"host": "node-elsewhere", "pid": 1, "run_id": "none"}))
        with pytest.raises(ConfigError, match="in use by another run"):
            RunLock(tmp_path).acquire()
        os.environ["TORCHELASTIC_RUN_ID"] = "job-7"
        for holder, free in cases:
            (tmp_path / LOCK_NAME).write_text(json.dumps(holder))
            lock = RunLock(tmp_path)
            if free:
                lock.acquire()
                assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
                lock.release()
                assert not (tmp_path / LOCK_NAME).exists()
            else:
                with pytest.raises(ConfigError, match="in use by another run"):
                    lock.acquire()
    finally:
        os.environ.pop("TORCHELASTIC_RUN_ID", None)


def test_move_aside_never_reuses_a_directory(tmp_path):
    """Two --overwrite in one second (or a replaced-<time>/ made by hand) each get their own
    directory: the first raised FileExistsError (exit 1) before; nothing is ever merged."""
    from train.rundir import move_aside

    moved = []
    for i in range(3):
        (tmp_path / "metrics.jsonl").write_text(f"run {i}\n")
        (tmp_path / "traces").mkdir()
        (tmp_path / "traces" / "rank0.json").write_text(f"trace {i}\n")
        moved.append(move_aside(tmp_path, ["metrics.jsonl", "traces", "absent"], "--out x"))
    assert len(set(moved)) == 3 and all(p.name.startswith("replaced-") for p in moved)
    assert [(p / "metrics.jsonl").read_text() for p in moved] == ["run 0\n", "run 1\n", "run 2\n"]
    assert [(p / "traces" / "rank0.json").read_text() for p in moved] == ["trace 0\n", "trace 1\n", "trace 2\n"]


def test_overwrite_moves_every_run_entry_and_refuses_a_live_nested_run(tmp_path):
    """--overwrite moves traces/ too (a new trace replaced the earlier rank0.json), and never
    moves a directory a live run writes in (it would pull it from under that run)."""
    import fcntl

    from train.config import load_config
    from train.errors import RunDirBusy
    from train.rundir import LOCK_NAME, RUN_FILES, prepare

    assert "traces" in RUN_FILES
    job = load_config("tiny", [])
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank0.json").write_text("earlier trace\n")
    event = prepare(tmp_path, job, resuming=False, overwrite=True, allow_config_change=False, log=lambda m: None)
    aside = next(p for p in tmp_path.iterdir() if p.name.startswith("replaced-"))
    assert (aside / "traces" / "rank0.json").read_text() == "earlier trace\n" and aside.name in event

    nested = tmp_path / "checkpoints" / "other"
    nested.mkdir(parents=True)
    fd = os.open(nested / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(RunDirBusy, match="holds a live run"):
            prepare(tmp_path, job, resuming=False, overwrite=True, allow_config_change=False, log=lambda m: None)
        assert (nested / LOCK_NAME).exists()
    finally:
        os.close(fd)


def test_out_inside_another_runs_entries_is_refused(tmp_path):
    """--out (any spelling, through links) inside another run's checkpoints/, traces/ or
    replaced-*/ is refused; a sibling directory below the run is fine."""
    from train.config import load_config
    from train.errors import ConfigError
    from train.preflight import check_out_dir
    from train.rundir import write_config

    run = tmp_path / "run"
    run.mkdir()
    write_config(run, load_config("tiny", []), "fresh start")
    (tmp_path / "link").symlink_to(run / "checkpoints", target_is_directory=True)
    for out in (run / "checkpoints" / "x", f"{run}//traces/", tmp_path / "link" / "y", run / "replaced-1" / "z"):
        with pytest.raises(ConfigError, match="inside another run's"):
            check_out_dir(str(out))
    assert check_out_dir(str(run / "sub")) == run / "sub"
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "config.yaml").write_text("lr: 1\n")  # not a run's config.yaml
    assert check_out_dir(str(tmp_path / "proj" / "checkpoints")) == tmp_path / "proj" / "checkpoints"
