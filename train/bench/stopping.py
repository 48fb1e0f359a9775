"""SIGTERM/SIGINT in the benchmarks that run one Trainer after another (``train bench step``,
``train bench compression``): the benchmark stops, keeps the report of what it measured, and
exits 128 + the signal number with one line.

Each Trainer installs its own handler (:class:`train.preemption.Preemption`); between two
trainers the handler installed last receives the signal. :class:`StopSignals` holds that
handler: a stop that reached it is handed to the next Trainer, whose next step's agreement
all-reduce acts on it on every rank, and ``check`` (a collective) stops before the next
Trainer is built."""

from __future__ import annotations

import signal

from train.bench.gpu_stats import reduce_max


class Stopped(BaseException):
    """Every rank agreed to stop. Not an ``Exception``: the benchmarks turn a failing point
    or variant into a row of the report and go on; this ends the benchmark. ``done``: how
    many points or variants were complete; ``row``: the report row of the one cut short, if any."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum, self.done = signum, 0
        self.row: dict | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class StopSignals:
    """The handler installed last: the benchmark's own until the first Trainer installs its own."""

    def __init__(self, grace_s: float) -> None:
        from train.preemption import Preemption

        self.last = Preemption(grace_s=grace_s)
        self.last.install()

    @property
    def signum(self) -> int:
        return self.last.signum or signal.SIGTERM

    def hand_over(self, trainer) -> None:
        """A stop that arrived before ``trainer`` existed applies to it."""
        trainer.preemption.take_over(self.last)
        self.last = trainer.preemption

    def check(self, info) -> None:
        """Before building the next Trainer: stop if any rank got SIGTERM/SIGINT since the last step."""
        if reduce_max([float(self.last.requested)], info)[0]:
            raise Stopped(self.signum)
