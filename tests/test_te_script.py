"""scripts/gpu/te.sh, which carries Transformer Engine to a GPU machine in parts: bad use is one
line and exit 2, a part that is not there is named, and install refuses until every part has
arrived. (Its download and build run on the machines they are for: prepare needs the package
registry, install nvcc and a CUDA torch.)"""

import os
import subprocess
from pathlib import Path

import pytest

from testlib import ROOT

SCRIPT = ROOT / "scripts" / "gpu" / "te.sh"


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, TMPDIR=str(tmp_path))
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("args, culprit", [((), "usage"), (("nosuch",), "usage"), (("receive",), "which part"),
                                           (("receive", "99"), ".te/p99")])
def test_bad_use_is_one_line_and_exit_2(args, culprit, tmp_path):
    proc = _run(*args, tmp_path=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and culprit in proc.stderr


def test_install_refuses_without_every_part(tmp_path):
    if Path("/tmp/te-site/.done").exists() or Path("/tmp/te-parts").exists():
        pytest.skip("this machine holds a TE install or parts in /tmp (a device machine)")
    proc = _run("install", tmp_path=tmp_path)
    assert proc.returncode == 2 and "receive" in proc.stderr and "/tmp/te-parts" in proc.stderr
    proc = _run("measure", tmp_path=tmp_path)
    assert proc.returncode == 2 and "which part" in proc.stderr
    proc = _run("measure", "1b", tmp_path=tmp_path)
    assert proc.returncode == 2 and "install" in proc.stderr
