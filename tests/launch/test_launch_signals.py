"""The rendered `launch torchrun` script stops gracefully: SIGTERM or SIGINT to the script makes
every worker checkpoint and exit 0, torchrun exit 0 (no SignalException traceback) and the script
exit 128+signal (143/130), as documented in docs/fault-tolerance.md. Real torchrun, 2 CPU workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch_testlib import REPO, render


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"])
def test_signal_to_rendered_torchrun_script_checkpoints_and_exits_documented_status(tmp_path, sig, status):
    out = tmp_path / "run"
    script = tmp_path / "train.sh"
    script.write_text(render(["torchrun", "--nproc-per-node", "2", "--env", "OMP_NUM_THREADS=1", "--", "--config",
                              "tiny", "--steps", "2000", "--set", "train.log_every=1", "--set", "train.batch_size=4",
                              "--set", "train.seq_len=32", "--out", str(out)]))
    victim = tmp_path / "victim.txt"  # an inherited LAUNCH_STOP_FILE that is no stop marker is never written
    victim.write_text("precious\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "LAUNCH_STOP_FILE": str(victim)}
    proc = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.3)
        proc.send_signal(sig)  # the script only, as `kill` or a service manager does
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == status, output[-3000:]
    assert "Traceback" not in output and "SignalException" not in output, output[-3000:]
    assert f"launch: stopped by SIG{sig.name[3:]}; the training processes exited cleanly" in output
    assert victim.read_text() == "precious\n"
    step = int(output.split("preempted: checkpoint written at step ")[1].split(";")[0])
    latest = (out / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{step:08d}"
    assert json.loads((out / "checkpoints" / latest / "manifest.json").read_text())["step"] == step
