"""Checks that need the world size or the machine but no process group.

Run by ``train run`` before ``init_process_group``: a bad mesh, an indivisible batch or
FP8 on a machine that cannot run it is reported as one line naming the key (exit 2)
before anything is allocated.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from core.errors import InputError
from core.runlayout import ASIDE_PREFIX, RUN_OWNED, check_not_in_run
from core.safety import check_output_target, control_chars, excerpt, excerpt_path, probe_path, reserved_local_path
from train.config import JobConfig
from train.errors import ConfigError
from train.hardware import host_memory_bytes
from train.memory import floor_bytes
from train.models.registry import param_count
from train.parallel.config import check_offload_device, offload_unavailable
from train.parallel.dims import ParallelDims
from train.precision.fp8 import check_float8

# gradient-accumulation micro-batches per optimizer step beyond which global_batch_size is a typo
MAX_ACCUM = 65536


def world_size_from_env() -> int:
    raw = os.environ.get("WORLD_SIZE", "1") or "1"
    if not re.fullmatch(r"[0-9]+", raw):
        raise ConfigError(f"WORLD_SIZE={excerpt(raw)} is not an integer")
    if len(raw) > 7:
        raise ConfigError(f"WORLD_SIZE={excerpt(raw)}: more than 9999999 processes")
    if int(raw) < 1:
        raise ConfigError(f"WORLD_SIZE={raw}: must be at least 1")
    return int(raw)


def check_job(job: JobConfig, world_size: int) -> ParallelDims:
    """Every check of the job that needs only the world size; returns its parallel dims."""
    dims = ParallelDims.from_job(job, world_size)
    check_offload_device(job)
    check_float8(job, dims)
    dp = dims.dp
    gbs = job.train.global_batch_size
    per_step = job.train.batch_size * dp
    if gbs and gbs % per_step:
        raise ConfigError(
            f"train.global_batch_size: {gbs} is not divisible by batch_size x dp ranks = "
            f"{job.train.batch_size} x {dp} = {per_step}"
        )
    if gbs // per_step > MAX_ACCUM:
        raise ConfigError(
            f"train.global_batch_size: {gbs} needs {gbs // per_step} micro-batches of batch_size x dp ranks = "
            f"{job.train.batch_size} x {dp} per optimizer step; more than {MAX_ACCUM} is taken for a mistake"
        )
    check_fits(job, dims)
    return dims


def check_fits(job: JobConfig, dims: ParallelDims) -> None:
    """What this rank must hold at the least (its fp32 parameters, the RoPE table, one micro-batch's
    hidden states: :func:`floor_bytes`) larger than its device's whole memory: one line now
    instead of minutes of allocating (or a swapping host) that end the same way."""
    m, t = job.model, job.train
    shard = dims.dp_shard * dims.tp if job.parallel.strategy == "fsdp" else 1
    parts = floor_bytes(m, t.batch_size, t.seq_len, shard, dims.tp)
    where, total = device_memory(job)
    if sum(parts.values()) <= total:
        return
    if may_offload(job, dims) and parts["params"] <= host_memory_bytes():
        return  # the plan may keep the parameters in host memory (train.plan: parallel.cpu_offload)
    gib = {k: f"{v / 2**30:.4g} GiB" for k, v in parts.items()}
    if parts["params"] >= parts["rope"] + parts["hidden"]:
        params = param_count(m)
        raise ConfigError(
            f"model.name={m.name} (model.dim={m.dim}, model.n_layers={m.n_layers}, model.vocab_size={m.vocab_size}, "
            f"FFN hidden {m.hidden_dim}): {params / 1e9:.4g}B parameters, {gib['params']} in fp32 on each rank"
            f"{f' (sharded {shard} ways)' if shard > 1 else ''}, more than all {total / 2**30:.4g} GiB of {where}: "
            "use a smaller model, or shard it (parallel.strategy=fsdp) over more GPUs"
        )
    raise ConfigError(
        f"train.seq_len={t.seq_len} with train.batch_size={t.batch_size} (model.dim={m.dim}): the RoPE table "
        f"({gib['rope']}) and one micro-batch's hidden states ({gib['hidden']}) alone, with the parameters "
        f"({gib['params']}), are more than all {total / 2**30:.4g} GiB of {where}: use a shorter sequence or a "
        "smaller micro-batch"
    )


def may_offload(job: JobConfig, dims: ParallelDims) -> bool:
    """Whether the automatic plan may still choose ``parallel.cpu_offload`` for this job on a GPU."""
    pcfg = job.parallel
    return (job.train.device != "cpu" and "parallel.cpu_offload" not in getattr(job, "explicit_keys", ())
            and not offload_unavailable(pcfg.strategy, dims.tp, job.fp8.backend, pcfg.fsdp_symm_mem))


def device_memory(job: JobConfig) -> tuple[str, int]:
    """(what, bytes): where this rank keeps its parameter shards, and all of that memory."""
    import torch

    if job.train.device == "cpu" or job.parallel.cpu_offload or not torch.cuda.is_available():
        return "this host's memory", host_memory_bytes()
    index = local_gpu()
    return f"GPU {index}", torch.cuda.get_device_properties(index).total_memory


def local_gpu() -> int:
    """The GPU this rank will use (LOCAL_RANK, checked by :func:`check_launcher_env`; against the
    visible GPUs when the process group starts)."""
    import torch

    raw = os.environ.get("LOCAL_RANK", "")
    return (int(raw) if raw.isascii() and raw.isdigit() else 0) % max(torch.cuda.device_count(), 1)


def check_out_dir(out, what: str = "--out") -> Path:
    """``--out`` (or another output directory option, ``what``): a usable directory path,
    not a system directory, not inside another run's own entries (returned as a Path)."""
    text = os.fspath(out)
    if not text.strip():
        raise ConfigError(f"{what}: empty directory name")
    _check_name(what, text)  # before realpath: a NUL makes it raise
    if reserved_local_path(text):
        raise ConfigError(f"{what} {excerpt(text)}: a system directory (/, /etc, /usr, /dev, /proc...) cannot "
                          "be a run directory")
    check_not_in_run(f"{what} {excerpt(text)}", text, ConfigError)
    return check_dir(what, text)


