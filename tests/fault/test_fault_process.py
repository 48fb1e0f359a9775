"""Process-level faults injected for real, on CPU with gloo and 2 processes.

* worker death: an external killer SIGKILLs rank 1 as soon as a checkpoint directory
  appears; ``torchrun --max-restarts 1`` restarts the group, which resumes on its own
  (no ``--resume``) and ends bitwise equal to an uninterrupted run.
* preemption: SIGTERM to torchrun (what Kubernetes/Slurm do), a resume from the
  checkpoint it wrote, and SIGTERM to a single worker of that resumed run.
* hang: rank 1 is frozen with SIGSTOP; rank 0 must end with one line naming the
  collective, its rank and the step within ``train.timeout_s`` plus slack.
* grace: SIGTERM while a peer is frozen; the process must still exit within
  ``train.shutdown_grace_s``.

The killer is external on purpose: the trainer carries no test-only code path, and a
SIGKILL from outside is exactly what the OOM killer or a node failure does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from testlib import ROOT, SMALL_RUN, child_env, free_port, load_dcp, torchrun
from train.checkpoint import verify

SMALL = SMALL_RUN + ["--set", "optim.warmup_steps=2", "--set", "metrics.progress=false"]
SLACK_S = 20  # scheduling slack on a loaded 2-core machine


# ----------------------------------------------------------------------------- helpers


class Proc:
    """A process whose stdout/stderr go to files we can poll (no pipe deadlocks)."""

    def __init__(self, cmd: list[str], log_dir: Path, name: str, env: dict | None = None):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = log_dir / f"{name}.out", log_dir / f"{name}.err"
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")
        self.p = subprocess.Popen(cmd, cwd=ROOT, env=env or child_env(), stdout=self._out, stderr=self._err)
        self.pid = self.p.pid

    def text(self) -> str:
        return self.out_path.read_text() + self.err_path.read_text()

    def stdout(self) -> str:
        return self.out_path.read_text()

    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait(self, timeout: float) -> int:
        try:
            return self.p.wait(timeout)
        finally:
            self._out.close()
            self._err.close()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(30)


def _wait_for(pred, timeout: float, what: str, procs=()) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        for p in procs:
            if p.p.poll() is not None:
                raise AssertionError(f"process exited (rc {p.p.returncode}) before {what}:\n{p.text()[-3000:]}")
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def _worker_pid(torchrun_pid: int, rank: int) -> int:
    for child in _children(torchrun_pid):
        if _rank_of(child) == rank:
            return child
    raise AssertionError(f"no worker with RANK={rank} under torchrun pid {torchrun_pid}")


def _torchrun_cmd(args: list[str], torchrun_args: list[str] = ()) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", *torchrun_args, "-m", "train", *args]


def _two_workers(args: list[str], log_dir: Path) -> list[Proc]:
    """Two ranks started by hand with the variables torchrun would set (no agent in
    between, so each rank's own exit code and timing are visible)."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = child_env() | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                        "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
        procs.append(Proc([sys.executable, "-m", "train", *args], log_dir, f"rank{rank}", env))
    return procs


def _latest(out: Path) -> str:
    return (out / "checkpoints" / "latest").read_text().strip()


def _step_line(step: int) -> str:
    return f"step {step:>6}/"


# ----------------------------------------------------------------------------- worker death


def test_killed_worker_restarts_and_resumes_bitwise(tmp_path, checkpoint_mode):
    common = ["run", "--steps", "24", "--checkpoint-every", "4", *SMALL, "--set", "optim.decay_steps=24",
              *checkpoint_mode]
    ref_out, out = tmp_path / "straight", tmp_path / "killed"
    ref = torchrun([*common, "--out", str(ref_out)])
    assert ref.returncode == 0, ref.stderr[-3000:]

    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: without it the restarted group can read the dead
    # group's keys from torchrun's shared store and fail to connect (pytorch#135712; the
    # trainer warns about it, docs/fault-tolerance.md explains).
    job = Proc(_torchrun_cmd([*common, "--out", str(out)], ["--max-restarts", "1", "--monitor-interval", "0.1"]),
               tmp_path, "killed", env=child_env() | {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    try:
        first = out / "checkpoints" / "step_00000004"
        _wait_for(first.is_dir, 240, "the first checkpoint", [job])
        victim = _worker_pid(job.pid, rank=1)
        os.kill(victim, signal.SIGKILL)
        rc = job.wait(240)
    finally:
        job.kill()
    text = job.text()
    assert rc == 0, text[-4000:]
    assert "resumed from" in text, "the restarted group did not resume:\n" + text[-4000:]
    assert "pytorch#135712" not in text
    resumed_at = int(text.split("resumed from", 1)[1].split("at step", 1)[1].split()[0])
    assert 4 <= resumed_at < 24, text[-3000:]
    assert _latest(out) == "step_00000024"
    a, b = load_dcp(ref_out / "checkpoints" / "step_00000024"), load_dcp(out / "checkpoints" / "step_00000024")
    assert a.keys() == b.keys() and any(k.startswith("model.") for k in a) and any(k.startswith("optim.") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after kill + auto-resume"


# ----------------------------------------------------------------------------- preemption


def test_sigterm_checkpoints_and_resume_continues(tmp_path, checkpoint_mode):
    """SIGTERM to torchrun (what Kubernetes and Slurm send) stops both ranks with a
    checkpoint; the resumed run continues from it, and a SIGTERM that reaches only one
    worker stops both ranks after the same step with everyone exiting 0."""
    out = tmp_path / "run"
    job = Proc(_torchrun_cmd(["run", "--steps", "400", "--out", str(out), *SMALL, *checkpoint_mode]), tmp_path, "term")
    try:
        _wait_for(lambda: _step_line(3) in job.stdout(), 240, "step 3", [job])
        t0 = time.monotonic()
        job.p.send_signal(signal.SIGTERM)
        rc = job.wait(60)
        took = time.monotonic() - t0
    finally:
        job.kill()
    text = job.text()
    # torchrun forwards SIGTERM to the workers, waits for them, then re-raises the signal as
    # SignalException and exits 1 by design; the workers' part is what we check. Now and then
    # torch's launcher then aborts while its interpreter exits (a C++ thread still joinable:
    # "terminate called without an active exception", SIGABRT), after the workers are done.
    aborted_at_exit = rc == -signal.SIGABRT and "terminate called without an active exception" in text
    assert (rc == 1 or aborted_at_exit) and "SignalException" in text, text[-3000:]
    assert text.count("SIGTERM received") == 2, text[-3000:]
    step = int(text.split("preempted: checkpoint written at step", 1)[1].split(";")[0])
    assert 3 <= step < 400 and took < 30 + SLACK_S
    ckpt = out / "checkpoints" / f"step_{step:08d}"
    assert _latest(out) == ckpt.name and verify(ckpt) is None

    again = Proc(_torchrun_cmd(["run", "--steps", "400", "--out", str(out), "--resume", *SMALL, *checkpoint_mode]),
                 tmp_path, "again")
    try:
        _wait_for(lambda: _step_line(step + 3) in again.stdout(), 240, f"step {step + 3}", [again])
        os.kill(_worker_pid(again.pid, rank=1), signal.SIGTERM)
        rc = again.wait(90)
    finally:
        again.kill()
    text = again.text()
    assert f"resumed from {ckpt} at step {step}" in text and _step_line(step + 1) in text, text[-3000:]
    assert rc == 0, text[-3000:]  # both workers exited 0, so torchrun reports success
    assert text.count("SIGTERM received") == 1 and "(preempted)" in text
    stop = int(text.split("preempted: checkpoint written at step", 1)[1].split(";")[0])
    ckpt = out / "checkpoints" / f"step_{stop:08d}"
    assert stop > step + 2 and _latest(out) == ckpt.name and verify(ckpt) is None
    assert {int(torch.load(ckpt / f"extra_rank{r}.pt", weights_only=True)["step"]) for r in range(2)} == {stop}


# ----------------------------------------------------------------------------- hangs


def test_hung_rank_ends_the_job_naming_the_collective(tmp_path):
    timeout_s = 5
    procs = _two_workers(["run", "--steps", "400", "--out", str(tmp_path / "run"), *SMALL,
                          "--set", f"train.timeout_s={timeout_s}"], tmp_path)
    r0, r1 = procs
    try:
        _wait_for(lambda: _step_line(3) in r0.stdout(), 240, "step 3", procs)
        os.kill(r1.pid, signal.SIGSTOP)  # rank 1 stops answering, like a wedged GPU or a stuck reader
        t0 = time.monotonic()
        rc = r0.wait(timeout_s + 60)
        took = time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
    err = r0.stderr()
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert rc == 1, err[-3000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith("[rank 0] error: collective all_reduce")
    assert f"timed out after {timeout_s}s on rank 0 (step " in lines[0]
    assert took < timeout_s + SLACK_S, f"took {took:.1f}s"


def test_sigterm_exits_within_grace_even_when_a_peer_hangs(tmp_path):
    grace_s = 2
    out = tmp_path / "run"
    procs = _two_workers(["run", "--steps", "400", "--out", str(out), *SMALL, "--set", "train.timeout_s=300",
                          "--set", f"train.shutdown_grace_s={grace_s}"], tmp_path)
    r0, r1 = procs
    try:
        _wait_for(lambda: _step_line(3) in r0.stdout(), 240, "step 3", procs)
        os.kill(r1.pid, signal.SIGSTOP)
        time.sleep(0.5)  # rank 0 is now blocked in a collective with its peer frozen
        t0 = time.monotonic()
        os.kill(r0.pid, signal.SIGTERM)
        rc = r0.wait(60)
        took = time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
    err = r0.stderr()
    assert rc == 1, err[-3000:]
    assert f"error: SIGTERM: no checkpoint within train.shutdown_grace_s={grace_s}s (waiting in " in err
    assert "Traceback" not in err
    assert grace_s <= took < grace_s + SLACK_S, f"took {took:.1f}s"
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").glob("step_*"))


@pytest.mark.skipif(sys.platform != "linux", reason="uses /proc to find worker pids")
def test_proc_helpers_find_workers():
    """The helpers above rely on /proc/<pid>/task/*/children: check they see a child."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env=child_env() | {"RANK": "7"})
    try:
        _wait_for(lambda: _rank_of(child.pid) == 7, 10, "the child")
        assert child.pid in _children(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_sigterm_stops_bench_step_and_keeps_the_finished_points(tmp_path):
    """SIGTERM ends ``train bench step`` at the next step (it ran on for the whole grace period,
    then blamed a missing checkpoint; a one-point grid ignored it): one line naming the signal,
    exit 128 + 15, and the report of the points already done is kept."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("- {steps: 1, warmup: 0}\n- {steps: 1000000, warmup: 0}\n")
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "train", "bench", "step", "--device", "cpu", "--preset", "tiny", "--batch", "2",
           "--seq", "32", "--plan", str(plan), "--out", str(out)]
    job = Proc(cmd, tmp_path / "logs", "bench")
    try:
        _wait_for(lambda: (out / "step.json").is_file(), 120 + SLACK_S, "the first point's report", [job])
        time.sleep(1)  # into the second point's steps
        job.p.send_signal(signal.SIGTERM)
        code = job.wait(SLACK_S)
    finally:
        job.kill()
    assert code == 128 + signal.SIGTERM, job.text()[-3000:]
    errors = [ln for ln in job.stderr().splitlines() if ln.startswith("error: ")]
    assert errors == [f"error: stopped by SIGTERM after 1 of 2 points; {out / 'step.json'} keeps them"], job.stderr()
    assert len(json.loads((out / "step.json").read_text())["rows"]) == 1


def test_sigterm_stops_bench_compression_and_keeps_the_report(tmp_path):
    """SIGTERM to both ranks of ``train bench compression`` (what Slurm and Kubernetes do): the
    variant running is cut short and marked so in the report (it was reported as a complete
    measurement, and the benchmark went on with the next variant); each rank exits 128 + 15
    with one line."""
    out = tmp_path / "bench"
    args = ["bench", "compression", "--preset", "tiny", "--batch", "2", "--seq", "32", "--steps", "1000000",
            "--variants", "none,fp16", "--out", str(out), "--set", "train.device=cpu"]
    ranks = _two_workers(args, tmp_path / "logs")
    metrics = out / "compression_runs" / "none" / "metrics.jsonl"
    try:
        _wait_for(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 3, 120 + SLACK_S,
                  "three steps of the first variant", ranks)
        for r in ranks:
            r.p.send_signal(signal.SIGTERM)
        codes = [r.wait(SLACK_S + 30) for r in ranks]
    finally:
        for r in ranks:
            r.kill()
    assert codes == [128 + signal.SIGTERM] * 2, ranks[0].text()[-3000:]
    for rank, r in enumerate(ranks):
        errors = [ln for ln in r.stderr().splitlines() if "error: " in ln]
        assert errors == [f"[rank {rank}] error: stopped by SIGTERM after 0 of 2 variants; "
                          f"{out / 'compression.json'} keeps what was measured"], r.stderr()
    report = json.loads((out / "compression.json").read_text())
    assert report["meta"]["partial"] == "0 of 2 variants; stopped by SIGTERM"
    [row] = report["rows"]
    assert row["variant"] == "none" and row["error"].startswith("stopped by SIGTERM at step ")
    assert not (out / "compression_runs" / "fp16").exists()
