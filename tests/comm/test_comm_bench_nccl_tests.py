"""scripts/gpu/comm_vs_nccl_tests.sh and its comparison (scripts/gpu/nccl_tests_compare.py) on CPU:
nccl-tests' table as its binaries print it, paired with ``train bench comm``'s columns, and the
10% check; the script itself is shellcheck-clean, keeps multicast off and pins its source."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testlib import ROOT, load_script
from train.bench.comm_timing import timing_columns

compare = load_script("gpu/nccl_tests_compare")


def _nt_line(nbytes: int, redop: str, oop: tuple, ip: tuple, wrong: str = "0") -> str:
    """One data line in nccl-tests' own format (src/util.cu: '%12li  %12li  %8s  %6s  %6s', then
    per side '  %7s  %6s  %6s  %6s')."""
    line = "%12li  %12li  %8s  %6s  %6i" % (nbytes, nbytes // 4, "float", redop, -1)
    for t, alg, bus in (oop, ip):
        line += "  %7s  %6s  %6s  %6s" % (f"{t:.2f}", f"{alg:.2f}", f"{bus:.2f}", wrong)
    return line


def _nt_text() -> str:
    head = ["# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809",
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)"]
    out = []
    for variant, scale, wrong in (("default", 1.0, "0"), ("graph", 0.5, "N/A"), ("blocking", 1.8, "N/A"),
                                  ("threads", 0.9, "N/A")):
        out.append(f"### variant={variant} op=all_reduce: all_reduce_perf -b 8K -e 1G -f 2 -g 2")
        out += head
        out.append(_nt_line(8192, "sum", (20.0 * scale, 0.4, 0.4), (13.0 * scale, 0.6, 0.6), wrong))
        out.append(_nt_line(1 << 30, "sum", (3500.0 * scale, 306.8, 306.8), (3430.0 * scale, 313.0, 313.0), wrong))
        out.append("# Avg bus bandwidth    : 157.2")
        out.append(f"### variant={variant} op=all_gather: all_gather_perf -b 8K -e 1G -f 2 -g 2")
        out += head
        out.append(_nt_line(8192, "none", (10.0 * scale, 0.8, 0.4), (9.0 * scale, 0.9, 0.45), wrong))
        out.append("### exit 0")
    return "\n".join(out) + "\n"


def _bench_rows() -> list[dict]:
    cols = timing_columns(cuda=True, graph=True)
    assert cols == ["device_us", "graph_us", "host_us"]

    def row(op, size, nbytes, dev, graph, host, busbw):
        return {"op": op, "dtype": "float32", "size": size, "bytes": nbytes, **dict(zip(cols, (dev, graph, host))),
                "busbw_GBps": busbw}
    return [row("all_reduce", "8K", 8192, 13.5, 8.0, 60.0, 0.6),         # in place: 13.0 -> 1.04x; graph 6.5 -> 1.23x
            row("all_reduce", "1G", 1 << 30, 3480.0, 1700.0, 70.0, 308.6),  # 1.01x; graph 1715 -> 0.99x
            row("all_gather", "8K", 8192, 12.5, 5.0, 55.0, 0.33),        # out of place: 10.0 -> 1.25x; graph 1.0x
            row("broadcast", "8K", 8192, 9.0, 5.0, 50.0, 0.9)]           # not an op nccl-tests ran here


def test_parse_takes_every_variant_and_both_sides():
    parsed = compare.parse_nccl_tests(_nt_text())
    assert set(parsed) == {"default", "graph", "blocking", "threads"}
    ar = parsed["default"]["all_reduce"]
    assert set(ar) == {8192, 1 << 30}
    assert ar[8192] == {"oop_us": 20.0, "oop_busbw": 0.4, "ip_us": 13.0, "ip_busbw": 0.6}
    assert parsed["graph"]["all_reduce"][1 << 30]["ip_us"] == pytest.approx(1715.0)  # '#wrong' N/A with -c 0
    assert compare._nt(parsed, "default", "all_gather", 8192) == (10.0, 0.4)  # out of place for all_gather
    assert compare._nt(parsed, "default", "reduce_scatter", 8192) == (None, None)


def test_compare_pairs_device_with_the_loop_and_graph_with_graphs():
    parsed = compare.parse_nccl_tests(_nt_text())
    rows = {(r["op"], r["size"]): r for r in compare.compare(parsed, _bench_rows())}
    assert set(rows) == {("all_reduce", "8K"), ("all_reduce", "1G"), ("all_gather", "8K")}
    small = rows[("all_reduce", "8K")]
    assert small["nt_default_us"] == 13.0 and small["device_us_ratio"] == pytest.approx(13.5 / 13.0)
    assert small["device_us_ok"] and not small["graph_us_ok"]  # 8.0 against 6.5: 23% off
    assert small["nt_blocking_us"] == pytest.approx(13.0 * 1.8) and small["nt_threads_us"] == pytest.approx(11.7)
    assert rows[("all_reduce", "1G")]["device_us_ok"] and rows[("all_reduce", "1G")]["graph_us_ok"]
    assert rows[("all_reduce", "1G")]["nt_busbw"] == 313.0
    ag = rows[("all_gather", "8K")]
    assert not ag["device_us_ok"] and ag["graph_us_ok"]
    lines = compare.verdicts(list(rows.values()))
    assert lines[0] == "- device_us vs nccl-tests default: 2 of 3 sizes within 10%: outside at all_gather 8K (1.25x)"
    assert lines[1] == "- graph_us vs nccl-tests graph: 2 of 3 sizes within 10%: outside at all_reduce 8K (1.23x)"
    # the headline: time against -G for small messages, busbw against the default loop for large ones
    assert lines[3] == ("- time up to 4M (device_us vs nccl-tests -G), busbw above (vs nccl-tests' default loop): "
                        "1 of 3 sizes within 10%: outside at all_reduce 8K (time 2.08x), all_gather 8K (time 2.50x)")
    assert rows[("all_reduce", "1G")]["basis"] == "busbw" and rows[("all_reduce", "1G")]["basis_ok"]
    md = "\n".join(compare.table(list(rows.values())))
    assert md.count("\n") == 4 and "| all_gather | 8K | 10.0 | 12.5 | 1.25 | NO |" in md


def test_a_variant_over_two_runs_and_the_one_process_per_gpu_graphs():
    """The script runs each variant over 8K-4M and 8M-1G (nccl-tests sizes its buffers for the
    largest size of a run): both runs' rows land in one table; ``mpi_graph`` (-G under mpirun, one
    process per GPU) is set beside ``graph_us`` with its own verdict."""
    head = "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong"
    text = _nt_text()
    for rng, nbytes, t in (("-b 8K -e 4M", 8192, 6.0), ("-b 8M -e 1G", 1 << 30, 1690.0)):
        text += "\n".join([f"### variant=mpi_graph op=all_reduce: all_reduce_perf {rng} -f 2 -w 5 -g 1 -G 10 -c 0", head,
                           _nt_line(nbytes, "sum", (t, 1.0, 1.0), (t, 1.0, 1.0), "N/A"), "### exit 0"]) + "\n"
    parsed = compare.parse_nccl_tests(text)
    assert set(parsed["mpi_graph"]["all_reduce"]) == {8192, 1 << 30}
    rows = {(r["op"], r["size"]): r for r in compare.compare(parsed, _bench_rows())}
    small, large = rows[("all_reduce", "8K")], rows[("all_reduce", "1G")]
    assert small["nt_mpi_graph_us"] == 6.0 and small["graph_mpi_ratio"] == pytest.approx(8.0 / 6.0)
    assert not small["graph_mpi_ok"] and large["graph_mpi_ok"]
    assert "graph_mpi_ratio" not in rows[("all_gather", "8K")]  # no mpirun run of all_gather
    lines = compare.verdicts(list(rows.values()))
    assert lines[2] == ("- graph_us vs nccl-tests -G one process per GPU (mpirun): 1 of 2 sizes within 10%: "
                        "outside at all_reduce 8K (1.33x)")
    assert "| 6.0 |" in compare.table([small])[2]


def test_symm_mem_wins_names_each_basis():
    latency = [{"size": "4K", "bytes": 4096, "nccl_device_us": 12.0, "one_shot_device_us": 9.0,
                "two_shot_device_us": 10.0, "nccl_graph_us": 6.0, "one_shot_graph_us": 7.0, "two_shot_graph_us": 8.0,
                "nccl_host_us": 60.0, "one_shot_host_us": 30.0, "two_shot_host_us": 31.0},
               {"size": "8K", "bytes": 8192, "nccl_device_us": 12.0, "one_shot_device_us": 14.0,
                "two_shot_device_us": None}]
    lines = compare.symm_mem_wins(latency)
    assert lines[0] == ("- device_us: symmetric memory faster at 4K (one_shot 9.0 vs NCCL 12.0 µs, +25%); "
                        "NCCL faster or equal at 8K (one_shot 14.0 vs NCCL 12.0 µs, -17%)")
    assert lines[1].startswith("- graph_us: symmetric memory faster at no size; NCCL faster or equal at 4K")
    assert lines[2].startswith("- host_us: symmetric memory faster at 4K")


def test_compare_main_writes_markdown_and_json(tmp_path):
    nt = tmp_path / "nccl_tests.txt"
    nt.write_text(_nt_text())
    comm = tmp_path / "comm.json"
    comm.write_text(json.dumps({"meta": {}, "rows": _bench_rows()}))
    r = subprocess.run([sys.executable, str(ROOT / "scripts/gpu/nccl_tests_compare.py"), str(nt), str(comm),
                        "--md", str(tmp_path / "c.md"), "--json", str(tmp_path / "c.json")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "c.json").read_text())
    assert len(data["rows"]) == 3 and data["verdicts"][0].startswith("- device_us vs nccl-tests default: 2 of 3")
    assert "nccl-tests beside train bench comm" in (tmp_path / "c.md").read_text()


SCRIPT = ROOT / "scripts/gpu/comm_vs_nccl_tests.sh"


def test_script_pins_its_source_and_keeps_multicast_off():
    text = SCRIPT.read_text()
    assert re.search(r"^NCCL_TESTS_SHA256=[0-9a-f]{64}$", text, re.M)
    assert re.search(r"^NCCL_TESTS_COMMIT=[0-9a-f]{40}$", text, re.M)
    assert 'sha256sum "$TARBALL"' in text and "source \"$here/common.sh\"" in text
    assert "export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1" in text
    assert "NCCL_NVLS_ENABLE=1" not in text
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        assert op in text
    # nccl-tests over the bench's sizes, in two runs (its buffers sized for each run's largest)
    assert 'RANGES=("-b 8K -e 4M" "-b 8M -e 1G")' in text and "--min-bytes 8K --max-bytes 1G" in text
    assert "-x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS" in text  # mpirun's ranks


def test_script_is_shellcheck_clean():
    tool = shutil.which("shellcheck") or next((str(p) for p in (ROOT / ".venv/bin/shellcheck",
                                                                 Path(sys.executable).parent / "shellcheck")
                                              if p.exists()), None)
    if tool is None:
        pytest.skip("shellcheck is not installed")
    r = subprocess.run([tool, "-x", str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout


def test_script_refuses_a_tarball_whose_sha256_differs(tmp_path):
    if shutil.which("sha256sum") is None:
        pytest.skip("sha256sum is not installed")
    """The source is checked first, before any GPU or build work."""
    bad = tmp_path / "nccl-tests.tar.gz"
    bad.write_bytes(b"not the pinned source")
    r = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
                            "NCCL_TESTS_TARBALL": str(bad)})
    assert r.returncode == 1
    assert f"FAILED: {bad}: sha256 " in r.stdout and "expected 85c65a24" in r.stdout
    assert (tmp_path / "out" / "nccl_tests.txt").read_text() == ""
