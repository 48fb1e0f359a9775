"""Typed job configuration: dataclasses, YAML presets and ``--set key=value`` overrides.

Every section is a dataclass; a component that owns a section defines it next to its
code (``ParallelConfig`` lives in ``train.parallel.config``, ``CommConfig`` in
``train.comm.config``...) and this module only assembles them. Loading is strict:
unknown keys, wrong types and impossible values raise :class:`ConfigError` naming the
dotted key, before any process group or tensor exists.
"""

from __future__ import annotations

import dataclasses
import datetime
import stat
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InputError, YamlSyntaxError
from core.homepath import expand_home
from core.safety import control_chars, excerpt, load_yaml_file, load_yaml_text, parse_finite_float, probe_path
from train.comm.config import CommConfig
from train.errors import ConfigError
from train.models.presets import ModelConfig
from train.models.registry import PRESETS, model_spec
from train.parallel.config import ParallelConfig
from train.precision.config import Float8Config

CONFIG_DIR = Path(__file__).parent / "configs"



# Config fields are numbers a job can actually use: integers fit int64 and floats are finite.
INT_LIMIT = 2**63 - 1
MAX_TIMEOUT_S = 7 * 24 * 3600  # collective timeouts (train.timeout_s, preflight, bench): a larger timedelta overflows
DATA_SOURCES = ("synthetic", "embedded", "file")
SEED_MAX = 2**32 - 1  # numpy's SeedSequence and torch.manual_seed(seed + 1000 * rank) both accept it
LOSS_MODES = ("auto", "eager", "compiled", "chunked")  # train.loss, see train/loss.py


# A field naming a path on this machine: a leading ``~``/``~user`` is expanded when the config is
# read (YAML and --set alike), as a shell would (it does not inside ``--set key=~/x`` or YAML).
PATH = {"path": True}


@dataclass
class DataConfig:
    source: str = "embedded"  # embedded | file | synthetic
    path: str = field(default="", metadata=PATH)  # token file for source=file (a .json metadata file sits beside it)
    cache_dir: str = field(default="", metadata=PATH)  # where the embedded corpus is cached ("" = ~/.cache/hopper-train)
    embedded_mb: int = 8  # size cap of the embedded corpus, MiB of source text
    # source=file: the tokenizer the file must have been prepared with (`train data prepare
    # --tokenizer` value, or a sha256 prefix of >= 8 hex digits); "" = not checked
    tokenizer: str = ""

    def validate(self) -> None:
        if self.source not in DATA_SOURCES:
            raise ConfigError(f"data.source: must be one of {', '.join(DATA_SOURCES)}, got {self.source!r}")
        if self.source == "file" and not self.path:
            raise ConfigError("data.path: required when data.source=file")
        if self.embedded_mb <= 0:
            raise ConfigError(f"data.embedded_mb: must be > 0, got {self.embedded_mb}")
        from core.safety import resolved, system_directory, within

        # one cache file is written there: /tmp itself and the memory file systems (/dev/shm,
        # /run/user/UID) are fine places; /etc, /usr, /proc... are not
        if self.cache_dir and system_directory(self.cache_dir) \
                and not within(resolved(self.cache_dir), ("/dev/shm", "/run/user")):
            raise ConfigError(f"data.cache_dir: {excerpt(self.cache_dir)} is a system directory")


