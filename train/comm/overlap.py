"""Measure what gradient communication costs a step: bytes sent and *exposed* time.

Exposed (non-overlapped) communication time of a step is the time from the end of the
backward pass's compute to the completion of the last gradient collective, plus any
communication the step runs outside the backward (LocalSGD's parameter averaging).

How it is measured (``comm.measure=true``), with timestamps taken on the device:

* *compute end*: when DDP hands the last bucket of the step to the comm hook, every
  gradient has been computed; a CUDA event is recorded on the backward's stream at
  that moment (``time.perf_counter()`` on CPU).
* *comm done*: every bucket's future gets one more ``then`` callback. torch runs such
  callbacks on a stream that waits for the collective's kernels, so an event recorded
  there marks the completion of the bucket's communication (and of any decompression
  chained before it). On CPU/gloo the callback runs when the work completes.
* exposed = max(0, max over buckets(comm done) - compute end), read after the step's
  final synchronisation; out-of-backward collectives add their own start/end events.

Bytes are what the hook hands to collectives on this rank (``comm_bytes``), computed
from the actual tensors: the bucket for an all-reduce, the fp16/bf16 copy, PowerSGD's
P and Q matrices plus the uncompressed tensors, Top-K's packed values+indices.
"""

from __future__ import annotations

import threading
import time

import torch


class CommProbe:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.bytes = 0
        self._compute_end = None
        self._done: list = []
        self._spans: list[tuple] = []

    def _stamp(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()  # on the current stream
            return ev
        return time.perf_counter()

    # ----------------------------------------------------------------- recording
    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes += int(n)

    def compute_end(self) -> None:
        self._compute_end = self._stamp()

    def comm_done(self, fut):
        """A ``Future.then`` callback: stamps completion and passes the value through."""
        stamp = self._stamp()
        with self._lock:
            self._done.append(stamp)
        return fut.value()

    def timed(self, fn, nbytes: int = 0):
        """Run ``fn()`` (a blocking collective outside the backward), counting its
        duration as exposed communication and ``nbytes`` as sent."""
        start = self._stamp()
        out = fn()
        end = self._stamp()
        with self._lock:
            self._spans.append((start, end))
            self.bytes += int(nbytes)
        return out

    # ----------------------------------------------------------------- reading
    def _elapsed_ms(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1000.0

    def collect(self) -> dict:
        """This step's ``comm_bytes`` and ``exposed_comm_ms``; resets for the next step.
        Call after the step has finished (the trainer's step timer synchronises)."""
        with self._lock:
            compute_end, done, spans, nbytes = self._compute_end, self._done, self._spans, self.bytes
            self._reset()
        exposed = 0.0
        if compute_end is not None and done:
            exposed = max(0.0, max(self._elapsed_ms(compute_end, d) for d in done))
        for start, end in spans:
            exposed += max(0.0, self._elapsed_ms(start, end))
        return {"comm_bytes": nbytes, "exposed_comm_ms": exposed}


def probed_hook(call, probe: CommProbe | None):
    """A DDP comm hook around ``call(state, bucket) -> (future, bytes_sent)``.

    Without a probe it only drops the byte count. The hook carries no annotations on
    purpose: DDP checks them, and postponed annotations would read as strings."""

    def hook(state, bucket):
        if probe is None:
            return call(state, bucket)[0]
        if bucket.is_last():
            probe.compute_end()
        fut, nbytes = call(state, bucket)
        probe.add_bytes(nbytes)
        return fut.then(probe.comm_done)

    hook.__name__ = f"probed_{getattr(call, '__name__', 'hook')}"
    return hook
