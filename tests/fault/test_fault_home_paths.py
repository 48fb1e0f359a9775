"""One rule for ``~`` in every path a user gives (docs/safety.md, "Paths and ``~``"): a shell expands
``~`` only at the start of a word, so ``--out=~/r``, ``--set data.path=~/t.bin``, YAML values and
``env X=~/c`` reach the program with a literal ``~``. Paths used on this machine are expanded
(``~`` and ``~user``); paths a rendered job uses on its nodes are refused with a one-line hint;
``~nosuchuser`` is one line. Never a directory named ``~``.

The table: every path option of ``train`` and ``launch`` (found by type, so a new one is covered)
x each form (``--opt PATH``, ``--opt=PATH``, a positional argument), every path field of the
config x (``--set``, YAML), every path environment variable."""

from __future__ import annotations

import contextlib
import io
import os
import pwd
from pathlib import Path

import click
import pytest

from core.clicktypes import CleanPath, LocalPath
from launch.cli import cli as launch_cli
from testlib import train_cli
from train.cli import main as train_main
from train.config import ConfigError, load_config

USER = pwd.getpwuid(os.getuid())
NO_USER = "nosuchuser-hopper-train"


def _commands(group, prefix=()):
    for name, cmd in sorted(getattr(group, "commands", {}).items()):
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


def _path_params():
    rows = []
    for tool, group in (("train", train_main), ("launch", launch_cli)):
        for path, cmd in _commands(group):
            for p in cmd.params:
                if isinstance(p.type, (CleanPath, LocalPath)):
                    rows.append(pytest.param(tool, path, p.name, id=f"{tool}-{'-'.join(path)}-{p.opts[0].lstrip('-')}"))
    return rows


PATH_PARAMS = _path_params()

# The options that name a path on this machine: each must be one of the path types (a plain
# string option would pass '~' on unexpanded).
EXPECTED = {("train", ("run",), "config_path"), ("train", ("run",), "out_dir"),
            ("train", ("data", "prepare"), "inputs"), ("train", ("data", "prepare"), "tokenizer"),
            ("train", ("data", "prepare"), "out"), ("train", ("bench", "step"), "plan"),
            ("train", ("bench", "step"), "out_dir"), ("train", ("bench", "comm"), "out_dir"),
            ("train", ("bench", "comm"), "apply_path"), ("train", ("bench", "compression"), "config_path"),
            ("train", ("bench", "compression"), "out_dir"), ("train", ("bench", "compression"), "runs_dir"),
            ("train", ("preflight",), "json_path"),
            *((("launch", (sub,), name) for sub in ("torchrun", "docker", "slurm", "k8s", "k8s-runtime", "env", "run")
               for name in ("profile", "fabric", "output")))}


def test_every_local_path_option_has_a_path_type():
    found = {tuple(p.values) for p in PATH_PARAMS}
    assert EXPECTED <= found, sorted(EXPECTED - found)


def _find(tool, path, name):
    cmd = train_main if tool == "train" else launch_cli
    for part in path:
        cmd = cmd.commands[part]
    return cmd, next(p for p in cmd.params if p.name == name)


def _argv(cmd, param, value: str, form: str) -> list[str]:
    """Arguments that give ``param`` ``value`` in ``form``, plus what the command requires."""
    argv = []
    for other in cmd.params:
        if other is param or not other.required:
            continue
        argv += ["x"] if isinstance(other, click.Argument) else [other.opts[0], "x"]
    if isinstance(param, click.Argument):
        return [*argv, value]
    opt = max(param.opts, key=len)
    return [*argv, f"{opt}={value}"] if form == "equals" else [*argv, opt, value]


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return home


@pytest.mark.parametrize("form", ["space", "equals"])
@pytest.mark.parametrize("tool,path,name", [tuple(p.values) for p in PATH_PARAMS],
                         ids=[p.id for p in PATH_PARAMS])
def test_tilde_in_a_local_path_option_is_expanded(home, tool, path, name, form):
    cmd, param = _find(tool, path, name)
    ctx = cmd.make_context(path[-1], _argv(cmd, param, "~/sub/x.yaml", form))
    got = ctx.params[name]
    got = got[0] if isinstance(got, tuple) else got
    assert os.fspath(got) == f"{home}/sub/x.yaml"
    ctx = cmd.make_context(path[-1], _argv(cmd, param, f"~{USER.pw_name}/y", form))
    got = ctx.params[name]
    got = got[0] if isinstance(got, tuple) else got
    assert os.fspath(got) == f"{USER.pw_dir.rstrip('/')}/y"
    with pytest.raises(click.BadParameter, match=f"~{NO_USER}/x.*cannot be expanded.*no user"):
        cmd.make_context(path[-1], _argv(cmd, param, f"~{NO_USER}/x", form))


