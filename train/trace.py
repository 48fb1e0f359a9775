"""Named step phases and profiler traces (``metrics.trace_steps=A:B``).

Every training step runs inside ranges named ``train_step#N`` with the phases ``forward``,
``backward``, ``optimizer`` and ``checkpoint`` inside it: ``torch.profiler.record_function``
ranges (they show in the profiler trace) and, on CUDA, NVTX ranges (they show in Nsight
Systems; NVTX is a no-op when no tool is attached), so ``nsys`` and the trace use the
same names.

With ``metrics.trace_steps=A:B`` each rank profiles steps A..B (1-based, inclusive) with
``torch.profiler`` (CPU ops, plus CUDA kernels on GPUs) and writes
``OUT/traces/rank{R}.json`` (Chrome trace format: open it in https://ui.perfetto.dev or
chrome://tracing). When the window closes it logs (``logging``, logger ``train.trace``)
the top ops/kernels by self time and the communication the step waited for:

* GPU: NCCL kernel time not overlapped by any compute kernel on the same GPU (exposed
  communication), next to the total NCCL kernel time;
* CPU (gloo): time of communication ops (``c10d``/``gloo``/``nccl`` in the name) on the
  training thread, where the loop blocks on them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from pathlib import Path

import torch

from core.safety import parse_json

log = logging.getLogger("train.trace")

PHASES = ("forward", "backward", "optimizer", "checkpoint")
_COMM = re.compile(r"nccl|gloo|c10d::|allreduce|all_reduce|allgather|all_gather|reduce_scatter|broadcast",
                   re.IGNORECASE)


def parse_window(spec: str) -> tuple[int, int] | None:
    """``"A:B"`` -> (A, B); ``""`` -> None. ValueError with the reason otherwise."""
    if not spec:
        return None
    parts = [part.strip() for part in spec.split(":")]
    if len(parts) != 2:
        raise ValueError(f"expected A:B (first and last step, e.g. 10:12), got {spec!r}")
    if not all(part.isascii() and part.isdigit() and len(part) <= 18 for part in parts):  # int() took '١' and '1_0'
        raise ValueError(f"expected integers A:B (ASCII digits), got {spec!r}")
    a, b = int(parts[0]), int(parts[1])
    if not 1 <= a <= b:
        raise ValueError(f"needs 1 <= A <= B, got {spec!r}")
    return a, b


_nvtx = None


def _nvtx_on() -> bool:
    global _nvtx
    if _nvtx is None:
        _nvtx = torch.cuda.is_available() and torch.cuda.is_initialized()
    return _nvtx


@contextlib.contextmanager
def phase(name: str):
    """A named range in the profiler trace and, on CUDA, in NVTX (Nsight Systems)."""
    nvtx = _nvtx_on()
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()


class StepTracer:
    """Starts the profiler before step A, writes the trace and the summary after step B."""

    def __init__(self, window: tuple[int, int] | None, out_dir: Path, rank: int, device: torch.device):
        self.window = window
        self.path = out_dir / "traces" / f"rank{rank}.json"
        self.rank = rank
        self.device = device
        self.prof = None
        self._step_range = None
        if window and not logging.getLogger().handlers and not log.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(f"[trace rank {rank}] %(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)

    def begin(self, step: int) -> None:
        """Called before step ``step`` (1-based) runs."""
        if self.window and step == self.window[0] and self.prof is None:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=acts, record_shapes=False, with_stack=False)
            self.prof.__enter__()
        self._step_range = phase(f"train_step#{step}")
        self._step_range.__enter__()

    def end(self, step: int) -> None:
        """Called after step ``step`` finished (metrics and checkpoint included)."""
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        if self.prof is not None and self.window and step >= self.window[1]:
            self._finish()

    def close(self) -> None:
        """Stop a profiler still running (run ended or failed inside the window)."""
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        if self.prof is not None:
            self._finish()

    def _finish(self) -> None:
        prof, self.prof = self.prof, None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        prof.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # a new file of a random name (O_EXCL), renamed over the trace: a link placed at the
        # trace's or a predictable temporary name is replaced, never written through
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=str(self.path.parent))
        os.close(fd)
        try:
            prof.export_chrome_trace(tmp)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        sort = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        try:
            table = prof.key_averages().table(sort_by=sort, row_limit=12, max_name_column_width=60)
        except Exception as exc:  # noqa: BLE001 - the trace is written; the summary is a bonus
            table = f"(no op table: {type(exc).__name__}: {exc})"
        comm = exposed_communication(self.path)
        a, b = self.window
        log.info("steps %d-%d: trace written to %s (open in https://ui.perfetto.dev)", a, b, self.path)
        log.info("top ops by %s:\n%s", sort.replace("_", " "), table)
        log.info("communication: %s", comm["text"])


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The sorted, merged union of ``(start, end)`` intervals."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _covered(interval: tuple[float, float], union: list[tuple[float, float]]) -> float:
    s, e = interval
    return sum(max(0.0, min(e, ue) - max(s, us)) for us, ue in union if ue > s and us < e)


def exposed_communication(trace_path: Path) -> dict:
    """Communication time in a Chrome trace written by torch.profiler (times in ms)."""
    events = parse_json(trace_path.read_text()).get("traceEvents", [])
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    if kernels:
        comm = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower()]
        compute = union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()])
        total = sum(e - s for s, e in comm) / 1e3
        exposed = sum((e - s) - _covered((s, e), compute) for s, e in comm) / 1e3
        return {"device": "gpu", "comm_ms": total, "exposed_ms": exposed,
                "text": f"NCCL kernels {total:.2f} ms in the window, {exposed:.2f} ms of it not overlapped by "
                        "compute kernels (exposed)"}
    steps = [e for e in spans if str(e.get("name", "")).startswith("train_step#")]
    main_tid = steps[0].get("tid") if steps else None
    ops = [e for e in spans if e.get("cat") == "cpu_op" and _COMM.search(str(e.get("name", "")))
           and (main_tid is None or e.get("tid") == main_tid)]
    # nested comm ops (c10d::allreduce_ inside record_param_comms...) count once
    total = sum(e - s for s, e in union([(e["ts"], e["ts"] + e["dur"]) for e in ops])) / 1e3
    return {"device": "cpu", "comm_ms": total, "exposed_ms": total,
            "text": f"{total:.2f} ms in communication ops on the training thread (CPU/gloo: the loop waits there)"}
