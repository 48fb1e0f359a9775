"""The automatic plan (train/plan.py, train/plan_apply.py): its choices as a pure function of
its inputs for fake 80 GB and 141 GB cards, 1, 2 and 8 GPUs, the 1b and 8b presets; the keys a
job sets win; nothing on CPU; and a resumed run keeps the plan its config.yaml recorded (a real
2-process gloo run)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from testlib import SMALL_RUN, torchrun
from train.config import load_config
from train.errors import ConfigError
from train.memory import GiB
from train.plan import HEADROOM_BYTES, PLAN_KEYS, PlanInputs, loss_chunk, memory_budget, plan

H100 = 85_029_158_912  # torch.cuda.mem_get_info's total of an H100 80GB HBM3 (79.19 GiB)
H200 = 150_121_709_568  # ... of an H200 141GB (139.8 GiB)


def inputs(preset: str, gpus: int, card: int, fp8: str = "none", **kw) -> PlanInputs:
    """What a fresh ``train run --config PRESET`` on ``gpus`` cards of ``card`` bytes would feed the plan."""
    job = load_config(preset, [])
    base = dict(device="cuda", model=job.model, batch=job.train.batch_size, seq=job.train.seq_len, world=gpus,
                strategy=job.parallel.strategy, dp_shard=gpus, ac=job.parallel.ac, compile=job.parallel.compile, fp8=fp8, total_bytes=card,
                free_bytes=card - GiB // 2, capability=(9, 0), host_bytes=256 * GiB, local_world=gpus,
                symm_auto="all_gather", explicit=job.explicit_keys)
    base.update(kw)
    return PlanInputs(**base)


def test_presets_leave_the_plan_keys_open():
    for preset in ("1b", "8b"):
        job = load_config(preset, [])
        assert not set(PLAN_KEYS) & job.explicit_keys, preset
        assert job.parallel.strategy == "fsdp"
    assert load_config("8b", []).parallel.ac == "full" and load_config("1b", []).parallel.ac == "none"


@pytest.mark.parametrize("recipe", ["none", "tensorwise"])
def test_8b_two_gpus_h100_ac_skip_is_the_measured_one(recipe):
    """2xH100: not every block's activations fit, so the last k blocks leave AC where the peak stays
    AC-full's and the reserved memory fits: 4 bf16 / 3 FP8, measured best at <= torchtitan's memory
    without cudaMalloc retries (docs/plan.md)."""
    res = plan(inputs("8b", 2, H100, recipe))
    assert res.values["parallel.ac_skip_last"] == {"none": 4, "tensorwise": 3}[recipe], res.reasons
    assert res.values["parallel.compile"] is True
    assert res.values["train.loss"] == "chunked" and res.values["train.loss_chunk_tokens"] == 2048
    assert res.values.get("fp8.fsdp_float8_all_gather", True) is (recipe == "none")
    assert "parallel.activation_memory_budget" not in res.values  # AC is on: no budget
    line = res.line(inputs("8b", 2, H100, recipe))
    assert line.count("\n") == 0 and "76.2 GiB" in line


@pytest.mark.parametrize("card,gpus", [(H200, 2), (H200, 4), (H100, 4), (H200, 8)])
@pytest.mark.parametrize("recipe", ["none", "tensorwise"])
def test_8b_every_block_out_of_ac_where_all_fit(card, gpus, recipe):
    """Where every block's activations fit the card, nothing is recomputed (measured on 2 and 4
    H200: docs/plan.md), and FSDP2 gets its no-AC settings (activation budget; the reduce-scatter
    on the copy engines too, as at 1b)."""
    res = plan(inputs("8b", gpus, card, recipe))
    assert res.values["parallel.ac_skip_last"] == 32, res.reasons
    assert any(r.startswith("AC off every block (all 32 fit") for r in res.reasons)
    assert res.values["parallel.fsdp_symm_mem"] == "all"
    assert "all-gather and reduce-scatter on the copy engines" in res.reasons
    assert res.values["parallel.activation_memory_budget"] == 0.999
    assert res.values["parallel.activation_memory_budget_skip_last"] == 20


def test_8b_no_ac_settings_follow_the_job():
    """A job that sets parallel.ac_skip_last itself keeps its AC and gets no no-AC settings."""
    base = inputs("8b", 4, H200)
    res = plan(dataclasses.replace(base, explicit=base.explicit | {"parallel.ac_skip_last"}))
    assert "parallel.ac_skip_last" not in res.values and "parallel.activation_memory_budget" not in res.values


@pytest.mark.parametrize("card", [H100, H200])
def test_8b_one_and_eight_gpus(card):
    one = plan(inputs("8b", 1, card))
    if card == H200:
        assert one.values["parallel.ac_skip_last"] == 0 and "parallel.cpu_offload" not in one.values
        # the reserved estimate is over the budget, the peak (122 GiB; 120.7 measured) is not: no offload
        assert any("AC on every block" in r and "over the" in r for r in one.reasons)
    else:  # the peak is over an 80 GB card's budget too: the state goes to the (256 GiB) host
        assert one.values["parallel.cpu_offload"] is True and not one.problem
    eight = plan(inputs("8b", 8, card))
    assert eight.values["parallel.ac_skip_last"] >= 0 and eight.values["parallel.compile"] is True
    # the reserved-memory bound only ever lowers the count: a smaller card never gets more blocks
    for gpus in (2, 8):
        assert plan(inputs("8b", gpus, H100)).values["parallel.ac_skip_last"] <= \
            plan(inputs("8b", gpus, H200)).values["parallel.ac_skip_last"]


@pytest.mark.parametrize("card", [H100, H200])
@pytest.mark.parametrize("gpus", [1, 8])
def test_1b(card, gpus):
    res = plan(inputs("1b", gpus, card))
    assert res.values["parallel.compile"] is True
    assert res.values["train.loss_chunk_tokens"] == (4096 if gpus == 1 else 8192)
    assert "parallel.ac_skip_last" not in res.values  # AC is off in the preset
    fsdp_keys = {"parallel.fsdp_symm_mem", "parallel.activation_memory_budget"}
    if gpus == 1:  # FSDP's mixed precision by casting: no collectives to tune
        assert not fsdp_keys & set(res.values)
    else:
        assert "parallel.reshard_after_forward" not in res.values  # FSDP2's default: at torchtitan's memory
        assert res.values["parallel.fsdp_symm_mem"] == "all"
        assert res.values["parallel.activation_memory_budget"] == 0.999
        assert res.values["parallel.activation_memory_budget_skip_last"] == 10  # budget on the first 6 of 16
    assert res.values["checkpoint.async_save"] is True


def test_pure_function_of_its_inputs():
    a, b = inputs("8b", 2, H100), inputs("8b", 2, H100)
    assert plan(a) == plan(b) and plan(a).line(a) == plan(b).line(b)
    # free memory, not the card's name: a card half used by another process gets a smaller plan
    # this process's context and NCCL buffers (in the headroom) do not count against the card
    assert plan(dataclasses.replace(a, free_bytes=H100 - 3 * GiB // 2)) == plan(a)
    busy = dataclasses.replace(a, free_bytes=H100 // 2)
    assert memory_budget(busy) < memory_budget(a) == H100 - HEADROOM_BYTES
    assert plan(busy).values["parallel.ac_skip_last"] == 0


def test_the_keys_a_job_sets_win():
    job = load_config("8b", ["parallel.ac_skip_last=1", "parallel.compile=false", "checkpoint.async_save=false"])
    assert {"parallel.ac_skip_last", "parallel.compile", "checkpoint.async_save"} <= job.explicit_keys
    res = plan(inputs("8b", 2, H200, explicit=job.explicit_keys))
    assert not {"parallel.ac_skip_last", "parallel.compile", "checkpoint.async_save"} & set(res.values)
    assert "train.loss" not in res.values  # no compile: the loss stays as configured
    chunk = plan(inputs("1b", 2, H100, explicit=frozenset({"train.loss_chunk_tokens"})))
    assert chunk.values["train.loss"] == "chunked" and "train.loss_chunk_tokens" not in chunk.values


def test_cpu_and_old_gpus():
    cpu = dataclasses.replace(inputs("1b", 2, 0), device="cpu", total_bytes=0, free_bytes=0)
    assert plan(cpu).values == {} and "nothing to decide" in plan(cpu).line(cpu)
    old = plan(inputs("1b", 1, H100, capability=(6, 1)))
    assert old.values["parallel.compile"] is False and "train.loss" not in old.values
    tp = plan(inputs("8b", 2, H100, tp=2, dp_shard=1))
    assert "train.loss" not in tp.values  # the chunked loss does not take a vocabulary-sharded head


def test_float8_all_gather_only_off_within_one_node():
    assert plan(inputs("8b", 2, H100, "tensorwise")).values["fp8.fsdp_float8_all_gather"] is False
    two_nodes = plan(inputs("8b", 16, H100, "tensorwise", local_world=8))
    assert "fp8.fsdp_float8_all_gather" not in two_nodes.values


def test_loss_chunk_and_sync_checkpoints():
    assert [loss_chunk(v) for v in (32_768, 128_256, 256)] == [8192, 2048, 8192]
    assert [loss_chunk(v, world=1) for v in (32_768, 128_256, 256)] == [4096, 2048, 4096]
    small_host = plan(inputs("8b", 2, H200, host_bytes=128 * GiB))
    assert "checkpoint.async_save" not in small_host.values
    assert any("synchronous" in r for r in small_host.reasons)


def test_cuda_graph_compile_modes_refused():
    for mode in ("reduce-overhead", "max-autotune"):
        with pytest.raises(ConfigError, match=f"parallel.compile_mode={mode}: CUDA graphs are refused"):
            load_config("tiny", [f"parallel.compile_mode={mode}"])
    assert load_config("tiny", ["parallel.compile_mode=max-autotune-no-cudagraphs"]).parallel.compile_mode


def test_resume_keeps_the_recorded_plan(tmp_path: Path):
    """A 2-process gloo run, then its config.yaml edited as a GPU plan would have written it (the
    chunked loss, 16-token chunks), then --resume: the resumed run trains with the recorded values
    (no config-change refusal) and records them again; a value set on the command line that
    differs from the recorded one is a change of what is trained."""
    out = tmp_path / "run"
    args = ["run", "--config", "tiny", "--out", str(out), *SMALL_RUN]
    first = torchrun([*args, "--steps", "2"])
    assert first.returncode == 0, first.stderr[-2000:]
    path = out / "config.yaml"
    text = path.read_text()
    head = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    data = yaml.safe_load(text)
    assert data["train"]["loss"] == "auto" and data["train"]["loss_chunk_tokens"] == 4096
    data["train"]["loss"], data["train"]["loss_chunk_tokens"] = "chunked", 16
    path.write_text(head + yaml.safe_dump(data, sort_keys=False))

    second = torchrun([*args, "--steps", "3", "--resume"])
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resumed under the recorded plan (2 of its values differ" in second.stdout + second.stderr
    again = yaml.safe_load(path.read_text())
    assert again["train"]["loss"] == "chunked" and again["train"]["loss_chunk_tokens"] == 16
    assert "resume (config unchanged)" in path.read_text()

    third = torchrun([*args, "--steps", "4", "--resume", "--set", "train.loss_chunk_tokens=32"])
    assert third.returncode != 0  # torchrun reports its workers' exit 2 as its own 1
    assert "the config differs from the run" in third.stderr and "train.loss_chunk_tokens: '16' -> '32'" in third.stderr


def test_doctor_shows_the_plan():
    """``train doctor --preset 8b --profile h100 --gpus 2`` (docs/plan.md) prints what a run would
    choose there; ``--json`` has the values."""
    import json

    from testlib import train_cli

    text = train_cli(["doctor", "--preset", "8b", "--profile", "h100", "--gpus", "2"])
    assert text.returncode == 0, text.stderr[-2000:]
    assert "automatic plan for --config 8b: 2 x 80.0 GiB, 8b fsdp 4x2048 bf16: compile on" in text.stdout
    assert "parallel.ac_skip_last=" in text.stdout
    res = train_cli(["doctor", "--preset", "1b", "--profile", "h200", "--gpus", "2", "--json"])
    shown = json.loads(res.stdout)["memory"]["plan"]
    assert shown["config"] == "1b" and shown["budget_gib"] == 138.0  # the profile's 141 GiB less the headroom
    assert shown["values"]["parallel.compile"] is True and shown["values"]["parallel.fsdp_symm_mem"] == "all"


def test_defaults_table_runs_the_presets_as_a_user_does(tmp_path):
    """``scripts/gpu/tables.py defaults``: our side is ``train run --config P`` with nothing but the data
    source (and a row per step, no final checkpoint) - each command line parses with the real CLI and
    its config validates; torchtitan gets the preset's batch, sequence length and AC; the table
    renders from raw files of that shape."""
    import importlib.util
    import json
    import sys
    from argparse import Namespace

    from testlib import ROOT
    from train.cli import main as cli

    spec = importlib.util.spec_from_file_location("gpu_tables_defaults", ROOT / "scripts" / "gpu" / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    sys.modules["gpu_tables_defaults"] = tables
    try:
        spec.loader.exec_module(tables)
        points = ",".join(tables.DEFAULT_POINTS)
        runs = [r for step in tables.plan_defaults(Namespace(points=points, gpus="2", visible=2, dry_run=True))
                for lane in step for r in lane]
        paired = tables.plan_defaults(Namespace(points="1b", gpus="2,4", visible=4, dry_run=True))
    finally:
        sys.modules.pop("gpu_tables_defaults", None)
    ours = [r for r in runs if r.side == "run"]
    assert len(ours) == 4 and all(r.nproc == 2 and r.gpus == "0,1" for r in runs)
    # 2 GPUs of 4: both sides at once on GPUs 0,1 and 2,3, then swapped; 4 of 4: one after the other
    assert [[(r.side, r.gpus) for r in lane] for lane in paired[0]] == [
        [("titan", "0,1"), ("run", "0,1")], [("run", "2,3"), ("titan", "2,3")]]
    assert [[(r.side, r.gpus) for r in lane] for lane in paired[1]] == [[("titan", "0,1,2,3"), ("run", "0,1,2,3")]]
    for run in ours:
        ctx = cli.commands["run"].make_context("run", ["--out", str(tmp_path / run.name), *run.args])
        p = ctx.params
        job = load_config(p["config_path"], [*p["overrides"], f"train.steps={p['steps']}"])
        assert not set(PLAN_KEYS) & job.explicit_keys and job.data.source == "synthetic"
        assert {k.split("=")[0] for k in p["overrides"]} <= {"data.source", "train.log_every", "checkpoint.final",
                                                            "fp8.backend"}
    for run in (r for r in runs if r.side == "titan"):
        args = dict(zip(run.args[::2], run.args[1::2]))
        job = load_config(args["--preset"], [])
        assert (args["--batch"], args["--seq"], args["--ac"]) == (
            str(job.train.batch_size), str(job.train.seq_len), job.parallel.ac)
    d = tmp_path / "raw"
    (d / "run_8b").mkdir(parents=True)
    rows = [{"step": s, "tokens_per_s_per_gpu": 100.0 * s, "peak_mem_gib": 60.0, "reserved_gib": 70.0,
             "alloc_retries": 0} for s in range(1, 14)]
    (d / "run_8b" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "run_8b.log").write_text("[rank 0] plan: 2 x 79.2 GiB, 8b fsdp 4x2048 bf16: compile on\n")
    (d / "titan_8b.json").write_text(json.dumps({"tokens_per_s_per_gpu": 800.0, "peak_mem_gib": 62.8,
                                                 "peak_reserved_gib": 73.4}))
    # the lanes of a paired point (POINT_gN_lK) and a lever tried beside it (not a row)
    for name, tps in (("1b_g2_l0", 50.0), ("1b_g2_l1", 70.0), ("1b_g2_nobudget", 1.0)):
        (d / f"run_{name}").mkdir()
        (d / f"run_{name}" / "metrics.jsonl").write_text("".join(json.dumps(dict(r, tokens_per_s_per_gpu=tps)) + "\n"
                                                                 for r in rows))
        (d / f"titan_{name}.json").write_text(json.dumps({"tokens_per_s_per_gpu": 50.0, "peak_mem_gib": 16.7,
                                                          "ac": "none"}))
    table = tables.render_defaults([d])
    assert "| 8b | 2 | 800 (?) | 850 | 1.062 | 62.80 / 60.00 | 73.40 / 70.00 | 0 |" in table  # median, steps 4..13
    assert "| 1b | 2 | 50 / 50 (none) | 50 / 70 | 1.200 | 16.70 / 60.00 |" in table
    assert "- 8b, 2 GPUs: 2 x 79.2 GiB, 8b fsdp 4x2048 bf16: compile on" in table
    assert table.count("| 1b |") == 1


@pytest.mark.parametrize("preset", ["1b", "8b"])
def test_one_gpu_recomputes_the_weight_casts(preset):
    """One compiled GPU: the blocks cast the fp32 weights themselves, and the plan has backward
    recast them instead of saving the bf16 copies (1b on one H200: 23.17 against 24.99 GiB)."""
    one = plan(inputs(preset, 1, H200))
    assert one.values["parallel.recompute_param_casts"] is True
    assert "weight casts recomputed in backward" in one.reasons
    assert "parallel.recompute_param_casts" not in plan(inputs(preset, 2, H200)).values
    base = inputs(preset, 1, H200)
    mine = dataclasses.replace(base, explicit=base.explicit | {"parallel.recompute_param_casts"})
    assert "parallel.recompute_param_casts" not in plan(mine).values
    assert plan(dataclasses.replace(base, device="cpu")).values == {}


def test_transformer_engine_keeps_compile_off_and_every_block_out_of_ac():
    """fp8.backend=te: TE layers run uncompiled and torch's AC would recompute them outside
    te.autocast, so the plan keeps compile off and leaves every block out of AC, or stops the
    run with one line where they do not all fit."""
    res = plan(inputs("8b", 2, H200, "current", fp8_backend="te"))
    assert res.values["parallel.compile"] is False and "Transformer Engine" in res.line(inputs("8b", 2, H200))
    assert res.values["parallel.ac_skip_last"] == 32 and not res.problem
    assert "train.loss" not in res.values  # the chunked loss is for compiled runs
    small = plan(inputs("8b", 2, H100, "current", fp8_backend="te"))
    assert small.problem.startswith("fp8.backend=te: 8b 4x2048 on 2 GPU(s) needs activation checkpointing")
    assert "fp8.backend=torchao" in small.problem and "\n" not in small.problem
    one = plan(inputs("1b", 1, H100, "delayed", fp8_backend="te"))  # 1b: AC none already
    assert not one.problem and one.values["parallel.compile"] is False
    # torchao is untouched
    assert plan(inputs("8b", 2, H100, "tensorwise", fp8_backend="torchao")).values["parallel.compile"] is True


def test_8b_one_80gb_card_offloads_the_state_where_the_host_holds_it():
    """8b on one 80 GB card: even AC on every block needs 122 GiB, so parameters, gradients and
    optimizer state go to host memory (FSDP2's CPUOffloadPolicy) and the rest of the plan sees only
    the GPU's share; without the host memory for it the run stops with one line before the model
    exists; an H200 keeps the state on the card."""
    big = inputs("8b", 1, H100, host_bytes=512 * GiB)
    res = plan(big)
    assert res.values["parallel.cpu_offload"] is True and not res.problem
    assert res.values["parallel.ac_skip_last"] == 32  # nothing resident: every block's activations fit
    assert "parallel.recompute_param_casts" not in res.values  # fully_shard, not the one-GPU casts
    assert res.values["checkpoint.async_save"] is True  # 120 staged + 120 offloaded of 512 GiB
    line = res.line(big)
    assert "in host memory" in line and "122.0 GiB of the 76.2 GiB budget" in line and "120 of 512 GiB host" in line
    # a host that cannot hold it twice over beside the offload: synchronous checkpoints
    res = plan(inputs("8b", 1, H100, host_bytes=200 * GiB))
    assert res.values["parallel.cpu_offload"] is True and "checkpoint.async_save" not in res.values
    assert any("the offload leaves" in r for r in res.reasons)
    # the device machines' 126 GiB host cannot hold 120 GiB pinned: stop, naming both memories
    small = plan(inputs("8b", 1, H100, host_bytes=126 * GiB))
    assert "parallel.cpu_offload" not in small.values
    assert "119.7 GiB of the card's 79.2 GiB" in small.problem and "this node has 126" in small.problem
    assert "\n" not in small.problem
    # the job's own value wins: offload off stops (it cannot fit), offload on is planned around
    job = dataclasses.replace(big, explicit=big.explicit | {"parallel.cpu_offload"})
    assert "parallel.cpu_offload" not in plan(job).values
    assert "more GPUs (parallel.cpu_offload=false is set)" in plan(job).problem
    on = plan(dataclasses.replace(job, cpu_offload=True))
    assert not on.problem and on.values["parallel.ac_skip_last"] == 32
    # where the state fits: no offload (8b on one H200, on two H100s; 1b and 3b on one H100)
    for args in (("8b", 1, H200), ("8b", 2, H100), ("1b", 1, H100), ("3b", 1, H100)):
        res = plan(inputs(*args, host_bytes=512 * GiB))
        assert "parallel.cpu_offload" not in res.values and not res.problem, args


def test_offload_for_a_card_mostly_used_by_another_process():
    """The plan reads the card's free memory: 3b on an H200 with 40 GiB free offloads (the
    device run of docs/plan.md emulates a smaller card so)."""
    res = plan(inputs("3b", 1, H200, free_bytes=40 * GiB, host_bytes=126 * GiB))
    assert res.values["parallel.cpu_offload"] is True
    assert res.values["parallel.ac_skip_last"] == 28
    assert "parallel.cpu_offload" not in plan(inputs("3b", 1, H200, host_bytes=126 * GiB)).values


def test_offload_around_the_jobs_other_settings():
    """What blocks the offload is named in the stop; settings that allow it do not block it."""
    big = dict(host_bytes=512 * GiB)
    symm = "parallel.fsdp_symm_mem"
    for mode, offloads in (("none", True), ("auto", True), ("all", False), ("all_gather", False)):
        res = plan(inputs("8b", 1, H100, fsdp_symm_mem=mode, explicit=frozenset({symm}), **big))
        assert res.values.get("parallel.cpu_offload", False) is offloads, mode
        assert bool(res.problem) is not offloads and (offloads or f"fsdp_symm_mem={mode}" in res.problem)
    # TP: no offload; the stop names this rank's state (8b over tp=2: 59.8 GiB), not an unsharded one
    res = plan(inputs("8b", 2, H100, dp_shard=1, tp=2, free_bytes=30 * GiB, **big))
    assert "take 59.8 GiB of the card's 32.0 GiB" in res.problem and "parallel.tp > 1" in res.problem
    # FP8 tensorwise across nodes keeps the float8 all-gather, except where the weights are offloaded
    fp8 = plan(inputs("8b", 2, H100, "tensorwise", local_world=1, free_bytes=40 * GiB, **big))
    assert fp8.values["parallel.cpu_offload"] is True and fp8.values["fp8.fsdp_float8_all_gather"] is False
    assert "fp8.fsdp_float8_all_gather" not in plan(inputs("8b", 2, H100, "tensorwise", local_world=1, **big)).values
    # a job without AC is judged by its own step, and said so
    res = plan(inputs("3b", 1, H100, ac="none", free_bytes=50 * GiB, **big))
    assert res.values["parallel.cpu_offload"] is True
    assert any("the step (AC off) needs" in r for r in res.reasons)
    # host memory not known: no offload, and the stop says why
    res = plan(inputs("8b", 1, H100, host_bytes=0))
    assert "parallel.cpu_offload" not in res.values and "memory is not known" in res.problem


def test_start_up_check_leaves_an_offloadable_model_to_the_plan(monkeypatch):
    """A model whose fp32 parameters alone exceed the card (8b with 96 layers: 22B, 81.9 GiB) is
    not refused before the plan where the plan may keep them in host memory."""
    from train import preflight
    from train.parallel.dims import ParallelDims

    monkeypatch.setattr(preflight, "device_memory", lambda job: ("GPU 0", H100))
    monkeypatch.setattr(preflight, "host_memory_bytes", lambda: 1024 * GiB)
    job = load_config("8b", ["model.n_layers=96"])
    preflight.check_fits(job, ParallelDims.from_job(job, 1))
    for extra in (["parallel.cpu_offload=false"], ["parallel.fsdp_symm_mem=all"]):
        job = load_config("8b", ["model.n_layers=96", *extra])
        with pytest.raises(ConfigError, match="more than all 79.19 GiB of GPU 0"):
            preflight.check_fits(job, ParallelDims.from_job(job, 1))
    monkeypatch.setattr(preflight, "host_memory_bytes", lambda: 64 * GiB)
    job = load_config("8b", ["model.n_layers=96"])
    with pytest.raises(ConfigError, match="more than all"):
        preflight.check_fits(job, ParallelDims.from_job(job, 1))
