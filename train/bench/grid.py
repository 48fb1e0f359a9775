"""The grid of ``train bench step``: options and ``--plan`` files -> checked points.

Every value is checked and every point's job config loaded here, before any process group:
a bad point is a usage error (exit 2), not a failed row later."""

from __future__ import annotations

import itertools
from pathlib import Path

from core.safety import excerpt, excerpt_path, load_yaml_file, parse_ascii_int
from train.config import DATA_SOURCES
from train.errors import ConfigError
from train.parallel.config import AC_MODES

STRATEGIES = {
    "ddp": ["parallel.strategy=ddp"],
    "fsdp": ["parallel.strategy=fsdp", "parallel.dp_replicate=1", "parallel.dp_shard=-1", "parallel.tp=1"],
    "hsdp": ["parallel.strategy=fsdp", "parallel.dp_replicate=2", "parallel.dp_shard=-1", "parallel.tp=1"],
    "tp": ["parallel.strategy=fsdp", "parallel.dp_replicate=1", "parallel.dp_shard=1", "parallel.tp=-1"],
    "fsdp_tp": ["parallel.strategy=fsdp", "parallel.dp_replicate=1", "parallel.dp_shard=-1", "parallel.tp=2"],
}
GRID_KEYS = ("preset", "strategy", "fp8", "ac", "compile", "batch", "seq")

# The config keys a point's options set (job_overrides): a --set of one of them is refused, as
# the row would show the option's value while the run used the override. The mesh sizes a
# strategy sets (parallel.tp, dp_*) stay open to --set: the row's mesh column shows the result.
OWNED_KEYS = {"model.name": "--preset", "data.source": "--data", "train.seq_len": "--seq",
              "train.batch_size": "--batch", "train.steps": "--steps/--warmup", "parallel.ac": "--ac",
              "parallel.compile": "--compile", "parallel.strategy": "--strategy", "fp8.backend": "--fp8",
              "fp8.recipe": "--fp8", "train.device": "--device"}


def fp8_overrides(value: str) -> list[str]:
    if value == "none":
        return ["fp8.backend=none"]
    if value.startswith("te:"):
        return ["fp8.backend=te", f"fp8.recipe={value[3:]}"]
    return ["fp8.backend=torchao", f"fp8.recipe={value}"]


def compile_flag(value: str) -> bool:
    v = str(value).lower()
    if v in ("on", "true", "1", "yes"):
        return True
    if v in ("off", "false", "0", "no"):
        return False
    raise ConfigError(f"--compile: expected on/off, got {excerpt(value)}")


FP8_CHOICES = ("none", "tensorwise", "rowwise", "rowwise_with_gw_hp", "mxfp8", "te:current", "te:delayed", "te:mxfp8")
MAX_POINTS = 1000


def _choice(key: str, value: str, valid) -> str:
    if value not in valid:
        raise ConfigError(f"--{key}: unknown {excerpt(value)} (valid: {', '.join(valid)})")
    return value


def expand(grid: dict) -> list[dict]:
    """The cartesian product of one grid's comma lists, as point dicts; every value is
    checked here (before any process group), every point's job config validated."""
    from train.bench.report import comma_list, refuse_set_keys
    from train.config import load_config
    from train.models.registry import PRESETS as MODEL_PRESETS

    try:
        lists = [comma_list(grid[k], f"--{k}") for k in GRID_KEYS]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for v in lists[GRID_KEYS.index("preset")]:
        _choice("preset", v, list(MODEL_PRESETS))
    for v in lists[GRID_KEYS.index("strategy")]:
        _choice("strategy", v, list(STRATEGIES))
    for v in lists[GRID_KEYS.index("fp8")]:
        _choice("fp8", v, FP8_CHOICES)
    for v in lists[GRID_KEYS.index("ac")]:
        _choice("ac", v, AC_MODES)
    total = 1
    for values in lists:
        total *= len(values)
    if total > MAX_POINTS:
        raise ConfigError(f"bench grid: {total} points, more than {MAX_POINTS}")
    if not isinstance(grid.get("data"), str) or grid["data"] not in DATA_SOURCES:
        raise ConfigError(f"--data: {excerpt(grid.get('data'))}: one of {', '.join(DATA_SOURCES)}")
    points = []
    for combo in itertools.product(*lists):
        point = dict(zip(GRID_KEYS, combo))
        point["compile"] = compile_flag(point["compile"])
        point["batch"] = parse_ascii_int("--batch", point["batch"], 1, 1 << 20)
        point["seq"] = parse_ascii_int("--seq", point["seq"], 1, 1 << 24)
        sets = grid.get("set") or []
        if not isinstance(sets, list) or not all(isinstance(x, str) for x in sets):
            raise ConfigError(f"--plan: set must be a list of KEY=VALUE strings, got {excerpt(sets)}")
        point.update(steps=parse_ascii_int("--steps", grid["steps"], 1, 1 << 20),
                     warmup=parse_ascii_int("--warmup", grid["warmup"], 0, 1 << 20), data=grid["data"],
                     set=list(sets))
        refuse_set_keys(point["set"], OWNED_KEYS, "point")
        load_config(None, job_overrides(point))  # a bad point is a usage error now, not a failed row later
        points.append(point)
    return points


def expand_all(grids: list[dict]) -> list[dict]:
    """Every grid's points, at most MAX_POINTS in all."""
    points: list[dict] = []
    for grid in grids:
        points += expand(grid)
        if len(points) > MAX_POINTS:
            raise ConfigError(f"bench plan: more than {MAX_POINTS} points in all")
    return points


def job_overrides(point: dict) -> list[str]:
    return [
        f"model.name={point['preset']}",
        f"data.source={point['data']}",
        f"train.seq_len={point['seq']}",
        f"train.batch_size={point['batch']}",
        f"train.steps={point['warmup'] + point['steps']}",
        "checkpoint.final=false", "checkpoint.resume=never", "checkpoint.every=0",
        "metrics.progress=false",
        *STRATEGIES[point["strategy"]],
        *fp8_overrides(point["fp8"]),
        f"parallel.ac={point['ac']}",
        f"parallel.compile={str(point['compile']).lower()}",
        *point["set"],
    ]


def load_plan(path: Path, defaults: dict) -> list[dict]:
    data = load_yaml_file(Path(path), "--plan")  # bounded: size, depth, aliases
    if not isinstance(data, list) or not data or not all(isinstance(g, dict) for g in data):
        raise ConfigError(f"--plan {excerpt_path(path)}: expected a YAML list of mappings")
    grids = []
    for i, g in enumerate(data):
        unknown = set(map(str, g)) - set(defaults)
        if unknown:
            raise ConfigError(f"--plan {excerpt_path(path)}: grid {i}: unknown keys "
                              f"{excerpt(', '.join(sorted(unknown)))}")
        sets = g.get("set") or []
        if not isinstance(sets, list) or not all(isinstance(x, str) for x in sets):
            raise ConfigError(f"--plan {excerpt_path(path)}: grid {i}: set: expected a list of KEY=VALUE strings")
        grid = {**defaults, **g, "set": [*defaults["set"], *sets]}  # command-line --set applies too
        grids.append(grid)
    return grids
