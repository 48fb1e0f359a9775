"""Every template variable is quoted by construction.

Two layers:

* template level: each template is rendered with the context its backend really builds,
  then again with EVERY string in that context (names, values, flags, comments, file
  names, header lines...) replaced by a hostile value (newline, ``$()``, backticks,
  quotes, leading ``-``, control and non-UTF-8 bytes, unicode). The hostile script must
  pass ``bash -n`` and shellcheck, execute nothing (canary file) when run against stub
  binaries that dump argv/env, and deliver every value byte-for-byte: the stubs' records
  of the hostile run, mapped back, equal those of a run with plain placeholder values.
  The YAML manifest must parse to the same document as the placeholder one.
* end to end: ``--profile``/``--fabric`` YAML files whose file names and contents are
  hostile, rendered through the CLI for every backend and executed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from launch_testlib import PY, SHELLCHECK, run_inproc, stub_env, write_address_stubs

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]

HOSTILE = [
    "new\nline; touch {canary}",
    "$(touch {canary})",
    "`touch {canary}`",
    "x; touch {canary} #",
    "it's \"q\" '",
    "-rf --privileged",
    "--",
    "",
    "\n#SBATCH --evil\n",
    "tab\tcr\rbell\x07esc\x1b[31m",
    "\udcff\udcfenon-utf8",
    "ünï ✓ 中文",
    "nel\x85ls\u2028ps\u2029",
    "back\\slash\\",
    "${{IFS}}$HOME!!*?~",
    "a,b=c:d",
    "\x7fdel\x01",
    "'$(touch {canary})'\\",
]

# Contexts a backend builds: (id, launch argv). Rich options so that every template
# branch (multi-node, elastic, pyxis, mounts, rdma, secrets...) has data in it.
JOBS = [
    ("torchrun-1node", ["torchrun", "--profile", "h100", "--flight-recorder", "--max-restarts", "1"]),
    ("torchrun-multi", ["torchrun", "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband",
                        "--rdzv-endpoint", "node0:29400"]),
    ("torchrun-elastic", ["torchrun", "--profile", "b200", "--nnodes", "1:4", "--fabric", "roce",
                          "--ib-hca", "=mlx5_0", "--rdzv-endpoint", "[::1]:5"]),
    ("docker-multi", ["docker", "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband",
                      "--rdzv-endpoint", "node0", "--mount", "/data:/data:ro", "--env", "A=b"]),
    ("docker-1node", ["docker", "--profile", "rtx-pro-6000", "--p2p-broken"]),
    ("slurm-pyxis", ["slurm", "--profile", "b200", "--nnodes", "2:4", "--fabric", "infiniband", "--pyxis",
                     "--mount", "/data:/data", "--partition", "gpu", "--time", "1:00:00", "--cpus", "8"]),
    ("slurm-1node", ["slurm", "--profile", "generic"]),
    ("env", ["env", "--profile", "gb200", "--nnodes", "2", "--fabric", "infiniband", "--nccl-debug", "INFO"]),
    ("k8s-elastic", ["k8s", "--profile", "gb200", "--nnodes", "2:4", "--fabric", "efa", "--gang",
                     "--rdma-resource", "vpc.amazonaws.com/efa=4", "--namespace", "ml", "--queue", "q",
                     "--image-pull-secret", "regcred", "--node-selector", "a=b", "--pod-annotation", "k=v",
                     "--env-secret", "HF_TOKEN=hf:token", "--cpus", "8", "--memory", "1Gi"]),
    ("k8s-fixed", ["k8s", "--profile", "h100", "--nnodes", "3", "--fabric", "infiniband"]),
    ("k8s-shared-runtime", ["k8s", "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband",
                            "--runtime", "shared-h100"]),
    ("k8s-pytorchjob", ["k8s", "--api", "pytorchjob", "--profile", "h100", "--nnodes", "3", "--fabric", "infiniband",
                        "--env-secret", "HF_TOKEN=hf:token"]),
    ("k8s-runtime", ["k8s-runtime", "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband", "--gang",
                     "--image-pull-secret", "regcred", "--node-selector", "a=b", "--pod-annotation", "k=v"]),
    ("k8s-trainjob-compute-domain", ["k8s", "--profile", "gb200", "--nnodes", "2", "--fabric", "infiniband", "--gang",
                                     "--namespace", "ml", "--queue", "q", "--env", "A=b", "--env-secret",
                                     "HF_TOKEN=hf:token", "--cpus", "8", "--memory", "1Gi"]),
]
TRAIN_ARGS = ["--", "--config", "tiny", "--set", "x=1"]


def _capture(monkeypatch, argv: list[str]) -> tuple[str, dict]:
    """(template, context) the backend renders for ``argv``."""
    import importlib
    import pkgutil
    import sys

    import launch
    import launch.render

    seen = []

    def fake_render(template, **context):
        seen.append((template, context))
        return ""

    for info in pkgutil.iter_modules(launch.__path__):  # every backend module that renders
        if info.name not in ("__main__",):
            importlib.import_module(f"launch.{info.name}")
    original = launch.render.render
    with pytest.MonkeyPatch.context() as mp:
        for name, module in list(sys.modules.items()):
            if name.startswith("launch.") and getattr(module, "render", None) is original:
                mp.setattr(module, "render", fake_render)
        rc, _, err = run_inproc([*argv, *(TRAIN_ARGS if argv[0] != "k8s-runtime" else [])])  # a runtime: no args
    assert rc == 0 and len(seen) == 1, err
    return seen[0]


class Replacer:
    """Replace every ``str`` leaf (not ``Shell`` fragments) with value number i."""

    def __init__(self, make, keep_names: bool = False):
        self.make, self.keep_names, self.count = make, keep_names, 0

    def context(self, context: dict) -> dict:
        return {key: self(value, key) for key, value in context.items()}

    def __call__(self, obj, field: str | None = None):
        from launch.render import Shell

        if isinstance(obj, Shell):
            return obj
        if isinstance(obj, str):
            if self.keep_names and field == "name":  # env var names: validated identifiers
                return obj
            if self.keep_names and field == "endpoint":  # HOST:PORT (parse_endpoint), checked again by the script
                return obj
            self.count += 1
            return self.make(self.count)
        if isinstance(obj, dict):
            return {self(k): self(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self(v) for v in obj)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            values = {f.name: self(getattr(obj, f.name), f.name) for f in dataclasses.fields(obj)}
            return dataclasses.replace(obj, **values)
        return obj


def _hostile(canary: Path, allow_non_utf8: bool = True):
    values = [v.format(canary=canary) for v in HOSTILE]
    if not allow_non_utf8:
        values = [v for v in values if not any("\ud800" <= c <= "\udfff" for c in v)]

    def make(i: int) -> str:
        base = values[i % len(values)]
        return f"{base}<{i}>" if i % 2 else f"<{i}>{base}"  # keep leading '-', '$(', newline...

    return make


def _placeholder(i: int) -> str:
    return f"tok{i}x"


def _render(template: str, context: dict) -> str:
    from launch.render import render

    return render(template, **context)


STUBS = {
    # Every stub dumps its argv (and torchrun its environment) and exits 0.
    "torchrun": "import json, os, sys\nrec = {'argv': sys.argv[1:], 'env': dict(os.environ)}\n"
                "open(os.environ['REC'] + '.torchrun', 'w').write(json.dumps(rec))\n",
    "docker": "import json, os, sys\nopen(os.environ['REC'] + '.docker', 'w').write(json.dumps(sys.argv[1:]))\n",
    "srun": "import json, os, sys\nopen(os.environ['REC'] + '.srun', 'w').write(json.dumps(sys.argv[1:]))\n"
            "args = sys.argv[1:]\nwhile args and args[0] not in ('torchrun', 'bash'): args.pop(0)\nos.execvp(args[0], args)\n",
    "scontrol": "print('node-a')\nprint('node-b')\n",
}


@pytest.fixture
def sandbox(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in STUBS.items():
        path = bindir / name
        path.write_text(f"#!{PY}\n{body}")
        path.chmod(0o755)
    write_address_stubs(bindir)
    return tmp_path, stub_env(bindir, tmp_path)


def _execute(script: str, workdir: Path, env: dict, template: str, env_names: list[str]) -> tuple[int, dict, str]:
    """Run a rendered script (or source an env file) against the stubs; return the records."""
    path = workdir / "job.sh"
    path.write_bytes(script.encode("utf-8", "surrogateescape"))
    path.chmod(0o755)
    rec = workdir / "rec"
    for old in workdir.glob("rec.*"):
        old.unlink()
    full_env = {**os.environ, **env, "REC": str(rec)}
    if template == "env.sh.j2":
        dump = "import json, os, sys; print(json.dumps({n: os.environ.get(n) for n in sys.argv[1:]}))"
        cmd = ["bash", "-c", f'set -euo pipefail; source "$1"; shift; exec {PY} -c "$0" "$@"', dump,
               str(path), *env_names]
    else:
        cmd = ["bash", str(path), "late arg"]
    proc = subprocess.run(cmd, cwd=workdir, env=full_env, capture_output=True, timeout=60)
    records = {p.suffix: json.loads(p.read_text()) for p in workdir.glob("rec.*")}
    if template == "env.sh.j2" and proc.returncode == 0:
        records[".env"] = json.loads(proc.stdout)
    for record in records.values():
        if isinstance(record, dict) and "env" in record:  # keep only what the script set
            record["env"] = {n: record["env"].get(n) for n in env_names}
    return proc.returncode, records, os.fsdecode(proc.stderr)


def _map_back(obj, mapping: list[tuple[str, str]]):
    if isinstance(obj, str):
        for hostile, token in mapping:
            obj = obj.replace(hostile, token)
        return obj
    if isinstance(obj, list):
        return [_map_back(v, mapping) for v in obj]
    if isinstance(obj, dict):
        return {_map_back(k, mapping): _map_back(v, mapping) for k, v in obj.items()}
    return obj


def _shellcheck(script: str, workdir: Path) -> None:
    path = workdir / "check.sh"
    path.write_bytes(script.encode("utf-8", "surrogateescape"))
    proc = subprocess.run([SHELLCHECK, "--shell=bash", "--severity=style", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[:3000]


def _env_names(context: dict) -> list[str]:
    return [v.name for v in context.get("env", ())]


@pytest.mark.parametrize("job_id,argv", [j for j in JOBS if not j[1][0].startswith("k8s")], ids=[j[0] for j in JOBS if not j[1][0].startswith("k8s")])
def test_every_shell_variable_hostile(monkeypatch, sandbox, job_id, argv):
    workdir, env = sandbox
    canary = workdir / "CANARY"
    template, context = _capture(monkeypatch, argv)

    # Values, not names: everything must arrive byte-for-byte, nothing executes.
    plain = Replacer(_placeholder, keep_names=True)
    plain_ctx = plain.context(context)
    hostile_make = _hostile(canary)
    hostile = Replacer(hostile_make, keep_names=True)
    hostile_ctx = hostile.context(context)
    assert plain.count == hostile.count > 10
    plain_script, hostile_script = _render(template, plain_ctx), _render(template, hostile_ctx)

    for script in (plain_script, hostile_script):
        proc = subprocess.run(["bash", "-n"], input=script.encode("utf-8", "surrogateescape"), capture_output=True)
        assert proc.returncode == 0, proc.stderr
    _shellcheck(hostile_script, workdir)

    names = _env_names(context)
    rc_plain, rec_plain, err = _execute(plain_script, workdir, env, template, names)
    assert rc_plain == 0 and rec_plain, err
    rc, rec_hostile, err = _execute(hostile_script, workdir, env, template, names)
    assert not canary.exists(), "a hostile value was executed"
    assert rc == 0, err
    mapping = sorted(((hostile_make(i), _placeholder(i)) for i in range(1, hostile.count + 1)),
                     key=lambda pair: -len(pair[0]))
    assert _map_back(rec_hostile, mapping) == rec_plain
    # and the hostile values really were in the records (not lost on the way)
    assert json.dumps(rec_hostile) != json.dumps(rec_plain)


@pytest.mark.parametrize("job_id,argv", [j for j in JOBS if not j[1][0].startswith("k8s")], ids=[j[0] for j in JOBS if not j[1][0].startswith("k8s")])
def test_hostile_names_execute_nothing(monkeypatch, sandbox, job_id, argv):
    """Names too (env names, flags, header, profile/fabric names): syntax holds, nothing runs."""
    workdir, env = sandbox
    canary = workdir / "CANARY"
    template, context = _capture(monkeypatch, argv)
    script = _render(template, Replacer(_hostile(canary)).context(context))
    proc = subprocess.run(["bash", "-n"], input=script.encode("utf-8", "surrogateescape"), capture_output=True)
    assert proc.returncode == 0, proc.stderr
    _execute(script, workdir, env, template, [])
    assert not canary.exists(), "a hostile name was executed"
    # no line starts with hostile text, no value adds a line: comments stay comments
    plain = _render(template, Replacer(_placeholder).context(context)).splitlines()
    lines = script.splitlines()
    assert len(lines) == len(plain)
    for line, plain_line in zip(lines, plain):
        assert line[:1] == plain_line[:1] and (line == "" or line[0] in "#abcdefghijklmnopqrstuvwxyz_)( }"), line


@pytest.mark.parametrize("job_id,argv", [j for j in JOBS if j[1][0].startswith("k8s")], ids=[j[0] for j in JOBS if j[1][0].startswith("k8s")])
def test_every_yaml_variable_hostile(monkeypatch, tmp_path, job_id, argv):
    template, context = _capture(monkeypatch, argv)
    make = _hostile(tmp_path / "CANARY", allow_non_utf8=False)
    plain, hostile = Replacer(_placeholder), Replacer(make)
    plain_doc = list(yaml.safe_load_all(_render(template, plain.context(context))))
    hostile_text = _render(template, hostile.context(context))
    hostile_doc = list(yaml.safe_load_all(hostile_text))
    assert hostile.count > 10
    # kq doubles '$' (Kubernetes expands $(VAR) in args and env values)
    mapping = []
    for i in range(1, hostile.count + 1):
        mapping += [(make(i).replace("$", "$$"), _placeholder(i)), (make(i), _placeholder(i))]
    mapping.sort(key=lambda pair: -len(pair[0]))
    assert _map_back(hostile_doc, mapping) == plain_doc
    assert "#SBATCH" not in yaml.safe_dump(plain_doc)


def test_yaml_refuses_non_utf8(monkeypatch):
    rc, _, err = run_inproc(["k8s", "--", "--set", "x=\udcff"])
    assert rc == 2 and "non-UTF-8" in err and "Traceback" not in err


def test_unfiltered_variables_are_quoted_by_default():
    """A new variable without a filter is still one quoted word / scalar."""
    from launch.render import environment

    shell = environment("shell").from_string("x={{ v }} # {{ v }}\n")
    assert shell.render(v="a\n$(b)") == "x=$'a\\x0a$(b)' # $'a\\x0a$(b)'\n"
    assert shell.render(v=7) == "x=7 # 7\n"
    yml = environment("yaml").from_string("k: {{ v }}\n")
    assert yml.render(v="yes") == 'k: "yes"\n'
    assert yml.render(v="nvidia.com/gpu") == "k: nvidia.com/gpu\n"
    assert yaml.safe_load(yml.render(v="a: b\n- c")) == {"k": "a: b\n- c"}


# --------------------------------------------------------------------------- end to end


def _hostile_catalog(tmp_path: Path, canary: Path) -> tuple[Path, Path]:
    """h100 / infiniband copies with hostile file names and hostile free text."""
    # relative: the scripts run in the directory of the canary; no '/' in a file name
    text = f"\n$(touch {canary.name})\n`touch {canary.name}`;touch {canary.name} 'q\"\x1b"
    directory = tmp_path / "cat"
    directory.mkdir()
    paths = []
    for kind, name in (("profiles", "h100"), ("fabrics", "infiniband")):
        data = yaml.safe_load((REPO / "core" / kind / f"{name}.yaml").read_text())
        data["description"] = f"desc{text}"
        data["notes"] = [f"note{text}"]
        for item in [*data["env"].values(), *data.get("k8s", {}).get("resources", {}).values()]:
            item["why"] = f"why why why{text}"
        path = directory / f"{name}{text}\udcff.yaml"  # and a non-UTF-8 byte
        path.write_text(yaml.safe_dump(data, allow_unicode=True))
        paths.append(path)
    return paths[0], paths[1]


@pytest.mark.parametrize("backend", ["torchrun", "docker", "slurm", "env", "k8s"])
def test_hostile_profile_and_fabric_files(sandbox, backend):
    workdir, env = sandbox
    canary = workdir / "CANARY"
    profile, fabric = _hostile_catalog(workdir, canary)
    argv = [backend, "--profile", str(profile), "--fabric", str(fabric), "--nnodes", "2",
            "--rdzv-endpoint", "node0", "--checkpoint-dir", str(workdir / "ckpt"), "--", "--config", "tiny"]
    rc, out, err = run_inproc(argv)
    assert rc == 0, err
    if backend == "k8s":  # names and texts reach comments only: flattened, same document
        plain = run_inproc(argv[:1] + ["--profile", "h100", "--fabric", "infiniband"] + argv[5:])[1]
        # the runtime is named after the job and written beside the TrainJob: the same documents
        assert list(yaml.safe_load_all(out)) == list(yaml.safe_load_all(plain))
        return
    proc = subprocess.run(["bash", "-n"], input=out.encode("utf-8", "surrogateescape"), capture_output=True)
    assert proc.returncode == 0, proc.stderr
    _shellcheck(out, workdir)
    rc, records, err = _execute(out, workdir, env, f"{backend}.j2" if backend != "env" else "env.sh.j2",
                                ["NCCL_IB_DISABLE", "OMP_NUM_THREADS"])
    assert not canary.exists(), "a file name or YAML text was executed"
    assert rc == 0, err
    if backend == "env":
        assert records[".env"]["OMP_NUM_THREADS"] == "8"
    elif backend == "docker":
        assert records[".docker"][-3:] == ["--config", "tiny", "late arg"]
    else:
        assert records[".torchrun"]["argv"][-3:] == ["--config", "tiny", "late arg"]


def test_single_ib_hca_is_shellcheck_clean(tmp_path):
    out = run_inproc(["env", "--profile", "h100", "--nnodes", "2", "--fabric", "roce", "--ib-hca", "=mlx5_0"])[1]
    assert "export NCCL_IB_HCA='=mlx5_0'" in out
    _shellcheck(out, tmp_path)


def test_every_template_is_covered(monkeypatch):
    """A new top-level template needs a JOBS entry above (its hostile-context test)."""
    from launch.render import TEMPLATE_DIR

    templates = {p.name for p in TEMPLATE_DIR.glob("*.j2") if not p.name.startswith("_")}
    covered = {_capture(monkeypatch, argv)[0] for _, argv in JOBS}
    assert templates <= covered, f"add a JOBS entry rendering {sorted(templates - covered)}"