@dataclass
class OptimConfig:
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 20
    decay_steps: int = 0  # length of the cosine schedule; 0 = train.steps
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    # fused AdamW (CUDA) applies the clip inside its kernel (grad_scale) instead of a separate
    # in-place pass over every gradient; off: torch's clip_grad_norm_ then the step (train/optim.py)
    clip_in_step: bool = True

    def validate(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optim.lr: must be > 0, got {self.lr}")
        if self.eps <= 0 or self.eps >= 1:
            raise ConfigError(f"optim.eps: must be in (0, 1), got {self.eps}")
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay: must be >= 0, got {self.weight_decay}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"optim.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ConfigError("optim.warmup_steps / optim.decay_steps: must be >= 0")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"optim.{name}: must be in [0, 1)")
        if self.grad_clip < 0:
            raise ConfigError(f"optim.grad_clip: must be >= 0, got {self.grad_clip}")


@dataclass
class TrainConfig:
    steps: int = 300
    seq_len: int = 128
    batch_size: int = 8  # micro-batch per rank
    global_batch_size: int = 0  # sequences per optimizer step; 0 = batch_size * dp ranks
    precision: str = "auto"  # auto | bf16 | fp16 | fp32 (auto: bf16 on CUDA, fp32 on CPU)
    seed: int = 1234
    log_every: int = 10
    device: str = "auto"  # auto | cuda | cpu
    nan_policy: str = "stop"  # stop | skip (skip the update, at most max_nan_skips times)
    max_nan_skips: int = 5
    timeout_s: int = 600  # process-group timeout: a hung collective ends the job after this
    shutdown_grace_s: int = 120  # SIGTERM: finish the step, checkpoint, exit within this
    # auto (compiled on CUDA, eager elsewhere) | eager | compiled | chunked (train/loss.py); left unset on
    # CUDA with compile on, the plan takes chunked and the chunk size (train/plan.py)
    loss: str = "auto"
    loss_chunk_tokens: int = 4096  # loss=chunked: tokens per chunk of the fused output projection + loss

    def validate(self) -> None:
        for name in ("steps", "seq_len", "batch_size", "log_every", "timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"train.{name}: must be > 0, got {getattr(self, name)}")
        if self.global_batch_size < 0:
            raise ConfigError(f"train.global_batch_size: must be >= 0, got {self.global_batch_size}")
        if self.precision not in ("auto", "bf16", "fp16", "fp32"):
            raise ConfigError(f"train.precision: must be auto, bf16, fp16 or fp32, got {self.precision!r}")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ConfigError(f"train.device: must be auto, cuda or cpu, got {self.device!r}")
        if self.nan_policy not in ("stop", "skip"):
            raise ConfigError(f"train.nan_policy: must be stop or skip, got {self.nan_policy!r}")
        if self.max_nan_skips < 0 or self.shutdown_grace_s < 0:
            raise ConfigError("train.max_nan_skips / train.shutdown_grace_s: must be >= 0")
        if not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"train.seed: must be in 0..{SEED_MAX}, got {self.seed}")
        if self.timeout_s > MAX_TIMEOUT_S or self.shutdown_grace_s > 24 * 3600:
            raise ConfigError("train.timeout_s must be at most 7 days and train.shutdown_grace_s at most 1 day")
        if self.loss not in LOSS_MODES:
            raise ConfigError(f"train.loss: must be one of {', '.join(LOSS_MODES)}, got {excerpt(self.loss)}")
        if not 1 <= self.loss_chunk_tokens <= 1 << 24:
            raise ConfigError(f"train.loss_chunk_tokens: must be in 1..{1 << 24}, got {self.loss_chunk_tokens}")


@dataclass
class CheckpointConfig:
    every: int = 0  # steps between checkpoints; 0 = only at the end
    keep: int = 3  # complete checkpoints to retain (0 = keep all)
    final: bool = True  # write one at the last step
    resume: str = "auto"  # auto (resume when a checkpoint exists under torchrun restarts) | never | always
    # DCP async_save: stage to host memory (pinned on CUDA), write in a background thread;
    # `latest` moves only once every rank's write finished and verified. Final and
    # preemption checkpoints still wait for their write. Left unset on CUDA: on where the host
    # memory holds the staged state (train/plan.py).
    async_save: bool = False

    def validate(self) -> None:
        if self.every < 0 or self.keep < 0:
            raise ConfigError("checkpoint.every / checkpoint.keep: must be >= 0")
        if self.resume not in ("auto", "never", "always"):
            raise ConfigError(f"checkpoint.resume: must be auto, never or always, got {self.resume!r}")


@dataclass
class MetricsConfig:
    peak_tflops: float = 0.0  # dense bf16 peak per GPU for MFU; 0 = detect from the GPU name
    tensorboard: bool = False
    progress: bool = True  # rank-0 progress bar
    trace_steps: str = ""  # "A:B": torch.profiler trace of steps A..B per rank (OUT/traces/), see train/trace.py
    prometheus_file: str = field(default="", metadata=PATH)  # Prometheus textfile (relative: under OUT), rewritten per logged step
    wandb: bool = False  # log the same rows to Weights & Biases (needs the wandb extra)
    wandb_project: str = "hopper-train"

    def validate(self) -> None:
        from train.trace import parse_window

        if self.peak_tflops < 0:
            raise ConfigError(f"metrics.peak_tflops: must be >= 0, got {self.peak_tflops}")
        try:
            parse_window(self.trace_steps)
        except ValueError as exc:
            raise ConfigError(f"metrics.trace_steps: {exc}") from None
        from train.exporters import missing

        for key, on, module in (("prometheus_file", self.prometheus_file, "prometheus_client"),
                                ("wandb", self.wandb, "wandb")):
            if on and (why := missing(module)):
                raise ConfigError(f"metrics.{key}: {why}")


@dataclass
class JobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    fp8: Float8Config = field(default_factory=Float8Config)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate()
        self._validate_model()
        if self.comm.hook != "none" and self.parallel.strategy != "ddp":
            raise ConfigError(
                f"comm.hook={self.comm.hook}: communication hooks are DDP hooks; parallel.strategy="
                f"{self.parallel.strategy} does not use them (set comm.hook=none or parallel.strategy=ddp)"
            )
        if self.train.loss == "chunked" and self.parallel.tp != 1:
            raise ConfigError("train.loss=chunked: not with tensor parallelism (parallel.tp != 1): use eager or compiled")
        if self.train.loss == "compiled" and self.parallel.tp != 1 and self.parallel.loss_parallel:
            raise ConfigError("train.loss=compiled: not with parallel.loss_parallel (vocabulary-sharded logits)")
        if self.train.seq_len > self.model.max_seq_len:
            raise ConfigError(
                f"train.seq_len: {self.train.seq_len} is longer than model.max_seq_len={self.model.max_seq_len}"
            )

    def _validate_model(self) -> None:
        """The model's family (or a user's builder, imported now) and its own rules."""
        spec = model_spec(self.model)
        if spec.validate is not None:
            spec.validate(self.model)
        if self.train.loss == "chunked" and not spec.loss_head:
            raise ConfigError(f"train.loss=chunked: model.builder={self.model.builder} takes no loss head "
                              "(use eager or compiled)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- loading


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotated type; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {tp}, got {excerpt(value)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {excerpt(value)}")
    if origin in (list, tuple):
        (elem,) = typing.get_args(tp)[:1] or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {excerpt(value)}")
        return [_coerce(v, elem, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > INT_LIMIT:
                raise ConfigError(f"{key}: {value} is out of range")
            return value
    elif tp is float:
        # finite, ASCII digits only (YAML 1.1 reads "1e-3", without a dot, as a string)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            try:
                return parse_finite_float(key, value)
            except InputError as exc:
                raise ConfigError(str(exc)) from None
    elif tp is str:
        if isinstance(value, str):
            if len(value) > 4096:
                raise ConfigError(f"{key}: longer than 4096 characters")
            if control_chars(value):  # names, modes and paths: a NUL or newline is never meant
                raise ConfigError(f"{key}: control characters in {excerpt(value)}")
            return value
    else:
        raise ConfigError(f"{key}: unsupported field type {tp}")
    hint = ""
    if tp is str and isinstance(value, bool):
        hint = " (quote it: YAML reads an unquoted yes/no/on/off/true/false as a boolean)"
    elif tp is str and isinstance(value, (int, float)):  # null, a date, a list: no hint fits
        hint = (" (quote it: YAML reads unquoted digits as a number, which need not be the text written:"
                " 2024.10 as 2024.1, 10:12 as 612)")
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {excerpt(value)}{hint}")


def _apply(obj: Any, data: dict[str, Any], prefix: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(type(obj))
    fields = {f.name: f for f in dataclasses.fields(obj)}
    names = set(fields)
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if not isinstance(key, str) or key not in names:
            valid = ", ".join(sorted(names))
            raise ConfigError(f"{dotted}: unknown key (valid keys: {valid})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            _apply(current, value, f"{dotted}.")
        else:
            value = _coerce(value, hints[key], dotted)
            if fields[key].metadata.get("path"):
                try:
                    value = expand_home(value, dotted)
                except InputError as exc:
                    raise ConfigError(str(exc)) from None
            setattr(obj, key, value)


def _apply_model_preset(cfg: JobConfig, model_section: dict[str, Any]) -> None:
    name = model_section.get("name", cfg.model.name)
    if not isinstance(name, str):
        raise ConfigError(f"model.name: expected a preset name, got {type(name).__name__} {excerpt(name)}")
    if name not in PRESETS:
        raise ConfigError(f"model.name: unknown preset {excerpt(name)} (valid: {', '.join(PRESETS)})")
    cfg.model = dataclasses.replace(PRESETS[name])


def _field_type(key: str) -> Any:
    """The declared type of the job's field at the dotted ``key`` (None where there is none)."""
    tp: Any = JobConfig
    for part in key.split("."):
        if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
            return None
        tp = typing.get_type_hints(tp).get(part)
    return tp


def parse_overrides(items: typing.Iterable[str]) -> dict[str, Any]:
    """``["a.b=3", "c=x"]`` -> nested dict with YAML-typed values."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: empty key")
        try:
            value = load_yaml_text(raw, f"--set {key}") if raw.strip() else ""
        except YamlSyntaxError:  # not YAML, or a number YAML 1.1 would misread (10:12 as 612): the plain string
            value = raw.strip()
        if isinstance(value, (bool, int, float, datetime.date)) and _field_type(key) is str:
            value = raw.strip()  # a text field: 12345678 (a sha256 prefix), 2024.10, 2026-01-01 as typed
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
        node[parts[-1]] = value
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``extra`` (the --set overrides) over ``base`` (the file). A section of the file (a top-level
    key) that is not a mapping is an error even where an override names keys in it (it was
    dropped unread); below that, the override replaces the value and the type check judges it."""
    merged = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = _merge(merged[k], v, f"{prefix}{k}.")
        elif isinstance(v, dict) and not prefix and merged.get(k) is not None:  # a section (train:, model:...)
            raise ConfigError(f"{k}: expected a mapping, got {type(merged[k]).__name__}")
        else:
            merged[k] = v
    return merged


def resolve_config_path(path: str | Path) -> Path:
    """A file path, or the name of a preset under train/configs (``tiny``, ``debug``...)."""
    if not str(path).strip():
        raise ConfigError("--config: empty name (a YAML file or a preset name)")
    p = Path(path)
    try:  # a name too long for the file system: one line (is_file() raised OSError)
        st = probe_path(p, "--config")
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    if st is not None and stat.S_ISREG(st.st_mode):
        return p
    preset = CONFIG_DIR / f"{path}.yaml"
    if "/" not in str(path) and preset.is_file():
        return preset
    if st is not None:
        raise ConfigError(f"--config {path}: is not a file")
    names = ", ".join(sorted(q.stem for q in CONFIG_DIR.glob("*.yaml")))
    raise ConfigError(f"--config {path}: no such file or preset (presets: {names})")


def load_yaml(path: Path) -> dict[str, Any]:
    """Bounded (size, nesting, alias expansion) safe YAML: see ``core.safety``."""
    try:
        data = load_yaml_file(path, "--config")
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: top level must be a mapping")
    return data


def build_config(data: dict[str, Any]) -> JobConfig:
    cfg = JobConfig()
    model_section = data.get("model") or {}
    if not isinstance(model_section, dict):
        raise ConfigError("model: expected a mapping")
    _apply_model_preset(cfg, model_section)
    _apply(cfg, data, "")
    cfg.validate()
    return cfg


def set_key(job: JobConfig, dotted: str, value: Any) -> None:
    """Set one ``section.key`` of ``job`` after the type check of loading (no validation of the whole)."""
    section, _, name = dotted.partition(".")
    obj = getattr(job, section, None)
    if not dataclasses.is_dataclass(obj) or name not in {f.name for f in dataclasses.fields(obj)}:
        raise ConfigError(f"{dotted}: unknown key")
    setattr(obj, name, _coerce(value, typing.get_type_hints(type(obj))[name], dotted))


def set_keys(data: dict[str, Any], prefix: str = "") -> frozenset[str]:
    """The dotted keys a config mapping sets (``train.plan`` never changes these)."""
    keys: set[str] = set()
    for k, v in data.items():
        keys |= set(set_keys(v, f"{prefix}{k}.")) if isinstance(v, dict) else {f"{prefix}{k}"}
    return frozenset(keys)


def load_config(path: str | Path | None = None, overrides: typing.Iterable[str] = ()) -> JobConfig:
    """The job from a YAML file or preset and ``--set`` overrides. ``job.explicit_keys`` holds the
    keys they set: the automatic plan (``train.plan``) decides only the others."""
    data: dict[str, Any] = load_yaml(resolve_config_path(path)) if path is not None else {}
    data = _merge(data, parse_overrides(overrides))
    job = build_config(data)
    job.explicit_keys = set_keys(data)
    return job
