"""The command line's manners, without training: help without torch, help text for every option,
a closed stdout, an unreachable Hub, the make targets, the linter, the documented FSDP mesh."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

from testlib import ROOT, child_env, free_port, one_error_line, train_cli
from train.spawn import failure_line

WALK = """
import runpy, sys, click
from train.cli import main

def paths(cmd, prefix):
    yield prefix
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from paths(sub, prefix + [name])

for path in paths(main, []):
    sys.argv = ["train", *path, "--help"]
    try:
        runpy.run_module("train", run_name="__main__")
    except SystemExit as exc:
        assert exc.code in (0, None), (path, exc.code)
    heavy = sorted(m for m in ("torch", "numpy", "tokenizers", "datasets") if m in sys.modules)
    assert not heavy, (path, heavy)
    print("ok", " ".join(path))
"""


def test_help_of_every_command_imports_no_torch():
    """``train --help`` and ``train <cmd> [<sub>] --help`` through the real entry point (``python -m
    train``): torch (seconds to import) and the data libraries stay unloaded."""
    res = subprocess.run([sys.executable, "-c", WALK], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    done = [ln for ln in res.stderr.splitlines() + res.stdout.splitlines() if ln.startswith("ok")]
    assert {"ok ", "ok run", "ok bench comm", "ok data prepare", "ok doctor"} <= {d.ljust(3) for d in done}


def _commands(cmd: click.Command, path: str):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, f"{path} {name}")


def test_every_command_and_option_has_help_text():
    from train.cli import main

    missing = []
    for path, cmd in _commands(main, "train"):
        if not (cmd.help or cmd.short_help):
            missing.append(path)
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip():
                missing.append(f"{path} {param.opts[0]}")
    assert not missing, missing


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["doctor", "--help"], ["bench", "--help"]])
def test_closed_stdout_ends_quietly(args):
    """The reader of stdout is gone before the command writes: no traceback, no BrokenPipeError,
    exit 141 (128 + SIGPIPE, what a shell reports for such a writer)."""
    proc = subprocess.Popen([sys.executable, "-m", "train", *args], cwd=ROOT, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert err == "", err


def test_failed_worker_lines():
    """train run --nproc-per-node's line for a failed worker: its own error line, else what ended it."""
    assert failure_line(1, 2, {"message": "[rank 1] error: data.path: no such file"}) == (
        "[rank 1] error: data.path: no such file", 2)
    assert failure_line(0, -9, "Signal 9 (SIGKILL) received by PID 7") == ("[rank 0] error: killed by SIGKILL", 137)
    line, code = failure_line(3, 1, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    assert code == 1 and line.startswith("[rank 3] error: exited with code 1")


def test_documented_fsdp_example_shards_over_all_ranks():
    """``--set parallel.strategy=fsdp --set parallel.dp_shard=-1``: dp_replicate (default -1)
    becomes 1, all ranks shard; an explicit replicate degree still makes HSDP."""
    from train.config import load_config
    from train.parallel.dims import ParallelDims
    from train.preflight import check_job

    job = load_config("1b", ["parallel.strategy=fsdp", "parallel.dp_shard=-1"])
    for world in (1, 2, 8):
        assert ParallelDims.resolve(job.parallel, world, job.model).shape == (1, world, 1)
    check_job(job, 8)
    hsdp = load_config("1b", ["parallel.strategy=fsdp", "parallel.dp_shard=-1", "parallel.dp_replicate=2"])
    assert ParallelDims.resolve(hsdp.parallel, 8, hsdp.model).shape == (2, 4, 1)


def test_nproc_per_node_under_a_launcher_is_refused():
    res = train_cli(["run", "--nproc-per-node", "2", "--steps", "1"], extra_env={"RANK": "0", "LOCAL_RANK": "0"})
    assert res.returncode == 2
    assert "already a rank of a launcher" in one_error_line(res.stderr)


@pytest.mark.parametrize("args, culprit", [
    (["--nproc-per-node", "2", "--nnodes", "2"], "--rdzv-endpoint"),
    (["--nproc-per-node", "2", "--nnodes", "3:2"], "--nnodes"),
    (["--nproc-per-node", "0"], "--nproc-per-node"),
    (["--nproc-per-node", "2", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "a b"], "--rdzv-id"),
])
def test_launcher_options_are_checked_before_any_worker(args, culprit):
    res = train_cli(["run", *args])
    assert res.returncode == 2
    assert culprit in one_error_line(res.stderr)


def _hub_env(tmp_path, **extra):
    """An empty Hugging Face cache, the Hub (or its proxy) at a closed local port."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
           "HF_HUB_OFFLINE": "", "HF_DATASETS_OFFLINE": "", "NO_PROXY": "", "no_proxy": ""}
    env.update(extra)
    return env


@pytest.mark.parametrize("where", ["endpoint", "proxy"])
def test_online_without_network_names_the_network(tmp_path, where):
    """``--online`` when the Hub (or the proxy) cannot be reached: one line naming the network and
    the host, exit 1, within seconds (no retries), not "not found"."""
    pytest.importorskip("tokenizers")
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        pytest.skip("huggingface_hub is not installed (pip install 'hopper-train[data]')")
    port = free_port()  # bound and released: nothing listens there
    extra = ({"HF_ENDPOINT": f"http://127.0.0.1:{port}"} if where == "endpoint" else
             {"HTTPS_PROXY": f"http://127.0.0.1:{port}", "https_proxy": f"http://127.0.0.1:{port}"})
    (tmp_path / "a.txt").write_text("hello world\n")
    start = time.monotonic()
    res = train_cli(["data", "prepare", str(tmp_path / "a.txt"), "--tokenizer", "someorg/sometokenizer",
                     "--online", "--out", str(tmp_path / "t.bin")], extra_env=_hub_env(tmp_path, **extra))
    elapsed = time.monotonic() - start
    assert res.returncode == 1, res.stderr[-2000:]
    line = one_error_line(res.stderr)
    assert "network unreachable" in line and f"127.0.0.1:{port}" in line and "not found" not in line
    assert "Retry" not in res.stderr and not (tmp_path / "t.bin").exists()
    assert elapsed < 120  # the libraries' own retries alone sleep 23 s; the process start dominates here


def test_make_help_lists_every_target():
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    res = subprocess.run([make, "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    listed = {ln.split()[0] for ln in res.stdout.splitlines() if ln.strip()}
    declared = set()
    for makefile in (ROOT / "Makefile", ROOT / "docker" / "docker.mk"):
        for phony in re.findall(r"^\.PHONY:(.*)$", makefile.read_text(), re.M):
            declared |= set(phony.split())
    assert declared and declared <= listed, sorted(declared - listed)
    for line in res.stdout.splitlines():
        assert len(line.split(None, 1)) == 2, f"no description: {line!r}"


def test_lint_is_clean():
    """What ``make lint`` runs: ruff (the version pinned in the dev extra) over the repository."""
    ruff = shutil.which("ruff", path=f"{Path(sys.executable).parent}:{ROOT / '.venv' / 'bin'}") or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    pinned = re.search(r'"ruff==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    version = subprocess.run([ruff, "--version"], capture_output=True, text=True).stdout.split()[-1]
    assert version == pinned, f"ruff {version} is not the pinned {pinned}"
    res = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


@pytest.mark.parametrize("program", ["train", "launch"])
def test_an_entry_point_without_its_packages_is_one_line(program, tmp_path):
    """``python -m train|launch`` in a Python that lacks a dependency: one line naming it and the
    way to the project's environment, exit 2 (the check both entry points run first)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from core.installed import require; "
            f"require({program!r}, ('click', 'no_such_module_for_this_test'))")
    res = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        f"error: no_such_module_for_this_test is not installed in this Python ({sys.executable}): run `make setup` "
        f"and use .venv/bin/{program}, or `source .venv/bin/activate` first"]
