"""How ``train bench comm`` times an operation (train/bench/comm_timing.py), on CPU with 2 gloo
processes: only the host column there, the slowest rank's median, the calls sized to
``--max-seconds``; and ``train preflight``'s busbw threshold (train/nodecheck.py), which
uses the same timing, against a busbw taken from ``train bench comm``."""

from __future__ import annotations

import json

import torch

from testlib import spawn, torchrun


def _timer_worker(rank, world, out):
    import time

    import torch.distributed as dist

    from train.bench.comm_timing import Timer

    calls = [0]

    def fn():  # rank 1 is ten times slower than rank 0
        calls[0] += 1
        time.sleep(0.001 if rank == 0 else 0.010)

    timer = Timer(torch.device("cpu"), iters=6, warmup=3, max_seconds=30.0)
    t = timer.measure(fn)
    t_calls = calls[0]
    planned = timer.plan(0.010)
    short = Timer(torch.device("cpu"), iters=20, warmup=3, max_seconds=0.05)
    calls_before = calls[0]
    s = short.measure(fn)
    short_calls = calls[0] - calls_before
    # preflight's way: iters below 3 stay as given, and no set-up call (the caller made it)
    calls_before = calls[0]
    p = Timer(torch.device("cpu"), iters=2, warmup=1, max_seconds=0.05).measure(fn, set_up=False)
    result = {"t": t, "calls": t_calls, "planned": planned, "short": s, "short_calls": short_calls,
              "pre": p, "pre_calls": calls[0] - calls_before}
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        torch.save(gathered, out)


def test_timer_on_gloo_reports_the_slowest_ranks_host_time_only(tmp_path):
    out = tmp_path / "timer.pt"
    spawn(_timer_worker, 2, out)
    by_rank = torch.load(out, weights_only=False)
    for r in by_rank:
        t = r["t"]
        # CPU: no device or graph time; the bandwidth basis is the host time
        assert t.device_s is None and t.graph_s is None and t.columns() == {"host_us": t.host_s * 1e6}
        assert t.seconds() == t.host_s
        # every rank reports the slowest rank's median: rank 1's 10 ms, not rank 0's 1 ms
        assert 0.010 <= t.host_s < 0.050, t
        # 30 s allow 5 batches of 6 calls; the first two calls and 1 warm-up call are not timed
        assert (t.iters, t.batches) == (6, 5) and r["calls"] == 2 + 1 + 5 * 6
        assert r["planned"] == (6, 5, 1)
        # 0.05 s for a 10 ms call: one batch of the minimum 3 calls
        s = r["short"]
        assert (s.iters, s.batches) == (3, 1) and r["short_calls"] == 2 + 0 + 3 and s.host_s >= 0.010
        pre = r["pre"]
        assert (pre.iters, pre.batches) == (2, 1) and r["pre_calls"] == 1 + 0 + 2
    assert by_rank[0]["t"].host_s == by_rank[1]["t"].host_s


def test_preflight_threshold_against_bench_comm_busbw(tmp_path):
    """The busbw a site declares from ``train bench comm`` (large messages) is what
    ``train preflight`` compares its own all-reduce with: the same timing, so a healthy
    link passes at a fraction of it, and a declared value far above it fails."""
    bench = tmp_path / "bench"
    r = torchrun(["bench", "comm", "--backend", "gloo", "--ops", "all_reduce", "--min-bytes", "16M",
                  "--max-bytes", "16M", "--no-p2p", "--no-raw", "--iters", "3", "--out", str(bench)], timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads((bench / "comm.json").read_text())["rows"][0]
    measured = row["busbw_GBps"]
    assert row["bytes"] == 16 << 20 and measured > 0

    report = tmp_path / "preflight.json"
    # a fraction of 0.05: the two runs are minutes apart on a shared 2-core machine (other tests' load)
    ok = torchrun(["preflight", "--expect-busbw", f"{measured:.6g}", "--min-fraction", "0.05", "--bytes", "16M",
                   "--iters", "3", "--json", str(report)], timeout=240)
    assert ok.returncode == 0, ok.stderr[-3000:]
    data = json.loads(report.read_text())
    ar = data["all_reduce"]
    assert ar["timing"] == "host_us" and ar["busbw_GBps"] > 0.05 * measured
    assert ar["busbw_GBps"] == __import__("pytest").approx((16 << 20) / ar["seconds"] / 1e9)  # 2 ranks: factor 1
    assert data["verdict"]["code"] == 0 and "preflight: PASS" in ok.stdout

    slow = torchrun(["preflight", "--expect-busbw", f"{measured * 1000:.6g}", "--min-fraction", "0.5",
                     "--bytes", "16M", "--iters", "3"], timeout=240)
    assert slow.returncode != 0
    assert "the fabric itself is slow" in slow.stderr + slow.stdout, slow.stderr[-3000:]
