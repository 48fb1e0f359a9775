"""parallel.fsdp_symm_mem: where ``auto`` turns FSDP2's symmetric-memory all-gather on, the NCCL
variable the trainer sets for it, and the settings it refuses (the GPU side is in
test_parallel_gpu.py; on gloo the fallback trains as DDP does, test_parallel_equivalence.py)."""

from __future__ import annotations

import pytest

from testlib import load_job
from train.errors import ConfigError
from train.parallel import symm_comm


@pytest.fixture
def nccl_228(monkeypatch):
    """A CUDA build with NCCL 2.28.9, one node of 2 ranks, no CTA policy in the environment."""
    monkeypatch.setattr(symm_comm, "_nccl_version", lambda: (2, 28, 9))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("NCCL_CTA_POLICY", raising=False)


FSDP = ["parallel.strategy=fsdp", "train.device=cuda"]


@pytest.mark.parametrize("overrides, env, expected", [
    (FSDP, {}, "all_gather"),
    (FSDP + ["parallel.fsdp_symm_mem=none"], {}, "none"),
    (FSDP + ["parallel.fsdp_symm_mem=all"], {}, "all"),
    ([], {}, "none"),  # DDP
    (FSDP + ["parallel.cpu_offload=true"], {}, "none"),
    (["parallel.strategy=fsdp"], {}, "none"),  # testlib's BASE: train.device=cpu
    (FSDP + ["comm.small_reduce=symm_mem"], {}, "none"),
    (FSDP, {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}, "none"),  # two nodes
    (FSDP, {"NCCL_CTA_POLICY": "1"}, "none"),  # the environment chose another policy
    (FSDP, {"NCCL_CTA_POLICY": "2"}, "all_gather"),
], ids=["fsdp", "none", "all", "ddp", "offload", "cpu", "small_reduce_symm", "two_nodes", "policy1", "policy2"])
def test_auto_turns_on_only_where_measured(nccl_228, monkeypatch, overrides, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    job = load_job(overrides)
    assert symm_comm.resolved_mode(job) == expected
    want_env = {"NCCL_CTA_POLICY": "2"} if expected != "none" and "NCCL_CTA_POLICY" not in env else {}
    assert symm_comm.nccl_env(job) == want_env


def test_auto_is_off_before_nccl_2_28(nccl_228, monkeypatch):
    monkeypatch.setattr(symm_comm, "_nccl_version", lambda: (2, 27, 7))
    job = load_job(FSDP)
    assert symm_comm.resolved_mode(job) == "none" and symm_comm.nccl_env(job) == {}


def test_auto_is_off_without_cuda():
    """This machine (no GPU): nothing to set, nothing applied."""
    job = load_job(FSDP)
    if symm_comm._nccl_version():
        pytest.skip("CUDA present")
    assert symm_comm.resolved_mode(job) == "none" and symm_comm.nccl_env(job) == {}


@pytest.mark.parametrize("overrides, culprit", [
    (FSDP + ["parallel.fsdp_symm_mem=all_gather", "comm.small_reduce=symm_mem"], "comm.small_reduce=symm_mem"),
    (FSDP + ["parallel.fsdp_symm_mem=all", "parallel.cpu_offload=true"], "parallel.cpu_offload"),
    (FSDP + ["parallel.fsdp_symm_mem=some"], "must be auto, none, all_gather or all"),
])
def test_refused_settings_name_the_culprit(overrides, culprit):
    with pytest.raises(ConfigError, match="parallel.fsdp_symm_mem") as info:
        load_job(overrides)
    assert culprit in str(info.value)
