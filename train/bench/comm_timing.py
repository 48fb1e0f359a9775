"""How ``train bench comm`` and ``train preflight`` time one operation at one message size.

Three numbers, each its own column, each the median over a few batches on every rank and
then the slowest rank's median:

* ``device_us`` (CUDA): the operation's time on the GPU, measured as nccl-tests measures it:
  ``iters`` calls back to back between one pair of CUDA events, divided by ``iters``. The
  calls are queued while a sleep kernel holds the GPU, so it runs them one after the other
  instead of waiting for Python to issue the next one (nccl-tests issues from C, a few µs
  per call; one ``dist.all_reduce`` from Python costs more on the host than a small
  all-reduce takes on NVLink). An untimed call opens each batch and absorbs the ranks'
  different start times. The batch counts only if its start event was still pending when
  the last call had been issued (checked on every rank); otherwise the sleep grows and the
  batch runs again, and after a few tries the batch is kept and ``queued`` says so.
* ``graph_us`` (CUDA, ``graph=True``): the same ``iters`` calls captured in one CUDA graph,
  the graph replayed between two events (nccl-tests ``-G``): no launch cost at all.
* ``host_us``: what one call costs the calling Python thread: the wall time of issuing a
  batch, without synchronizing, divided by ``iters``. On CPU (gloo) a call returns when the
  operation is done, so there it is the operation's time, and the only column.

Bandwidths are computed from ``device_us`` on CUDA and from ``host_us`` on CPU
(:meth:`Timing.seconds`). Every rank runs the same calls: the sizing and each decision to
repeat a batch are agreed by an all-reduce.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

BATCHES = 5  # timed batches per size (fewer when --max-seconds is short for the size)
REQUEUE_TRIES = 3  # a batch the host could not queue ahead runs again this often, with a longer sleep
SLEEP_MARGIN_S = 200e-6  # on top of twice the measured issue time
COLUMN_DOC = {
    "device_us": "µs per operation on the GPU: `iters` operations back to back between one pair of CUDA events, "
                 "queued ahead of the GPU (as nccl-tests' loop issues them), / `iters`; median of the batches, "
                 "slowest rank",
    "graph_us": "µs per operation: the `iters` operations captured in one CUDA graph, one replay between two "
                "events (nccl-tests -G), / `iters`; median of the batches, slowest rank",
    "host_us": "µs of the calling Python thread per call: wall time of issuing `iters` calls without a sync, "
               "/ `iters` (on CPU a call returns when the operation is done: there it is the operation's time); "
               "median of the batches, slowest rank",
}


@dataclass
class Timing:
    host_s: float
    iters: int
    batches: int
    device_s: float | None = None
    graph_s: float | None = None
    queued: bool = True  # every device batch was queued ahead of the GPU
    graph_error: str | None = None

    def seconds(self) -> float:
        """The time bandwidths are computed from: the device's on CUDA, the host's on CPU."""
        return self.device_s if self.device_s is not None else self.host_s

    def columns(self, prefix: str = "") -> dict:
        """``{prefix}device_us`` / ``graph_us`` / ``host_us``: only the measured ones."""
        out = {}
        for key, sec in (("device_us", self.device_s), ("graph_us", self.graph_s), ("host_us", self.host_s)):
            if sec is not None:
                out[prefix + key] = sec * 1e6
        return out


def timing_columns(cuda: bool, graph: bool) -> list[str]:
    return ["device_us", *(["graph_us"] * graph), "host_us"] if cuda else ["host_us"]


class Timer:
    """``measure(fn)`` -> :class:`Timing` of ``fn`` (one collective call, the same on every rank)."""

    def __init__(self, device: torch.device, iters: int = 20, warmup: int = 5, max_seconds: float = 2.0,
                 graph: bool = False, batches: int = BATCHES):
        self.device = device
        self.cuda = device.type == "cuda"
        self.iters, self.warmup, self.max_seconds, self.batches = iters, warmup, max_seconds, batches
        self.graph = graph and self.cuda
        self._cycles_per_s: float | None = None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def max_over_ranks(self, *values: float) -> list[float]:
        """Each value's maximum over the ranks (one all-reduce; it also lines the ranks up)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(v) for v in t.tolist()]

    def wall(self, fn) -> float:
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0

    def plan(self, est: float) -> tuple[int, int, int]:
        """(calls per batch, batches, warm-up calls) for an operation of about ``est`` seconds
        (the slowest rank's, so that every rank plans the same): within ``max_seconds``
        where possible; a slow operation gets fewer batches, then fewer calls, but never
        fewer than 3 calls (or ``iters``, if smaller)."""
        per = max(est, 1e-9)
        budget = 0.8 * self.max_seconds / (2 if self.graph else 1)
        n, batches = self.iters, self.batches
        while batches > 1 and per * (n + 1) * batches > budget:
            batches -= 1
        if per * (n + 1) > budget:
            n = min(n, max(3, int(budget / per) - 1))
        warm = max(0, min(self.warmup - 2, int(0.2 * self.max_seconds / per)))
        return n, batches, warm

    def measure(self, fn, set_up: bool = True) -> Timing:
        """``set_up=False``: the caller has already run the operation once (connections made)."""
        if set_up:
            fn()  # first call: lazy set-up (e.g. NCCL's connections), not timed
        n, batches, warm = self.plan(self.max_over_ranks(self.wall(fn))[0])  # second: sizes the rest
        for _ in range(warm):
            fn()
        self.sync()
        if not self.cuda:
            return self._host_batches(fn, n, batches)
        timing = self._device_batches(fn, n, batches)
        if self.graph:
            timing.graph_s, timing.graph_error = self._graph_batches(fn, n, batches)
        return timing

    def _host_batches(self, fn, n: int, batches: int) -> Timing:
        per_call = []
        for _ in range(batches):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            per_call.append((time.perf_counter() - t0) / n)
        return Timing(host_s=self.max_over_ranks(statistics.median(per_call))[0], iters=n, batches=batches)

    def _cycles(self, seconds: float) -> int:
        """Clock cycles of ``torch.cuda._sleep`` that last about ``seconds`` (calibrated once)."""
        if self._cycles_per_s is None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1000)
            start.record()
            torch.cuda._sleep(1_000_000)
            end.record()
            end.synchronize()
            self._cycles_per_s = 1e6 / max(start.elapsed_time(end) / 1e3, 1e-6)
        return max(1, int(seconds * self._cycles_per_s))

    def _one_batch(self, fn, n: int, sleep_s: float) -> tuple[float, float, bool]:
        """(device seconds per call, host seconds to issue the n calls, whether the GPU got
        to the start event before the host had issued them all)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(self._cycles(sleep_s))
        fn()  # untimed: waits for the last rank to arrive
        start.record()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        issued = time.perf_counter() - t0
        late = start.query()
        end.record()
        self.sync()
        return start.elapsed_time(end) / 1e3 / n, issued, late

    def _device_batches(self, fn, n: int, batches: int) -> Timing:
        sleep_s = 2 * n * 500e-6 + SLEEP_MARGIN_S  # first guess: at most 0.5 ms of host time per call
        dev, issue, tries, queued = [], [], 0, True
        self.max_over_ranks(0.0)  # start together
        while len(dev) < batches:
            d, issued, late = self._one_batch(fn, n, sleep_s)
            any_late, slowest_issue = self.max_over_ranks(float(late), issued)
            sleep_s = max(2 * slowest_issue + SLEEP_MARGIN_S, 2 * sleep_s if any_late else 0.0)
            if any_late and tries < REQUEUE_TRIES:
                tries += 1
                continue
            queued = queued and not any_late
            dev.append(d)
            issue.append(issued / n)
        device_s, host_s = self.max_over_ranks(statistics.median(dev), statistics.median(issue))
        return Timing(host_s=host_s, iters=n, batches=batches, device_s=device_s, queued=queued)

    def _graph_batches(self, fn, n: int, batches: int) -> tuple[float | None, str | None]:
        """(seconds per call from CUDA-graph replays, or None and why not)."""
        graph, error = torch.cuda.CUDAGraph(), None
        try:
            self.sync()
            with torch.cuda.graph(graph):
                for _ in range(n):
                    fn()
        except (RuntimeError, ValueError, TypeError) as exc:
            error = f"graph capture: {' '.join(str(exc).split())[:150]}"
        if self.max_over_ranks(float(error is not None))[0]:  # before any replay: a lone replay would hang
            return None, error or "graph capture failed on another rank"
        graph.replay()
        self.sync()
        times = []
        for _ in range(batches):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(self._cycles(SLEEP_MARGIN_S))
            graph.replay()  # untimed: waits for the last rank to arrive
            start.record()
            graph.replay()
            end.record()
            self.sync()
            times.append(start.elapsed_time(end) / 1e3 / n)
            self.max_over_ranks(0.0)
        del graph
        return self.max_over_ranks(statistics.median(times))[0], None
