"""Model shapes. A preset is a complete :class:`ModelConfig`; YAML or ``--set model.x=``
overrides single fields after the preset named by ``model.name`` is applied. The fields are
those every family reads (a family may ignore some: GPT-2 has no RoPE); this file holds the
Llama family's presets, each family its own (``train.models.registry.PRESETS``: all of them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    name: str = "tiny"
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 0  # 0 = n_heads (multi-head); fewer = grouped-query attention
    vocab_size: int = 256
    ffn_hidden: int = 0  # 0 = Llama rule: 8/3 * dim rounded up to multiple_of
    multiple_of: int = 64
    max_seq_len: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    family: str = "llama"  # the model family (train/models/registry.py); a preset sets it
    builder: str = ""  # a user's model: "pkg.mod:fn", fn(ModelConfig) -> nn.Module (family then unused)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        hidden = int(8 * self.dim / 3)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def validate(self) -> None:
        from train.errors import ConfigError

        for name in ("dim", "n_layers", "n_heads", "vocab_size", "max_seq_len", "multiple_of"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name}: must be > 0, got {getattr(self, name)}")
        if self.n_kv_heads < 0 or self.ffn_hidden < 0:
            raise ConfigError("model.n_kv_heads / model.ffn_hidden: must be >= 0")
        if self.dim % self.n_heads:
            raise ConfigError(f"model.dim: {self.dim} is not divisible by model.n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ConfigError(f"model.n_kv_heads: {self.kv_heads} does not divide model.n_heads={self.n_heads}")
        if self.norm_eps <= 0 or self.rope_theta <= 0:
            raise ConfigError("model.norm_eps / model.rope_theta: must be > 0")


def _preset(**kw) -> ModelConfig:
    return ModelConfig(**kw)


# Shapes follow the Llama family; 8b is Llama-3-8B (dim 4096, 32 layers, 32 heads,
# 8 KV heads, FFN 14336, vocab 128256). Smaller ones are scaled-down GQA decoders.
MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny": _preset(name="tiny", dim=128, n_layers=4, n_heads=4, vocab_size=256, max_seq_len=256),
    "debug": _preset(name="debug", dim=256, n_layers=6, n_heads=16, vocab_size=2048, max_seq_len=2048),
    "125m": _preset(name="125m", dim=768, n_layers=12, n_heads=12, vocab_size=32768, max_seq_len=2048),
    "350m": _preset(
        name="350m", dim=1024, n_layers=24, n_heads=16, n_kv_heads=8, vocab_size=32768, max_seq_len=2048
    ),
    "1b": _preset(
        name="1b", dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_hidden=8192,
        vocab_size=32768, max_seq_len=4096, rope_theta=500000.0,
    ),
    "3b": _preset(
        name="3b", dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_hidden=8192,
        vocab_size=32768, max_seq_len=4096, rope_theta=500000.0,
    ),
    "8b": _preset(
        name="8b", dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
        vocab_size=128256, max_seq_len=8192, rope_theta=500000.0,
    ),
}
