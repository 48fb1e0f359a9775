"""Metric sinks beside metrics.jsonl: the Prometheus textfile (always tested: prometheus-client
is a dev dependency) and W&B in offline mode (when wandb is installed)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from testlib import SMALL_RUN, train_cli
from train.metrics import read_metrics

SMALL = SMALL_RUN + ["--set", "metrics.progress=false", "--set", "checkpoint.final=false"]


def test_prometheus_textfile_has_the_last_row_and_no_temp_files(tmp_path):
    parser = pytest.importorskip("prometheus_client.parser")
    out = tmp_path / "run"
    res = train_cli(["run", "--steps", "3", "--out", str(out), *SMALL, "--set", "metrics.prometheus_file=train.prom"])
    assert res.returncode == 0, res.stderr[-3000:]
    last = read_metrics(out / "metrics.jsonl")[-1]
    families = {f.name: f for f in parser.text_string_to_metric_families((out / "train.prom").read_text())}
    for key in ("step", "loss", "tokens_per_s", "step_time_s", "lr", "grad_norm"):
        (sample,) = families[f"hopper_train_{key}"].samples
        assert sample.labels == {"run": "run"} and sample.value == pytest.approx(last[key], rel=1e-12)
    assert "hopper_train_mfu" not in families  # None on CPU: not exported
    assert sorted(p.name for p in out.iterdir() if "prom" in p.name) == ["train.prom"]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                    reason="wandb is not installed (optional extra: pip install 'hopper-train[wandb]')")
def test_wandb_offline_run_logs_every_row(tmp_path):
    out = tmp_path / "run"
    res = train_cli(["run", "--steps", "3", "--out", str(out), *SMALL, "--set", "metrics.wandb=true"],
                    extra_env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(out)})
    assert res.returncode == 0, res.stderr[-3000:]
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((out / "wandb").iterdir())
    # The offline run log (protobuf records; history values are stored as JSON text).
    (log,) = runs[0].glob("run-*.wandb")
    data = log.read_bytes()
    rows = read_metrics(out / "metrics.jsonl")
    assert len(rows) == 3 and b"tokens_per_s" in data
    assert all(json.dumps(r["loss"]).encode() in data for r in rows)
