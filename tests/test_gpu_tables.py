"""scripts/gpu/tables.py, the one command per published GPU table: the tables in
docs/performance.md are what it renders from the raw files kept under docs/results/, every
`train bench step` it would launch parses and validates, NVLink multicast stays off in every
process it starts, and the docs name only tables it has."""

import importlib.util
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from testlib import ROOT

SCRIPT = ROOT / "scripts" / "gpu" / "tables.py"
PERF = ROOT / "docs" / "performance.md"
RAW = ROOT / "docs" / "results" / "h100x2-perf"


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("gpu_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_tables"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_tables", None)


def _rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("| ") and not line.startswith("| point |")]


def test_vs_titan_table_in_the_doc_is_the_one_rendered_from_the_kept_raw_files(tables):
    rendered = tables.render("vs-titan", [RAW / "vs-titan-1", RAW / "vs-titan-2"])
    rows = _rows(rendered)
    assert len(rows) == 5 and all("; " in r for r in rows)  # five points, two calls each
    doc = PERF.read_text()
    assert [r for r in rows if r not in doc] == []


def test_fp8_table_in_the_doc_is_the_one_rendered_from_the_kept_raw_files(tables):
    rendered = tables.render("fp8", [RAW / "fp8loss-seed1234", RAW / "fp8loss-seed1", RAW / "fp8-floor"])
    rows = _rows(rendered)
    assert any("seed 1234" in r for r in rows) and any("seed 1 " in r for r in rows) and "1.326" in rendered
    doc = PERF.read_text()
    assert [r for r in rows if r not in doc] == []


def _bench_runs(tables, tmp_path):
    runs = []
    for table, plan in (("vs-titan", tables.plan_vs_titan), ("fp8", tables.plan_fp8), ("levers", tables.plan_levers),
                        ("mesh", tables.plan_mesh)):
        points = sorted(tables.LEVERS) if table == "levers" else [None]
        for point in points:
            a = Namespace(skip_bf16=4, skip_fp8=3, seed=1, point=point, dry_run=False, table_dir=tmp_path, gpus="4")
            runs += [r for step in plan(a) for lane in step for r in lane if r.side == "ours"]
    return runs


def test_every_bench_step_launch_parses_and_every_point_validates(tables, tmp_path):
    """What the device would run: each `train bench step` command line through the real CLI's
    parser, its --plan through the real plan loader, every point's config through load_config."""
    from train.bench.grid import expand_all, load_plan
    from train.bench.step import step_cmd

    runs = _bench_runs(tables, tmp_path)
    assert {r.name for r in runs} >= {"1b_bf16", "1b_fsdp2", "8b_fp8", "fp8loss_seed1", "levers_8b", "mesh_8b_g4"}
    for run in runs:
        ctx = step_cmd.make_context("step", ["--device", "cpu", "--out", str(tmp_path), *run.args])
        p = ctx.params
        defaults = {k: p[k] for k in ("preset", "strategy", "fp8", "ac", "batch", "seq", "steps", "warmup", "data")}
        defaults.update(compile=p["compile_"], set=list(p["overrides"]))
        grids = load_plan(Path(p["plan"]), defaults) if p["plan"] else [defaults]
        assert expand_all(grids), run.name


def test_levers_plan_has_the_defaults_first_and_one_lever_per_grid(tables, tmp_path):
    for point, (_, _, grids) in tables.LEVERS.items():
        assert grids[0].get("set") is None, point  # the first row: the defaults (and the point's fp8)
        assert len({repr(g) for g in grids}) == len(grids), point


def test_every_process_started_has_nvlink_multicast_off(tables, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    env = tables.environment()
    assert {k: env[k] for k in tables.SAFETY_ENV} == {
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    for script in tables.SHELL_TABLES.values():  # the shell tables set it themselves too
        text = (ROOT / "scripts" / "gpu" / script).read_text()
        assert "NCCL_NVLS_ENABLE=0" in text or "common.sh" in text, script
    assert "NCCL_NVLS_ENABLE=0" in (ROOT / "scripts" / "gpu" / "common.sh").read_text()


def test_dry_run_prints_the_commands_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "vs-titan", "--dry-run", "--out", str(out)], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("titan_bench.py") == 5 and proc.stdout.count("train bench step") == 5
    assert not out.exists()


@pytest.mark.parametrize("argv, culprit", [(["comm", "--render", "."], "comm"),
                                           (["vs-titan", "--render", "/nonexistent-dir"], "/nonexistent-dir"),
                                           (["nosuch"], "nosuch")])
def test_bad_input_is_one_line_and_exit_2(argv, culprit):
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert culprit in proc.stderr.strip().splitlines()[-1]


def test_the_docs_name_only_tables_the_command_has(tables):
    named = set()
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "results" / "README.md"]:
        named |= set(re.findall(r"tables\.py ([\w-]+)", doc.read_text()))
    named -= {"TABLE"}
    assert named and named <= set(tables.TABLES), named - set(tables.TABLES)


def test_mesh_table_in_the_doc_is_the_one_rendered_and_its_meshes_share_one_global_batch(tables, tmp_path):
    """The 4-GPU mesh table of docs/parallel.md is rendered from the kept raw files; every mesh of
    the plan sees 16 sequences a step (batch per rank x data-parallel ranks) on the same data."""
    from train.bench.grid import expand_all, load_plan

    rendered = tables.render("mesh", [ROOT / "docs" / "results" / "h200x4-mesh"])
    assert rendered.count("| dp_replicate=") == 3 and "recommends FSDP2" in rendered
    doc = (ROOT / "docs" / "parallel.md").read_text()
    for tps in ("11,191", "10,392", "10,180", "2.3864", "2.3617", "2.3673"):
        assert tps in rendered and tps in doc
    tables.plan_mesh(Namespace(gpus="4", dry_run=False, table_dir=tmp_path))
    defaults = {"preset": "tiny", "strategy": "ddp", "fp8": "none", "ac": "none", "batch": "4", "seq": "128",
                "steps": 10, "warmup": 3, "data": "synthetic", "compile": "off", "set": []}
    points = expand_all(load_plan(tmp_path / "mesh_8b_g4.yaml", defaults))
    dp = {"fsdp": 4, "hsdp": 4, "fsdp_tp": 2}
    assert sorted(p["strategy"] for p in points) == ["fsdp", "fsdp_tp", "hsdp"]
    assert {int(p["batch"]) * dp[p["strategy"]] for p in points} == {16}
    assert {p["data"] for p in points} == {"embedded"} and {p["steps"] for p in points} == {100}


def test_defaults_table_in_the_readme_is_the_one_rendered_from_the_kept_raw_files(tables):
    raw = ROOT / "docs" / "results" / "h200-defaults"
    folders = ("4gpu", "2gpu", "2gpu-8b-again", "1gpu")
    rendered = tables.render("defaults", [raw / c for c in folders])
    assert (raw / "table.md").read_text() == rendered
    readme = (ROOT / "README.md").read_text()
    rows = _rows(rendered)
    assert len(rows) == 8
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        ours, ratio = cells[3], cells[4]
        assert ours in readme and ratio in readme, row


def test_the_plans_earlier_defaults_tables_are_the_ones_rendered_from_their_raw_files(tables):
    raw = ROOT / "docs" / "results" / "h200x4-defaults"
    assert (raw / "table.md").read_text() == tables.render("defaults", [raw / c for c in ("call1", "call4", "call2", "call5")])
    again = ROOT / "docs" / "results" / "h200x2-8b-plan" / "defaults"
    assert (again / "table.md").read_text() == tables.render("defaults", [again])
