"""``python -m train ARGS`` (or ``python -m torch.distributed.run ARGS``, torchrun's launcher) as a
real child process, minus the interpreter start.

Most CPU tests of ``train`` start it as a process (its exit status, its stderr line, the files
it leaves), and each start spends about 4 s of a 2-core machine importing torch and the
trainer. A zygote is one interpreter per test process that has imported them once and then
forks a child per call: the child sets the call's working directory, environment and standard
streams, runs ``train``'s ``__main__`` exactly as ``python -m train`` does, and ends as a normal exit
would (``train.distributed.end_process``: the status Python would give, the exit handlers). It is a separate process with its own
memory, so the code under test runs as it does for a user; what it shares with the zygote is
only the state that importing the modules creates.

Used by ``testlib.train_cli`` and ``testlib.torchrun`` (the launcher only: torchrun starts
each worker as a new interpreter, as always) where the call allows it (see ``usable``): not for an
environment that changes what happens at import time (``fresh_env_keys``), and never from two
threads at once (the second caller starts a plain process instead).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Variables read while the preloaded modules import (torch's start-up, the allocator, logging):
# a call that sets or changes one of them gets a fresh interpreter.
FRESH_PREFIXES = ("PYTHON", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "CUDA_", "LD_", "OMP_", "MKL_",
                  "KMP_", "GOMP_", "OPENBLAS_", "NCCL_", "GLOO_", "PYTORCH_", "TRAIN_DEBUG", "HF_", "LANG",
                  "LC_", "TMPDIR", "HOME")

_CHILD = r"""
import json, os, runpy, signal, sys, traceback
proto_in = os.fdopen(os.dup(0), "r")
proto_out = os.fdopen(os.dup(1), "w")
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
import torch  # noqa: F401  (the point: imported once, before any fork)
import torch._dynamo  # noqa: F401  (a training run imports it: torch's optimizers, checkpoint loading)
import train.cli, train.trainer, train.spawn  # noqa: F401
from train.distributed import end_process
proto_out.write("ready\n")
proto_out.flush()
for line in proto_in:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            proto_in.close()
            proto_out.close()
            os.setsid()
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            os.dup2(null, 0)
            for fd, path in ((1, req["out"]), (2, req["err"])):
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(f, fd)
                os.close(f)
            os.close(null)
            sys.argv = ["-m", *req["argv"]]
            try:
                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exc:
                code = exc.code
            except BaseException:
                traceback.print_exc()
                code = 1
            end_process(code)  # what a normal exit does (status, threads, atexit, flush), then os._exit
        finally:
            os._exit(rc)
    proto_out.write(json.dumps({"pid": pid}) + "\n")
    proto_out.flush()
    _, status = os.waitpid(pid, 0)
    proto_out.write(json.dumps({"status": status}) + "\n")
    proto_out.flush()
"""


class Zygote:
    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self.lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=ROOT, env=self.env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the train zygote did not start")

    def usable(self, env: dict[str, str]) -> bool:
        if self.proc.poll() is not None:
            return False
        for key in set(env) | set(self.env):
            if key.startswith(FRESH_PREFIXES) and env.get(key) != self.env.get(key):
                return False
        return True

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, timeout: float,
            module: str = "train") -> subprocess.CompletedProcess:
        """``python -m MODULE ARGV`` forked from the zygote; a hang past ``timeout`` is killed and
        raised as subprocess.TimeoutExpired, as subprocess.run does."""
        import signal

        cmd = [sys.executable, "-m", module, *argv]
        with tempfile.TemporaryDirectory(prefix="zygote-") as tmp:
            out, err = Path(tmp) / "out", Path(tmp) / "err"
            req = {"module": module, "argv": argv, "env": env, "cwd": str(cwd), "out": str(out), "err": str(err)}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            pid = json.loads(self.proc.stdout.readline())["pid"]
            done: list[str] = []
            reader = threading.Thread(target=lambda: done.append(self.proc.stdout.readline()), daemon=True)
            reader.start()
            reader.join(timeout)
            if not done:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                reader.join(30)
                raise subprocess.TimeoutExpired(cmd, timeout,
                                                output=out.read_text(errors="replace"),
                                                stderr=err.read_text(errors="replace"))
            status = json.loads(done[0])["status"]
            rc = os.waitstatus_to_exitcode(status)
            return subprocess.CompletedProcess(cmd, rc, out.read_text(errors="replace"), err.read_text(errors="replace"))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
