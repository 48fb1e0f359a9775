"""``launch``: describe a training job once, get launchers that fit the hardware.

One subcommand per entry of the backends' table (``launch.backends.BACKENDS``), built here
with the shared job options; the backends' modules load at start-up, Jinja, YAML and the
hardware catalog only inside the commands, so ``launch --help`` stays fast and torch is
never imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from core import limits
from core.clicktypes import LocalPath, StrictFloat, StrictInt, harden_click
from core.errors import InputError, SpecError
from core.safety import one_line
from launch import defaults

PROG = "launch"
LAUNCH_DIR = Path(__file__).resolve().parent
_ARGV: list[str] = []  # the invocation, echoed into the generated files' header


def _command_line(extra: tuple[str, ...] = ()) -> str:
    """The invocation minus ``-o FILE``, plus ``extra`` (options taken from the environment):
    the same output whatever file it is written to, and rendering it again gives the same."""
    from launch.render import command_line

    argv = list(_ARGV)
    if extra:
        cut = argv.index("--") if "--" in argv else len(argv)
        argv[cut:cut] = list(extra)
    shown, tokens = [], iter(argv)
    for token in tokens:
        if token == "--":
            shown += [token, *tokens]
            break
        if token in ("-o", "--output"):
            next(tokens, None)
        elif token.startswith("--output=") or (token.startswith("-o") and not token.startswith("--")):
            continue
        else:
            shown.append(token)
    return command_line([PROG, *shown])


def _warn(message: str) -> None:
    click.echo(f"{PROG}: warning: {one_line(message)}", err=True)


# --------------------------------------------------------------------------- shared options


def job_options(func):
    """The job description: the same option names on every subcommand."""
    options = [
        click.option("--profile", default=defaults.PROFILE, show_default=True, metavar="NAME|FILE.yaml", type=LocalPath(),
                     help="Hardware profile (see `launch profiles`)."),
        click.option("--fabric", default=None, metavar="NAME|FILE.yaml", type=LocalPath(),
                     help="Network fabric; default from the profile (single-node or multi-node)."),
        click.option("--nnodes", default="1", show_default=True, metavar="N|MIN:MAX",
                     help="Node count, or MIN:MAX for an elastic job."),
        click.option("--nproc-per-node", type=StrictInt(1, limits.MAX_NPROC_PER_NODE), default=None, metavar="N",
                     help="Processes (GPUs) per node; default: the profile's GPUs per node."),
        click.option("--name", default="train", show_default=True,
                     help="Job name: a container/Slurm job name; a DNS-1035 label for Kubernetes."),
        click.option("-o", "--output", default=None, metavar="FILE", type=LocalPath(),
                     help="Write here (atomically) instead of stdout."),
    ]
    func = _image_options(func)  # the options after these, [-- TRAIN_ARGS...] last
    for option in reversed(options):
        func = option(func)
    return func


def _image_options(func):
    """The rest of the job description (image, name, rendezvous, environment, ...)."""
    options = [
        click.option("--image", default=None,
                     help=f"Container image; default [REGISTRY/]{defaults.IMAGE_REPOSITORY}:<image target>, the name "
                          "`make build-image`/`make push` give it."),
        click.option("--registry", default=None, metavar="HOST[:PORT][/PATH]",
                     help="Registry of the default image: the REGISTRY of `make push`; without --registry and "
                          "--image, the environment's REGISTRY (recorded in the rendered header)."),
        click.option("--image-preloaded", is_flag=True,
                     help="The image is on every node already (k8s: imagePullPolicy Never): a short name is "
                          "accepted for the cluster backends."),
        click.option("--rdzv-endpoint", default=None, metavar="HOST[:PORT]",
                     help="c10d rendezvous host for multi-node torchrun/docker scripts."),
        click.option("--rdzv-port", type=StrictInt(1, 65535), default=defaults.RDZV_PORT, show_default=True),
        click.option("--rdzv-id", default=None, help="Rendezvous id; default: the job name."),
        click.option("--max-restarts", type=StrictInt(0, 1000), default=None,
                     help=f"torchrun worker-group restarts; default 0, or {defaults.ELASTIC_MAX_RESTARTS} for elastic jobs."),
        click.option("--entrypoint", default=defaults.ENTRYPOINT, show_default=True,
                     help="Training program; arguments after `--` are appended unchanged."),
        click.option("--env", multiple=True, metavar="NAME=VALUE",
                     help="Extra environment (repeatable; each name once; NCCL_* names must be documented NCCL "
                          "variables; NCCL_NVLS_ENABLE only 0)."),
        click.option("--allow-undocumented-nccl", is_flag=True,
                     help="Accept NCCL_* names in --env/--env-secret that NCCL does not document."),
        click.option("--mount", multiple=True, metavar="SRC:DST[:OPTIONS]",
                     help="Host path to mount (docker, Slurm+pyxis)."),
        click.option("--checkpoint-dir", default=defaults.CHECKPOINT_DIR, show_default=True,
                     help="Checkpoint directory inside the job (mounted volume / shared FS)."),
        click.option("--cpus", default=None, help="CPUs per node (k8s request, Slurm --cpus-per-task)."),
        click.option("--memory", default=None, help="Memory per node, k8s quantity (e.g. 512Gi)."),
        click.option("--nccl-debug", default=None, metavar="LEVEL", help="NCCL_DEBUG (VERSION|WARN|INFO|TRACE)."),
        click.option("--nccl-debug-subsys", default=None, metavar="LIST", help="NCCL_DEBUG_SUBSYS filter."),
        click.option("--flight-recorder", type=StrictInt(1, 10_000_000), default=None, is_flag=False,
                     flag_value=defaults.FLIGHT_RECORDER_ENTRIES,
                     metavar="[N]", help="Torch flight recorder: keep N collectives, dump on timeout."),
        click.option("--p2p-broken", is_flag=True,
                     help="PCIe P2P is broken here (IOMMU/ACS): set NCCL_P2P_DISABLE=1."),
        click.option("--socket-ifname", default=None, help="NCCL_SOCKET_IFNAME (e.g. =eth1)."),
        click.option("--ib-hca", default=None, help="NCCL_IB_HCA (e.g. =mlx5_0,mlx5_1)."),
        click.option("--ib-gid-index", default=None, help="NCCL_IB_GID_INDEX (RoCE)."),
        click.option("--grace-period", type=StrictInt(30, 7 * 24 * 3600), default=defaults.GRACE_PERIOD_S,
                     show_default=True,
                     help="Seconds between SIGTERM and SIGKILL (checkpoint on preemption)."),
        click.option("--preflight", is_flag=True,
                     help="Before training, every node runs `train preflight` (doctor facts, per-node link "
                          "bandwidth, all-reduce vs the fabric's declared busbw); the job stops, naming the "
                          "slow or broken node, when one is below --preflight-min-fraction. Off by default."),
        click.option("--preflight-min-fraction", type=StrictFloat(0.0), default=None, metavar="F",
                     help=f"Fraction of the expected bandwidth a node must reach (default {defaults.PREFLIGHT_MIN_FRACTION:g})."),
        click.option("--preflight-busbw", type=StrictFloat(0.0), default=None, metavar="GB/s",
                     help="Expected all-reduce busbw instead of the fabric YAML's busbw_GBps."),
        click.argument("train_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- TRAIN_ARGS...]"),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _prepare(options: dict, backend=None, opts=None):
    """What every backend renders (``backends.base.Job``: spec, environment, command line),
    warnings printed; errors surface as SpecError. ``backend`` (a ``registry.Backend``): refuse
    the names its runtime owns, and -o never goes inside its ``--venv``."""
    import os

    from core import catalog
    from launch import builder, envplan, output
    from launch.backends.base import Job
    from launch.envnames import check_not_owned

    venv = backend.venv(opts) if backend else None
    from_env: tuple[str, ...] = ()
    if options.get("registry") is None and options.get("image") is None and os.environ.get("REGISTRY"):
        options = {**options, "registry": os.environ["REGISTRY"]}  # the same REGISTRY as make's
        from_env = ("--registry", options["registry"])
    # where -o may never go first: a read-only install (an image's) would otherwise say "not writable"
    inside = [("the launch package", LAUNCH_DIR), ("the core package", catalog.PACKAGE_DIR), ("--venv", venv)]
    output.check_not_inside(options.get("output"), inside)
    output.check_target(options.get("output"))
    built = builder.build({**options, **(backend.builder_inputs(opts) if backend else {})})
    output.check_not_input(options.get("output"), [*output.job_inputs(built.spec), venv])
    plan = envplan.build_env(built.spec)
    job = Job(built.spec, plan, _command_line(from_env))
    if backend:
        given = {name for name, _ in job.spec.env}
        named = [("--env" if v.name in given else "environment variable", v.name) for v in job.plan.variables]
        named += [("--env-secret", s.name) for s in backend.secret_env(opts)]
        check_not_owned(backend.owned(job.spec, opts), named)
    for message in built.warnings + list(plan.warnings):
        _warn(message)
    return job


def _emit(text: str, options: dict, executable: bool) -> None:
    from launch import output

    output.write(text, options.get("output"), executable)


def _job_keys(options: dict, extra: tuple[str, ...]) -> tuple[dict, dict]:
    job = {k: v for k, v in options.items() if k not in extra}
    return job, {k: options[k] for k in extra}


# --------------------------------------------------------------------------- commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Render launchers for a distributed PyTorch training job.

    Describe the job once (profile, fabric, nodes, image, ...); every subcommand
    takes the same options and prints the result (or writes it with -o FILE).
    Arguments after `--` go to the training program unchanged, e.g.

    \b
      launch torchrun --profile h100 -- --config 1b --steps 100 --set optim.lr=3e-4
      launch k8s --profile h100 --nnodes 2 --fabric infiniband -o job.yaml -- --config 8b --resume
    """


