"""A run writes only files of its own: a run-owned directory that is a symbolic link (into
another run) is refused, files that share an inode with another run's (``cp -al``) are
copied before they are rewritten, and temporary files are created fresh, never through a
link placed at their name."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from testlib import QUIET_RUN, one_error_line, train_cli, tree_hashes
from train.errors import ConfigError
from train.metrics import append_row, open_rows
from train.rundir import RunLock, check_layout

SMALL = QUIET_RUN
RUN_DIRS = ("checkpoints", "flight_recorder", "tb", "traces", "wandb")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def run_a(run_copy):
    return run_copy


def _snapshot(root: Path) -> dict:
    return tree_hashes(root, ())


# ----------------------------------------------------------------------------- symlinked run entries


def test_checkpoints_linked_into_another_run_is_refused_on_resume_and_fresh_start(run_a, tmp_path):
    """B/checkpoints -> A/checkpoints: with another config, --resume used to load A's checkpoint,
    save into A's directory and let retention delete A's checkpoint."""
    before = _snapshot(run_a)
    b = tmp_path / "B"
    b.mkdir()
    (b / "checkpoints").symlink_to(run_a / "checkpoints", target_is_directory=True)
    res = train_cli(["run", "--out", str(b), "--steps", "4", "--resume", *SMALL, "--set", "train.seed=7"])
    line = one_error_line(res.stderr)
    assert res.returncode == 2 and "checkpoints is a symbolic link" in line and str(run_a) in line, line
    assert _snapshot(run_a) == before


@pytest.mark.parametrize("name", RUN_DIRS)
def test_every_run_owned_directory_that_is_a_link_is_refused(tmp_path, name):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / name).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ConfigError, match=f"{name} is a symbolic link"):
        check_layout(out)


def test_fresh_run_into_an_empty_linked_directory_is_refused(tmp_path):
    out, shared = tmp_path / "out", tmp_path / "shared"
    out.mkdir()
    shared.mkdir()
    (out / "traces").symlink_to(shared, target_is_directory=True)  # empty: no earlier run to refuse
    res = train_cli(["run", "--out", str(out), "--steps", "1", *SMALL])
    assert res.returncode == 2 and "traces is a symbolic link" in one_error_line(res.stderr)
    assert not (out / "metrics.jsonl").exists() and not any(shared.iterdir())


# ----------------------------------------------------------------------------- hard links


def _link_copy(src: Path, dst: Path) -> None:
    """``cp -al src dst``: directories new, every file a hard link."""
    shutil.copytree(src, dst, copy_function=os.link)


def test_resume_of_a_hard_linked_copy_leaves_the_original_run_as_it_was(run_a, tmp_path):
    before = _snapshot(run_a)
    a2 = tmp_path / "A2"
    _link_copy(run_a, a2)
    res = train_cli(["run", "--out", str(a2), "--steps", "4", "--resume", *SMALL])
    assert res.returncode == 0, res.stderr[-3000:]
    assert _snapshot(run_a) == before
    rows = [json.loads(line)["step"] for line in (a2 / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3, 4]
    assert os.stat(a2 / "metrics.jsonl").st_nlink == 1


def test_open_rows_breaks_a_hard_link_and_keeps_only_the_rows_to_keep(tmp_path):
    original, linked = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    text = "".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo'
    original.write_text(text)
    os.chmod(original, 0o640)
    os.link(original, linked)
    fd = open_rows(linked, keep_up_to_step=2)
    try:
        append_row(fd, {"step": 3})
    finally:
        os.close(fd)
    assert original.read_text() == text
    assert [json.loads(x)["step"] for x in linked.read_text().splitlines()] == [1, 2, 3]
    assert os.stat(linked).st_nlink == 1 and os.stat(linked).st_mode & 0o777 == 0o640


def test_run_lock_that_is_a_hard_link_to_another_runs_lock_is_not_written(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / ".train.lock").write_text('{"host": "elsewhere", "pid": 1}')  # a crashed run's lock, kept
    os.link(a / ".train.lock", b / ".train.lock")
    with RunLock(b):
        assert os.stat(b / ".train.lock").st_nlink == 1
    assert (a / ".train.lock").read_text() == '{"host": "elsewhere", "pid": 1}'


def test_copy_of_a_live_run_takes_a_lock_of_its_own(tmp_path):
    """``cp -al`` of a run that is still training: the copy's lock is the live run's inode, whose
    flock that run holds; the copy must get a file of its own, not "in use by another run"."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    with RunLock(a):
        b.mkdir()
        os.link(a / ".train.lock", b / ".train.lock")
        with RunLock(b):
            assert not os.path.samefile(a / ".train.lock", b / ".train.lock")


# ----------------------------------------------------------------------------- temporary files


def test_trace_is_written_through_a_new_file_never_a_placed_link(tmp_path):
    from train.trace import StepTracer

    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    traces = tmp_path / "out" / "traces"
    traces.mkdir(parents=True)
    for name in ("rank0.json.tmp", "rank0.json"):
        (traces / name).symlink_to(victim)
    tracer = StepTracer((1, 1), tmp_path / "out", 0, torch.device("cpu"))
    tracer.begin(1)
    torch.ones(4).sum()
    tracer.end(1)
    assert victim.read_text() == "keep"
    assert not (traces / "rank0.json").is_symlink()
    assert "traceEvents" in json.loads((traces / "rank0.json").read_text())
    assert sorted(p.name for p in traces.iterdir()) == ["rank0.json", "rank0.json.tmp"]