def _check_name(what: str, text: str) -> None:
    if control_chars(text):
        raise ConfigError(f"{what} {excerpt(text)}: control characters in a directory name")


def check_dir(what: str, text: str) -> Path:
    """A directory that exists or can be created: no control characters, no file or
    dangling link on the way, a writable existing ancestor."""
    _check_name(what, text)
    out = Path(text)
    try:
        if out.is_symlink() and not out.is_dir():
            raise ConfigError(f"{what} {excerpt(text)}: a dangling symbolic link")
        if out.exists() and not out.is_dir():
            raise ConfigError(f"{what} {excerpt(text)}: exists and is not a directory")
        probe = out
        while not probe.exists():
            if probe.is_symlink():
                raise ConfigError(f"{what} {excerpt(text)}: {excerpt_path(probe)} is a dangling symbolic link")
            probe = probe.parent
    except OSError as exc:  # name too long, permission...
        raise ConfigError(f"{what} {excerpt(text)}: {exc.strerror}") from None
    if not probe.is_dir():
        raise ConfigError(f"{what} {excerpt(text)}: {excerpt_path(probe)} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {excerpt(text)}: {excerpt_path(probe)} is not writable")
    return out


_LAUNCHER_INT = re.compile(r"[0-9]{1,7}")


def _launcher_int(name: str, raw: str) -> int:
    if not _LAUNCHER_INT.fullmatch(raw):
        raise ConfigError(f"environment {name}={excerpt(raw)}: expected an integer >= 0 (torchrun sets it)")
    return int(raw)


def check_launcher_env() -> int:
    """torchrun's variables are consistent; returns the world size.

    WORLD_SIZE > 1 needs RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (without them the
    process would wait for peers that never come until the timeout), RANK < WORLD_SIZE."""
    env = os.environ
    world = world_size_from_env()
    ints = {name: _launcher_int(name, env[name]) for name in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                           "TORCHELASTIC_RESTART_COUNT") if env.get(name)}
    if world > 1 or env.get("MASTER_ADDR"):  # a process group will start (train.distributed)
        missing = [n for n in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if not env.get(n)]
        if missing:
            raise ConfigError(f"environment WORLD_SIZE={world} without {', '.join(missing)}: start multi-process "
                              "runs with torchrun (it sets them all)")
        port = env["MASTER_PORT"]
        if not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
            raise ConfigError(f"environment MASTER_PORT={excerpt(env['MASTER_PORT'])}: expected a port 1..65535")
        _check_master_addr(env["MASTER_ADDR"], int(port))
    if ints.get("RANK", 0) >= world:
        raise ConfigError(f"environment RANK={ints['RANK']} is not below WORLD_SIZE={world}")
    if "LOCAL_WORLD_SIZE" in ints and ints.get("LOCAL_RANK", 0) >= max(ints["LOCAL_WORLD_SIZE"], 1):
        raise ConfigError(f"environment LOCAL_RANK={ints['LOCAL_RANK']} is not below "
                          f"LOCAL_WORLD_SIZE={ints['LOCAL_WORLD_SIZE']}")
    return world


def _check_master_addr(host: str, port: int) -> None:
    """MASTER_ADDR resolves: torch would otherwise retry the lookup until train.timeout_s. A
    temporary failure (EAI_AGAIN: a cluster DNS record not served yet) is left to torch's retries."""
    import socket

    shown = f"environment MASTER_ADDR={excerpt(host)}"
    if control_chars(host) or len(host) > 253:
        raise ConfigError(f"{shown}: not a host name or address")
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_AGAIN:  # a DNS server not answering yet: torch retries it
            return
        raise ConfigError(f"{shown}: cannot be resolved ({exc.strerror or exc})") from None
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"{shown}: cannot be resolved ({getattr(exc, 'strerror', None) or exc})") from None