def _run_backend(backend, options: dict) -> None:
    """One ``launch NAME``: its options parsed, the job built and checked, the text written."""
    options, extra = _job_keys(options, tuple(p.name for p in backend.params()))
    opts = backend.parse(extra, options)
    job = _prepare(options, backend, opts)
    for message in backend.warnings(job, opts):
        _warn(message)
    _emit(backend.render(job, opts), options, executable=backend.executable)


def _backend_command(backend) -> click.Command:
    def callback(**options):
        _run_backend(backend, options)

    command = click.command(backend.name, help=backend.help)(job_options(callback))
    command.params[-1:-1] = backend.params()  # before [-- TRAIN_ARGS...]
    return command


def _add_backends() -> None:
    from launch.backends import BACKENDS

    for backend in BACKENDS.values():
        cli.add_command(_backend_command(backend))


_add_backends()


@cli.command("run")
@job_options
@click.option("--dry-run", is_flag=True, help="Print the script that would run; execute nothing.")
def run_cmd(**options):
    """Render the single-node torchrun script and execute it here."""
    from launch.backends import torchrun

    dry_run = options.pop("dry_run")
    job = _prepare(options, torchrun.BACKEND, torchrun.TorchrunOptions())
    if job.spec.nodes.multi_node:
        raise SpecError("`launch run` starts single-node jobs; use `launch torchrun` and run it on every node")
    script = torchrun.render_job(job)
    if dry_run or options.get("output"):
        _emit(script, options, executable=True)
        if dry_run:
            click.echo(f"{PROG}: dry run: nothing executed", err=True)
        return
    sys.stdout.flush()
    _exec_bash(script)


