"""Which gradient exchange to use on a link: uncompressed, LocalSGD or PowerSGD.

The single place where the choice is made (``train bench comm --recommend`` prints it,
``--apply FILE`` writes it into a config). The input is the link's measured all-reduce
bus bandwidth (``train bench comm``) and how fast a GPU computes; the decision variable
is

    rho = (time of one all-reduce of the fp32 gradients) / (compute time of the step)
        = (2(n-1)/n) * 4 B * N / busbw  /  (6 * N * T / F)
        = (2(n-1)/n) * 4 * F / (6 * T * busbw)

with N parameters, T tokens per GPU per step and F the FLOP/s a GPU achieves. N cancels:
for dense transformers the ratio depends only on the link, the GPU and the batch.
Reference workload when nothing else is given: F = 40% of 989 TFLOP/s (H100/H200 bf16
dense at MFU 0.4), T = 8192 tokens (4 x 2048) per GPU, n = 2: rho = 32.2 / busbw[GB/s].

The step time of each option, in units of the compute time c (a model, checked against
the measurements in docs/results):

* uncompressed DDP: c * (1 + max(0, rho - OVERLAP)). DDP overlaps the all-reduce with the
  backward (about 2/3 of the compute, less the last bucket): OVERLAP = 0.5.
* LocalSGD, period P: c * (1 + rho / P). No gradient exchange; the parameters (same bytes
  as the gradients) are averaged every P steps, not overlapped.
* PowerSGD, rank r: c * (1 + K + rho / C). K = compression compute as a fraction of the
  step's compute (orthogonalisation, matmuls, error feedback: COMPUTE_OVERHEAD), C the
  compression ratio (about 165 at r = 4 for 350m-class matrices).

Choosing the fastest gives the thresholds (one table, :data:`THRESHOLDS`):

* rho < OVERLAP * P / (P - 1) = 0.67: **none**. The exchange hides behind the backward;
  any scheme only adds error (measured on NVLink, 2xH200, rho ~ 0.1: every compressor was
  slower than none).
* 0.67 <= rho < K / (1/P - 1/C) = 1.2: **LocalSGD (P = 4)**. Saves (P-1)/P of the bytes
  at no compute cost; the ranks drift only between averages (measured: the smallest loss
  change of all schemes, +2.8% after 20 steps on sockets).
* rho >= 1.2: **PowerSGD (r = 4)**: 1/165 of the bytes; its fixed compute cost is
  repaid. Warm-up of 10 plain steps (``comm.powersgd_start_iter``) before it starts.

K = 0.3 is kept as a conservative bound, not a point measurement: on 2xH200 over a
10 Gbit/s veth (``scripts/gpu/slowlink.sh``, docs/results/h200x2-slowlink/summary.md) the
decomposition "step time minus exposed communication minus the uncompressed step's
compute, over that compute" gave K = -0.22 (r=4), +0.16 (r=8), -0.51 (r=1): within the
noise of that decomposition, i.e. PowerSGD's compute is small next to a 350m step. The
LocalSGD band stays because of the loss it keeps: after 100 steps there, LocalSGD 4 was
+3.7% over the uncompressed loss, PowerSGD r=4 +9.1%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from train.hardware import peak_bf16_tflops

OVERLAP = 0.5  # fraction of the step's compute that hides the gradient all-reduce
LOCALSGD_PERIOD = 4
POWERSGD_RANK = 4
POWERSGD_RATIO = 165.0  # bytes(uncompressed) / bytes(PowerSGD r=4), 350m (docs/communication.md)
COMPUTE_OVERHEAD = 0.3  # PowerSGD compression compute / step compute: a bound, measured values above

REF_TFLOPS = 0.4 * peak_bf16_tflops("H100 SXM")  # achieved per GPU: H100/H200 bf16 dense peak (989) at MFU 0.4
REF_TOKENS = 8192  # tokens per GPU per step (batch 4 x 2048)

RHO_LOCALSGD = OVERLAP * LOCALSGD_PERIOD / (LOCALSGD_PERIOD - 1)
RHO_POWERSGD = COMPUTE_OVERHEAD / (1 / LOCALSGD_PERIOD - 1 / POWERSGD_RATIO)

# (rho from, hook, config overrides, why) -- the one table of thresholds
THRESHOLDS: list[tuple[float, str, list[str], str]] = [
    (0.0, "none", ["comm.hook=none"],
     "the all-reduce hides behind the backward; compression would only add compute and error"),
    (RHO_LOCALSGD, "localsgd", ["comm.hook=localsgd", f"comm.localsgd_period={LOCALSGD_PERIOD}",
                                "comm.localsgd_warmup=10"],
     f"communication exceeds what overlap hides; LocalSGD sends 1/{LOCALSGD_PERIOD} of the bytes at no compute cost"),
    (RHO_POWERSGD, "powersgd", ["comm.hook=powersgd", f"comm.powersgd_rank={POWERSGD_RANK}",
                                "comm.powersgd_start_iter=10"],
     f"communication dominates; PowerSGD r={POWERSGD_RANK} sends ~1/{POWERSGD_RATIO:.0f} of the bytes, "
     f"its compute (~{COMPUTE_OVERHEAD:.0%} of a step) is repaid"),
]


@dataclass
class Advice:
    hook: str
    overrides: list[str]
    rho: float
    busbw_GBps: float
    reason: str
    inputs: dict = field(default_factory=dict)

    def line(self) -> str:
        return (f"recommendation: {' '.join('--set ' + o for o in self.overrides)}  "
                f"(all_reduce busbw {self.busbw_GBps:.3g} GB/s -> rho = {self.rho:.3g}: {self.reason})")


def rho(busbw_GBps: float, world: int = 2, tflops: float = REF_TFLOPS, tokens: int = REF_TOKENS) -> float:
    """Un-overlapped all-reduce time of the fp32 gradients over the step's compute time."""
    if busbw_GBps <= 0 or tflops <= 0 or tokens <= 0 or world < 2:
        raise ValueError("need busbw > 0, tflops > 0, tokens > 0 and world >= 2")
    factor = 2 * (world - 1) / world
    return factor * 4 * tflops * 1e12 / (6 * tokens * busbw_GBps * 1e9)