def check_device(job: JobConfig) -> None:
    """Settings this machine cannot run: CUDA without a GPU, fp16 on the CPU."""
    import torch

    cuda = torch.cuda.is_available()
    if job.train.device == "cuda" and not cuda:
        raise ConfigError("train.device=cuda: no CUDA GPU is visible here (use train.device=auto or cpu)")
    from train.precision.amp import resolve_precision

    on_cpu = job.train.device == "cpu" or not cuda
    try:  # the precision rules live with the precision code (fp16 needs a GPU)
        resolve_precision(job.train.precision, torch.device("cpu" if on_cpu else "cuda"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_data(job: JobConfig) -> None:
    """A token file (data.source=file) is opened and checked now: a bad file is a usage
    error before any directory, lock or process group exists."""
    if job.data.source == "embedded" and job.data.cache_dir:
        check_not_in_run(f"data.cache_dir {excerpt(job.data.cache_dir)}", job.data.cache_dir, ConfigError)
        check_dir("data.cache_dir", job.data.cache_dir)
    elif job.data.source == "embedded" or (job.parallel.compile and not os.environ.get("TORCHINDUCTOR_CACHE_DIR")):
        _check_default_cache_dir()
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR") if job.parallel.compile else ():  # kernels go there
        if os.environ.get(name):
            _check_cache_dir(f"environment {name}", os.environ[name])
    if job.data.source == "embedded":
        from train.data import cached_corpus
        from train.paths import default_cache_dir

        cached_corpus(Path(job.data.cache_dir) if job.data.cache_dir else default_cache_dir(), job.data.embedded_mb)
    if job.data.source != "file":
        return
    from train.data import open_token_file
    from train.errors import DataError

    _, vocab = open_token_file(Path(job.data.path))
    if vocab > job.model.vocab_size:
        raise DataError(f"model.vocab_size: {job.model.vocab_size} is smaller than the data's vocabulary ({vocab})")


def _check_cache_dir(what: str, text: str, fix: str = "") -> None:
    """A cache directory we write into (the corpus, Inductor's kernels) that the environment or a
    default chose: not a system directory, not inside a run, a directory if it exists."""
    if reserved_local_path(text):
        raise ConfigError(f"{what} {excerpt(text)} is a system directory{fix}")
    check_not_in_run(f"{what} {excerpt(text)}", text, ConfigError)
    check_dir(what, text)


def _check_default_cache_dir() -> None:
    """The cache the environment chose (``$XDG_CACHE_HOME/hopper-train``, ``~/.cache/hopper-train``:
    the embedded corpus, Inductor's kernels) meets ``data.cache_dir``'s rules before it is created."""
    from train.paths import default_cache_dir, default_cache_origin

    _check_cache_dir(f"data.cache_dir (default, from environment {default_cache_origin()})",
                     str(default_cache_dir()), "; set data.cache_dir")


def check_runs_here(job: JobConfig, out_dir: Path) -> None:
    """What this machine must give ``job`` before it starts (``train run``, and each point or
    variant of a benchmark): the device, the data (token file, cache directory), the metric
    files (relative to ``out_dir``)."""
    check_device(job)
    check_data(job)
    check_metric_files(job, out_dir)


PROM_NAME_MAX = 200  # + ".PID.THREAD-ID" of the temporary file: within the 255 bytes of a name


def check_metric_files(job: JobConfig, out_dir: Path) -> None:
    """``metrics.prometheus_file`` (rewritten at every logged step) names a ``*.prom`` file
    (what node_exporter's textfile collector reads) that is not the run's own, not in a
    system directory, and a regular file if it exists: it never replaces config.yaml,
    metrics.jsonl, a checkpoint or an unrelated file."""
    name = job.metrics.prometheus_file
    if not name:
        return
    shown = f"metrics.prometheus_file {excerpt(name)}"
    path = Path(name) if os.path.isabs(name) else out_dir / name
    if not path.name.endswith(".prom") or path.name == ".prom":
        raise ConfigError(f"{shown}: expected a file name ending in .prom (the textfile collector's)")
    if len(os.fsencode(path.name)) > PROM_NAME_MAX:  # prometheus_client writes NAME.PID.THREAD-ID beside it
        raise ConfigError(f"{shown}: file name longer than {PROM_NAME_MAX} bytes")
    top = os.path.relpath(os.path.realpath(path), os.path.realpath(out_dir)).split(os.sep)[0]
    if top in RUN_OWNED or top.startswith(ASIDE_PREFIX):
        raise ConfigError(f"{shown}: inside the run's own {top}")
    check_not_in_run(shown, str(path), ConfigError)
    if reserved_local_path(path):
        raise ConfigError(f"{shown}: inside a system directory")
    check_dir("metrics.prometheus_file", str(path.parent))
    try:
        probe_path(path, "metrics.prometheus_file")  # a name too long: lexists() says False, the write fails late
        if os.path.lexists(path):
            check_output_target(path, "metrics.prometheus_file")
    except InputError as exc:
            raise ConfigError(str(exc)) from None
