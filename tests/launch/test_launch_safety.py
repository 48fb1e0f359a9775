"""The shared safety layer (``core/safety.py``) and the job-spec gates, as classes:
numeric options, image references, output targets, YAML bounds, fabrics."""

from __future__ import annotations

import os
import stat
import time

import click
import pytest

from launch_testlib import run_inproc


def _all_params(command):
    stack = [command]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        for param in cmd.params:
            yield cmd.name, param


def test_no_plain_int_or_float_option_left():
    """Every numeric option of both CLIs is ASCII-only, bounded and finite by construction
    (``int('²')`` and ``float('١')`` succeed in Python; ``click.INT`` uses them)."""
    from launch.cli import cli as launch_cli

    plain = (click.types.IntParamType, click.types.FloatParamType)
    for name, param in _all_params(launch_cli):
        assert not isinstance(param.type, plain) or type(param.type).__name__.startswith("Strict"), (name, param.name)


def test_train_cli_is_hardened():
    pytest.importorskip("torch")
    from train.cli import main

    checked = 0
    for name, param in _all_params(main):
        if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)):
            raise AssertionError(f"{name} {param.name}: plain {param.type}")
        checked += type(param.type).__name__.startswith("Strict")
    assert checked >= 15


@pytest.mark.parametrize("image", [
    "hopper-train:hopper", "nvcr.io/nvidia/pytorch:25.01-py3", "localhost:5000/a/b_c.d-e:tag",
    "ghcr.io/org/img@sha256:" + "a" * 64, "img:tag@sha256:" + "0" * 64, "[::1]:5000/img",
])
def test_valid_images_render(image):
    for backend in ("docker", "k8s", "torchrun"):
        preloaded = ["--image-preloaded"] if backend == "k8s" and "/" not in image else []  # a short name
        assert run_inproc([backend, "--image", image, *preloaded])[0] == 0


@pytest.mark.parametrize("image", [
    "--privileged", "-v/:/host", "img --privileged", "img\n", "IMG", "img:", "img@sha256:short", " img",
    "img:tag;reboot", "$(id)", "img:" + "t" * 129, "a" * 256, "img\udcff", "ïmg",
])
def test_hostile_images_refused_everywhere(image):
    for backend, extra in (("docker", []), ("slurm", ["--pyxis"]), ("k8s", []), ("torchrun", []), ("env", [])):
        rc, out, err = run_inproc([backend, *extra, "--image", image])
        assert rc == 2 and out == "" and err.startswith("launch: error: --image"), (backend, err)


def test_pyxis_accepts_enroot_forms():
    for image in ("nvcr.io#nvidia/pytorch:25.01-py3", "/shared/images/train.sqsh"):
        assert run_inproc(["slurm", "--pyxis", "--image", image])[0] == 0
        assert run_inproc(["docker", "--image", image])[0] == 2


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dangling", "directory"])
def test_output_never_replaces_special_files(tmp_path, kind):
    target = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        (tmp_path / "real").write_text("keep\n")
        target.symlink_to(tmp_path / "real")
    elif kind == "dangling":
        target.symlink_to(tmp_path / "nowhere")
    else:
        target.mkdir()
    before = os.lstat(target)
    rc, out, err = run_inproc(["torchrun", "-o", str(target)])
    assert rc == 2 and len(err.splitlines()) == 1, err
    after = os.lstat(target)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".target.")], "no temp file left"
    if kind == "symlink":
        assert (tmp_path / "real").read_text() == "keep\n"


def test_output_regular_file_replaced_whole(tmp_path):
    target = tmp_path / "job.sh"
    target.write_text("old\n")
    assert run_inproc(["torchrun", "-o", str(target)])[0] == 0
    assert target.read_text().startswith("#!/usr/bin/env bash") and os.access(target, os.X_OK)


@pytest.mark.parametrize("text, message", [
    ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)), "alias bomb"),
    ("[" * 50000 + "]" * 50000, "nested deeper"),
    ("a: &a {b: *a}\n", "through aliases"),
    ("a: &a '" + "x" * 500_000 + "'\nb: [" + ", ".join(["*a"] * 100) + "]\n", "characters after expanding"),
    ("{a: 1, a: 2}", "duplicate key"),
    ("a: !!python/object/apply:os.system [id]", "malformed YAML"),
    ("a: 1\n---\nb: 2\n", "malformed YAML"),
])
def test_yaml_bounds_answer_at_once(text, message):
    from core.errors import InputError
    from core.safety import load_yaml_text

    t0 = time.monotonic()
    with pytest.raises(InputError, match=message):
        load_yaml_text(text, "test")
    assert time.monotonic() - t0 < 2.0


def test_yaml_errors_show_a_bounded_excerpt(tmp_path):
    from core.safety import MESSAGE_CHARS

    bad = tmp_path / ("x" * 200 + ".yaml")
    bad.write_text("a: [" + "y" * 100000)
    rc, _, err = run_inproc(["torchrun", "--profile", str(bad)])
    assert rc == 2 and len(err.splitlines()) == 1 and len(err) < MESSAGE_CHARS + 40


def test_ethernet_fabric_keeps_nccl_on_sockets():
    rc, out, _ = run_inproc(["env", "--nnodes", "2", "--fabric", "ethernet"])
    assert rc == 0
    assert "export NCCL_IB_DISABLE=1" in out and "export NCCL_NET=Socket" in out


def test_escape_hatch_for_undocumented_nccl():
    assert run_inproc(["env", "--env", "NCCL_NEW_KNOB=1"])[0] == 2
    rc, out, _ = run_inproc(["env", "--allow-undocumented-nccl", "--env", "NCCL_NEW_KNOB=1"])
    assert rc == 0 and "export NCCL_NEW_KNOB=1" in out
    # the hatch never opens NVLink multicast or the myths
    assert run_inproc(["env", "--allow-undocumented-nccl", "--env", "NCCL_NVLS_ENABLE=1"])[0] == 2
    assert run_inproc(["env", "--allow-undocumented-nccl", "--env", "NCCL_TIMEOUT=1"])[0] == 2
    assert run_inproc(["k8s", "--allow-undocumented-nccl", "--env-secret", "NCCL_NVLS_ENABLE=s:k"])[0] == 2


def test_atomic_write_keeps_a_replaced_files_permissions_but_no_set_id_bits(tmp_path):
    from core.safety import atomic_write

    private = tmp_path / "job.yaml"
    private.write_text("a: 1\n")
    private.chmod(0o640)
    atomic_write(private, "a: 2\n")
    assert private.read_text() == "a: 2\n" and private.stat().st_mode & 0o7777 == 0o640
    setuid = tmp_path / "tool.sh"
    setuid.write_text("old\n")
    setuid.chmod(0o4744)
    atomic_write(setuid, "new\n", executable=True)
    assert setuid.stat().st_mode & 0o7777 == 0o755  # x where r was; the set-user-ID bit dropped