# bash reads the script from an open, nameless file (fd $1) and evaluates it: one `bash -c SCRIPT`
# argument is limited to 128 KiB (MAX_ARG_STRLEN), which long training arguments reach; stdin
# stays the terminal's, and nothing is left on disk.
_RUN_READER = 'launch_fd=$1; shift; launch_script=$(cat <&"$launch_fd") || exit 2; exec {launch_fd}<&-; eval "$launch_script"'


def _exec_bash(script: str) -> None:
    import os
    import tempfile

    handle = tempfile.TemporaryFile()  # unlinked at once: only the descriptor refers to it
    handle.write(script.encode("utf-8", "surrogateescape"))
    handle.flush()
    handle.seek(0)
    os.set_inheritable(handle.fileno(), True)
    try:
        os.execvp("bash", ["bash", "-c", _RUN_READER, "launch-run", str(handle.fileno())])
    except OSError as exc:
        raise InputError(f"cannot run bash: {exc.strerror or exc}") from None


@cli.command("profiles")
def profiles_cmd():
    """Known hardware profiles and fabrics, one line each."""
    from core import catalog

    click.echo("Profiles (--profile):")
    for name in catalog.available("profiles"):
        p = catalog.load_profile(name)
        click.echo(f"  {one_line(name):<14} " + one_line(f"{p.description} [{p.gpus_per_node}x {p.arch}, "
                                                         f"{p.cpu_arch}, fp8: {','.join(p.fp8) or '-'}, "
                                                         f"image: {p.image_target}]"))
    click.echo("Fabrics (--fabric):")
    for name in catalog.available("fabrics"):
        f = catalog.load_fabric(name)
        click.echo(f"  {one_line(name):<14} " + one_line(f"{f.description} [{f.scope}]"))


harden_click(cli)  # any numeric option added later is ASCII-only, bounded and finite too

# --------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    """Console entry point: user errors are one line on stderr and exit status 2.

    Known user-error classes are mapped here (bad values, unreadable/unwritable files,
    undecodable text); anything else is a bug and keeps its traceback."""
    global _ARGV
    args = list(sys.argv[1:] if argv is None else argv)
    _ARGV = args
    try:
        rv = cli.main(args, prog_name=PROG, standalone_mode=False)
    except InputError as exc:  # SpecError and the shared input checks
        return _fail(str(exc))
    except getattr(click.exceptions, "NoArgsIsHelpError", ()) as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
        return 0
    except click.exceptions.Abort:
        return _fail("aborted")
    except click.ClickException as exc:
        return _fail(exc.format_message())
    except BrokenPipeError:
        return 0
    except OSError as exc:  # writing -o (disk full, read-only file system...)
        where = f" {exc.filename!r}" if exc.filename else ""
        return _fail(f"cannot write{where}: {exc.strerror or exc}")
    return rv if isinstance(rv, int) else 0


def _fail(message: str) -> int:
    click.echo(f"{PROG}: error: {one_line(message)}", err=True)
    return 2
