"""What a command of a ``<!-- docs-test: render ... -->`` block is checked with instead of
being run (it needs GPUs or a cluster). Each check raises ``AssertionError`` naming the
command and the problem:

* ``torchrun [opts] -m train run ARGS`` (also ``--no-python`` wrappers such as ``nsys``,
  ``python -m torch.distributed.run``, a bare ``train run``): torchrun's own argument parser
  reads the torchrun options; the ``train run`` arguments are parsed by its click command,
  the config is loaded with the same ``--config``/``--set`` values, and every check
  ``train run`` makes before it starts (:func:`train.preflight.check_job`: mesh, batch
  divisibility, FP8, memory floor) runs for the world size the command implies
  (``--nnodes`` x ``--nproc-per-node``), as on an 80 GiB sm_90 GPU (sm_100 for MXFP8);
* another ``train`` command (``train bench step ...``, ``train doctor --measure``): parsed
  by its click command (option names, types, choices);
* ``bash FILE``, ``sbatch FILE``: the file exists, ``bash -n`` and shellcheck pass;
* ``kubectl apply -f FILE``: the file exists and is YAML;
* ``python3 scripts/gpu/tables.py TABLE ...``: run with ``--dry-run`` (on a 4-GPU machine): it
  prints the runs it would make, or refuses its arguments;
* ``python FILE.py`` / ``torchrun FILE.py``: the file exists and compiles.

Anything else has no fallback: run it, or mark its block ``skip`` with a reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
from pathlib import Path
from unittest import mock

GIB = 2**30


def check(argv: list[str], cwd: str) -> None:
    with _cwd(cwd):
        _dispatch(argv, 1)


@contextlib.contextmanager
def _cwd(path: str):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _dispatch(argv: list[str], world: int) -> None:
    name = os.path.basename(argv[0]) if argv else ""
    shown = " ".join(argv)[:160]
    if name == "torchrun":
        return _torchrun(argv[1:])
    if name.startswith("python"):
        if argv[1:3] == ["-m", "train"]:
            return _train(argv[3:], world)
        if argv[1:3] == ["-m", "torch.distributed.run"]:
            return _torchrun(argv[3:])
        if len(argv) > 1 and argv[1].endswith("scripts/gpu/tables.py"):
            return _gpu_table(argv)
        if len(argv) > 1 and argv[1].endswith(".py"):
            return _python_file(argv[1])
    if name == "train":
        return _train(argv[1:], world)
    if name in ("bash", "sh", "sbatch") and len(argv) > 1:
        return _shell_file([a for a in argv[1:] if not a.startswith("-")][0])
    if name == "kubectl" and argv[1:2] == ["apply"] and "-f" in argv:
        return _yaml_file(argv[argv.index("-f") + 1])
    for k in range(1, len(argv) - 1):  # a wrapper (nsys, numactl) around python -m train / train
        if argv[k:k + 2] == ["-m", "train"] or os.path.basename(argv[k]) == "train":
            return _train(argv[k + 2:] if argv[k] == "-m" else argv[k + 1:], world)
    raise AssertionError(f"`{shown}`: no render check for this command; run it, or mark its block "
                         "`docs-test: skip REASON`")


def _torchrun(args: list[str]) -> None:
    from torch.distributed.run import get_args_parser

    try:
        ns = get_args_parser().parse_args(args)
    except SystemExit as exc:
        raise AssertionError(f"torchrun {' '.join(args)[:120]}: torchrun rejects its options") from exc
    nnodes = int(str(ns.nnodes).split(":")[-1])
    if not str(ns.nproc_per_node).isdigit():
        raise AssertionError(f"torchrun --nproc-per-node {ns.nproc_per_node}: name the process count in the docs")
    world = nnodes * int(ns.nproc_per_node)
    program = [ns.training_script, *ns.training_script_args]
    if ns.module:
        program = ["python", "-m", *program]
    elif not ns.no_python:
        program = ["python", *program]
    _dispatch(program, world)


def _click_context(group, args: list[str]):
    """Parse ``args`` down the click group's subcommands (no callback runs); the last context."""
    import click

    ctx = group.make_context(group.name or "train", list(args))
    cmd = group
    while isinstance(cmd, click.Group) and _rest(ctx):
        name, cmd, rest = cmd.resolve_command(ctx, _rest(ctx))
        ctx = cmd.make_context(name, rest, parent=ctx)
    return ctx


