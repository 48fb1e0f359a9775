"""train.distributed's teardown: ``shutdown(ok)`` never hangs and ``end_process`` ends a
process that used a process group with the right status, its atexit handlers run.

Two real gloo processes (no torchrun, so each one's exit status is seen). Each does 20
all-reduces of tensors it drops at once (the case that left torch 2.7.1 in
destroy_process_group: a gloo worker freeing such a tensor needs the GIL that the
destructor holds), then tears down the way the test names."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from testlib import ROOT, child_env, free_port

_SCRIPT = textwrap.dedent("""
    import atexit, os, sys, time
    sys.path.insert(0, os.getcwd())
    import torch, torch.distributed as dist
    from train import distributed as tdist

    mode = sys.argv[1]
    info = tdist.init_distributed("cpu", timeout_s=60)
    atexit.register(print, f"atexit ran on rank {info.rank}", flush=True)
    for _ in range(20):
        t = torch.ones(4096)
        dist.all_reduce(t)
        del t
    t0 = time.monotonic()
    if mode == "ok":
        tdist.shutdown()
        assert not dist.is_initialized() and tdist.group_used()
    elif mode == "peer_gone":
        if info.rank == 1:
            os._exit(0)
        tdist.shutdown(barrier_s=10)
        assert dist.is_initialized(), "no destroy after a failed barrier"
    elif mode == "error":
        if info.rank == 1:
            time.sleep(8)  # alive, but never in a barrier
        tdist.shutdown(ok=False)
    print(f"rank {info.rank}: shutdown took {time.monotonic() - t0:.1f}s", flush=True)
    sys.stdout.write("unflushed tail")  # end_process flushes it
    tdist.end_process(3 if mode == "ok" else None)
""")


def _two_ranks(tmp_path, mode: str, timeout: float = 90) -> list[subprocess.CompletedProcess]:
    script = tmp_path / "teardown.py"
    script.write_text(_SCRIPT)
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = child_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
                         "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"})
        procs.append(subprocess.Popen([sys.executable, str(script), mode], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out = []
    for rank, proc in enumerate(procs):
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"{mode}: rank {rank} still running after {timeout} s (a teardown hang)")
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


def _took(result) -> float:
    line = next(ln for ln in result.stdout.splitlines() if "shutdown took" in ln)
    return float(line.rsplit(" ", 1)[1].rstrip("s"))


def test_success_teardown_barrier_destroy_and_exit_status(tmp_path):
    for rank, r in enumerate(_two_ranks(tmp_path, "ok")):
        assert r.returncode == 3, r.stderr[-3000:]
        assert r.stdout.endswith(f"unflushed tailatexit ran on rank {rank}\n"), r.stdout


def test_success_teardown_with_the_peer_gone_is_bounded(tmp_path):
    t0 = time.monotonic()
    r0, r1 = _two_ranks(tmp_path, "peer_gone")
    assert r1.returncode == 0 and r0.returncode == 0, r0.stderr[-3000:]
    assert _took(r0) < 15 and time.monotonic() - t0 < 60
    assert "teardown barrier failed" in r0.stderr and "exiting without waiting for it" in r0.stderr


def test_error_teardown_does_not_wait_for_peers(tmp_path):
    r0, r1 = _two_ranks(tmp_path, "error")
    assert r0.returncode == 0 and r1.returncode == 0, (r0.stderr + r1.stderr)[-3000:]
    assert _took(r0) < 3, r0.stdout  # rank 1 sleeps 8 s outside any barrier
    assert "teardown barrier" not in r0.stderr + r1.stderr
