"""FP8 is refused, before any process group, wherever it cannot run: one line naming
what is missing (GPU, compute capability, sm_100 for MXFP8, the library), exit 2 from
the CLI; no silent fallback to bf16."""

from __future__ import annotations

import pytest

from testlib import train_cli
from train.config import load_config
from train.errors import ConfigError
from train.precision.fp8 import float8_problem


def fp8(backend, recipe="auto"):
    return load_config(None, [f"fp8.backend={backend}", f"fp8.recipe={recipe}"]).fp8


@pytest.mark.parametrize("backend,recipe,cap,installed,expect", [
    ("torchao", "tensorwise", None, True, "no GPU"),
    ("te", "current", None, True, "no GPU"),
    ("torchao", "tensorwise", (8, 0), True, "sm_80 (A100)"),
    ("te", "delayed", (8, 6), True, "compute capability >= 8.9"),
    ("torchao", "mxfp8", (9, 0), True, "MXFP8 needs a sm_100 GPU"),
    ("te", "mxfp8", (12, 0), True, "use fp8.recipe=current"),
    ("torchao", "rowwise", (8, 9), True, "need sm_90"),
    ("torchao", "tensorwise", (9, 0), False, "torchao package is not installed"),
    ("te", "current", (9, 0), False, "transformer_engine package is not installed"),
])
def test_float8_problem_names_what_is_missing(backend, recipe, cap, installed, expect):
    problem = float8_problem(fp8(backend, recipe), cap, installed)
    assert problem and expect in problem, problem
    assert "\n" not in problem and problem.startswith(f"fp8.backend={backend}")


@pytest.mark.parametrize("backend,recipe,cap", [
    ("torchao", "tensorwise", (8, 9)), ("torchao", "rowwise", (9, 0)), ("torchao", "mxfp8", (10, 0)),
    ("te", "current", (12, 0)), ("te", "mxfp8", (10, 0)), ("none", "auto", None),
])
def test_float8_allowed_where_it_runs(backend, recipe, cap):
    assert float8_problem(fp8(backend, recipe), cap, True) is None


def test_torchao_mxfp8_needs_a_recent_torch():
    problem = float8_problem(fp8("torchao", "mxfp8"), (10, 0), True, mx_supported=False)
    assert "needs a newer torch" in problem


def test_te_refuses_dtensor_tp_compile_and_torch_checkpointing():
    assert "tensor parallelism" in float8_problem(fp8("te", "current"), (9, 0), True, tp=2)
    assert "compile" in float8_problem(fp8("te", "current"), (9, 0), True, compile=True)
    assert "parallel.ac=full" in float8_problem(fp8("te", "current"), (9, 0), True, ac="full")


def test_recipe_defaults_and_validation():
    assert fp8("torchao").resolved_recipe == "tensorwise"
    assert fp8("te").resolved_recipe == "current"
    with pytest.raises(ConfigError, match="fp8.recipe: 'tensorwise' is not a te recipe"):
        fp8("te", "tensorwise")
    with pytest.raises(ConfigError, match="fp8.backend"):
        fp8("int4")
    assert fp8("none", "rowwise").recipe == "rowwise"  # FP8 switched off, its recipe kept: fine
    with pytest.raises(ConfigError, match="fp8.recipe: 'rowise' is no recipe of torchao or te"):
        fp8("none", "rowise")


def test_fp8_on_cpu_is_a_one_line_config_error_exit_2(tmp_path):
    res = train_cli(["run", "--config", "tiny", "--steps", "1", "--out", str(tmp_path / "run"),
                     "--set", "fp8.backend=torchao", "--set", "train.device=cpu"])
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: fp8.backend=torchao") and "no GPU" in lines[0]
    assert not (tmp_path / "run").exists(), "nothing may be created before the check"


def test_fsdp_with_fp16_and_offload_on_cpu_are_config_errors():
    from train.preflight import check_job

    with pytest.raises(ConfigError, match="fp16 is not supported with parallel.strategy=fsdp"):
        check_job(load_config(None, ["parallel.strategy=fsdp", "train.precision=fp16"]), 2)
    with pytest.raises(ConfigError, match="cpu_offload"):
        check_job(load_config(None, ["parallel.strategy=fsdp", "parallel.cpu_offload=true",
                                     "train.device=cpu"]), 2)
    with pytest.raises(ConfigError, match="cpu_offload: needs parallel.strategy=fsdp"):
        load_config(None, ["parallel.cpu_offload=true"])
