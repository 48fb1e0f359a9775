"""The model families and a user's own model: which :class:`~train.models.spec.ModelSpec` a
job's ``model`` section means.

* ``model.family`` (set by the preset ``model.name`` names) picks a registered family;
* ``model.builder=pkg.mod:fn`` brings a user's model: ``fn(ModelConfig) -> torch.nn.Module``,
  imported from the Python path. It gets a spec of its own (:func:`user_spec`): its blocks are
  ``model.layers`` when it has them (activation checkpointing, per-block compile, FSDP2 units),
  its weights come from ``model.init_weights(seed)`` or else every module's ``reset_parameters()``
  under ``torch.manual_seed(seed)``; tensor parallelism and ``train.loss=chunked`` need a family.

A new family is one folder (or module) defining a ``SPEC`` and one line in :data:`FAMILIES`.
No torch at import time: ``train doctor`` reads presets and shapes through here.
"""

from __future__ import annotations

import importlib
import re

from core.safety import excerpt
from train.errors import ConfigError
from train.models import llama_spec
from train.models.gpt2 import spec as gpt2_spec
from train.models.presets import ModelConfig
from train.models.spec import ModelSpec

FAMILIES: dict[str, ModelSpec] = {spec.family: spec for spec in (llama_spec.SPEC, gpt2_spec.SPEC)}


def _all_presets() -> dict[str, ModelConfig]:
    out: dict[str, ModelConfig] = {}
    for spec in FAMILIES.values():
        for name, cfg in spec.presets.items():
            if name in out or cfg.family != spec.family:
                raise RuntimeError(f"model preset {name}: defined twice, or not of family {spec.family}")
            out[name] = cfg
    return out


# Every family's presets by name (``model.name``); each sets its ``family``.
PRESETS: dict[str, ModelConfig] = _all_presets()

_BUILDER = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z", re.ASCII)


def model_spec(cfg: ModelConfig) -> ModelSpec:
    """The spec of ``cfg``'s model (a user's builder, else its family), or a ConfigError."""
    if cfg.builder:
        return user_spec(cfg.builder)
    if cfg.family not in FAMILIES:
        raise ConfigError(f"model.family: unknown family {excerpt(cfg.family)} (valid: {', '.join(FAMILIES)})")
    return FAMILIES[cfg.family]


def _unknown_builder(cfg: ModelConfig):
    raise ValueError("a module given without its spec cannot be rebuilt")


# A module built elsewhere (no ModelConfig of its own): its blocks, if any, in ``layers``.
PLAIN = ModelSpec(family="module", build=_unknown_builder, blocks="layers")


def spec_of(model) -> ModelSpec:
    """The spec of a built model: that of its ``cfg`` (every family keeps its config there), else
    :data:`PLAIN`."""
    cfg = getattr(model, "cfg", None)
    return model_spec(cfg) if isinstance(cfg, ModelConfig) else PLAIN


def load_builder(path: str):
    """``pkg.mod:fn`` -> the callable, or a one-line ConfigError naming what is wrong."""
    key = f"model.builder={excerpt(path)}"
    if not _BUILDER.match(path):
        raise ConfigError(f"{key}: expected MODULE:FUNCTION, e.g. mypkg.models:build")
    module_name, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"{key}: no module named {exc.name!r} on the Python path") from None
        raise ConfigError(f"{key}: importing {module_name} failed: {excerpt(str(exc))}") from None
    except Exception as exc:  # a user's module that raises or does not parse: one line, no traceback
        raise ConfigError(f"{key}: importing {module_name} failed: {type(exc).__name__}: {excerpt(str(exc))}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{key}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{key}: {attr} is a {type(obj).__name__}, not a function")
    return obj


def user_spec(path: str) -> ModelSpec:
    """The spec of a user's model given by import path (see the module docstring)."""
    fn = load_builder(path)

    def build(cfg: ModelConfig):
        from torch import nn

        try:
            model = fn(cfg)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"model.builder={path}: raised {type(exc).__name__}: {excerpt(str(exc))}") from None
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model.builder={path}: returned {type(model).__name__}, not a torch.nn.Module")
        return model

    return ModelSpec(family="user", build=build, init=_user_init, blocks="layers", source=path)


def _user_init(model, seed: int) -> None:
    import torch

    if callable(getattr(model, "init_weights", None)):
        model.init_weights(seed)
        return
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()


def param_count(cfg: ModelConfig) -> int | None:
    """Parameters of ``cfg``'s model from the config alone; None where only building it would tell."""
    return model_spec(cfg).param_count(cfg)


def flops_per_token(cfg: ModelConfig, seq_len: int, n_params: int) -> float:
    """Training FLOPs per token: the family's formula, else 6 N + 12 L d s with N the model's
    ``n_params`` (embeddings included: an upper bound)."""
    spec = model_spec(cfg)
    if spec.flops_per_token is not None:
        return spec.flops_per_token(cfg, seq_len)
    return 6.0 * n_params + 12.0 * cfg.n_layers * cfg.dim * seq_len