def _rest(ctx) -> list[str]:
    """A group context's unparsed words (click < 8.2 keeps the subcommand apart)."""
    return [*vars(ctx).get("protected_args", vars(ctx).get("_protected_args", [])), *ctx.args]


def _train(args: list[str], world: int) -> None:
    import click

    from train.cli import main

    try:
        ctx = _click_context(main, args)
    except click.ClickException as exc:
        raise AssertionError(f"train {' '.join(args)[:120]}: {exc.format_message()}") from exc
    if ctx.info_name == "run":
        nproc = ctx.params.get("nproc_per_node")
        if nproc:  # `train run --nproc-per-node N [--nnodes M|MIN:MAX]`: the world it starts
            nnodes = str(ctx.params.get("nnodes") or "1").rpartition(":")[2]
            world = int(nproc) * int(nnodes)
        _train_run(ctx.params, world, " ".join(args)[:120])


def _train_run(params: dict, world: int, shown: str) -> None:
    """The config ``train run`` would build from these options, checked for ``world`` ranks."""
    from train import preflight
    from train.config import load_config
    from train.errors import ConfigError
    from train.precision import fp8

    extra = list(params["overrides"])
    for key, opt in (("train.steps", "steps"), ("checkpoint.every", "checkpoint_every"), ("train.seed", "seed")):
        if params[opt] is not None:
            extra.append(f"{key}={params[opt]}")
    try:
        job = load_config(params["config_path"], extra)
        if job.train.device == "cpu":
            preflight.check_job(job, world)
            return
        no_fp8 = dataclasses.replace(job, fp8=dataclasses.replace(job.fp8, backend="none"))
        with mock.patch("train.parallel.config._cuda_available", return_value=True), \
                mock.patch.object(preflight, "device_memory", return_value=("an 80 GiB GPU", 80 * GIB)):
            dims = preflight.check_job(no_fp8, world)
        sm = (10, 0) if job.fp8.resolved_recipe == "mxfp8" else (9, 0)
        compile_, ac = fp8.planned_compile_ac(job)
        problem = fp8.float8_problem(job.fp8, sm, True, dims.tp, compile_, True, ac)
        if problem:
            raise ConfigError(problem)
    except Exception as exc:
        raise AssertionError(f"train run {shown} on {world} rank(s): {exc}") from exc


def _shell_file(path: str) -> None:
    if not Path(path).is_file():
        raise AssertionError(f"{path}: no such file")
    subprocess.run(["bash", "-n", path], check=True)
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        out = subprocess.run([shellcheck, "-x", path], capture_output=True, text=True)
        if out.returncode:
            raise AssertionError(f"shellcheck {path}:\n{out.stdout[-2000:]}")


def _yaml_file(path: str) -> None:
    import yaml

    files = sorted(Path(path).glob("*.yaml")) if Path(path).is_dir() else [Path(path)]
    if not files or not all(f.is_file() for f in files):
        raise AssertionError(f"{path}: no such file (or no YAML in the directory)")
    for f in files:
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        if not docs or not all(isinstance(d, dict) and "kind" in d for d in docs):
            raise AssertionError(f"{f}: not a Kubernetes manifest (a YAML mapping with a kind)")


def _gpu_table(argv: list[str]) -> None:
    import sys

    out = subprocess.run([sys.executable, *argv[1:], "--dry-run", "--visible", "4"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PIP_NO_INDEX="1"))
    if out.returncode != 0:
        raise AssertionError(f"`{' '.join(argv)[:160]}` --dry-run: exit {out.returncode}: {out.stderr[-300:]}")


def _python_file(path: str) -> None:
    if not Path(path).is_file():
        raise AssertionError(f"{path}: no such file")
    compile(Path(path).read_text(), path, "exec")
