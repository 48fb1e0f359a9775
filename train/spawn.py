"""``train run --nproc-per-node N``: start the workers from ``train`` itself.

The parent checks the whole job once (the config, the mesh for the world size, this machine's
device, data and output files) before any worker exists: a bad config is one line, exit 2. It
then runs torchrun's launcher in this process (``torch.distributed.run``: the same elastic agent,
rendezvous and restarts as the ``torchrun`` command) with ``python -m train run`` as the worker.
A worker that fails ends the run with one line naming the first failed rank and its error (the
worker's own ``error:`` line, from its torchrun error record) and that worker's exit code.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys

import click

from core.clicktypes import StrictInt
from core.safety import excerpt
from train.console import ERRORS_TO_PARENT, fail

# torchrun's variables: set in a process that a launcher started (then it is one rank, not a parent)
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")
NODES_MAX = 100_000
PROCS_MAX = 1024


def launcher_options(f):
    """The options of ``train run`` that make it a parent of N workers per node."""
    options = [
        click.option("--nproc-per-node", type=StrictInt(1, PROCS_MAX), metavar="N",
                     help="Start N worker processes on this node (one per GPU) with torchrun's launcher, after "
                          "checking the config once: a bad config is one line, not one per rank."),
        click.option("--nnodes", metavar="N|MIN:MAX", default="1", show_default=True,
                     help="Nodes taking part (with --nproc-per-node); more than 1 needs --rdzv-endpoint."),
        click.option("--rdzv-endpoint", metavar="HOST:PORT",
                     help="Rendezvous of a multi-node run (torchrun's c10d backend): the same on every node."),
        click.option("--rdzv-id", metavar="ID", default="train", show_default=True,
                     help="Rendezvous id of a multi-node run: the same on every node, unique per job."),
        click.option("--max-restarts", type=StrictInt(0, 1000), default=0, show_default=True,
                     help="Restart all workers up to this many times after a worker fails."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


LAUNCHER_PARAMS = ("nproc_per_node", "nnodes", "rdzv_endpoint", "rdzv_id", "max_restarts")


def node_range(nnodes: str) -> tuple[int, int]:
    """``--nnodes``: ``N`` or ``MIN:MAX`` (ASCII digits, 1 <= MIN <= MAX)."""
    match = re.fullmatch(r"([0-9]{1,6})(?::([0-9]{1,6}))?", nnodes)
    if not match:
        raise click.BadParameter(f"{excerpt(nnodes)}: expected N or MIN:MAX", param_hint="--nnodes")
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if not 1 <= low <= high <= NODES_MAX:
        raise click.BadParameter(f"{excerpt(nnodes)}: needs 1 <= MIN <= MAX <= {NODES_MAX}", param_hint="--nnodes")
    return low, high


def check_launcher(params: dict) -> list[int]:
    """The launcher options of a parent (``--nproc-per-node`` given): the world sizes to check the job
    with (the smallest and the largest of an elastic ``--nnodes``). Usage errors raise ClickException."""
    inside = [name for name in LAUNCHER_VARS if os.environ.get(name)]
    if inside:
        raise click.UsageError(f"--nproc-per-node: this process is already a rank of a launcher ({inside[0]} is set);"
                               " start train run --nproc-per-node directly, not under torchrun")
    low, high = node_range(params["nnodes"])
    endpoint = params["rdzv_endpoint"]
    if high > 1 and not endpoint:
        raise click.UsageError(f"--nnodes {params['nnodes']}: a multi-node run needs --rdzv-endpoint HOST:PORT")
    if endpoint is not None and not re.fullmatch(r"[A-Za-z0-9._\[\]:-]+(:[0-9]{1,5})?", endpoint):
        raise click.BadParameter(f"{excerpt(endpoint)}: expected HOST[:PORT]", param_hint="--rdzv-endpoint")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", params["rdzv_id"]):
        raise click.BadParameter(f"{excerpt(params['rdzv_id'])}: letters, digits, '.', '_' and '-' (1-128)",
                                 param_hint="--rdzv-id")
    n = params["nproc_per_node"]
    return sorted({n * low, n * high})


def worker_args(ctx: click.Context) -> list[str]:
    """The command line of ``train run`` as the user gave it, less the launcher options: what each
    worker runs (options left at their default are left out)."""
    args: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if name in LAUNCHER_PARAMS or not isinstance(param, click.Option):
            continue
        if ctx.get_parameter_source(name) in (click.core.ParameterSource.DEFAULT, None):
            continue
        value, flag = ctx.params[name], param.opts[0]
        if param.is_flag:
            args += [flag] if value else []
        elif param.multiple:
            for item in value:
                args += [flag, str(item)]
        elif value is not None:
            args += [flag, str(value)]
    return args


def torchrun_argv(params: dict, args: list[str]) -> list[str]:
    """torchrun's command line for ``python -m train run ARGS`` under these launcher options."""
    argv = ["--nproc-per-node", str(params["nproc_per_node"]), "--nnodes", params["nnodes"],
            "--max-restarts", str(params["max_restarts"])]
    if params["rdzv_endpoint"]:
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", params["rdzv_endpoint"], "--rdzv-id", params["rdzv_id"]]
    else:
        argv += ["--standalone"]
    return argv + ["-m", "train", "run", *args]


def start(params: dict, args: list[str]) -> None:
    """Run the workers with torchrun's launcher in this process; exit with the run's status."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    os.environ[ERRORS_TO_PARENT] = "1"  # the workers' error lines: printed once, here
    for name in ("torch.distributed.run", "torch.distributed.elastic"):  # its per-worker failure reports
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        torchrun.run(torchrun.parse_args(torchrun_argv(params, args)))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        line, code = failure_line(rank, failure.exitcode, failure.message)
        sys.stderr.write(line + "\n")
        sys.exit(code)
    except SignalException as exc:  # SIGTERM/SIGINT to this process: the workers were stopped with it
        sys.exit(128 + int(exc.sigval))
    except RendezvousError as exc:
        fail(f"rendezvous at {params['rdzv_endpoint'] or 'localhost'}: {type(exc).__name__}: {exc}", 1)
    sys.exit(0)


def failure_line(rank: int, exitcode: int, message) -> tuple[str, int]:
    """One line for a failed worker, and the exit code of the parent: the worker's own (128 + N for
    a signal N). ``message``: the worker's error record (its ``error:`` line), else torchrun's text."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"[rank {rank}] error: killed by {name}", 128 - exitcode
    code = exitcode if 0 < exitcode < 256 else 1
    text = message.get("message") if isinstance(message, dict) else message
    if isinstance(text, str) and re.match(r"(\[rank [0-9?]+\] )?error: ", text):
        return text.splitlines()[0] if text.strip() else f"[rank {rank}] error: exit code {code}", code
    return f"[rank {rank}] error: exited with code {code} (its messages are above)", code
