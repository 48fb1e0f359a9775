"""Launcher environment that needs a real ``train run`` process (the bad-input table's
child never reaches the process group): a MASTER_PORT another process listens on, and
torchrun's variables set but empty."""

from __future__ import annotations

import socket

from testlib import SMALL_RUN, one_error_line, train_cli

SMALL = ["run", "--steps", "2", "--set", "train.device=cpu", "--set", "data.source=synthetic",
         "--set", "metrics.progress=false", *SMALL_RUN]
# torchrun's variables exported but empty: the same as unset
CLEAN = {name: "" for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                               "TORCHELASTIC_RESTART_COUNT")}


def test_master_port_in_use_is_one_line(tmp_path):
    """torch's DistNetworkError (EADDRINUSE) used to end the run with a traceback."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**CLEAN, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        res = train_cli([*SMALL, "--out", str(tmp_path / "run")], env, timeout=240)
    assert res.returncode == 2, res.stderr[-3000:]
    line = one_error_line(res.stderr)
    assert f"MASTER_PORT={port}: already in use" in line, line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_empty_launcher_variables_mean_unset(tmp_path):
    """RANK='' used to crash in int(''), MASTER_ADDR='' in torch's env:// rendezvous."""
    res = train_cli([*SMALL, "--out", str(tmp_path / "run")], CLEAN, timeout=240)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.jsonl").exists()