def recommend(busbw_GBps: float, world: int = 2, tflops: float = REF_TFLOPS, tokens: int = REF_TOKENS) -> Advice:
    r = rho(busbw_GBps, world, tflops, tokens)
    chosen = [row for row in THRESHOLDS if r >= row[0]][-1]
    return Advice(chosen[1], list(chosen[2]), r, busbw_GBps, chosen[3],
                  {"world": world, "tflops_per_gpu": tflops, "tokens_per_gpu": tokens})


def busbw_for_rho(r: float, world: int = 2, tflops: float = REF_TFLOPS, tokens: int = REF_TOKENS) -> float:
    """The busbw (GB/s) at which ``rho`` equals ``r`` (for printing the table in GB/s)."""
    return rho(1.0, world, tflops, tokens) / r if r > 0 else math.inf


def table_markdown(world: int = 2, tflops: float = REF_TFLOPS, tokens: int = REF_TOKENS) -> str:
    lines = ["| rho from | busbw below (GB/s) | hook | set | why |", "|---|---|---|---|---|"]
    for lo, hook, overrides, why in THRESHOLDS:
        bw = "any" if lo == 0 else f"{busbw_for_rho(lo, world, tflops, tokens):.3g}"
        lines.append(f"| {lo:.2f} | {bw} | {hook} | {' '.join(overrides)} | {why} |")
    return "\n".join(lines)


def read_apply_target(path) -> dict:
    """The YAML config ``--apply`` rewrites ({} when missing), checked before the benchmark runs:
    a file ``atomic_write`` may replace (no FIFO, link, directory, system directory), read by
    the bounded loader (no hang, no alias bomb), a mapping whose ``comm`` is a mapping."""
    from pathlib import Path

    from core.errors import InputError
    from core.runlayout import check_not_in_run
    from core.safety import check_output_target, excerpt_path, load_yaml_file
    from train.errors import ConfigError

    try:
        path = check_output_target(Path(path), "--apply")
        check_not_in_run(f"--apply {excerpt_path(path)}", path)  # a run's config.yaml is its history, read by --resume
        data = load_yaml_file(path, "--apply") if path.exists() else None
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"--apply {excerpt_path(path)}: top level must be a mapping")
    if not isinstance(data.get("comm") or {}, dict):
        raise ConfigError(f"--apply {excerpt_path(path)}: comm: expected a mapping")
    if data:
        from train.config import build_config

        try:  # now, not after the benchmark: a config that does not load is not rewritten
            build_config(data)
        except ConfigError as exc:
            raise ConfigError(f"--apply {excerpt_path(path)}: does not load as a config: {exc}") from None
    return data


def apply_to_config(path, advice: Advice) -> str | None:
    """Write the recommended ``comm.*`` keys into the YAML config ``path`` (created if
    missing; the keys outside ``comm`` and ``comm``'s other keys kept, a hook's settings replaced
    by the chosen hook's). Validated through ``load_config`` before anything is written; written
    atomically. The file is re-dumped (its comments and layout are not carried over), so the
    version it replaces is kept beside it: returns that file's name (None when ``path`` was new)."""
    from pathlib import Path

    import yaml

    from core.safety import atomic_write
    from train.config import build_config
    from train.errors import ConfigError

    path = Path(path)
    data = read_apply_target(path)
    comm = {k: v for k, v in (data.get("comm") or {}).items() if not k.startswith(("powersgd", "localsgd", "topk"))}
    for o in advice.overrides:
        key, _, value = o.partition("=")
        comm[key.split(".", 1)[1]] = yaml.safe_load(value)
    data["comm"] = comm
    text = yaml.safe_dump(data, sort_keys=False)
    try:
        build_config(yaml.safe_load(text))  # what load_config would make of the written file
    except ConfigError as exc:
        raise ConfigError(f"--apply {path}: the result would not load: {exc}") from None
    kept = None
    if path.exists():
        kept = _keep_previous(path)
    atomic_write(path, text, what=f"--apply {path}")
    return kept


def _keep_previous(path) -> str:
    """Copy ``path`` to a new ``NAME.before-apply[.N]`` beside it (never over an existing file)."""
    import os

    data, mode = path.read_bytes(), path.stat().st_mode & 0o777
    for n in range(1000):
        kept = path.with_name(f"{path.name}.before-apply{f'.{n}' if n else ''}")
        try:
            fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return str(kept)
    raise OSError(f"--apply {path}: 1000 earlier versions beside it already; remove some")
