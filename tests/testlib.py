"""The shared test helpers: run real multi-process code (gloo on CPU, NCCL on GPUs), the
small models and runs the tests train, and checks on what they leave (DCP checkpoints,
metrics). Every test directory imports it as ``testlib`` (tests/conftest.py puts tests/ on
sys.path); no test module imports another."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """A developer script under scripts/ (not a package), e.g. ``render_examples``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cxx_compiler() -> str | None:
    """The C++ compiler Inductor would use on the CPU ($CXX, g++, c++, clang++), or None."""
    import shutil

    return next((shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if c and shutil.which(c)),
                None)


NO_CXX = "Inductor on the CPU compiles C++: no C++ compiler on PATH"


def needs_cxx():
    """A skipif marker for tests that run Inductor on the CPU (it compiles C++ at run time)."""
    import pytest

    return pytest.mark.skipif(cxx_compiler() is None, reason=NO_CXX)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], nproc: int = 2, extra_env: dict | None = None, timeout: float = 300,
             torchrun_args: list[str] | None = None) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node N -m train <args>`` with a private rendezvous port. The
    launcher is forked from the zygote where the environment allows (tests/zygote.py); its
    workers are new interpreters, as torchrun always starts them."""
    launcher = ["--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"127.0.0.1:{free_port()}", *(torchrun_args or []), "-m", "train", *args]
    return _python_m("torch.distributed.run", launcher, extra_env, timeout)


_ZYGOTE = None


def train_cli(args: list[str], extra_env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """One process, no torchrun: ``python -m train <args>``, forked from a zygote that has
    imported torch once (tests/zygote.py) where the environment allows, else started afresh."""
    return _python_m("train", args, extra_env, timeout)


def _python_m(module: str, args: list, extra_env: dict | None, timeout: float) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS``: forked from the zygote where allowed, else a new interpreter."""
    global _ZYGOTE
    env = child_env(extra_env)
    if os.environ.get("TRAIN_TEST_NO_ZYGOTE") != "1":
        from zygote import Zygote

        if _ZYGOTE is None or _ZYGOTE.proc.poll() is not None:
            _ZYGOTE = Zygote(child_env())
        if _ZYGOTE.usable(env) and _ZYGOTE.lock.acquire(blocking=False):
            try:
                return _ZYGOTE.run([str(a) for a in args], env, ROOT, timeout, module)
            finally:
                _ZYGOTE.lock.release()
    return run([sys.executable, "-m", module, *args], extra_env, timeout)


def run(cmd: list[str], extra_env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=child_env(extra_env), capture_output=True, text=True, timeout=timeout)


