"""Metric sinks beside ``metrics.jsonl`` and TensorBoard, fed the same rows (rank 0 only).

* ``metrics.prometheus_file=PATH``: the latest value of every numeric metric as Prometheus
  gauges (``hopper_train_<name>``, label ``run``), in the text format of node_exporter's
  textfile collector. ``prometheus_client.write_to_textfile`` rewrites it atomically
  (temporary file + rename) at every logged step, so the collector never reads half a
  file. Point it into the collector's directory (name it ``*.prom``), or scrape it any other
  way. Needs the ``prometheus`` extra.
* ``metrics.wandb=true``: ``wandb.log`` of every row (project ``metrics.wandb_project``,
  run name = the run directory's name, files under ``OUT/wandb``). Set ``WANDB_MODE=offline``
  for air-gapped clusters and ``wandb sync`` later. Needs the ``wandb`` extra.

Both are off by default; enabling one whose package is missing is a config error.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

EXTRA = {"prometheus_client": "prometheus", "wandb": "wandb"}


def missing(module: str) -> str | None:
    """None when ``module`` imports, else the one-line fix."""
    if importlib.util.find_spec(module) is not None:
        return None
    return f"the {module} package is not installed (pip install 'hopper-train[{EXTRA[module]}]')"


class PrometheusTextfile:
    def __init__(self, path: Path, run: str):
        from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

        self.path = path
        self.run = run
        self._registry = CollectorRegistry()
        self._gauge_cls = Gauge
        self._write = write_to_textfile
        self._gauges: dict = {}
        path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, row: dict) -> None:
        for key, value in row.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            name = "hopper_train_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
            gauge = self._gauges.get(name)
            if gauge is None:
                gauge = self._gauges[name] = self._gauge_cls(name, f"hopper-train metric {key}", ["run"],
                                                             registry=self._registry)
            gauge.labels(run=self.run).set(value)
        self._write(str(self.path), self._registry)

    def close(self) -> None:
        pass


class WandbSink:
    def __init__(self, out_dir: Path, project: str, config: dict):
        import wandb

        self._wandb = wandb
        out_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=project, name=out_dir.name, dir=str(out_dir), config=config)

    def log(self, row: dict) -> None:
        data = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        self._run.log(data, step=int(row["step"]))

    def close(self) -> None:
        self._run.finish()


def build_sinks(metrics_cfg, out_dir: Path, job_dict: dict) -> list:
    """The sinks ``metrics_cfg`` enables (call on rank 0 only)."""
    sinks: list = []
    if metrics_cfg.prometheus_file:
        path = Path(metrics_cfg.prometheus_file)
        sinks.append(PrometheusTextfile(path if path.is_absolute() else out_dir / path, out_dir.name))
    if metrics_cfg.wandb:
        sinks.append(WandbSink(out_dir, metrics_cfg.wandb_project, job_dict))
    return sinks
