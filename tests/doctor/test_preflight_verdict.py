"""`train preflight`'s verdict (train/nodecheck.py) on measured numbers, and its bad inputs.
The measurement itself runs on the emulated cluster (tests/cluster/test_preflight.py)."""

import subprocess
import sys

import pytest

from train.nodecheck import EXIT_BROKEN, EXIT_OK, EXIT_SLOW, verdict


def _result(hosts, bw: dict, problems=None, ar=1.0):
    facts = [{"host": h, "node_rank": i, "local_rank": 0, "problems": (problems or {}).get(h, [])}
             for i, h in enumerate(hosts)]
    pairs = [{"src": s, "dst": d, "src_host": hosts[s], "dst_host": hosts[d], "seconds": 0.1, "GBps": v}
             for (s, d), v in bw.items()]
    return {"facts": facts, "leaders": list(range(len(hosts))), "pairs": pairs,
            "all_reduce": {"busbw_GBps": ar}}


def test_healthy_nodes_pass():
    v = verdict(_result(["a", "b"], {(0, 1): 1.1, (1, 0): 1.2}), 1.0, 0.5)
    assert v["code"] == EXIT_OK and v["line"].startswith("preflight: PASS: 2 node(s)")


def test_two_nodes_one_slow_direction_names_its_sender():
    v = verdict(_result(["a", "b"], {(0, 1): 1.1, (1, 0): 0.01}), 1.0, 0.5)
    assert v["code"] == EXIT_SLOW and list(v["slow"]) == ["b"]
    assert "FAIL (slow node: b)" in v["line"] and "0.5 x 1 GB/s declared" in v["line"]


def test_two_nodes_both_directions_slow_names_both():
    v = verdict(_result(["a", "b"], {(0, 1): 0.01, (1, 0): 0.01}), 1.0, 0.5)
    assert list(v["slow"]) == ["a or b"] and "both ways" in v["line"]


def test_three_nodes_name_the_one_whose_links_are_all_slow():
    bw = {(0, 1): 1.0, (1, 2): 0.01, (2, 0): 0.01, (0, 2): 0.01, (1, 0): 1.0, (2, 1): 0.01}
    v = verdict(_result(["n0", "n1", "n2"], bw), 1.0, 0.5)
    assert v["code"] == EXIT_SLOW and list(v["slow"]) == ["n2"]


def test_without_a_declared_busbw_nodes_are_compared_with_each_other():
    bw = {(0, 1): 5.0, (1, 2): 5.0, (2, 3): 5.0, (3, 0): 0.1, (0, 3): 5.0, (1, 0): 5.0, (2, 1): 5.0, (3, 2): 0.2}
    v = verdict(_result(["n0", "n1", "n2", "n3"], bw), None, 0.5)
    assert list(v["slow"]) == ["n3"] and "median pair" in v["line"]


def test_a_broken_node_wins_over_slowness_and_a_slow_fabric_is_reported():
    v = verdict(_result(["a", "b"], {(0, 1): 1.0, (1, 0): 1.0}, {"b": ["NCCL unusable"]}), 1.0, 0.5)
    assert v["code"] == EXIT_BROKEN and "FAIL (broken node: b)" in v["line"]
    v = verdict(_result(["a", "b"], {(0, 1): 1.0, (1, 0): 1.0}, ar=0.1), 1.0, 0.5)
    assert v["code"] == EXIT_SLOW and "the fabric itself is slow" in v["line"]


@pytest.mark.parametrize("args, culprit", [(["--min-fraction", "2"], "--min-fraction"),
                                           (["--expect-busbw", "-1"], "--expect-busbw"),
                                           (["--bytes", "lots"], "--bytes")])
def test_bad_inputs_are_one_line_exit_2(args, culprit):
    proc = subprocess.run([sys.executable, "-m", "train", "preflight", *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and culprit in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
