"""Checkpoints under faults: corrupted on disk, a crash in the middle of a save, a
full disk. Each fault is made for real (files truncated/removed/overwritten, the
process killed by the kernel while writing, a tmpfs that runs out of space) and the
job is resumed from what is left."""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from testlib import ROOT, SMALL_RUN, load_dcp, train_cli, trained_tiny_llama
from train.checkpoint import CheckpointManager, rng_state, set_rng_state, verify
from train.distributed import DistInfo
from train.errors import CheckpointError

SMALL = SMALL_RUN + ["--set", "metrics.progress=false"]
ONE = DistInfo(0, 0, 1, torch.device("cpu"), None)




@pytest.fixture(scope="module")
def _saved_once(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved") / "checkpoints"
    mgr = CheckpointManager(root, ONE, keep=3)
    weights = {}
    for step in (2, 4, 6):
        m, opt = trained_tiny_llama(step)
        mgr.save(step, m, opt, {"step": step, "rng": rng_state(), "note": f"s{step}"})
        weights[step] = m.output.weight.detach().clone()
    return root, weights


@pytest.fixture
def three_checkpoints(_saved_once, tmp_path):
    """step 2, 4, 6 saved by the real manager (each with different weights), copied
    fresh for every test."""
    root, weights = _saved_once
    shutil.copytree(root, tmp_path / "checkpoints")
    return CheckpointManager(tmp_path / "checkpoints", ONE, keep=3), weights


def _corrupt(ckpt: Path, how: str) -> str:
    """Damage ``ckpt``; returns the text the skip warning must contain."""
    if how == "missing_shard":
        next(ckpt.glob("*.distcp")).unlink()
        return "is missing"
    if how == "truncated_shard":
        shard = next(ckpt.glob("*.distcp"))
        with open(shard, "r+b") as fh:
            fh.truncate(shard.stat().st_size // 2)
        return "bytes, manifest says"
    if how == "garbage_manifest":
        (ckpt / "manifest.json").write_bytes(b"\x00{not json")
        return "manifest.json is unreadable"
    if how == "no_manifest":  # a save that died before its last file
        (ckpt / "manifest.json").unlink()
        return "no manifest.json"
    if how == "missing_metadata":
        (ckpt / ".metadata").unlink()
        return ".metadata is missing"
    if how == "garbage_extra_same_size":  # passes the size check; fails when loaded
        extra = ckpt / "extra_rank0.pt"
        extra.write_bytes(b"\x00" * extra.stat().st_size)
        return "cannot be loaded"
    if how == "pickle_payload_extra":  # a file that would run code under weights_only=False
        class Evil:
            def __reduce__(self):
                return (os.system, ("echo pwned > " + str(ckpt.parent / "pwned"),))

        extra = ckpt / "extra_rank0.pt"
        torch.save({"step": 6, "x": Evil()}, extra)
        manifest = json.loads((ckpt / "manifest.json").read_text())
        manifest["files"]["extra_rank0.pt"] = extra.stat().st_size
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
        return "cannot be loaded"
    if how == "latest_points_to_deleted":
        shutil.rmtree(ckpt)
        return "'latest' names 'step_00000006', which does not exist"
    raise AssertionError(how)


CORRUPTIONS = ["missing_shard", "truncated_shard", "garbage_manifest", "no_manifest", "missing_metadata",
               "garbage_extra_same_size", "pickle_payload_extra", "latest_points_to_deleted"]


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_corrupted_latest_is_skipped_with_a_warning_and_previous_loads(three_checkpoints, how, caplog):
    mgr, weights = three_checkpoints
    newest = mgr.root / "step_00000006"
    expected = _corrupt(newest, how)
    m, opt = trained_tiny_llama(99)
    logger = logging.getLogger("train.checkpoint")  # its records, whatever the train loggers' setup
    logger.addHandler(caplog.handler)
    try:
        path, extra = mgr.load_latest(m, opt)
    finally:
        logger.removeHandler(caplog.handler)
    assert path.name == "step_00000004" and extra["step"] == 4 and extra["note"] == "s4"
    assert torch.equal(m.output.weight, weights[4])
    warn = [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "step_00000006" in r.getMessage()]
    assert warn and expected in " ".join(warn), caplog.text
    assert not (mgr.root / "pwned").exists()


def test_every_checkpoint_bad_is_an_error_not_a_fresh_start(three_checkpoints):
    mgr, _ = three_checkpoints
    for step in (2, 4, 6):
        _corrupt(mgr.root / f"step_{step:08d}", "garbage_extra_same_size")
    m, opt = trained_tiny_llama(99)
    with pytest.raises(CheckpointError, match="none of the 3 complete checkpoint"):
        mgr.load_latest(m, opt)


def test_checkpoints_removed_under_their_pointer_is_an_error_not_a_fresh_start(three_checkpoints):
    """`latest` says a checkpoint was committed here; with every step directory gone a resume
    stops (nothing changed) instead of training from step 0 over the run's metrics."""
    import shutil

    mgr, _ = three_checkpoints
    for step in (2, 4, 6):
        shutil.rmtree(mgr.root / f"step_{step:08d}")
    m, opt = trained_tiny_llama(99)
    with pytest.raises(CheckpointError, match="names 'step_00000006', but no complete checkpoint"):
        mgr.load_latest(m, opt)
    (mgr.root / "latest").unlink()  # the way out the message names: a fresh start
    assert mgr.load_latest(m, opt) is None


def test_rng_state_round_trips_through_weights_only_load(tmp_path):
    import random

    import numpy as np

    state = rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expect = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expect[0], got[0]) and (expect[1] == got[1]).all() and expect[2] == got[2]


def test_retention_keeps_k_and_cleans_crash_leftovers(tmp_path):
    mgr = CheckpointManager(tmp_path / "checkpoints", ONE, keep=2)
    m, opt = trained_tiny_llama(1)
    for step in (1, 2):
        mgr.save(step, m, opt, {"step": step})
    leftover = mgr.root / ".tmp-step_00000003"  # what a save killed mid-write leaves
    leftover.mkdir()
    (leftover / "__0_0.distcp").write_bytes(b"partial")
    broken = mgr.root / "step_00000000"
    broken.mkdir()
    mgr.save(4, m, opt, {"step": 4})
    names = sorted(p.name for p in mgr.root.iterdir())
    assert names == ["latest", "step_00000002", "step_00000004"], names
    assert (mgr.root / "latest").read_text().strip() == "step_00000004"
    assert all(verify(mgr.root / n) is None for n in names if n.startswith("step_"))


def test_async_save_commits_only_in_finish_with_the_state_at_save_time(tmp_path):
    """``latest`` and the step directory appear only when the background write is
    committed; the written state is the one staged at save time, not what training did
    afterwards; a second save first commits the one in flight (never two at once)."""
    mgr = CheckpointManager(tmp_path / "checkpoints", ONE, keep=0, async_save=True)
    m, opt = trained_tiny_llama(1)
    mgr.save(2, m, opt, {"step": 2})
    assert (mgr.root / "latest").read_text().strip() == "step_00000002" and mgr.in_flight is None
    mgr.save(4, m, opt, {"step": 4}, wait=False)
    saved = m.output.weight.detach().clone()
    assert mgr.in_flight == 4 and (mgr.root / ".tmp-step_00000004").is_dir()
    assert not (mgr.root / "step_00000004").exists()
    assert (mgr.root / "latest").read_text().strip() == "step_00000002"
    with torch.no_grad():  # training goes on while the write runs
        m.output.weight.add_(1.0)
    assert mgr.finish() == mgr.root / "step_00000004" and mgr.in_flight is None
    assert (mgr.root / "latest").read_text().strip() == "step_00000004" and verify(mgr.root / "step_00000004") is None
    mgr.save(6, m, opt, {"step": 6}, wait=False)
    mgr.save(8, m, opt, {"step": 8}, wait=False)
    assert mgr.in_flight == 8 and verify(mgr.root / "step_00000006") is None
    mgr.abandon()  # never committed: stays a .tmp- directory that later saves clean up
    assert not (mgr.root / "step_00000008").exists() and (mgr.root / "latest").read_text().strip() == "step_00000006"
    fresh, fopt = trained_tiny_llama(2)
    path, extra = CheckpointManager(mgr.root, ONE, keep=0).load_latest(fresh, fopt)
    assert path.name == "step_00000006" and extra["step"] == 6
    m4, o4 = trained_tiny_llama(3)
    CheckpointManager(mgr.root, ONE, keep=0).load(mgr.root / "step_00000004", m4, o4)
    assert torch.equal(m4.output.weight, saved)



def test_async_save_replaces_a_stager_that_torch_closed(tmp_path):
    """torch 2.11's DefaultStager closes its inner StateDictStager at the end of every stage,
    and the next save with it fails (pytorch#183413; seen on 2xH200). Do to the stager what
    2.11 does, then save again: a fresh stager is used and both checkpoints are complete."""
    mgr = CheckpointManager(tmp_path / "checkpoints", ONE, keep=0, async_save=True)
    m, opt = trained_tiny_llama(1)
    mgr.save(2, m, opt, {"step": 2})
    stager = mgr._get_stager()
    if stager is None:
        pytest.skip("this torch has no DefaultStager: async_save stages into fresh memory")
    stager._state_dict_stager.close()  # what torch 2.11 does after each stage
    mgr.save(4, m, opt, {"step": 4})
    assert mgr._get_stager() is not stager
    assert verify(mgr.root / "step_00000002") is None and verify(mgr.root / "step_00000004") is None
    assert (mgr.root / "latest").read_text().strip() == "step_00000004"

# ----------------------------------------------------------------------------- real crashes


def _limit_file_size(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


# Python ignores SIGXFSZ at start-up (a write past RLIMIT_FSIZE then fails with EFBIG);
# restoring the default makes the kernel kill the process at that exact write, the way
# it kills any other program: a deterministic crash in the middle of a checkpoint.
_DIE_ON_SIGXFSZ = ("import runpy, signal; signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
                   "runpy.run_module('train', run_name='__main__', alter_sys=True)")


def test_crash_during_save_keeps_previous_and_resume_cleans_up(tmp_path, checkpoint_mode):
    out = tmp_path / "run"
    base = ["run", "--out", str(out), "--checkpoint-every", "2", *SMALL, *checkpoint_mode]
    first = train_cli([*base, "--steps", "4"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((out / "checkpoints" / "step_00000004" / "manifest.json").read_text())["step"] == 4

    # The kernel kills the process (SIGXFSZ) the moment a checkpoint file grows past 256 KiB:
    # a crash in the middle of writing step 6's shards.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    crash = subprocess.run([sys.executable, "-c", _DIE_ON_SIGXFSZ, *base, "--steps", "8", "--resume"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size(256 * 1024))
    assert crash.returncode == -signal.SIGXFSZ, crash.stderr[-3000:]
    ckpts = out / "checkpoints"
    assert (ckpts / ".tmp-step_00000006").is_dir() and not (ckpts / "step_00000006").exists()
    assert (ckpts / "latest").read_text().strip() == "step_00000004" and verify(ckpts / "step_00000004") is None

    again = train_cli([*base, "--steps", "8", "--resume"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout and "at step 4" in again.stdout
    names = sorted(p.name for p in ckpts.iterdir())
    assert names == ["latest", "step_00000006", "step_00000008"], names  # tiny keeps 2; .tmp-* removed


def _mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a small tmpfs (root only); returns why not when it cannot."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                         capture_output=True, text=True)
    return None if res.returncode == 0 else f"mount -t tmpfs failed: {res.stderr.strip()}"


def test_disk_full_during_save_is_one_clear_error_and_keeps_previous(tmp_path, checkpoint_mode):
    disk = tmp_path / "disk"
    why = _mount_tmpfs(disk, "2600k")  # room for one checkpoint of this model (~1.8 MB), not two
    if why:
        pytest.skip(why)
    try:
        out = disk / "run"
        res = train_cli(["run", "--out", str(out), "--steps", "6", "--checkpoint-every", "2", *SMALL, *checkpoint_mode])
        err = res.stderr
        assert res.returncode == 1, err[-3000:]
        lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
        assert "checkpoint save at step 4 failed on rank 0: No space left on device" in lines[0]
        assert "step_00000002 is still the latest complete checkpoint" in lines[0]
        ckpts = out / "checkpoints"
        assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000002"]
        assert verify(ckpts / "step_00000002") is None
        state = load_dcp(ckpts / "step_00000002", "model.")
        assert state and all(torch.isfinite(t).all() for t in state.values())
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_resume_from_per_rank_state_of_another_shape_is_one_line(tmp_path):
    """An extra_rank0.pt that torch.load(weights_only=True) reads (a list) and the manifest
    matches: resume stops with one line naming the checkpoint (it was a TypeError traceback)."""
    import io

    out = tmp_path / "run"
    assert train_cli(["run", "--out", str(out), "--steps", "2", *SMALL]).returncode == 0
    ckpt = out / "checkpoints" / "step_00000002"
    buf = io.BytesIO()
    torch.save([1, 2, 3], buf)
    (ckpt / "extra_rank0.pt").write_bytes(buf.getvalue())
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["extra_rank0.pt"] = len(buf.getvalue())
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    res = train_cli(["run", "--out", str(out), "--steps", "4", "--resume", *SMALL])
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert len(lines) == 1 and "step_00000002: its per-rank state (extra_rank0.pt) is not what this program writes" \
        in lines[0], res.stderr[-3000:]


def test_a_checkpoint_of_another_model_stops_the_resume_without_an_older_one(tmp_path):
    """`--resume --allow-config-change` with another model shape: the newest checkpoint does not
    fit, and an older one that happens to fit (here: one of a dim-96 run) is not taken in its
    place, which would silently drop the newer steps. One line, exit 2, nothing on disk changed."""
    import hashlib

    common = ["--set", "data.source=synthetic", "--set", "checkpoint.every=2", *SMALL]
    other, run = tmp_path / "other", tmp_path / "run"
    for out, dim, steps in ((other, 96, 2), (run, 64, 4)):
        res = train_cli(["run", *common, "--set", f"model.dim={dim}", "--steps", str(steps), "--out", str(out)])
        assert res.returncode == 0, res.stderr
    shutil.rmtree(run / "checkpoints" / "step_00000002")
    shutil.copytree(other / "checkpoints" / "step_00000002", run / "checkpoints" / "step_00000002")

    def digest() -> dict:
        return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(run.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}

    before = digest()
    res = train_cli(["run", *common, "--set", "model.dim=96", "--steps", "6", "--out", str(run), "--resume",
                     "--allow-config-change"])
    assert res.returncode == 2, res.stderr
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "step_00000004 holds another model than this run's" in err[0], res.stderr
    assert "model.tok_embeddings.weight is [256, 64] there, [256, 96] here" in err[0]
    assert "Traceback" not in res.stderr and "falling back" not in res.stderr
    assert digest() == before
