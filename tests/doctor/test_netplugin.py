"""train/doctor/netplugin.py: which NCCL net plugin NCCL would dlopen, probed in a child process.

The libraries are real shared objects built with the C compiler for each test (a file that
only looks like one would not load); the environment is simulated, no NCCL is involved."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from train.doctor import netplugin

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc/gcc) to build test plugins")


def build_so(path: Path, source: str, *link: str) -> Path:
    src = path.with_suffix(".c")
    src.write_text(source)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(path), str(src), *link], check=True, capture_output=True)
    return path


PLUGIN_V8 = "struct s { const char *name; }; struct s ncclNetPlugin_v8 = {\"Fake\"};\n"
PLUGIN_V6_V10 = "int ncclNetPlugin_v6 = 6; int ncclNetPlugin_v10 = 10;\n"


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NCCL_NET_PLUGIN", "LD_LIBRARY_PATH")}
    env.update(extra)
    return env


def test_candidates_follow_nccl_order():
    assert netplugin.candidates(None) == ["libnccl-net.so"]
    assert netplugin.candidates("ofi") == ["ofi", "libnccl-net-ofi.so"]
    assert netplugin.candidates("/opt/p/libx.so") == ["/opt/p/libx.so", "libnccl-net-/opt/p/libx.so.so"]


def test_nothing_on_the_search_path(tmp_path):
    got = netplugin.probe(env_with(LD_LIBRARY_PATH=str(tmp_path)))
    assert got.path is None and got.error is None and not got.usable
    assert got.tried == ["libnccl-net.so"]
    assert got.line == ("NCCL net plugin: none found (tried libnccl-net.so); NCCL uses its internal "
                        "IB/socket transports (NCCL_NET_PLUGIN unset)")


def test_default_name_found_through_ld_library_path(tmp_path):
    so = build_so(tmp_path / "libnccl-net.so", PLUGIN_V8)
    got = netplugin.probe(env_with(LD_LIBRARY_PATH=str(tmp_path)))
    assert got.usable and got.path == str(so.resolve()) and got.symbol == "ncclNetPlugin_v8"
    assert got.line == f"NCCL net plugin: {so.resolve()} (ncclNetPlugin_v8; NCCL_NET_PLUGIN unset)"
    assert got.as_dict() == {"env": None, "tried": ["libnccl-net.so"], "path": str(so.resolve()),
                             "symbol": "ncclNetPlugin_v8", "usable": True, "error": None, "line": got.line}


def test_named_plugin_reports_the_newest_symbol_and_resolves_symlinks(tmp_path):
    real = build_so(tmp_path / "libnccl-net-ofi.so.1", PLUGIN_V6_V10)
    (tmp_path / "libnccl-net-ofi.so").symlink_to(real.name)
    got = netplugin.probe(env_with(LD_LIBRARY_PATH=str(tmp_path), NCCL_NET_PLUGIN="ofi"))
    assert got.tried == ["ofi", "libnccl-net-ofi.so"]
    assert got.path == str(real.resolve()) and got.symbol == "ncclNetPlugin_v10"
    assert "NCCL_NET_PLUGIN=ofi" in got.line


def test_path_value_is_opened_as_given(tmp_path):
    so = build_so(tmp_path / "custom.so", PLUGIN_V8)
    got = netplugin.probe(env_with(NCCL_NET_PLUGIN=str(so)))
    assert got.tried == [str(so)] and got.path == str(so.resolve()) and got.usable


def test_none_means_internal_transports(tmp_path):
    build_so(tmp_path / "libnccl-net.so", PLUGIN_V8)  # present, but not asked for
    got = netplugin.probe(env_with(LD_LIBRARY_PATH=str(tmp_path), NCCL_NET_PLUGIN="none"))
    assert got.path is None and got.tried == ["none", "libnccl-net-none.so"]
    assert "none found" in got.line and "internal IB/socket" in got.line


def test_library_without_plugin_symbol_is_ignored(tmp_path):
    so = build_so(tmp_path / "libnccl-net.so", "int unrelated = 1;\n")
    got = netplugin.probe(env_with(LD_LIBRARY_PATH=str(tmp_path)))
    assert got.path == str(so.resolve()) and got.symbol is None and not got.usable
    assert "exports no ncclNetPlugin_v* symbol" in got.line


def test_missing_dependency_is_a_load_failure_not_absence(tmp_path):
    dep = build_so(tmp_path / "libfakefabric.so", "int fi_fake(void) { return 0; }\n")
    build_so(tmp_path / "libnccl-net.so", "int fi_fake(void); int ncclNetPlugin_v8 = 8;\n"
             "int use(void) { return fi_fake(); }\n", f"-L{tmp_path}", "-lfakefabric")
    dep.unlink()
    got = netplugin.probe(env_with(LD_LIBRARY_PATH=str(tmp_path)))
    assert got.path is None and "libfakefabric.so" in got.error
    assert got.line.startswith("NCCL net plugin: FAILS to load (") and "\n" not in got.line


def test_probe_failure_is_reported_in_one_line(monkeypatch):
    monkeypatch.setattr(netplugin.sys, "executable", "/nonexistent/python")
    got = netplugin.probe(env_with())
    assert got.line.startswith("NCCL net plugin: could not probe: ") and not got.usable


def test_doctor_reports_the_plugin_and_fails_when_an_asked_for_one_does_not_load(tmp_path):
    """`train doctor` prints the plugin line; a plugin named by NCCL_NET_PLUGIN that does
    not load (the efa fabric outside the EFA image) is a problem: exit 1, named."""

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "NCCL_NET_PLUGIN": "ofi", "LD_LIBRARY_PATH": str(tmp_path)}
    text = subprocess.run([sys.executable, "-m", "train", "doctor"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert text.returncode == 1, text.stderr
    assert "NCCL net plugin" in text.stdout and "libnccl-net-ofi.so" in text.stdout
    env.pop("NCCL_NET_PLUGIN")
    js = subprocess.run([sys.executable, "-m", "train", "doctor", "--json"], env=env, capture_output=True,
                        text=True, timeout=120)
    report = json.loads(js.stdout)
    assert report["net_plugin"]["tried"] == ["libnccl-net.so"] and report["net_plugin"]["usable"] is False
    assert not any("net plugin" in p for p in report["problems"])  # none asked for: not a problem
