"""Bandwidth figures as nccl-tests reports them (see nccl-tests' doc/PERFORMANCE.md).

``size`` is the nccl-tests message size in bytes: the buffer of one rank for
all_reduce, broadcast, all_to_all and send/recv; the *full* (gathered) buffer for
all_gather and the full input for reduce_scatter.

* algbw = size / time
* busbw = algbw x factor, with the factor that makes busbw comparable with the
  hardware's peak link bandwidth whatever the operation and the rank count n:

  ==============  =============
  all_reduce      2 (n - 1) / n
  all_gather      (n - 1) / n
  reduce_scatter  (n - 1) / n
  all_to_all      (n - 1) / n
  broadcast       1
  send_recv       1
  ==============  =============
"""

from __future__ import annotations

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")


def bus_factor(op: str, n: int) -> float:
    if n < 1:
        raise ValueError(f"world size must be >= 1, got {n}")
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "send_recv"):
        return 1.0
    raise ValueError(f"unknown collective {op!r} (known: {', '.join(OPS)})")


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1 GB = 1e9 bytes, as nccl-tests prints)."""
    return size_bytes / seconds / 1e9


def busbw(op: str, size_bytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in GB/s."""
    return algbw(size_bytes, seconds) * bus_factor(op, n)
