"""Outputs of the commands other than ``train run``: two writers never share one place and
an earlier result is kept (moved aside, ``train.rundir.move_aside``), never replaced:
bench reports (``OUT/NAME.*``), ``bench compression``'s per-variant runs, and
``train data prepare``'s token file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testlib import torchrun

ROOT = Path(__file__).resolve().parents[2]


def test_bench_report_keeps_the_earlier_one_and_refuses_a_second_writer(tmp_path):
    """A bench rerun moved the earlier NAME.json/.md/.png aside (it replaced them silently);
    its own partial rewrites replace its own files; a second bench on the same --out/--name
    is refused while the first holds it (before, their files interleaved)."""
    from train.bench.report import claim_report, write_report
    from train.errors import RunDirBusy
    from train.rundir import RunLock

    out = tmp_path / "bench"
    out.mkdir()
    (out / "step.json").write_text("earlier\n")
    (out / "step.md").write_text("earlier table\n")
    claim_report(out, "step")
    write_report(out, "step", [{"a": 1}], ["a"])
    write_report(out, "step", [{"a": 1}, {"a": 2}], ["a"])  # a partial report rewritten: its own
    aside = [p for p in out.iterdir() if p.name.startswith("replaced-")]
    assert len(aside) == 1 and (aside[0] / "step.json").read_text() == "earlier\n"
    assert (aside[0] / "step.md").read_text() == "earlier table\n"
    assert len(json.loads((out / "step.json").read_text())["rows"]) == 2

    other = RunLock(out, ".other.report.lock")  # another bench, writing NAME=other
    other.acquire()
    try:
        with pytest.raises(RunDirBusy, match="in use by another run"):
            claim_report(out, "other")
    finally:
        other.release()


def test_bench_report_claim_in_another_process_is_refused(tmp_path):
    code = ("import sys; from pathlib import Path; from train.bench.report import claim_report; "
            "claim_report(Path(sys.argv[1]), 'step'); print('claimed', flush=True); sys.stdin.read()")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RANK", None)
    first = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout.readline().strip() == "claimed"
        second = subprocess.run([sys.executable, "-m", "train", "bench", "step", "--preset", "tiny", "--steps", "1",
                                 "--warmup", "0", "--device", "cpu", "--out", str(tmp_path)],
                                capture_output=True, text=True, env=env, timeout=240)
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert second.returncode == 2 and len(lines) == 1 and "in use by another run" in lines[0], second.stderr
        assert not (tmp_path / "step.json").exists()
    finally:
        first.communicate("", timeout=60)
    assert not (tmp_path / ".step.report.lock").exists(), "released at exit"


def test_compression_keeps_an_earlier_variant_run(tmp_path):
    """--runs-dir DIR with DIR/none holding a file: it was deleted (shutil.rmtree); now the
    earlier directory is moved to DIR/replaced-<time>/none."""
    runs = tmp_path / "runs"
    (runs / "none").mkdir(parents=True)
    (runs / "none" / "precious.txt").write_text("keep me\n")
    r = torchrun(["bench", "compression", "--preset", "tiny", "--steps", "2", "--start-iter", "2",
                  "--loss-window", "1", "--variants", "none", "--no-measure", "--out", str(tmp_path / "bench"),
                  "--runs-dir", str(runs)], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    kept = list(runs.glob("replaced-*/none/precious.txt"))
    assert len(kept) == 1 and kept[0].read_text() == "keep me\n"
    assert (runs / "none" / "metrics.jsonl").is_file() and not (runs / ".train.lock").exists()


def test_prepare_refuses_a_second_preparation_of_one_out(tmp_path):
    """Two `train data prepare --out T` at once: the first removed T.parts/ under the second
    (FileNotFoundError traceback), or one of other inputs replaced the first's finished T.
    Now the second is refused at once, naming the first; a shard has its own lock, and the
    merging run keeps T.parts/ while a shard still writes there."""
    from train.errors import RunDirBusy
    from train.prepare.run import _shards_running, prepare
    from train.rundir import RunLock

    out = tmp_path / "t.bin"
    (tmp_path / "doc.txt").write_text("hello\n")
    with RunLock(tmp_path, ".t.bin.lock"):
        with pytest.raises(RunDirBusy, match="--out .*t.bin.*in use by another run"):
            prepare([str(tmp_path / "doc.txt")], out, "no-such-tokenizer")
    with RunLock(tmp_path, ".t.bin.shard-0-of-2.lock"):
        assert _shards_running(out)
        with pytest.raises(RunDirBusy):
            prepare([str(tmp_path / "doc.txt")], out, "no-such-tokenizer", shard=(0, 2))
    assert not _shards_running(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.txt"]


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only file system (a tmpfs mounted ``ro``): root ignores directory modes, so
    this is the one way a root test machine sees an unwritable output place."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.mark.parametrize("argv", [
    ["-m", "train", "run", "--config", "debug", "--out", "{ro}/run"],
    ["-m", "train", "bench", "comm", "--out", "{ro}/bench"],
    ["-m", "train", "bench", "step", "--device", "cpu", "--preset", "tiny", "--steps", "1", "--out", "{ro}/bench"],
    ["-m", "train", "data", "prepare", "--tokenizer", "gpt2", "--out", "{ro}/sub/tok.bin", str(ROOT / "README.md")],
    ["-m", "launch", "torchrun", "-o", "{ro}/train.sh"],
], ids=["run", "bench-comm", "bench-step", "data-prepare", "launch"])
def test_read_only_output_place_is_a_one_line_usage_error(read_only_dir, argv):
    """An output place on a read-only file system: exit 2 and one line naming it, before any
    work (no traceback, no process group)."""
    args = [a.replace("{ro}", str(read_only_dir)) for a in argv]
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert any(str(read_only_dir) in ln and "not writable" in ln for ln in lines), proc.stderr
