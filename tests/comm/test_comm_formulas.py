"""Pure functions of the communication benches and config (no processes)."""

import pytest

from train.bench.bandwidth import OPS, algbw, bus_factor, busbw
from train.bench.comm_args import parse_size, size_range
from train.bench.compression import timing_window, variant_overrides
from train.bench.links import LINKS, emulate_link
from train.config import load_config
from train.errors import ConfigError


@pytest.mark.parametrize("n,ar,gather", [(2, 1.0, 0.5), (4, 1.5, 0.75), (8, 1.75, 0.875)])
def test_bus_factors_match_nccl_tests(n, ar, gather):
    assert bus_factor("all_reduce", n) == pytest.approx(ar)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(op, n) == pytest.approx(gather)
    assert bus_factor("broadcast", n) == 1.0
    assert bus_factor("send_recv", n) == 1.0


def test_algbw_and_busbw():
    # 1 GiB all_reduce in 6.5 ms on 2 ranks: algbw 165.2 GB/s, busbw the same (factor 1)
    size = 1 << 30
    assert algbw(size, 6.5e-3) == pytest.approx(size / 6.5e-3 / 1e9)
    assert busbw("all_reduce", size, 6.5e-3, 2) == pytest.approx(algbw(size, 6.5e-3))
    assert busbw("all_reduce", size, 1.0, 8) == pytest.approx(size / 1e9 * 1.75)
    assert busbw("all_gather", 1e9, 2.0, 4) == pytest.approx(0.375)
    with pytest.raises(ValueError):
        bus_factor("gather", 2)
    assert set(OPS) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"}


def test_sizes():
    assert parse_size("8") == 8
    assert parse_size("64K") == 65536
    assert parse_size("1M") == 1 << 20
    assert parse_size("4G") == 4 << 30
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("512mb") == 512 << 20
    with pytest.raises(ValueError):
        parse_size("lots")
    assert size_range(8, 64, 2) == [8, 16, 32, 64]
    assert size_range(1 << 20, 1 << 30, 4)[-1] == 1 << 30
    with pytest.raises(ValueError):
        size_range(64, 8, 2)


def test_emulate_link_sets_documented_nccl_switches():
    env = {}
    assert emulate_link("ethernet", env) == env == {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
                                                     "NCCL_IB_DISABLE": "1"}
    env = {"NCCL_P2P_DISABLE": "1"}
    emulate_link("nvlink", env)
    assert env["NCCL_P2P_DISABLE"] == "0"
    assert emulate_link("pcie", {})["NCCL_P2P_DISABLE"] == "1"
    assert emulate_link(None, env) == {}
    with pytest.raises(ValueError):
        emulate_link("infiniband", {})
    assert set(LINKS) == {"nvlink", "pcie", "ethernet"}


def test_compression_bench_helpers():
    assert variant_overrides("powersgd:8") == ("powersgd r=8", ["comm.hook=powersgd", "comm.powersgd_rank=8",
                                                                   "comm.powersgd_impl=train"])
    assert variant_overrides("topk:0.01")[0] == "topk 1%"
    assert variant_overrides("localsgd:4")[1] == ["comm.hook=localsgd", "comm.localsgd_period=4"]
    with pytest.raises(ValueError):
        variant_overrides("qsgd")
    # 30 steps, compression from step 4 on, settle 2 more: steps 7..30 (24 = 6 LocalSGD periods of 4)
    assert timing_window(30, 3, 4) == (7, 30)
    assert timing_window(20, 3, 4) == (9, 20)
    lo, hi = timing_window(5, 3, 4)
    assert 1 <= lo <= hi == 5


def test_comm_config_validation():
    job = load_config("tiny", ["comm.hook=topk", "comm.topk_ratio=0.05", "comm.measure=true"])
    assert job.comm.topk_ratio == 0.05 and job.comm.measure
    for bad in ("comm.hook=qsgd", "comm.topk_ratio=0", "comm.topk_ratio=1.5", "comm.powersgd_start_iter=1",
                "comm.topk_start_iter=0", "comm.localsgd_period=0", "comm.powersgd_rank=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config("tiny", [bad])
