"""``train run --nproc-per-node``: the documented multi-process path (2 CPU processes, gloo).
A bad config is one line before any worker starts; a failed worker is one line naming its rank;
a good run trains. Plain torchrun prints a config error once per node. A closed stdout is quiet."""

from __future__ import annotations

import subprocess
import sys

from testlib import ROOT, child_env, one_error_line, sets, torchrun, train_cli
from train.metrics import read_metrics


def test_bad_config_is_one_line_before_any_worker(tmp_path):
    """The README's FSDP example with a key that cannot work: one line naming it, exit 2, no
    torchrun output (no worker was started), nothing written."""
    out = tmp_path / "run"
    res = train_cli(["run", "--nproc-per-node", "2", "--config", "1b", "--out", str(out),
                     *sets("parallel.strategy=fsdp", "parallel.dp_shard=-1", "parallel.dp_shards=2")])
    assert res.returncode == 2, res.stderr[-3000:]
    assert "parallel.dp_shards: unknown key" in one_error_line(res.stderr)
    assert len(res.stderr.strip().splitlines()) == 1 and "ChildFailedError" not in res.stderr
    assert not out.exists()


def test_two_processes_train_then_a_failed_worker_is_one_line(tmp_path):
    out = tmp_path / "run"
    args = ["run", "--nproc-per-node", "2", "--config", "tiny", "--steps", "2", "--out", str(out)]
    res = train_cli(args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "2 rank(s)" in res.stdout + res.stderr and res.stdout.count("=== summary ===") == 1
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")][-1] == 2
    # the same --out again: rank 0 refuses the earlier run's directory (a worker's error)
    again = train_cli(args)
    assert again.returncode == 2, again.stderr[-3000:]
    lines = [ln for ln in again.stderr.splitlines() if "error:" in ln]
    assert lines == [lines[0]] and lines[0].startswith("[rank 0] error: --out") and "holds an earlier run" in lines[0]
    assert "Traceback" not in again.stderr and "ChildFailedError" not in again.stderr


def test_plain_torchrun_prints_a_config_error_once(tmp_path):
    """Under torchrun every rank meets the same config error: the node's first worker prints it,
    and it is each worker's error record (torchrun's summary shows the line, not a blank)."""
    res = torchrun(["run", "--config", "tiny", "--out", str(tmp_path / "run"), *sets("train.nonsense=1")])
    assert res.returncode != 0
    printed = [ln for ln in res.stderr.splitlines() if ln.startswith("[rank") and "error: train.nonsense" in ln]
    assert len(printed) == 1, res.stderr[-4000:]
    assert "traceback : [rank 0] error: train.nonsense" in res.stderr


def test_closed_stdout_during_a_run_is_quiet(tmp_path):
    """``train run | head -1``: the run goes on to its end with its output dropped, exit 0, and
    nothing about the closed pipe on stderr."""
    script = (f'set -o pipefail; "{sys.executable}" -m train run --config tiny --steps 3 --out "{tmp_path / "run"}" '
              '--set train.log_every=1 | head -1; echo "status ${PIPESTATUS[0]}" >&2')
    res = subprocess.run(["bash", "-c", script], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                         timeout=600)
    assert len(res.stdout.splitlines()) == 1
    assert "status 0" in res.stderr, res.stderr[-3000:]
    assert "BrokenPipe" not in res.stderr and "Traceback" not in res.stderr and "Logging error" not in res.stderr
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")][-1] == 3
