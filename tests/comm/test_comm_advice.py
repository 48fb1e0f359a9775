"""train.bench.advice: the one table that picks none / LocalSGD / PowerSGD from a link's busbw."""

import math
from pathlib import Path

import pytest
import yaml

from train.bench import advice
from train.config import load_config
from train.errors import ConfigError


def test_rho_matches_the_measured_socket_link():
    # 2xH200 over sockets: all_reduce busbw 3.67 GB/s (docs/communication.md); 350m at
    # 4x2048 tokens per GPU: 1.4 GB of gradients / 3.67 GB/s = 0.38 s against
    # 6 * 350e6 * 8192 FLOP at 40% of 989 TFLOP/s = 43 ms of compute -> rho ~ 8.8
    n = 350e6
    expected = (4 * n / 3.67e9) / (6 * n * 8192 / (advice.REF_TFLOPS * 1e12))
    assert advice.rho(3.67) == pytest.approx(expected, rel=1e-9)
    assert advice.rho(3.67) == pytest.approx(8.8, abs=0.1)


def test_thresholds_follow_from_the_step_time_model():
    # none vs LocalSGD(P): rho - OVERLAP = rho / P; LocalSGD vs PowerSGD: rho / P = K + rho / C
    p, k, c = advice.LOCALSGD_PERIOD, advice.COMPUTE_OVERHEAD, advice.POWERSGD_RATIO
    r1, r2 = advice.RHO_LOCALSGD, advice.RHO_POWERSGD
    assert r1 - advice.OVERLAP == pytest.approx(r1 / p)
    assert r2 / p == pytest.approx(k + r2 / c)
    assert [row[0] for row in advice.THRESHOLDS] == sorted(row[0] for row in advice.THRESHOLDS)


@pytest.mark.parametrize("busbw, hook", [
    (326.7, "none"),     # NVLink, 2xH200 (measured): every compressor was slower there
    (40.0, "localsgd"),  # rho ~ 0.8
    (3.67, "powersgd"),  # sockets, 2xH200 (measured)
    (1.2, "powersgd"),   # 10 Gbit/s tbf
])
def test_recommendation_per_link(busbw, hook):
    adv = advice.recommend(busbw)
    assert adv.hook == hook
    assert adv.overrides[0] == f"comm.hook={hook}"
    load_config("tiny", adv.overrides)  # every recommendation is a valid config
    assert f"{busbw:.3g} GB/s" in adv.line()


def test_more_compute_per_byte_moves_the_choice():
    # a slower GPU (10 TFLOP/s achieved) on the same 3.67 GB/s link: communication hides
    assert advice.recommend(3.67, tflops=10).hook == "none"
    assert advice.busbw_for_rho(advice.rho(5.0)) == pytest.approx(5.0)
    assert math.isinf(advice.busbw_for_rho(0))
    with pytest.raises(ValueError):
        advice.rho(0)


def test_apply_writes_comm_keys_and_keeps_the_rest(tmp_path):
    cfg = tmp_path / "job.yaml"
    before = "# my notes\nmodel:\n  name: tiny  # small\ncomm:\n  hook: topk\n  topk_ratio: 0.05\n  measure: true\n"
    cfg.write_text(before)
    cfg.chmod(0o600)
    kept = advice.apply_to_config(cfg, advice.recommend(1.2))
    assert kept == str(tmp_path / "job.yaml.before-apply") and Path(kept).read_text() == before  # comments too
    assert cfg.stat().st_mode & 0o777 == 0o600  # a private config stays private
    data = yaml.safe_load(cfg.read_text())
    assert data["model"] == {"name": "tiny"}
    assert data["comm"] == {"measure": True, "hook": "powersgd", "powersgd_rank": 4, "powersgd_start_iter": 10}
    assert load_config(str(cfg)).comm.hook == "powersgd"
    assert advice.apply_to_config(cfg, advice.recommend(1.2)) == str(tmp_path / "job.yaml.before-apply.1")
    fresh = tmp_path / "new.yaml"
    assert advice.apply_to_config(fresh, advice.recommend(40.0)) is None
    assert load_config(str(fresh)).comm.hook == "localsgd"


def test_apply_refuses_a_broken_config_and_leaves_it(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("- not\n- a mapping\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        advice.apply_to_config(cfg, advice.recommend(1.2))
    assert cfg.read_text() == "- not\n- a mapping\n"
    cfg.write_text("train:\n  bogus: 1\n")
    with pytest.raises(ConfigError, match="does not load as a config: train.bogus"):
        advice.apply_to_config(cfg, advice.recommend(1.2))
    assert cfg.read_text() == "train:\n  bogus: 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]