def spawn(fn, world_size: int = 2, *args, timeout: float = 240) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes with a gloo
    process group already initialised; re-raises the first failure."""
    import time

    import torch.multiprocessing as mp

    port = free_port()
    env = dict(os.environ)
    ctx = mp.start_processes(_entry, args=(fn, world_size, port, args, (os.getpid(), env)), nprocs=world_size,
                             join=False, start_method=_start_method(env))
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
        if time.monotonic() > deadline:  # a rank hung (e.g. in a collective whose peer died)
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
            raise TimeoutError(f"spawn({fn.__name__}): {world_size} ranks still running after {timeout:g} s")


# The modules a rank's interpreter imports anyway (Dynamo: torch's optimizers and checkpoint
# loading import it, compiled or not); the fork server imports them once.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint", "torch._dynamo", "train.trainer"]
_FORKSERVER_ENV: dict | None = None


def _start_method(env: dict) -> str:
    """How ``spawn`` starts its ranks: "forkserver" (each rank a fresh process forked from a
    server that imported ``FORKSERVER_PRELOAD`` once, about 5 s of CPU less per rank), or
    "spawn" (a new interpreter) where this call's environment differs from the server's in a
    variable read at import time (tests/zygote.py's rule) or TRAIN_TEST_NO_ZYGOTE=1."""
    global _FORKSERVER_ENV
    import multiprocessing
    from multiprocessing import forkserver

    from zygote import FRESH_PREFIXES

    if os.environ.get("TRAIN_TEST_NO_ZYGOTE") == "1" or _cuda_visible():
        return "spawn"  # GPU machines: ranks start as new interpreters (CUDA and NCCL as a user has them)
    multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    pid = forkserver._forkserver._forkserver_pid
    forkserver.ensure_running()  # started (or restarted) here, with this environment
    if _FORKSERVER_ENV is None or forkserver._forkserver._forkserver_pid != pid:
        _FORKSERVER_ENV = dict(env)
    for key in set(env) | set(_FORKSERVER_ENV):
        if key.startswith(FRESH_PREFIXES) and env.get(key) != _FORKSERVER_ENV.get(key):
            return "spawn"
    return "forkserver"


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def _adopt(caller: tuple[int, dict]) -> None:
    """In a rank: the environment and standard streams of the process that called ``spawn``
    (``caller``: its pid and environment), as of the call: a forked rank has the fork
    server's; a spawned one has these already."""
    parent, env = caller
    os.environ.clear()
    os.environ.update(env)
    for fd in (1, 2):
        try:
            if os.path.samestat(os.stat(f"/proc/{parent}/fd/{fd}"), os.fstat(fd)):
                continue
            new = os.open(f"/proc/{parent}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        except OSError:  # not on Linux, or a stream that cannot be reopened: keep the server's
            continue
        os.dup2(new, fd)
        os.close(new)


def _entry(rank: int, fn, world_size: int, port: int, args, caller: tuple[int, dict]) -> None:
    import datetime
    import faulthandler

    import torch
    import torch.distributed as dist

    _adopt(caller)
    faulthandler.enable(all_threads=True)  # a C++ abort (SIGABRT) prints every thread's Python stack
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120))
    try:
        fn(rank, world_size, *args)
    except BaseException:
        dist.destroy_process_group()
        raise
    # Success: the commands' teardown (train.distributed.shutdown: a barrier, so no rank
    # leaves while a peer's collective is in flight, then destroy_process_group with the
    # group's C++ objects kept alive), then the process ends without interpreter
    # finalization. Gloo's worker threads outlive destroy_process_group (other objects still
    # hold the groups); one that drops a Python-owned tensor while the interpreter finalizes
    # is killed mid-destructor: "terminate called without an active exception", SIGABRT, a
    # test failed after its work passed (CI, 1 in several hundred spawns). Freed earlier,
    # with the GIL held, the group deadlocks with that thread instead (torch 2.7.1).
    from train import distributed as tdist

    tdist.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def child_env(extra_env: dict | None = None) -> dict:
    """This process's environment for a child, one OpenMP thread unless set, plus ``extra_env``."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra_env or {})
    return env


def sets(*items: str) -> list[str]:
    """``["--set", A, "--set", B, ...]``: config overrides as ``train run`` options."""
    return [arg for item in items for arg in ("--set", item)]


# ----------------------------------------------------------------------------- small models
# ``train run`` options: the small model the CPU end-to-end tests train (64 wide, 2 layers,
# 32-token sequences, 4 per rank), a metrics row every step. Tests append their own options.
SMALL_RUN = sets("model.dim=64", "model.n_layers=2", "train.seq_len=32", "train.batch_size=4", "train.log_every=1")

# Config overrides (``load_config(None, BASE + ...)``) of the in-process parallel tests:
# a 2-layer model, 3 steps on CPU of synthetic data, gradient clipping active, no checkpoints.
BASE = [
    "model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.vocab_size=256",
    "train.seq_len=32", "train.batch_size=4", "train.steps=3", "train.device=cpu", "data.source=synthetic",
    "optim.lr=0.01", "optim.warmup_steps=0", "optim.grad_clip=0.5",  # clipping active: norm ~0.53
    "checkpoint.final=false", "checkpoint.resume=never", "metrics.progress=false",
]
FSDP = ["parallel.strategy=fsdp"]
# Added to BASE by the FP8 layer tests: dim 32, 4 heads of 8, 1 KV head: wk/wv are 32 -> 8
# (not a multiple of 16); hidden 128.
FP8_SMALL = ["model.dim=32", "model.n_heads=4", "model.n_kv_heads=1", "model.n_layers=2"]


# The parallel set-ups of the 2-rank trajectory comparisons (test_loss, test_optim).
TRAJECTORY_STRATEGIES = {
    "fsdp": ["parallel.strategy=fsdp"],
    "fsdp_accum": ["parallel.strategy=fsdp", "train.batch_size=2", "train.global_batch_size=8"],
    "ddp_accum": ["train.batch_size=2", "train.global_batch_size=8"],
}


def rank0_result(fn, tmp_path: Path, world: int, *args):
    """``fn(rank, world, *args, result_file)`` in this process (world 1) or in ``world`` gloo
    processes (``spawn``); returns what rank 0 saved to ``result_file`` with ``torch.save``."""
    import torch

    out = tmp_path / "rank0_result.pt"
    if world == 1:
        fn(0, 1, *args, out)
    else:
        spawn(fn, world, *args, out)
    return torch.load(out)


def assert_same_trajectory(traj, ref, label: str, loss_rtol: float = 1e-5, norm_rtol: float = 1e-4) -> None:
    """``[(loss, grad_norm), ...]`` per step of a trainer run against a reference run."""
    for step, ((loss, norm), (ref_loss, ref_norm)) in enumerate(zip(traj, ref)):
        assert abs(loss - ref_loss) <= loss_rtol * abs(ref_loss), f"{label} step {step + 1}: loss {loss} vs {ref_loss}"
        assert abs(norm - ref_norm) <= norm_rtol * abs(ref_norm), f"{label} step {step + 1}: norm {norm} vs {ref_norm}"
    assert len(traj) == len(ref)


def load_job(extra):
    """The job of ``BASE`` plus ``extra`` overrides."""
    from train.config import load_config

    return load_config(None, BASE + list(extra))


def gloo_trainer(job, rank: int, world: int, out: Path | None = None, resume: bool = False):
    """A CPU ``Trainer`` for ``rank`` of a gloo world (inside a ``spawn`` worker), writing to
    ``out`` or to a fresh temporary directory."""
    import tempfile

    import torch

    from train.distributed import DistInfo
    from train.trainer import Trainer

    info = DistInfo(rank, rank, world, torch.device("cpu"), "gloo")
    return Trainer(job, info, out or Path(tempfile.mkdtemp()), resume=resume)


def gloo_runs(rank: int, world: int, jobs: dict, measure, result_file: Path) -> None:
    """Inside a ``spawn`` worker: ``{key: measure(trainer)}`` for each ``{key: job}``, one CPU
    gloo ``Trainer`` at a time (closed and released before the next), saved by rank 0 to
    ``result_file`` (``torch.load`` it in the test)."""
    import torch

    out = {}
    for key, job in jobs.items():
        trainer = gloo_trainer(job, rank, world)
        out[key] = measure(trainer)
        trainer.metrics.close()
        trainer.release()
    if rank == 0:
        torch.save(out, result_file)


def full_state(model) -> dict:
    """Full (unsharded) parameters with canonical names; a collective for DTensors."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone() for k, v in sd.items()}


