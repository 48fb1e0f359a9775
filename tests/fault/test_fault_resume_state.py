"""Resuming from checkpoints that are on disk but wrong: none verifies (never a silent fresh
start, nothing touched), retention of unverified ones, per-rank state of the wrong type or
range (one line naming file and key, on every rank together, never a hang), manifests and
``latest`` pointers that are not what a save writes. Real ``train run`` processes on a
checkpoint written by one; files tampered with as a user or a broken disk would."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
import torch

from testlib import QUIET_RUN, one_error_line, torchrun, train_cli, tree_hashes
from train.checkpoint import CheckpointManager
from train.checkpoint.files import read_pointer, verify
from train.distributed import DistInfo

SMALL = QUIET_RUN
ONE = DistInfo(0, 0, 1, torch.device("cpu"), None)
STEP2 = "checkpoints/step_00000002"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def run(run_copy):
    return run_copy


def _snapshot(root: Path) -> dict:
    return tree_hashes(root, (".train.lock",))


def _resume(out: Path, steps: int = 4, *extra: str):
    return train_cli(["run", "--out", str(out), "--steps", str(steps), "--resume", *SMALL, *extra])


def _tamper(ckpt: Path, rank: int, edit) -> None:
    """Edit ``extra_rank{rank}.pt`` as a dict and record its new size in the manifest (so it
    passes verification: only the loader can catch it)."""
    path = ckpt / f"extra_rank{rank}.pt"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][path.name] = path.stat().st_size
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


# ----------------------------------------------------------------------------- class: none verifies


def _break(ckpt: Path, how: str) -> None:
    if how == "shard_appended":
        with open(next(ckpt.glob("*.distcp")), "ab") as fh:
            fh.write(b"x\n")
    elif how == "manifest_missing":
        (ckpt / "manifest.json").unlink()
    elif how == "manifest_garbled":
        (ckpt / "manifest.json").write_bytes(b"{\x00garbled")
    elif how == "manifest_overflow":  # json reads 1e999 as inf: int(inf) was an OverflowError traceback
        (ckpt / "manifest.json").write_text('{"step": 2, "files": {".metadata": 1e999, "extra_rank0.pt": 1}}')
    elif how == "manifest_long_name":  # stat() of it: ENAMETOOLONG, was exit 1 for the whole resume
        (ckpt / "manifest.json").write_text(json.dumps({"step": 2, "files": {
            ".metadata": 1, "extra_rank0.pt": 1, "x" * 300: 1}}))


@pytest.mark.parametrize("how", ["shard_appended", "manifest_missing", "manifest_garbled", "manifest_overflow",
                                 "manifest_long_name"])
def test_resume_with_no_verifiable_checkpoint_is_an_error_and_touches_nothing(run, how):
    _break(run / STEP2, how)
    before = _snapshot(run)
    res = _resume(run)
    line = one_error_line(res.stderr)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "no complete checkpoint to resume from" in line and "step_00000002" in line and "nothing was changed" \
        in line, line
    assert "starting from step 0" not in res.stdout + res.stderr
    assert _snapshot(run) == before  # metrics.jsonl not truncated, the step directory not deleted


def test_retention_keeps_unverified_directories_without_a_newer_complete_one(tmp_path):
    """Retention deletes a step directory that fails verification only when a newer complete
    checkpoint exists; one newer than every complete checkpoint stays."""
    from torch import nn

    mgr = CheckpointManager(tmp_path / "checkpoints", ONE, keep=1)
    model = nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    mgr.save(2, model, opt, {"step": 2})
    for name in ("step_00000001", "step_00000009"):  # unverified: older, and newer than any complete one
        (mgr.root / name).mkdir()
        (mgr.root / name / "__0_0.distcp").write_bytes(b"salvage me")
    mgr.save(4, model, opt, {"step": 4})
    names = sorted(p.name for p in mgr.root.iterdir())
    assert names == ["latest", "step_00000004", "step_00000009"], names
    assert (mgr.root / "step_00000009" / "__0_0.distcp").read_bytes() == b"salvage me"


def test_fresh_run_next_to_unverified_checkpoints_is_refused(run):
    (run / STEP2 / "manifest.json").unlink()
    before = _snapshot(run)
    res = train_cli(["run", "--out", str(run), "--steps", "2", *SMALL])
    assert res.returncode == 2 and "holds an earlier run" in one_error_line(res.stderr)
    assert _snapshot(run) == before


# ----------------------------------------------------------------------------- class: per-rank state


def _set(*keys, value):
    def edit(state):
        target = state
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


PER_RANK_CASES = {
    "step_inf": (_set("step", value=math.inf), "step="),
    "nan_skips_inf": (_set("nan_skips", value=math.inf), "nan_skips="),
    "step_negative": (_set("step", value=-5), "step="),
    "step_other_dir": (_set("step", value=100), "step=100 is not the step of its directory"),
    "step_huge": (_set("step", value=10**30), "step="),
    "rng_torch_size": (_set("rng", "torch", value=torch.zeros(3, dtype=torch.uint8)), "rng.torch must be"),
    "data_epoch_negative": (_set("data", "epoch", value=-1), "data.epoch="),
    "data_cursor_negative": (_set("data", "cursor", value=-7), "data.cursor="),
    "base_lrs_length": (_set("scheduler", "base_lrs", value=[1e-3] * 7), "scheduler.base_lrs must be"),
}


@pytest.mark.parametrize("case", list(PER_RANK_CASES))
def test_per_rank_state_of_wrong_type_or_range_is_one_line_naming_file_and_key(run, case):
    edit, expected = PER_RANK_CASES[case]
    _tamper(run / STEP2, 0, edit)
    before = _snapshot(run)
    res = _resume(run)
    line = one_error_line(res.stderr)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "step_00000002: its per-rank state (extra_rank0.pt)" in line and expected in line, line
    assert _snapshot(run) == before
    assert not any(p.name.startswith("step_") and p.name != "step_00000002" for p in (run / "checkpoints").iterdir())


def test_ranks_disagreeing_on_the_step_fail_together_at_once(tmp_path):
    """A 2-rank checkpoint whose rank 1 file says step 1: one line on both ranks, right away
    (it was a hang until train.timeout_s, then a hung rank blamed)."""
    out = tmp_path / "run"
    res = torchrun(["run", "--out", str(out), "--steps", "2", *SMALL])
    assert res.returncode == 0, res.stderr[-3000:]
    _tamper(out / STEP2, 1, _set("step", value=1))
    t0 = time.monotonic()
    res = torchrun(["run", "--out", str(out), "--steps", "4", "--resume", *SMALL, "--set", "train.timeout_s=120"])
    took = time.monotonic() - t0
    assert res.returncode != 0 and took < 100, (took, res.stderr[-3000:])
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert errors and all("extra_rank1.pt" in ln and "step=1 is not the step of its directory" in ln
                          for ln in errors), res.stderr[-3000:]
    # one line from each rank; torchrun's failure report quotes them again ("traceback : [rank N] ...")
    workers = [ln for ln in errors if ln.startswith("[rank ")]
    assert sorted(ln[:7] for ln in workers) == ["[rank 0", "[rank 1"], res.stderr[-3000:]
    assert not any("timed out" in ln for ln in errors), res.stderr[-3000:]
    # the one traceback is bare torchrun's own report of its failed workers, none of a worker
    assert res.stderr.count("Traceback") == 1 and "ChildFailedError" in res.stderr, res.stderr[-3000:]


# ----------------------------------------------------------------------------- class: manifest and pointer


@pytest.mark.parametrize("files", [{".metadata": 1e999, "extra_rank0.pt": 1}, {".metadata": -1, "extra_rank0.pt": 1},
                                   {".metadata": True, "extra_rank0.pt": 1},
                                   {".metadata": 1, "extra_rank0.pt": 1, "../../etc/passwd": 1},
                                   {".metadata": 1, "extra_rank0.pt": 1, "y" * 300: 1}])
def test_manifest_values_are_checked_never_raised(tmp_path, files):
    ckpt = tmp_path / "step_00000002"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text(json.dumps({"step": 2, "files": files}).replace("Infinity", "1e999"))
    assert "manifest.json is unreadable" in verify(ckpt)


def test_manifest_of_another_step_does_not_verify(tmp_path):
    ckpt = tmp_path / "step_00000002"
    ckpt.mkdir()
    for name in (".metadata", "extra_rank0.pt"):
        (ckpt / name).write_bytes(b"x")
    (ckpt / "manifest.json").write_text(json.dumps({"step": 7, "files": {".metadata": 1, "extra_rank0.pt": 1}}))
    assert "records step 7" in verify(ckpt)


def test_latest_pointer_that_is_no_step_name_is_reported_not_raised(tmp_path):
    (tmp_path / "latest").write_text("s" * 300 + "\n")
    named, problem = read_pointer(tmp_path)
    assert named is None and "no step directory name" in problem
    (tmp_path / "latest").unlink()
    os.symlink("/dev/zero", tmp_path / "latest")
    named, problem = read_pointer(tmp_path)
    assert named is None and "symbolic link" in problem


def test_resume_with_a_long_latest_name_uses_the_checkpoint(run):
    (run / "checkpoints" / "latest").write_text("step_" + "9" * 300 + "\n")
    res = _resume(run, 3)
    assert res.returncode == 0 and "resumed from" in res.stdout, res.stderr[-3000:]


def test_latest_pointer_linked_to_a_device_is_refused_at_start(run):
    (run / "checkpoints" / "latest").unlink()
    os.symlink("/dev/zero", run / "checkpoints" / "latest")
    res = _resume(run)
    line = one_error_line(res.stderr)
    assert res.returncode == 2 and "checkpoints/latest is a symbolic link" in line, line
    assert "step " not in res.stdout  # refused before training


def test_save_with_latest_linked_fails_before_the_commit_naming_it(tmp_path):
    """A `latest` link placed while a run goes on: the save fails before its rename, so the
    message that the previous checkpoint is still the latest is true."""
    from torch import nn

    from train.errors import CheckpointError

    mgr = CheckpointManager(tmp_path / "checkpoints", ONE, keep=2)
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    mgr.save(1, model, opt, {"step": 1})
    (mgr.root / "latest").unlink()
    os.symlink("/dev/zero", mgr.root / "latest")
    with pytest.raises(CheckpointError, match="is a symbolic link.*step_00000001 is still the latest"):
        mgr.save(2, model, opt, {"step": 2})
    assert sorted(p.name for p in mgr.root.iterdir()) == ["latest", "step_00000001"]