CONFIG_PATHS = ["data.path", "data.cache_dir", "metrics.prometheus_file"]


@pytest.mark.parametrize("form", ["set", "yaml"])
@pytest.mark.parametrize("key", CONFIG_PATHS)
def test_tilde_in_a_config_path_is_expanded(home, tmp_path, key, form):
    def load(value):
        if form == "set":
            return load_config(None, [f"{key}={value}"])
        section, field = key.split(".")
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"{section}:\n  {field}: {value}\n")
        return load_config(str(cfg))

    section, field = key.split(".")
    assert getattr(getattr(load("~/t.prom"), section), field) == f"{home}/t.prom"
    assert getattr(getattr(load("./~/t.prom"), section), field) == "./~/t.prom"  # a name, not a home
    with pytest.raises(ConfigError, match=f"{key} '~{NO_USER}/t': '~' cannot be expanded"):
        load(f"~{NO_USER}/t")


@pytest.mark.parametrize("name", ["XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"])
def test_tilde_in_a_path_variable_is_expanded(home, monkeypatch, name):
    from core.errors import InputError
    from train.paths import default_cache_dir, expand_path_env

    monkeypatch.setenv(name, "~/c")
    expand_path_env()
    assert os.environ[name] == f"{home}/c"
    if name == "XDG_CACHE_HOME":
        assert default_cache_dir() == home / "c" / "hopper-train"
    monkeypatch.setenv(name, f"~{NO_USER}/c")
    with pytest.raises(InputError, match=f"environment {name} '~{NO_USER}/c'"):
        expand_path_env()


@pytest.mark.parametrize("name,kind", [("LAUNCH_PROFILE_PATH", "profiles"), ("LAUNCH_FABRIC_PATH", "fabrics")])
def test_tilde_in_a_launch_search_path_is_expanded(home, monkeypatch, name, kind):
    from core import catalog

    (home / "site").mkdir()
    (home / "site" / "mine.yaml").write_text("x: 1\n")
    monkeypatch.setenv(name, "~/site")
    assert catalog.available(kind)["mine"] == home / "site" / "mine.yaml"


REMOTE = [("--mount", "~/data:/data"), ("--mount", "/data:~/data"), ("--checkpoint-dir", "~/ckpt"),
          ("--entrypoint", "~/venv/bin/python -m train run"), ("--entrypoint", "python ~/train.py")]


@pytest.mark.parametrize("form", ["space", "equals"])
@pytest.mark.parametrize("option,value", REMOTE + [("--venv", "~/venv")])
def test_tilde_in_a_path_the_job_uses_on_its_nodes_is_one_line_with_a_hint(home, option, value, form):
    from launch.cli import main

    args = ["torchrun", f"{option}={value}"] if form == "equals" else ["torchrun", option, value]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(args)
    out = err.getvalue().strip()
    assert rc == 2 and len(out.splitlines()) == 1, out
    assert option.lstrip("-").split("-")[0] in out and "'~' is not expanded" in out and "absolute path" in out, out
    assert not (home.parent / "~").exists()


def test_run_with_tilde_paths_writes_under_home_never_a_directory_named_tilde(home, tmp_path):
    (home / "cfg.yaml").write_text("data:\n  source: synthetic\n  cache_dir: ~/cache\n")
    res = train_cli(["run", "--config=~/cfg.yaml", "--out=~/runs/r", "--steps", "1", "--set", "model.dim=64",
                     "--set", "model.n_layers=1", "--set", "train.seq_len=16", "--set", "train.batch_size=2",
                     "--set", "metrics.progress=false"],
                    extra_env={"HOME": str(home)})
    assert res.returncode == 0, res.stderr
    assert (home / "runs" / "r" / "metrics.jsonl").is_file()
    assert not list(Path(tmp_path).rglob("~")) and not (Path(__file__).parents[2] / "~").exists()
    res = train_cli(["run", f"--out=~{NO_USER}/r", "--steps", "1"], extra_env={"HOME": str(home)})
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"~{NO_USER}/r" in res.stderr and "cannot be expanded" in res.stderr