def load_dcp(ckpt: Path, prefix: str = "") -> dict:
    """The tensors of a DCP checkpoint whose keys start with ``prefix`` (``"model."``: the
    model's; ``""``: model and optimizer), loaded without a process group."""
    import torch

    from train.checkpoint import safe_load as dcp_safe

    meta = dcp_safe.load_metadata(ckpt / dcp_safe.METADATA_FILE)
    state = {k: torch.empty(v.size, dtype=v.properties.dtype)
             for k, v in meta.state_dict_metadata.items() if k.startswith(prefix) and hasattr(v, "size")}
    dcp_safe.load(state, ckpt)
    return state


# ----------------------------------------------------------------------------- GPU runs
GPU_RUN = ["run", "--config", "debug", "--steps", "30", "--set", "train.seq_len=256", "--set", "train.batch_size=8",
           "--set", "train.log_every=1", "--set", "optim.lr=1e-3", "--set", "optim.warmup_steps=5",
           "--set", "checkpoint.final=false", "--set", "metrics.progress=false"]


def run_losses(run_dir: Path) -> list[float]:
    """The per-step losses of a run directory's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows]


def assert_learns(res: subprocess.CompletedProcess, run_dir: Path) -> None:
    """A ``GPU_RUN`` exited 0 and its 30 losses are finite, the last 5 below 0.8x the first 5."""
    assert res.returncode == 0, res.stderr[-3000:]
    losses = run_losses(run_dir)
    assert len(losses) == 30 and all(x == x for x in losses), losses
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses


def one_error_line(stderr: str) -> str:
    """The one ``error:`` line of a refused command (and no traceback)."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def topk_dense(acc, k: int):
    """The reference Top-K: ``acc`` with all but its ``k`` largest-magnitude entries zeroed."""
    import torch

    idx = acc.abs().topk(k).indices
    out = torch.zeros_like(acc)
    out[idx] = acc[idx]
    return out


QUIET_RUN = SMALL_RUN + ["--set", "metrics.progress=false"]


def finished_run(out: Path, steps: int = 2) -> Path:
    """A real ``train run`` of QUIET_RUN for ``steps`` steps into ``out`` (its checkpoint at the last step)."""
    res = train_cli(["run", "--out", str(out), "--steps", str(steps), *QUIET_RUN])
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def tree_hashes(root: Path, skip: tuple = ()) -> dict:
    """Every file under ``root`` but those named in ``skip``: its content hash (what "nothing touched" compares)."""
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in skip}


def trained_tiny_llama(seed: int):
    """A one-block Llama on the CPU after one AdamW step: ``(model, optimizer)`` with every state
    a checkpoint holds (the fault tests save and load it)."""
    import torch

    from train.models.llama import Transformer
    from train.models.presets import ModelConfig

    with torch.device("meta"):
        m = Transformer(ModelConfig(dim=32, n_layers=1, n_heads=2, vocab_size=64, max_seq_len=16))
    m.to_empty(device="cpu")
    m.init_weights(seed)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randint(0, 64, (2, 8))).sum().backward()
    opt.step()
    return m, opt
