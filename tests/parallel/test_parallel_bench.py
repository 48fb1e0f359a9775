"""``train bench step`` on CPU: a grid in one process, a plan of grids under torchrun
(2 gloo processes); points that cannot run here become rows with their reason."""

from __future__ import annotations

import json
import math

import pytest

from testlib import torchrun, train_cli

SMALL = ["--set", "model.n_layers=2", "--set", "model.dim=64", "--set", "model.n_heads=4",
         "--device", "cpu"]


def _report(out):
    data = json.loads((out / "step.json").read_text())
    assert (out / "step.md").is_file() and (out / "step.png").stat().st_size > 0
    return data["meta"], data["rows"]


def test_bench_step_grid_on_cpu_one_process(tmp_path):
    out = tmp_path / "bench"
    res = train_cli(["bench", "step", "--preset", "tiny", "--ac", "none,full", "--fp8", "none,tensorwise",
                     "--steps", "2", "--warmup", "1", "--seq", "64", "--out", str(out), *SMALL])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| preset | strategy |" in res.stdout
    meta, rows = _report(out)
    assert meta["world_size"] == 1 and "torch" in meta
    assert [(r["fp8"], r["ac"]) for r in rows] == [("none", "none"), ("none", "full"),
                                                   ("tensorwise", "none"), ("tensorwise", "full")]
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 2
    for r in ok:
        assert r["tokens_per_s"] > 0 and r["step_ms"] > 0 and r["gpus"] == 1
        assert r["tokens_per_s"] == r["tokens_per_s_per_gpu"]
        assert len(r["losses"]) == 3 and all(math.isfinite(x) for x in r["losses"])
        assert r["mfu"] is None  # no peak FLOP/s known for a CPU
    # activation checkpointing recomputes, it does not change the numbers
    assert ok[0]["losses"] == ok[1]["losses"]
    for r in rows[2:]:
        assert r["status"].startswith("skipped: fp8.backend=torchao") and "no GPU" in r["status"]


def test_bench_step_plan_under_torchrun_two_processes(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("- {strategy: 'ddp,fsdp'}\n- {strategy: tp, batch: 8}\n- {strategy: hsdp, batch: 4}\n")
    out = tmp_path / "bench"
    res = torchrun(["bench", "step", "--plan", str(plan), "--batch", "4", "--seq", "64", "--steps", "2",
                    "--warmup", "1", "--out", str(out), *SMALL], nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    _, rows = _report(out)
    assert [r["strategy"] for r in rows] == ["ddp", "fsdp", "tp", "hsdp"]
    assert all(r["status"] == "ok" and r["gpus"] == 2 for r in rows), [r["status"] for r in rows]
    assert rows[1]["mesh"] == "dp_replicate=1 x dp_shard=2 x tp=1"
    assert rows[2]["mesh"] == "dp_replicate=1 x dp_shard=1 x tp=2"
    assert rows[3]["mesh"] == "dp_replicate=2 x dp_shard=1 x tp=1"
    # 8 sequences per step everywhere (TP: one data-parallel group of 8): same losses
    for r in rows[1:]:
        for a, b in zip(r["losses"], rows[0]["losses"]):
            assert abs(a - b) < 1e-4 * abs(b), (r["strategy"], r["losses"], rows[0]["losses"])


def test_bench_step_takes_every_model_family_preset(tmp_path):
    """``--preset`` takes the presets of every model family that ``model.name`` takes (GPT-2 here),
    and names them all when it refuses one."""
    out = tmp_path / "bench"
    res = train_cli(["bench", "step", "--preset", "gpt2-124m", "--steps", "1", "--warmup", "1", "--batch", "1",
                     "--seq", "32", "--device", "cpu", "--set", "model.n_layers=1", "--out", str(out)])
    assert res.returncode == 0, res.stderr[-3000:]
    _, rows = _report(out)
    assert [(r["preset"], r["status"]) for r in rows] == [("gpt2-124m", "ok")]
    res = train_cli(["bench", "step", "--preset", "gpt3", "--out", str(tmp_path / "no")])
    assert res.returncode == 2 and "gpt2-124m" in res.stderr and "8b" in res.stderr, res.stderr


def test_bench_step_rejects_unknown_strategy(tmp_path):
    from click.testing import CliRunner

    from train.cli import main

    res = CliRunner().invoke(main, ["bench", "step", "--strategy", "zero3", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "zero3" in res.output


def test_plan_grids_are_checked_before_any_point_runs(tmp_path):
    """A grid's ``set`` must be a list of KEY=VALUE strings (a bare string was split into
    characters, blamed on ``--set 't'``); unknown keys and non-lists are refused too."""
    from train.bench.grid import load_plan
    from train.errors import ConfigError

    defaults = {"preset": "tiny", "set": ["train.seed=1"]}
    plan = tmp_path / "plan.yaml"
    plan.write_text("- {preset: tiny, set: [train.seed=2]}\n")
    assert load_plan(plan, defaults)[0]["set"] == ["train.seed=1", "train.seed=2"]
    for text, why in (("- {set: train.steps=3}\n", "set: expected a list of KEY=VALUE"),
                      ("- {set: [1, 2]}\n", "set: expected a list of KEY=VALUE"),
                      ("- {bogus: 1}\n", "unknown keys 'bogus'"), ("{preset: tiny}\n", "expected a YAML list")):
        plan.write_text(text)
        with pytest.raises(ConfigError, match=why):
            load_plan(plan, defaults)


def test_bench_step_exits_2_when_no_point_can_run_here(tmp_path):
    """Points that cannot run are rows and the grid goes on (exit 0 while one point ran); when
    none ran the command failed: one line naming the first point's reason, exit 2 (every point
    refused as configured), the report kept."""
    out = tmp_path / "bench"
    res = train_cli(["bench", "step", "--preset", "tiny", "--fp8", "tensorwise,rowwise", "--steps", "1",
                     "--warmup", "0", "--seq", "32", "--out", str(out), *SMALL])
    assert res.returncode == 2, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: no point ran: skipped: fp8.backend=torchao"), res.stderr
    assert errors[0].endswith("(and 1 more point(s), see the report)")
    assert "Traceback" not in res.stderr
    _, rows = _report(out)
    assert [r["fp8"] for r in rows] == ["tensorwise", "rowwise"]
